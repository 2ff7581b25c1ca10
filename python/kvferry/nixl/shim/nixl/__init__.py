"""A ``nixl`` package that is kvferry.nixl (see kvferry/nixl/__init__.py, docs/VLLM.md)."""
from kvferry.nixl import *  # noqa: F401,F403
from kvferry.nixl import __kvferry__  # noqa: F401
