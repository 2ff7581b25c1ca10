"""``nixl._bindings``: the names vLLM takes from NIXL's extension module.

nixlXferTelemetry is the C++ telemetry record (read-only: xferDuration and postDuration in
microseconds, totalBytes, descCount). The memory-type and operation constants mirror NIXL's.
"""

from .. import _kvferry
from ..errors import FailedPreconditionError, KvferryError, NotRegisteredError

nixlXferTelemetry = _kvferry.NixlTelemetry
nixlXferDList = _kvferry.NixlDescList
nixlRegDList = _kvferry.NixlDescList

DRAM_SEG = "DRAM"
VRAM_SEG = "VRAM"
NIXL_READ = "READ"
NIXL_WRITE = "WRITE"

# NIXL raises nixl*Error classes; here every failure is a kvferry.errors.KvferryError
# subclass (ValueError, ConnectionError, ... as well), whose .code says what went wrong.
nixlError = KvferryError


class nixlNotFoundError(NotRegisteredError):
    """NIXL's error for a name it does not have (a backend plugin, an agent, a handle)."""


class nixlNoTelemetryError(FailedPreconditionError):
    """get_xfer_telemetry on an agent created without telemetry."""
