"""``nixl._api``: nixl_agent and nixl_agent_config over one kvferry TransferEngine.

Method names, arguments and return values follow NIXL's Python API as vLLM's NixlConnector
calls it. Handles are ints. Descriptor lists live in C++ as flat arrays; ``make_prepped_xfer``
gathers indices (lists or numpy arrays) in C++ into one engine batch.

Errors: bad arguments raise (kvferry.errors: InvalidArgumentError, OutOfRangeError,
NotRegisteredError, ...); a transfer that fails shows "ERR" in check_xfer_state (its message:
``xfer_error(handle)``); transfers to a removed or restarted agent fail with
PeerDisconnectedError (make_prepped_xfer) or "ERR" (in flight).

Notifications (``notif_msg``, ``send_notif``) are kvferry engine notifications: delivered to
the target after the transfer's bytes are in place, in order per sender. As in NIXL, a
transfer is "DONE" once its bytes are in place and its notification is queued on the ordered
channel to the target: a stalled target does not hold the reader up, and one that dies first
loses the notification. ``nixl_agent_config(acknowledged_notifications=True)`` makes "DONE"
wait for the target's acknowledgement instead (a notification that cannot be delivered is then
"ERR").

Reachability: with no listen address configured (``listen_address``, ``KVFERRY_LISTEN_ADDRESS``
or vLLM's ``VLLM_NIXL_SIDE_CHANNEL_HOST``), an agent listens on every interface and its
metadata lists each IPv4 address of the host; ``add_remote_agent`` uses the first that answers.

Backends: kvferry serves what NIXL's "UCX" backend serves (host and device memory, on one host
and across hosts) and routes each transfer itself. Other backend names are skipped with a
warning, as NIXL skips a backend whose plugin is missing, and ``create_backend`` refuses them
(nixlNotFoundError).

Thread-safety: every method may be called from any thread (the handshake thread and vLLM's
writer thread call concurrently); the GIL is released during engine calls.
"""

import atexit
import json
import logging
import os
import pickle
import sys
import threading
import time
import weakref
from enum import Enum

import numpy as np

from ..errors import FailedPreconditionError, InvalidArgumentError, StatusCode
from . import _bindings as nixlBind
from . import _metadata
from ._bindings import (DEFAULT_COMM_PORT, nixlNoTelemetryError, nixlNotFoundError,  # noqa: F401
                        nixlRegDList, nixlRepostActiveError,
                        nixlXferDList, nixlXferTelemetry)

logger = logging.getLogger(__name__)


class nixl_thread_sync_t(Enum):
    """NIXL's thread-synchronisation modes. Every mode is accepted: a kvferry agent may be
    called from any thread in all of them."""

    NIXL_THREAD_SYNC_NONE = nixlBind.NIXL_THREAD_SYNC_NONE
    NIXL_THREAD_SYNC_STRICT = nixlBind.NIXL_THREAD_SYNC_STRICT
    NIXL_THREAD_SYNC_RW = nixlBind.NIXL_THREAD_SYNC_RW
    NIXL_THREAD_SYNC_DEFAULT = nixlBind.NIXL_THREAD_SYNC_DEFAULT


class _UnknownName(InvalidArgumentError, KeyError):
    """An operation or memory type NIXL does not have: NIXL raises KeyError for those."""

    def __str__(self):
        return Exception.__str__(self)

# The agent name NIXL uses for "this agent's own memory" in prep_xfer_dlist.
LOCAL_AGENT = "NIXL_INIT_AGENT"
_METADATA_FORMAT = "kvferry-nixl-1"

nixl_xfer_handle = int
nixl_prepped_dlist_handle = int
nixl_backend_handle = int

# The one NIXL backend kvferry stands in for, the memory it serves and its parameters.
_PLUGINS = {"UCX": ["DRAM", "VRAM"]}
_PLUGIN_PARAMS = {"UCX": {"num_threads": "0"}}
_MEM_TYPES = {"DRAM": "DRAM", "VRAM": "VRAM", "cpu": "DRAM", "cuda": "VRAM"}
_OPS = ("READ", "WRITE")
_TRUE = ("y", "yes", "1", "true", "on")
# Metadata exchange through etcd: the label of an agent's whole metadata, and how long a
# fetch waits for its key to appear.
_ETCD_LABEL = "metadata"
_ETCD_WAIT_S = 30
# Endpoints add_remote_agent tries, at most (each within the engine's handshake timeout).
_MAX_ENDPOINTS = 16


