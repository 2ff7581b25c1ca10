"""``nixl._bindings``: the names NIXL's Python API takes from its extension module.

* nixlXferTelemetry: the telemetry record (read-only: startTime in microseconds since the
  epoch, xferDuration and postDuration in microseconds, totalBytes, descCount).
* nixlXferDList, nixlRegDList: descriptor lists, made from a list of tuples (addr, len, dev
  [, meta]) or an Nx3 integer array; immutable once made (NIXL's can be edited in place),
  compared by value, indexable, picklable.
* Memory types, operations, thread-sync modes and NIXL's default metadata port mirror NIXL's.
* NIXL's exception classes are kvferry's (kvferry.errors), so that a handler written for
  NIXL catches what kvferry raises: nixlNotFoundError is NotRegisteredError,
  nixlInvalidParamError InvalidArgumentError, and so on.
"""

from .. import _kvferry
from ..errors import (CancelledError, FailedPreconditionError, InternalError,
                      InvalidArgumentError, KvferryError, NotRegisteredError, NotSupportedError,
                      PeerDisconnectedError)

nixlXferTelemetry = _kvferry.NixlTelemetry

DRAM_SEG = "DRAM"
VRAM_SEG = "VRAM"
NIXL_READ = "READ"
NIXL_WRITE = "WRITE"

DEFAULT_COMM_PORT = 8888
# NIXL's UCX GPU device API (memory views for device-initiated transfers): not in kvferry.
HAVE_UCX_GPU_DEVICE_API = False
NIXL_THREAD_SYNC_NONE = 0
NIXL_THREAD_SYNC_STRICT = 1
NIXL_THREAD_SYNC_RW = 2
NIXL_THREAD_SYNC_DEFAULT = NIXL_THREAD_SYNC_NONE


class nixlAgentConfig:
    """The agent's options as NIXL's binding layer carries them (nixl._api fills it in), and
    kvferry's own."""

    def __init__(self):
        self.useProgThread = True
        self.useListenThread = False
        self.listenPort = DEFAULT_COMM_PORT
        self.syncMode = NIXL_THREAD_SYNC_DEFAULT
        self.pthrDelay = 0
        self.lthrDelay = 100000
        self.captureTelemetry = False
        self.listen_address = "0.0.0.0:0"
        self.batch_timeout_ms = 30_000
        self.transport = None
        self.secret = None
        self.worker_threads = 2
        self.acknowledged_notifications = False


def nixlAgent(agent_name, agent_config):
    """The agent's core: one kvferry TransferEngine named `agent_name`."""
    c = agent_config
    return _kvferry.NixlAgent(agent_name, c.listen_address, c.batch_timeout_ms, c.transport,
                              c.secret, c.worker_threads, c.acknowledged_notifications)


def _descs(descs, fields):
    """The descriptors a list is made of: `descs` as given, or `descs` empty ones when it is an
    int (NIXL's init_size)."""
    if descs is None:
        return []
    if isinstance(descs, int):
        return [(0, 0, 0, "")[:fields]] * descs
    return descs


class nixlXferDList(_kvferry.NixlDescList):
    """A transfer descriptor list: nixlXferDList(mem_type, descs) with descs a list of
    (addr, len, dev) tuples or an Nx3 array, or nixlXferDList(mem_type, init_size)."""

    _FIELDS = 3

    def __init__(self, type, descs=None):
        fields = 3 if hasattr(descs, "ndim") else self._FIELDS
        _kvferry.NixlDescList.__init__(self, _descs(descs, fields), type, fields)

    def __reduce__(self):
        return (type(self), (self.getType(), self.rows()))

    def __repr__(self):
        return f"{type(self).__name__}({self.getType()}, {len(self)} descriptors)"


class nixlRegDList(_kvferry.NixlDescList):
    """A registration descriptor list: tuples (addr, len, dev, meta) or an Nx3 array; or
    nixlRegDList(mem_type, init_size)."""

    _FIELDS = 4
    __init__ = nixlXferDList.__init__

    def trim(self):
        """The same descriptors as a nixlXferDList (without their meta)."""
        return nixlXferDList(self.getType(), self.rows())

    __reduce__ = nixlXferDList.__reduce__
    __repr__ = nixlXferDList.__repr__


# NIXL's exception classes.
nixlError = KvferryError
nixlNotFoundError = NotRegisteredError
nixlInvalidParamError = InvalidArgumentError
nixlNotSupportedError = NotSupportedError
nixlRemoteDisconnectError = PeerDisconnectedError
nixlCancelledError = CancelledError
nixlBackendError = InternalError
nixlUnknownError = KvferryError


class nixlNoTelemetryError(FailedPreconditionError):
    """get_xfer_telemetry on an agent that does not capture telemetry."""


class nixlRepostActiveError(FailedPreconditionError):
    """transfer() of a transfer still in progress."""


class nixlNotAllowedError(FailedPreconditionError):
    """A call NIXL does not allow in the agent's state."""


class nixlMismatchError(InvalidArgumentError):
    """Descriptor lists that do not match (lengths, memory types)."""


class nixlNotPostedError(FailedPreconditionError):
    """A query of a transfer that was never posted."""

