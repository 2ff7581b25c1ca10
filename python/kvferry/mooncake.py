"""Mooncake-compatible TransferEngine: ``from kvferry.engine import TransferEngine``.

Same method names, argument order and return conventions as ``mooncake.engine.TransferEngine``:
every call returns 0 on success and a negative number on failure; async submissions return a
batch id, 0 on failure. The negative number is ``-int(kvferry.StatusCode)`` of the C++ error
(-1 InvalidArgument, -2 NotRegistered, -7 PeerUnreachable, -8 PeerDisconnected, -9 Timeout,
...), and ``get_last_error()`` (a kvferry extension) returns the exception with its message
for the calling thread.

Differences from Mooncake, on purpose:

* ``protocol``: "auto", "rdma" and "shm" let the engine route each op (cuda_ipc for device
  memory on one host, shm for a same-host peer's allocate_managed_buffer memory, cma —
  cross-memory attach — for its other registered host memory, ucx across hosts where UCX
  reports hardware RMA on both sides, tcp otherwise). "rdma" is what sglang passes: it means
  ucx for a cross-host peer wherever UCX has hardware RMA on both sides (``ucx_info -d``: rc,
  dc, ud), and tcp otherwise, with a one-time warning when this host has none. "shm" no
  longer requires managed buffers (cma reaches any registered host memory of a same-host
  peer). "tcp", "cma", "local" and "cuda_ipc" (when built) force that transport. A Mooncake
  protocol kvferry does not serve ("efa", "nvmeof", ...) or any other value makes
  ``initialize`` log an error naming it and what kvferry offers, and return -1.
* A sync call that times out returns only once no byte of it can land any more (the C++
  engine cancels a timed-out batch before reporting Timeout). ``get_batch_transfer_status``
  waits for every listed batch to end (not just until the first failure) for the same reason.
* Peers are "host:rpc_port" where rpc_port is get_rpc_port(): the engine's handshake
  endpoint. ``local_hostname`` may carry a port ("10.0.0.1:17000") to bind that port;
  without one a free port is picked.
* ``device_name`` is accepted and ignored (no NIC selection in this build).
* ``send_probe(session)`` is a fresh handshake with the peer (never the cache) within
  PROBE_TIMEOUT_MS: 0 when it answers, negative otherwise. ``get_engine()`` returns the
  underlying ``kvferry.Engine``.
* The transfer timeout is MC_TRANSFER_TIMEOUT seconds when set (Mooncake's variable, minimum
  5), else 30 s; ``TransferEngine(transfer_timeout_ms=...)`` overrides it.
* Bad arguments are errors, never exceptions or crashes: an address or length that is not an
  integer in 0..2**64-1 (a negative length, a float, None), a session that is not a string, an
  unknown opcode or batch id returns -1 (InvalidArgument) naming the argument.
  ``write_bytes_to_buffer`` and ``read_bytes_from_buffer`` touch only memory registered (or
  allocated) through this engine, host memory only: any other range returns -2
  (NotRegistered) without being touched, and so does registered memory the application
  unmapped. ``read_bytes_from_buffer`` returns the bytes, or that negative number.
  ``register_memory`` of memory not mapped in this process returns -1.
"""

import enum
import itertools
import logging
import operator
import os
import threading

import numpy as np

from . import _kvferry
from .errors import KvferryError, StatusCode

logger = logging.getLogger("kvferry")

# Protocols that force one transport, and those that let the engine route each op.
_FORCED_TRANSPORTS = ("tcp", "cma", "local", "cuda_ipc")
_AUTO = "auto"
_RDMA = "rdma"
_ROUTED = (_AUTO, _RDMA, "shm")
# Mooncake transports kvferry does not serve (named in initialize's error).
_MOONCAKE_ONLY = ("efa", "nvmeof", "nvlink", "nvlink_intra", "hip", "barex", "ascend", "cxl")
_OFFERED = ", ".join(_ROUTED + _FORCED_TRANSPORTS)
PROBE_TIMEOUT_MS = 1000
_P2P_HANDSHAKE = "P2PHANDSHAKE"
_DEFAULT_TIMEOUT_MS = 30_000
_MIN_MOONCAKE_TIMEOUT_S = 5
# Mooncake's sync-call status codes of transfer_check_status.
_CHECK_COMPLETED, _CHECK_PENDING, _CHECK_FAILED, _CHECK_TIMEOUT = 1, 0, -1, -2


