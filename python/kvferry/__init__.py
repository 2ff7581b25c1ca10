"""kvferry: move LLM KV cache between prefill and decode workers.

Three layers, all over the C++ library (the _kvferry extension):

* :class:`TransferEngine` - Mooncake-compatible: same method names, argument order and return
  codes (0 success, negative failure, batch id 0 on failure), so ``mooncake.engine`` users
  switch by changing one import (see kvferry/mooncake.py for the few deliberate differences).
* :class:`Engine` - the Pythonic engine: raises :mod:`kvferry.errors` exceptions carrying the
  status code; ``with engine.registered(array): ...`` registers numpy memory for a block.
* :func:`plan` - the KV transfer planner over numpy page arrays (uint32 arrays are read in
  place); the returned :class:`Plan` exposes its calls as read-only numpy views of the C++
  plan's own arrays.
* The PD session layer: :class:`BootstrapServer`, :class:`PrefillServer` / :class:`KvSender`,
  :class:`DecodeClient` / :class:`KvReceiver`, with :class:`RequestState`.

The GIL is released during every transfer and every wait.
"""

import contextlib

import numpy as np

from . import _kvferry
from .errors import (
    AlreadyExistsError,
    CancelledError,
    DataCorruptedError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    KvferryError,
    NotRegisteredError,
    NotSupportedError,
    OutOfRangeError,
    PeerDisconnectedError,
    PeerUnreachableError,
    ProtocolError,
    StatusCode,
    TransferTimeoutError,
    UnauthenticatedError,
)

OpKind = _kvferry.OpKind
BatchState = _kvferry.BatchState
KvLayout = _kvferry.KvLayout
Plan = _kvferry.Plan
RequestState = _kvferry.RequestState
PdTimeouts = _kvferry.PdTimeouts
BootstrapServer = _kvferry.BootstrapServer
PrefillServer = _kvferry.PrefillServer
KvSender = _kvferry.KvSender
DecodeClient = _kvferry.DecodeClient
KvReceiver = _kvferry.KvReceiver

_MAX_PAGE = np.iinfo(np.uint32).max


def as_pages(pages, what="pages"):
    """A 1-D contiguous uint32 array of page indices, without copying when possible.

    uint32 arrays are returned as they are; int32 arrays are reinterpreted in place after a
    check that none is negative; anything else (lists, int64 tensors' numpy views) is converted
    once, after a range check, so a bad index raises InvalidArgumentError instead of wrapping.
    """
    if isinstance(pages, np.ndarray) and pages.ndim == 1 and pages.flags.c_contiguous:
        if pages.dtype == np.uint32:
            return pages
        if pages.dtype == np.int32:
            if pages.size and pages.min() < 0:
                raise InvalidArgumentError(
                    StatusCode.InvalidArgument, f"{what}: negative page {int(pages.min())}"
                )
            return pages.view(np.uint32)
    array = np.asarray(pages)
    if array.ndim != 1:
        raise InvalidArgumentError(
            StatusCode.InvalidArgument, f"{what}: {array.ndim}-D array, expected 1-D"
        )
    if array.size == 0:
        return np.empty(0, dtype=np.uint32)
    if not np.issubdtype(array.dtype, np.integer):
        raise InvalidArgumentError(
            StatusCode.InvalidArgument, f"{what}: dtype {array.dtype} is not an integer type"
        )
    low, high = int(array.min()), int(array.max())
    if low < 0 or high > _MAX_PAGE:
        bad = low if low < 0 else high
        raise InvalidArgumentError(
            StatusCode.InvalidArgument, f"{what}: page {bad} is outside [0, {_MAX_PAGE}]"
        )
    return np.ascontiguousarray(array, dtype=np.uint32)