def _env_listen_address():
    """KVFERRY_LISTEN_ADDRESS ("host:port"), else vLLM's VLLM_NIXL_SIDE_CHANNEL_HOST (any
    port), else every interface."""
    address = os.environ.get("KVFERRY_LISTEN_ADDRESS")
    if address:
        return address
    host = os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST")
    return f"{host}:0" if host else "0.0.0.0:0"


def _env_int(name, default):
    text = os.environ.get(name)
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise InvalidArgumentError(
            StatusCode.InvalidArgument, f"{name}={text!r} is not an integer") from None


class nixl_agent_config:
    """NIXL's agent options, plus kvferry's own; each kvferry option left as None is taken
    from the environment (so a deployment can set what vLLM cannot pass):

    * listen_address: "host:port" of the agent's listeners (KVFERRY_LISTEN_ADDRESS, else
      VLLM_NIXL_SIDE_CHANNEL_HOST's host, else "0.0.0.0:0": every interface);
    * batch_timeout_ms: a transfer ends in DONE or ERR within it (KVFERRY_BATCH_TIMEOUT_MS,
      else 30,000);
    * transport: force one kvferry transport (KVFERRY_TRANSPORT);
    * secret: authenticate peers (KVFERRY_SECRET);
    * acknowledged_notifications: "DONE" waits for the target's acknowledgement of the
      notification (default False: NIXL's semantics).

    The progress-thread choices and sync_mode are accepted and have no effect: the engine
    runs its own threads and every call is thread-safe. enable_listen_thread starts NIXL's
    metadata listener on listen_port (kvferry/nixl/_metadata.py)."""

    def __init__(self, enable_prog_thread=True, enable_listen_thread=False,
                 listen_port=DEFAULT_COMM_PORT, capture_telemetry=False, num_threads=0,
                 backends=("UCX",), sync_mode=None, listen_address=None, batch_timeout_ms=None,
                 transport=None, secret=None, acknowledged_notifications=False):
        if sync_mode is not None and not isinstance(sync_mode, nixl_thread_sync_t):
            raise TypeError(
                f"sync_mode must be a nixl_thread_sync_t (got {type(sync_mode).__name__!r})")
        self.sync_mode = sync_mode
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        self.backends = list(backends)
        self.listen_address = listen_address or _env_listen_address()
        self.batch_timeout_ms = (batch_timeout_ms if batch_timeout_ms is not None
                                 else _env_int("KVFERRY_BATCH_TIMEOUT_MS", 30_000))
        self.transport = transport or os.environ.get("KVFERRY_TRANSPORT") or None
        self.secret = secret
        self.acknowledged_notifications = acknowledged_notifications


