"""``nixl.logging``: get_logger as NIXL has it. Loggers under "nixl" write to stdout at INFO,
or at the level NIXL_LOG_LEVEL names (TRACE, DEBUG, INFO, WARN, ERROR, FATAL)."""

import logging
import os

_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO,
           "WARN": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}
_configured = False


def _configure():
    global _configured
    if _configured:
        return
    _configured = True
    root = logging.getLogger("nixl")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(
        "%(asctime)s NIXL %(levelname)-7s %(filename)s:%(lineno)d %(message)s",
        "%Y-%m-%d %H:%M:%S"))
    root.addHandler(handler)
    root.propagate = False
    wanted = os.environ.get("NIXL_LOG_LEVEL", "INFO").upper()
    if wanted not in _LEVELS:
        root.setLevel(logging.INFO)
        root.warning("Invalid NIXL_LOG_LEVEL value '%s'; using INFO", wanted)
    else:
        root.setLevel(_LEVELS[wanted])


def get_logger(name=None):
    """A logger under "nixl" (named "nixl" when `name` is None)."""
    _configure()
    if not name or name == "nixl":
        return logging.getLogger("nixl")
    return logging.getLogger(name if name.startswith("nixl.") else f"nixl.{name}")
