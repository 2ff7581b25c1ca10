"""Drop-in module path for Mooncake users: ``from kvferry.engine import TransferEngine``
replaces ``from mooncake.engine import TransferEngine``."""

from .mooncake import TransferEngine, TransferOpcode

__all__ = ["TransferEngine", "TransferOpcode"]