class nixl_agent:
    def __init__(self, agent_name, nixl_conf=None, instantiate_all=False):
        if not agent_name:
            raise InvalidArgumentError(StatusCode.InvalidArgument, "the agent name is empty")
        if nixl_conf is not None and instantiate_all:
            logger.warning("Ignoring instantiate_all based on the provided config in agent "
                           "creation.")
            instantiate_all = False
        conf = nixl_conf or nixl_agent_config()
        self.name = agent_name
        self.config = conf
        default_sync = (nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT if conf.enable_listen
                        else nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE)
        agent_config = nixlBind.nixlAgentConfig()
        agent_config.useProgThread = conf.enable_pthread
        agent_config.useListenThread = conf.enable_listen
        agent_config.listenPort = conf.port
        agent_config.syncMode = (conf.sync_mode or default_sync).value
        agent_config.captureTelemetry = conf.capture_telemetry
        agent_config.listen_address = conf.listen_address
        agent_config.batch_timeout_ms = conf.batch_timeout_ms
        agent_config.transport = conf.transport
        agent_config.secret = conf.secret
        agent_config.worker_threads = (conf.num_threads if conf.num_threads and
                                       conf.num_threads > 0 else 2)
        agent_config.acknowledged_notifications = conf.acknowledged_notifications
        self._core = nixlBind.nixlAgent(agent_name, agent_config)
        self.plugin_list = list(_PLUGINS)
        self.backends = {}
        self.backend_mems = {}
        self.notifs = {}
        self._lost = {}
        # NIXL_TELEMETRY_ENABLE, when set, decides; otherwise capture_telemetry.
        env = os.environ.get("NIXL_TELEMETRY_ENABLE")
        self._telemetry = env.lower() in _TRUE if env else bool(conf.capture_telemetry)
        # Per remote agent: (incarnation, the regions its metadata showed, None: all of them).
        # Partial metadata adds up within one incarnation.
        self._shown_lock = threading.Lock()
        self._shown = {}
        self._exchanges = _metadata.Exchanges()
        self._listener = None
        closer = weakref.WeakMethod(self._close)
        self._at_exit = lambda: closer() and closer()()
        atexit.register(self._at_exit)
        if conf.enable_listen:
            host = conf.listen_address.rsplit(":", 1)[0]
            handler = weakref.WeakMethod(self._on_metadata_request)
            self._listener = _metadata.MetadataListener(
                host, conf.port, self._core.secret, lambda request: handler()(request))
        for backend in (self.plugin_list if instantiate_all else conf.backends):
            if backend not in _PLUGINS:
                logger.warning(
                    "Skipping backend registration %s due to the missing plugin: kvferry "
                    "serves what NIXL's UCX backend serves (host and device memory, on this "
                    "host and across hosts) and routes every transfer itself; name UCX",
                    backend)
            else:
                self.create_backend(backend)

    @property
    def listen_port(self):
        """kvferry extension: the port NIXL's metadata listener is bound to (it logs it too),
        or None without one."""
        return self._listener.port if self._listener is not None else None

    # ---- backends -----------------------------------------------------------------------
    def get_plugin_list(self):
        return list(self.plugin_list)

    def create_backend(self, backend, initParams=None):
        if backend not in _PLUGINS:
            raise nixlNotFoundError(
                StatusCode.NotRegistered,
                f"backend {backend!r}: no such plugin (kvferry serves only {list(_PLUGINS)})")
        self.backends[backend] = 1 + list(_PLUGINS).index(backend)
        self.backend_mems[backend] = list(_PLUGINS[backend])
        return self.backends[backend]

    def get_plugin_mem_types(self, backend):
        if backend not in _PLUGINS:
            logger.warning("Plugin %s is not available to get its supported mem types.",
                           backend)
            return []
        return list(_PLUGINS[backend])

    def get_plugin_params(self, backend):
        if backend not in _PLUGINS:
            logger.warning("Plugin %s is not available to get its parameters.", backend)
            return {}
        return dict(_PLUGIN_PARAMS[backend])

    def get_backend_mem_types(self, backend):
        if backend not in self.backends:
            logger.warning("Backend %s not instantiated to get its supported mem types.",
                           backend)
            return []
        return list(self.backend_mems[backend])

    def get_backend_params(self, backend):
        if backend not in self.backends:
            logger.warning("Backend %s not instantiated to get its parameters.", backend)
            return {}
        return dict(_PLUGIN_PARAMS[backend])

    def _need_backend(self, what, names=()):
        for name in names:
            if name not in self.backends:
                raise KeyError(name)
        if not self.backends:
            raise nixlNotFoundError(
                StatusCode.NotRegistered,
                f"{what}: this agent has no backend (its backends were {self.config.backends}; "
                f"kvferry serves {list(_PLUGINS)}: create_backend('UCX'))")

    # ---- memory -------------------------------------------------------------------------
    def get_reg_descs(self, descs, mem_type=None, is_sorted=False):
        """A nixlRegDList from (addr, len, dev, meta) tuples or an Nx3 array with a mem_type,
        a contiguous tensor, or a list of them. As in NIXL, input of the wrong shape logs an
        error naming it and returns None; an unknown mem_type raises KeyError."""
        return _desc_list(nixlRegDList, nixlXferDList, 4, descs, mem_type)

    def get_xfer_descs(self, descs, mem_type=None, is_sorted=False):
        """A nixlXferDList from (addr, len, dev) tuples or an Nx3 array with a mem_type, a
        contiguous tensor, or a list of them; otherwise as get_reg_descs."""
        return _desc_list(nixlXferDList, nixlRegDList, 3, descs, mem_type)

    def get_serialized_descs(self, descs):
        return pickle.dumps(descs)

    def deserialize_descs(self, serialized_descs):
        return pickle.loads(serialized_descs)

    def register_memory(self, reg_list, mem_type=None, is_sorted=False, backends=()):
        self._need_backend("register_memory", backends)
        descs = self.get_reg_descs(reg_list, mem_type)
        self._core.register_memory(descs)
        return descs

    def deregister_memory(self, dereg_list, backends=()):
        self._core.deregister_memory(dereg_list)

    # ---- peers --------------------------------------------------------------------------
    def get_agent_metadata(self):
        return json.dumps({"format": _METADATA_FORMAT, "name": self.name,
                           "endpoints": self._core.endpoints,
                           "incarnation": self._core.incarnation}).encode()

    def add_remote_agent(self, metadata):
        return self._load(_parse_metadata(metadata))

    def _load(self, parsed):
        name, endpoints, incarnation, regions = parsed
        loaded = self._core.add_remote(name, endpoints, incarnation)
        with self._shown_lock:
            was, shown = self._shown.get(name, (None, []))
            if was != loaded:
                shown = []  # a new incarnation shows afresh
            self._shown[name] = (loaded, None if regions is None or shown is None
                                 else shown + regions)
        return name.encode()  # bytes, as NIXL returns it; every call here takes bytes or str

    # ---- metadata exchange (kvferry/nixl/_metadata.py) ------------------------------------
    # Each call returns at once; the exchange runs on the agent's exchange thread (a failure
    # is logged, as in NIXL) and check_remote_metadata says when a peer is loaded. With an
    # address it goes to that agent's listener; without one, through etcd
    # (NIXL_ETCD_ENDPOINTS, NIXL_ETCD_NAMESPACE), as in NIXL.

    def get_partial_agent_metadata(self, descs=None, inc_conn_info=True, backends=()):
        """Metadata that shows a peer only `descs` (a registration or transfer list): the
        peer addresses nothing else of this agent (check_remote_metadata, prep_xfer_dlist)."""
        md = json.loads(self.get_agent_metadata())
        shown = self.get_xfer_descs(descs.trim() if isinstance(descs, nixlRegDList) else descs)
        md["regions"] = [list(shown[i]) for i in range(len(shown))] if shown is not None else []
        return json.dumps(md).encode()

    def send_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        return self._publish("send_local_metadata", self.get_agent_metadata(), ip_addr, port,
                             _ETCD_LABEL)

    def send_partial_agent_metadata(self, descs=None, inc_conn_info=True, backends=(),
                                    ip_addr="", port=DEFAULT_COMM_PORT, label=""):
        return self._publish("send_partial_agent_metadata",
                             self.get_partial_agent_metadata(descs, inc_conn_info, backends),
                             ip_addr, port, label or "partial")

    def fetch_remote_metadata(self, remote_name, ip_addr="", port=DEFAULT_COMM_PORT, label=""):
        name = _text(remote_name)

        def load(metadata, where):
            found = json.loads(metadata)["name"]
            if found != name:
                raise ValueError(f"the agent at {where} is {found!r}, not {name!r}")
            self.add_remote_agent(metadata)

        if ip_addr:
            where = f"{ip_addr}:{port}"
            return self._exchange(f"fetch_remote_metadata of {name} from {where}", ip_addr,
                                  port, {"op": "fetch"},
                                  lambda reply: load(bytes.fromhex(reply["metadata"]), where))
        etcd = _need_etcd("fetch_remote_metadata")
        key = etcd.key(name, label or _ETCD_LABEL)

        def fetch():
            deadline = time.monotonic() + _ETCD_WAIT_S
            while (metadata := etcd.get(key)) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no {key} in etcd within {_ETCD_WAIT_S} s")
                time.sleep(0.02)
            load(metadata, f"etcd key {key}")

        return self._exchanges.submit(f"fetch_remote_metadata of {name} from etcd", fetch)

    def invalidate_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        if ip_addr:
            return self._exchange(f"invalidate_local_metadata at {ip_addr}:{port}", ip_addr,
                                  port, {"op": "invalidate", "name": self.name})
        etcd = _need_etcd("invalidate_local_metadata")
        return self._exchanges.submit("invalidate_local_metadata in etcd",
                                      lambda: etcd.delete_prefix(etcd.key(self.name, "")))

    def _publish(self, what, metadata, ip_addr, port, label):
        if ip_addr:
            return self._exchange(f"{what} to {ip_addr}:{port}", ip_addr, port,
                                  {"op": "send", "metadata": metadata.hex()})
        etcd = _need_etcd(what)
        return self._exchanges.submit(f"{what} to etcd",
                                      lambda: etcd.put(etcd.key(self.name, label), metadata))

    def _exchange(self, what, host, port, message, then=None):
        secret = self._core.secret

        def run():
            reply = _metadata.request(host, port, secret, message)
            if not reply.get("ok"):
                raise RuntimeError(reply.get("error", "refused"))
            if then is not None:
                then(reply)

        return self._exchanges.submit(what, run)

    def _on_metadata_request(self, request):
        """A peer's request to this agent's listener (on the listener's thread)."""
        op = request.get("op")
        if op == "fetch":
            return {"ok": True, "metadata": self.get_agent_metadata().hex()}
        if op == "send":
            # Checked here, loaded on the exchange thread: connecting to the sender's
            # endpoints never holds up the listener.
            parsed = _parse_metadata(bytes.fromhex(str(request["metadata"])))
            self._exchanges.submit(f"loading {parsed[0]}'s metadata", lambda: self._load(parsed))
            return {"ok": True}
        if op == "invalidate":
            name = str(request["name"])
            if not self.check_remote_metadata(name):
                return {"ok": False, "error": f"no remote agent named {name!r}"}
            self.remove_remote_agent(name)
            return {"ok": True}
        return {"ok": False, "error": f"unknown op {op!r}"}

    def __del__(self):
        self._close()

    def _close(self):
        """Stops the listener and the exchange thread and closes the engine, which delivers
        the notifications still queued (within 2 s) first. Also run at interpreter exit: a
        process that exits right after a transfer is DONE (its notification queued, NIXL's
        semantics) must not drop that notification."""
        listener = getattr(self, "_listener", None)
        if listener is not None:
            listener.close()
        exchanges = getattr(self, "_exchanges", None)
        if exchanges is not None:
            exchanges.close()
        if getattr(self, "_at_exit", None) is not None:
            atexit.unregister(self._at_exit)
        self._core = None

    def check_remote_metadata(self, remote_name, descs=None):
        """Whether `remote_name` was added (add_remote_agent) and not removed, and its
        metadata covers `descs` when given."""
        name = _text(remote_name)
        try:
            self._core.check_remote(name)
        except nixlNotFoundError:
            return False
        return descs is None or self._uncovered(name, self.get_xfer_descs(descs)) is None

    # Partial metadata (get_partial_agent_metadata): a peer that showed only some of its
    # regions is addressed only there, as in NIXL. This is the initiator's own bookkeeping,
    # not a protection: the peer's engine guards its memory.
    def _uncovered(self, name, descs):
        """The first descriptor of `descs` outside what `name`'s metadata showed, or None."""
        with self._shown_lock:
            _, shown = self._shown.get(name, (None, None))
        if shown is None:
            return None
        for addr, length, dev in (descs[i] for i in range(len(descs))):
            if not any(d == dev and a <= addr and addr + length <= a + n for a, n, d in shown):
                return (addr, length, dev)
        return None

    def _need_shown(self, name, descs):
        missing = self._uncovered(name, descs)
        if missing is not None:
            raise nixlNotFoundError(
                StatusCode.NotRegistered,
                f"descriptor {missing} of agent {name!r} is not in the metadata it sent")

    def make_connection(self, remote_agent, backends=()):
        """NIXL connects ahead of the first transfer here; add_remote_agent already has."""
        self._core.check_remote(_text(remote_agent))

    def remove_remote_agent(self, agent):
        name = _text(agent)
        self._core.remove_remote(name)
        with self._shown_lock:
            self._shown.pop(name, None)

    # ---- descriptors and transfers -------------------------------------------------------
    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None, is_sorted=False,
                        backends=()):
        descs = self.get_xfer_descs(xfer_list, mem_type)
        name = _text(agent_name)
        local = name in (LOCAL_AGENT, "")
        if not local:
            self._need_shown(name, descs)
        return self._core.prep(name, descs, local)

    def release_dlist_handle(self, handle):
        self._core.release_prepped(handle)

    def make_prepped_xfer(self, operation, local_xfer_side, local_indices, remote_xfer_side,
                          remote_indices, notif_msg=b"", backends=(), skip_desc_merge=False):
        _need_op(operation)
        self._need_backend("make_prepped_xfer", backends)
        return self._core.make_xfer(operation, local_xfer_side, local_indices,
                                    remote_xfer_side, remote_indices, _notif(notif_msg))

    def initialize_xfer(self, operation, local_descs, remote_descs, remote_agent,
                        notif_msg=b"", backends=()):
        _need_op(operation)
        local = self.prep_xfer_dlist(LOCAL_AGENT, local_descs)
        try:
            remote = self.prep_xfer_dlist(remote_agent, remote_descs)
            try:
                n = len(self.get_xfer_descs(local_descs))
                return self._core.make_xfer(operation, local, range(n), remote, range(n),
                                            _notif(notif_msg))
            finally:
                self._core.release_prepped(remote)
        finally:
            self._core.release_prepped(local)

    def transfer(self, handle, notif_msg=b""):
        """Posts the transfer; a non-empty notif_msg replaces its notification (for this
        post and later ones), as in NIXL."""
        try:
            return self._core.post(handle, _notif(notif_msg))
        except FailedPreconditionError as e:  # still in progress
            raise nixlRepostActiveError(e.code, e.message) from None

    def query_xfer_backend(self, handle):
        """The backend of a transfer: "UCX", the one kvferry stands in for."""
        self._core.state(handle)  # raises for an unknown handle
        return "UCX"

    def check_xfer_state(self, handle):
        return self._core.state(handle)

    def xfer_error(self, handle):
        """kvferry extension: why the transfer failed ("" when it did not)."""
        return self._core.error(handle)

    def get_xfer_telemetry(self, handle):
        if not self._telemetry:
            raise nixlNoTelemetryError(
                StatusCode.FailedPrecondition,
                "telemetry is off for this agent (nixl_agent_config(capture_telemetry=True) or "
                "NIXL_TELEMETRY_ENABLE=y)")
        return self._core.telemetry(handle)

    def release_xfer_handle(self, handle):
        self._core.release_xfer(handle)

    abort_xfer = release_xfer_handle

    # ---- notifications -------------------------------------------------------------------
    def _drain(self, into):
        for kind, sender, payload in self._core.notifications():
            if kind == 0:
                into.setdefault(sender, []).append(payload)
            else:
                self._lost[sender] = payload.decode(errors="replace")
        return into

    def get_new_notifs(self):
        return self._drain({})

    def update_notifs(self):
        return self._drain(self.notifs)

    def check_remote_xfer_done(self, remote_agent_name, lookup_msg):
        self._drain(self.notifs)
        name = _text(remote_agent_name)
        for msg in self.notifs.get(name, []):
            if lookup_msg in msg:
                self.notifs[name].remove(msg)
                return msg
        return None

    def lost_agents(self):
        """kvferry extension: {agent name: why} for senders whose connection ended uncleanly
        (they died or the network broke) since the last call."""
        lost, self._lost = self._lost, {}
        return lost

    def send_notif(self, remote_agent_name, notif_msg):
        self._core.send_notif(_text(remote_agent_name), _notif(notif_msg) or b"")