class TransferOpcode(enum.IntEnum):
    Read = 0
    Write = 1


def _code(error):
    return -int(error.code)


_U64_LIMIT = 1 << 64


def _invalid(message):
    from .errors import InvalidArgumentError

    return InvalidArgumentError(StatusCode.InvalidArgument, message)


def _u64(value, what):
    """`value` as an int in 0..2**64-1 (Python or numpy integer), else InvalidArgumentError
    naming `what` and the value."""
    try:
        number = operator.index(value)
    except TypeError:
        raise _invalid(f"{what} must be an integer, got {type(value).__name__} {value!r}") \
            from None
    if not 0 <= number < _U64_LIMIT:
        raise _invalid(f"{what} {number} out of range 0..{_U64_LIMIT - 1}")
    return number


def _u64_array(values, what):
    """A 1-D uint64 array of the integers in `values` (list, tuple or integer array), else
    InvalidArgumentError naming `what`, the index and the value. One numpy conversion in the
    usual case (what the extension would do anyway)."""
    try:
        array = np.asarray(values)
    except (TypeError, ValueError, OverflowError):
        array = None
    if array is not None and array.ndim == 1 and array.dtype.kind in "iu":
        if array.dtype.kind == "i" and array.size and array.min() < 0:
            index = int(np.argmax(array < 0))
            raise _invalid(f"{what}[{index}] {int(array[index])} out of range "
                           f"0..{_U64_LIMIT - 1}")
        return array.astype(np.uint64, copy=False)
    if array is not None and array.ndim == 1 and array.size == 0:
        return np.zeros(0, dtype=np.uint64)
    # Anything else is checked element by element, so the error names the one that is wrong.
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise _invalid(f"{what} must be a list of integers, got {type(values).__name__}")
    return np.array([_u64(v, f"{what}[{i}]") for i, v in enumerate(values)], dtype=np.uint64)


def _text(value, what):
    if not isinstance(value, str):
        raise _invalid(f"{what} must be a string, got {type(value).__name__} {value!r}")
    return value


def _split_host_port(local_hostname):
    """("host", port) of "host", "host:port", "[v6]" or "[v6]:port"; port 0 when absent."""
    if local_hostname.startswith("["):
        host, _, rest = local_hostname[1:].partition("]")
        return f"[{host}]", int(rest[1:]) if rest.startswith(":") else 0
    if local_hostname.count(":") == 1:
        host, port = local_hostname.split(":")
        return host, int(port)
    return local_hostname, 0


def _metadata_uri(metadata_server, metadata_type=None):
    if metadata_server == _P2P_HANDSHAKE or metadata_type in ("p2p", _P2P_HANDSHAKE):
        return "p2p"
    if "://" in metadata_server:
        return metadata_server
    # Mooncake reads a bare "host:port" as an etcd server.
    return f"{metadata_type or 'etcd'}://{metadata_server}"


def _timeout_ms(override_ms):
    if override_ms is not None:
        return int(override_ms)
    seconds = os.environ.get("MC_TRANSFER_TIMEOUT")
    if seconds:
        return max(_MIN_MOONCAKE_TIMEOUT_S, int(seconds)) * 1000
    return _DEFAULT_TIMEOUT_MS


def _hardware_rma_here():
    """Whether UCX here has a hardware RMA transport (the seam tests replace)."""
    return _kvferry.ucx_hardware_rma()


def _rdma_warning(hardware_rma_here):
    """What protocol "rdma" means here: None when ucx can carry it (hardware RMA here; the
    engine then picks ucx for every cross-host peer whose UCX has hardware RMA too, tcp for
    the others, logging each route), else the one-time warning that it means tcp."""
    if hardware_rma_here:
        return None
    return ("protocol 'rdma': UCX here has no hardware RMA transport (or this build has no "
            "ucx); the engine routes each op (cuda_ipc, shm or cma on one host, tcp across "
            "hosts)")


