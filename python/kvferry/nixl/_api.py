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

import json
import logging
import os

from .. import _kvferry
from ..errors import InvalidArgumentError, StatusCode
from ._bindings import nixlNoTelemetryError, nixlNotFoundError, nixlXferTelemetry  # noqa: F401

logger = logging.getLogger(__name__)

# The agent name NIXL uses for "this agent's own memory" in prep_xfer_dlist.
LOCAL_AGENT = "NIXL_INIT_AGENT"
_METADATA_FORMAT = "kvferry-nixl-1"

nixl_xfer_handle = int
nixl_prepped_dlist_handle = int
nixl_backend_handle = int

# The one NIXL backend kvferry stands in for, and the memory it serves.
_PLUGINS = {"UCX": ["DRAM", "VRAM"]}


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

    The progress-thread choices are accepted and have no effect: the engine runs its own."""

    def __init__(self, enable_prog_thread=True, enable_listen_thread=False, listen_port=0,
                 capture_telemetry=False, num_threads=0, backends=("UCX",),
                 listen_address=None, batch_timeout_ms=None, transport=None, secret=None,
                 acknowledged_notifications=False):
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
        conf = nixl_conf or nixl_agent_config()
        self.name = agent_name
        self.config = conf
        workers = conf.num_threads if conf.num_threads and conf.num_threads > 0 else 2
        self._core = _kvferry.NixlAgent(agent_name, conf.listen_address, conf.batch_timeout_ms,
                                        conf.transport, conf.secret, workers,
                                        conf.acknowledged_notifications)
        self.plugin_list = list(_PLUGINS)
        self.backends = {}
        self.backend_mems = {}
        self.notifs = {}
        self._lost = {}
        self._telemetry = conf.capture_telemetry or os.environ.get(
            "NIXL_TELEMETRY_ENABLE", "").lower() in ("y", "yes", "1", "true", "on")
        for backend in (self.plugin_list if instantiate_all else conf.backends):
            if backend not in _PLUGINS:
                logger.warning(
                    "Skipping backend registration %s due to the missing plugin: kvferry "
                    "serves what NIXL's UCX backend serves (host and device memory, on this "
                    "host and across hosts) and routes every transfer itself; name UCX",
                    backend)
            else:
                self.create_backend(backend)

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
            raise nixlNotFoundError(StatusCode.NotRegistered, f"no plugin {backend!r}")
        return list(_PLUGINS[backend])

    def get_backend_mem_types(self, backend):
        return list(self.backend_mems[backend])

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
        if isinstance(descs, _kvferry.NixlDescList):
            return descs
        _need_mem_type(mem_type)
        return _kvferry.nixl_desc_list(descs, mem_type, 4)

    def get_xfer_descs(self, descs, mem_type=None, is_sorted=False):
        if isinstance(descs, _kvferry.NixlDescList):
            return descs
        _need_mem_type(mem_type)
        return _kvferry.nixl_desc_list(descs, mem_type, 3)

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
        try:
            md = json.loads(bytes(metadata).decode())
            if md.get("format") != _METADATA_FORMAT:
                raise ValueError(f"format {md.get('format')!r}")
            name, endpoints = str(md["name"]), [str(e) for e in md["endpoints"]]
            incarnation = int(md.get("incarnation", 0))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise InvalidArgumentError(
                StatusCode.InvalidArgument, f"add_remote_agent: not kvferry agent metadata ({e})") from None
        self._core.add_remote(name, endpoints, incarnation)
        return name.encode()  # bytes, as NIXL returns it; every call here takes bytes or str

    def make_connection(self, remote_agent, backends=()):
        """NIXL connects ahead of the first transfer here; add_remote_agent already has."""
        self._core.check_remote(_text(remote_agent))

    def remove_remote_agent(self, agent):
        self._core.remove_remote(_text(agent))

    # ---- descriptors and transfers -------------------------------------------------------
    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None, is_sorted=False,
                        backends=()):
        descs = self.get_xfer_descs(xfer_list, mem_type)
        name = _text(agent_name)
        local = name in (LOCAL_AGENT, "")
        return self._core.prep(name, descs, local)

    def release_dlist_handle(self, handle):
        self._core.release_prepped(handle)

    def make_prepped_xfer(self, operation, local_xfer_side, local_indices, remote_xfer_side,
                          remote_indices, notif_msg=b"", backends=(), skip_desc_merge=False):
        self._need_backend("make_prepped_xfer", backends)
        return self._core.make_xfer(operation, local_xfer_side, local_indices,
                                    remote_xfer_side, remote_indices, _notif(notif_msg))

    def initialize_xfer(self, operation, local_descs, remote_descs, remote_agent,
                        notif_msg=b"", backends=()):
        local = self.prep_xfer_dlist(LOCAL_AGENT, local_descs)
        remote = self.prep_xfer_dlist(remote_agent, remote_descs)
        try:
            n = len(self.get_xfer_descs(local_descs))
            return self._core.make_xfer(operation, local, range(n), remote, range(n),
                                        _notif(notif_msg))
        finally:
            self._core.release_prepped(local)
            self._core.release_prepped(remote)

    def transfer(self, handle, notif_msg=b""):
        """Posts the transfer; a non-empty notif_msg replaces its notification (for this
        post and later ones), as in NIXL."""
        return self._core.post(handle, _notif(notif_msg))

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


def _need_mem_type(mem_type):
    if mem_type is None:
        raise InvalidArgumentError(StatusCode.InvalidArgument, "a mem_type (DRAM or VRAM) is required")


def _text(name):
    return name.decode() if isinstance(name, (bytes, bytearray)) else str(name)


def _notif(msg):
    if msg is None:
        return None
    if isinstance(msg, str):
        msg = msg.encode()
    msg = bytes(msg)
    return msg if msg else None