def _parse_metadata(metadata):
    """(name, endpoints, incarnation, regions or None) of an agent's metadata; InvalidArgument
    naming what is wrong with it."""
    try:
        md = json.loads(bytes(metadata).decode())
        if md.get("format") != _METADATA_FORMAT:
            raise ValueError(f"format {md.get('format')!r}")
        name, endpoints = str(md["name"]), [str(e) for e in md["endpoints"]]
        if len(endpoints) > _MAX_ENDPOINTS:
            raise ValueError(f"{len(endpoints)} endpoints, more than {_MAX_ENDPOINTS}")
        incarnation = int(md.get("incarnation", 0))
        regions = md.get("regions")
        if regions is not None:
            regions = [(int(a), int(n), int(d)) for a, n, d in regions]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise InvalidArgumentError(
            StatusCode.InvalidArgument, f"add_remote_agent: not kvferry agent metadata ({e})") from None
    return name, endpoints, incarnation, regions


def _need_etcd(what):
    etcd = _metadata.Etcd.from_env()
    if etcd is None:
        raise InvalidArgumentError(
            StatusCode.InvalidArgument,
            f"{what}: no address given, and NIXL_ETCD_ENDPOINTS is not set for etcd")
    return etcd


def _tensor_rows(tensors):
    """(Nx3 rows, mem type) of contiguous tensors on one device, or None (logged)."""
    device = tensors[0].device
    rows = np.zeros((len(tensors), 3), dtype=np.uint64)
    for i, t in enumerate(tensors):
        if t.device != device:
            logger.error("Tensors of one list must be on one device (%s and %s)", device,
                         t.device)
            return None
        if not t.is_contiguous():
            logger.error("Please use a list of contiguous Tensors (tensor %d is not)", i)
            return None
        gpu = t.get_device()
        rows[i] = (t.data_ptr(), t.numel() * t.element_size(), max(gpu, 0))
    return rows, ("DRAM" if tensors[0].get_device() == -1 else "VRAM")