class TransferEngine:
    """Mooncake's Python TransferEngine API over kvferry. Thread-safe like kvferry.Engine."""

    _rdma_warned = False

    def __init__(self, transfer_timeout_ms=None):
        self._engine = None
        self._timeout_ms = transfer_timeout_ms
        self._batches = {}
        self._batch_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._errors = threading.local()

    # ---- errors --------------------------------------------------------------------------

    def _fail(self, error, what):
        self._errors.last = error
        logger.debug("%s failed: %s", what, error)
        return _code(error)

    def _not_initialized(self, what):
        from .errors import FailedPreconditionError

        return self._fail(
            FailedPreconditionError(StatusCode.FailedPrecondition,
                                    f"{what} before initialize() succeeded"), what)

    def get_last_error(self):
        """kvferry extension: the KvferryError of this thread's last failed call, or None."""
        return getattr(self._errors, "last", None)

    # ---- initialization ------------------------------------------------------------------

    def initialize(self, local_hostname, metadata_server, protocol, device_name):
        return self.initialize_ext(local_hostname, metadata_server, protocol, device_name, None)

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name,
                       metadata_type):
        from . import Engine
        from .errors import InvalidArgumentError

        del device_name  # no NIC selection in this build
        for value, what in ((local_hostname, "local_hostname"),
                            (metadata_server, "metadata_server")):
            if not isinstance(value, str):
                return self._fail(_invalid(f"{what} must be a string, got "
                                           f"{type(value).__name__} {value!r}"), "initialize")
        for value, what in ((protocol, "protocol"), (metadata_type, "metadata_type")):
            if value is not None and not isinstance(value, str):
                return self._fail(_invalid(f"{what} must be a string, got "
                                           f"{type(value).__name__} {value!r}"), "initialize")
        if self._engine is not None:
            return self._fail(InvalidArgumentError(
                StatusCode.InvalidArgument, "initialize called twice"), "initialize")
        protocol = (protocol or _AUTO).lower()
        if protocol == _RDMA and not TransferEngine._rdma_warned:
            warning = _rdma_warning(_hardware_rma_here())
            if warning:
                logger.warning(warning)
                TransferEngine._rdma_warned = True
        if protocol not in _ROUTED and protocol not in _FORCED_TRANSPORTS:
            what = (f"protocol '{protocol}' is a Mooncake transport kvferry does not serve"
                    if protocol in _MOONCAKE_ONLY else f"unknown protocol '{protocol}'")
            error = InvalidArgumentError(
                StatusCode.InvalidArgument,
                f"{what} (kvferry offers: {_OFFERED}; auto, rdma and shm route each op to the "
                f"best transport)")
            logger.error("kvferry.TransferEngine.initialize: %s", error.message)
            return self._fail(error, "initialize")
        try:
            host, port = _split_host_port(local_hostname)
            self._engine = Engine(
                name=f"kvferry-py-{os.getpid()}",
                listen_address=f"{host}:{port}",
                metadata_uri=_metadata_uri(metadata_server, metadata_type),
                transport=None if protocol in _ROUTED else protocol,
                batch_timeout_ms=_timeout_ms(self._timeout_ms),
            )
        except (KvferryError, ValueError) as error:
            if not isinstance(error, KvferryError):
                error = InvalidArgumentError(StatusCode.InvalidArgument,
                                             f"local_hostname '{local_hostname}': {error}")
            logger.error("kvferry.TransferEngine.initialize: %s", error)
            return self._fail(error, "initialize")
        return 0

    def get_engine(self):
        """The underlying kvferry.Engine (None before initialize succeeded)."""
        return self._engine

    def send_probe(self, target_hostname):
        """0 when the peer answers a fresh handshake within PROBE_TIMEOUT_MS, else the negative
        code (-7 PeerUnreachable for a dead peer). sglang un-blacklists a session on 0."""
        return self._call("send_probe", lambda: self._engine.probe(
            _text(target_hostname, "target_hostname"), PROBE_TIMEOUT_MS))

    def get_rpc_port(self):
        if self._engine is None:
            return self._not_initialized("get_rpc_port")
        return self._engine.rpc_port

    def get_session_id(self):
        """kvferry extension: "host:rpc_port", the name peers use for this engine."""
        return self._engine.endpoint if self._engine is not None else ""

    # ---- memory --------------------------------------------------------------------------

    def _call(self, what, fn, *args):
        if self._engine is None:
            return self._not_initialized(what)
        try:
            fn(*args)
        except KvferryError as error:
            return self._fail(error, what)
        except (TypeError, ValueError, OverflowError) as error:
            # An argument the checks above let through and the extension refused: still a code.
            return self._fail(_invalid(f"{what}: {error}"), what)
        return 0

    def register_memory(self, buffer_addr, capacity, location="*"):
        return self._call("register_memory", lambda: self._engine.register_memory(
            _u64(buffer_addr, "buffer_addr"), _u64(capacity, "capacity"),
            _text(location, "location")))

    def unregister_memory(self, buffer_addr):
        return self._call("unregister_memory", lambda: self._engine.unregister_memory(
            _u64(buffer_addr, "buffer_addr")))

    def batch_register_memory(self, buffer_addresses, capacities, location="*"):
        return self._call("batch_register_memory", lambda: self._engine.register_memory_batch(
            _u64_array(buffer_addresses, "buffer_addresses"), _u64_array(capacities, "capacities"),
            _text(location, "location")))

    def batch_unregister_memory(self, buffer_addresses):
        return self._call("batch_unregister_memory", lambda: self._engine.unregister_memory_batch(
            _u64_array(buffer_addresses, "buffer_addresses")))

    def allocate_managed_buffer(self, length):
        """Registered shared memory (reachable through shm too); its address, 0 on failure."""
        address = []
        self._call("allocate_managed_buffer", lambda: address.append(
            self._engine.allocate_shared(_u64(length, "length"))))
        return address[0] if address else 0

    def free_managed_buffer(self, buffer_addr, length):
        del length
        return self._call("free_managed_buffer", lambda: self._engine.free_shared(
            _u64(buffer_addr, "buffer_addr")))

    def write_bytes_to_buffer(self, dest_address, src_ptr, length):
        """Copies the first `length` bytes of src_ptr (bytes-like) to dest_address, which must
        lie inside memory registered or allocated through this engine: -2 (NotRegistered)
        otherwise, nothing touched."""

        def write():
            count = _u64(length, "length")
            source = src_ptr.encode() if isinstance(src_ptr, str) else src_ptr
            try:
                data = bytes(memoryview(source)[:count])
            except TypeError:
                raise _invalid(f"src_ptr must be bytes-like, got {type(src_ptr).__name__}") \
                    from None
            if len(data) < count:
                raise _invalid(f"length {count} exceeds the {len(data)} bytes of src_ptr")
            self._engine.write_bytes(_u64(dest_address, "dest_address"), data)

        return self._call("write_bytes_to_buffer", write)

    def read_bytes_from_buffer(self, source_address, length):
        """The `length` bytes at source_address, which must lie inside memory registered or
        allocated through this engine; the negative code instead (-2 NotRegistered) for any
        other range, nothing touched."""
        data = []
        code = self._call("read_bytes_from_buffer", lambda: data.append(self._engine.read_bytes(
            _u64(source_address, "source_address"), _u64(length, "length"))))
        return data[0] if code == 0 else code

    # ---- synchronous transfers -----------------------------------------------------------

    def _transfer_one(self, what, target_hostname, kind, buffer, peer_buffer_address, length):
        return self._call(what, lambda: self._engine.transfer_one(
            _text(target_hostname, "target_hostname"), kind, _u64(buffer, "buffer"),
            _u64(peer_buffer_address, "peer_buffer_address"), _u64(length, "length")))

    def _transfer(self, what, target_hostname, kind, buffers, peer_buffer_addresses, lengths):
        return self._call(what, lambda: self._engine.transfer(
            _text(target_hostname, "target_hostname"), kind, _u64_array(buffers, "buffers"),
            _u64_array(peer_buffer_addresses, "peer_buffer_addresses"),
            _u64_array(lengths, "lengths")))

    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length,
                            transport_hint=""):
        return self._transfer_one("transfer_sync_write", target_hostname, _kvferry.OpKind.WRITE,
                                  buffer, peer_buffer_address, length)

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length,
                           transport_hint=""):
        return self._transfer_one("transfer_sync_read", target_hostname, _kvferry.OpKind.READ,
                                  buffer, peer_buffer_address, length)

    def transfer_sync(self, target_hostname, buffer, peer_buffer_address, length, opcode,
                      notify=None, transport_hint=""):
        try:
            opcode = TransferOpcode(opcode)
        except ValueError:
            return self._fail(_invalid(f"opcode {opcode!r} is neither Read (0) nor Write (1)"),
                              "transfer_sync")
        kind = _kvferry.OpKind.WRITE if opcode == TransferOpcode.Write else _kvferry.OpKind.READ
        return self._transfer_one("transfer_sync", target_hostname, kind, buffer,
                                  peer_buffer_address, length)

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                  transport_hint=""):
        return self._transfer("batch_transfer_sync_write", target_hostname,
                              _kvferry.OpKind.WRITE, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                 transport_hint=""):
        return self._transfer("batch_transfer_sync_read", target_hostname, _kvferry.OpKind.READ,
                              buffers, peer_buffer_addresses, lengths)

    # ---- asynchronous transfers ----------------------------------------------------------

    def _submit(self, what, target_hostname, kind, buffers, peer_buffer_addresses, lengths):
        submitted = []
        self._call(what, lambda: submitted.append(self._engine.submit(
            _text(target_hostname, "target_hostname"), kind, _u64_array(buffers, "buffers"),
            _u64_array(peer_buffer_addresses, "peer_buffer_addresses"),
            _u64_array(lengths, "lengths"))))
        if not submitted:
            return 0
        batch = submitted[0]
        batch_id = next(self._batch_ids)
        with self._lock:
            self._batches[batch_id] = batch
        return batch_id

    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses,
                                   lengths, transport_hint=""):
        return self._submit("batch_transfer_async_write", target_hostname,
                            _kvferry.OpKind.WRITE, buffers, peer_buffer_addresses, lengths)

    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths, transport_hint=""):
        return self._submit("batch_transfer_async_read", target_hostname,
                            _kvferry.OpKind.READ, buffers, peer_buffer_addresses, lengths)

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length,
                              transport_hint=""):
        return self._submit("transfer_submit_write", target_hostname, _kvferry.OpKind.WRITE,
                            [buffer], [peer_buffer_address], [length])

    @staticmethod
    def _batch_key(batch_id):
        """The batch id as an int, or None for anything that cannot be one."""
        try:
            return operator.index(batch_id)
        except TypeError:
            return None

    def _take(self, batch_id):
        key = self._batch_key(batch_id)
        with self._lock:
            return self._batches.pop(key, None) if key is not None else None

    def _unknown_batch(self, batch_id, what):
        from .errors import InvalidArgumentError

        return self._fail(InvalidArgumentError(
            StatusCode.InvalidArgument, f"unknown batch id {batch_id}"), what)

    def get_batch_transfer_status(self, batch_ids):
        """Waits until every listed batch ended (and forgets them): 0 when all completed, else
        the negative code of the first failure in list order."""
        if self._engine is None:
            return self._not_initialized("get_batch_transfer_status")
        try:
            batch_ids = list(batch_ids)
        except TypeError:
            return self._fail(_invalid(f"batch_ids must be a list of batch ids, got "
                                       f"{type(batch_ids).__name__}"),
                              "get_batch_transfer_status")
        result = 0
        for batch_id in batch_ids:
            batch = self._take(batch_id)
            if batch is None:
                code = self._unknown_batch(batch_id, "get_batch_transfer_status")
            else:
                state, status, message = self._engine.wait_final(batch)
                code = 0
                if state != int(_kvferry.BatchState.COMPLETED):
                    from .errors import error_from_status

                    code = self._fail(error_from_status(status, message),
                                      f"batch {batch_id}")
            if result == 0:
                result = code
        return result

    def transfer_check_status(self, batch_id):
        """Mooncake's poll: 1 completed, 0 pending, -1 failed, -2 timed out. A batch that ended
        is forgotten."""
        key = self._batch_key(batch_id)
        with self._lock:
            batch = self._batches.get(key) if key is not None else None
        if batch is None:
            self._unknown_batch(batch_id, "transfer_check_status")
            return _CHECK_FAILED
        state, status, message = self._engine.batch_status(batch)
        if state == int(_kvferry.BatchState.PENDING):
            return _CHECK_PENDING
        self._take(batch_id)
        if state == int(_kvferry.BatchState.COMPLETED):
            return _CHECK_COMPLETED
        from .errors import error_from_status

        self._fail(error_from_status(status, message), f"batch {batch_id}")
        return _CHECK_TIMEOUT if status == int(StatusCode.Timeout) else _CHECK_FAILED