def plan(src, dst, src_pages, dst_pages, *, strategy="all_layers", max_pages_per_call=0,
         coalesce=True, head_slice=None):
    """Builds the transfer plan moving ``src_pages`` of layout ``src`` to ``dst_pages`` of ``dst``.

    ``strategy``: "all_layers", "per_layer" or "index_sharded" (with ``max_pages_per_call``).
    ``head_slice``: (prefill_tp_size, prefill_tp_rank, decode_tp_size, decode_tp_rank,
    total_kv_heads) for MHA with prefill TP != decode TP. Page arrays follow :func:`as_pages`
    (uint32 is read in place). Returns a :class:`Plan`; ``plan.calls[i]`` is (src, dst, len),
    read-only uint64 views that keep the plan alive.
    """
    return _kvferry.build_plan(
        src,
        dst,
        as_pages(src_pages, "src_pages"),
        as_pages(dst_pages, "dst_pages"),
        strategy=strategy,
        max_pages_per_call=max_pages_per_call,
        coalesce=coalesce,
        head_slice=head_slice,
    )


def buffer_address(array):
    """(address, nbytes) of a C-contiguous numpy array (or anything numpy can view as one)."""
    array = np.asarray(array)
    if not array.flags.c_contiguous:
        raise InvalidArgumentError(
            StatusCode.InvalidArgument, "array is not C-contiguous: it cannot be registered"
        )
    return array.ctypes.data, array.nbytes


class Engine(_kvferry.Engine):
    """The Pythonic transfer engine: raises kvferry.errors exceptions.

    Engine(name="kvferry", listen_address="127.0.0.1:0", metadata_uri="p2p", transport=None,
    batch_timeout_ms=30000, handshake_timeout_ms=2000, worker_threads=2, secret=None,
    metrics=False). With ``metrics=True``, ``metrics()`` returns what it counted (a dict by
    family name) and ``metrics_text()`` the same in Prometheus text format.
    ``transport`` None lets the engine route each op (shm or cma on the same host, else tcp);
    "tcp", "shm", "cma" or "local" forces one. ``routes(peer)`` lists the routes chosen. Peers
    are named by their ``endpoint`` ("host:port").
    """

    @property
    def rpc_port(self):
        return int(self.endpoint.rsplit(":", 1)[1])

    @contextlib.contextmanager
    def registered(self, *arrays, location="*"):
        """Registers every array for the block, all or none; unregisters on exit.

        Yields the list of (address, nbytes). The arrays are kept alive while registered.
        """
        regions = [buffer_address(a) for a in arrays]
        keep_alive = list(arrays)
        self.register_memory_batch(
            [a for a, _ in regions], [n for _, n in regions], location=location
        )
        try:
            yield regions
        finally:
            self.unregister_memory_batch([a for a, _ in regions])
            del keep_alive

    def write(self, peer, local, remote, lengths, timeout_ms=0):
        """Synchronous batch WRITE of local[i] -> peer's remote[i], lengths[i] bytes."""
        self.transfer(peer, OpKind.WRITE, local, remote, lengths, timeout_ms)

    def read(self, peer, local, remote, lengths, timeout_ms=0):
        """Synchronous batch READ of peer's remote[i] -> local[i], lengths[i] bytes."""
        self.transfer(peer, OpKind.READ, local, remote, lengths, timeout_ms)


from .mooncake import TransferEngine, TransferOpcode  # noqa: E402  (needs Engine above)

__all__ = [
    "AlreadyExistsError", "BatchState", "BootstrapServer", "CancelledError", "DataCorruptedError",
    "DecodeClient",
    "Engine", "FailedPreconditionError", "InternalError", "InvalidArgumentError", "KvLayout",
    "KvReceiver", "KvSender", "KvferryError", "NotRegisteredError", "NotSupportedError", "OpKind",
    "OutOfRangeError", "PdTimeouts", "PeerDisconnectedError", "PeerUnreachableError", "Plan",
    "PrefillServer", "ProtocolError", "RequestState", "StatusCode", "TransferEngine",
    "TransferOpcode", "TransferTimeoutError", "UnauthenticatedError", "as_pages",
    "buffer_address", "plan",
]