def _is_tensor(obj):
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported
    return torch is not None and isinstance(obj, torch.Tensor)


def _desc_list(cls, other_cls, fields, descs, mem_type):
    """get_reg_descs / get_xfer_descs: NIXL's input forms, NIXL's answers to bad ones."""
    if isinstance(descs, cls):
        return descs
    if isinstance(descs, other_cls):
        logger.error("%s given where a %s is needed", type(descs).__name__, cls.__name__)
        return None
    if _is_tensor(descs) or (isinstance(descs, (list, tuple)) and descs and _is_tensor(descs[0])):
        found = _tensor_rows([descs] if _is_tensor(descs) else list(descs))
        return None if found is None else cls(found[1], found[0])
    if mem_type is None:
        logger.error("Please specify a mem type (DRAM or VRAM) if not using Tensors")
        return None
    if mem_type not in _MEM_TYPES:
        raise _UnknownName(StatusCode.InvalidArgument,
                           f"memory type {mem_type!r} is not one of DRAM, VRAM (cpu, cuda)")
    if isinstance(descs, np.ndarray):
        if descs.ndim != 2 or descs.shape[1] != 3:
            logger.error("An Nx3 array is needed for a descriptor list (got shape %s)",
                         descs.shape)
            return None
    elif len(descs) > 0 and (not isinstance(descs[0], tuple) or len(descs[0]) != fields):
        logger.error("A list of %d-tuples is needed for a %s (got %r first)", fields,
                     cls.__name__, descs[0])
        return None
    return cls(_MEM_TYPES[mem_type], descs)


def _need_op(operation):
    if operation not in _OPS:
        raise _UnknownName(StatusCode.InvalidArgument,
                           f"operation {operation!r} is not one of READ, WRITE")


def _text(name):
    return name.decode() if isinstance(name, (bytes, bytearray)) else str(name)


def _notif(msg):
    if msg is None:
        return None
    if isinstance(msg, str):
        msg = msg.encode()
    msg = bytes(msg)
    return msg if msg else None
