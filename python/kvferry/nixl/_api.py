"""``nixl._api``: nixl_agent and nixl_agent_config over one kvferry TransferEngine.

Method names, arguments and return values follow NIXL's Python API as vLLM's NixlConnector
calls it. Handles are ints. Descriptor lists live in C++ as flat arrays; ``make_prepped_xfer``
gathers indices (lists or numpy arrays) in C++ into one engine batch.

Errors: bad arguments raise (kvferry.errors: InvalidArgumentError, OutOfRangeError,
NotRegisteredError, ...); a transfer that fails shows "ERR" in check_xfer_state (its message:
``xfer_error(handle)``); transfers to a removed or restarted agent fail with
PeerDisconnectedError (make_prepped_xfer) or "ERR" (in flight).

Notifications (``notif_msg``, ``send_notif``) are kvferry engine notifications: delivered to
the target after the transfer's bytes are in place, in order per sender; a transfer with a
notification is "DONE" only once the target has it.

Thread-safety: every method may be called from any thread (the handshake thread and vLLM's
writer thread call concurrently); the GIL is released during engine calls.
"""

import json

from .. import _kvferry
from ..errors import InvalidArgumentError, StatusCode
from ._bindings import nixlXferTelemetry  # noqa: F401

# The agent name NIXL uses for "this agent's own memory" in prep_xfer_dlist.
LOCAL_AGENT = "NIXL_INIT_AGENT"
_METADATA_FORMAT = "kvferry-nixl-1"

nixl_xfer_handle = int
nixl_prepped_dlist_handle = int


class nixl_agent_config:
    """NIXL's agent options; kvferry ignores the progress-thread and backend choices (the
    engine routes every transfer itself) and adds its own: listen_address, batch_timeout_ms
    (a transfer ends in DONE or ERR within it), transport (force one kvferry transport),
    secret (authenticate peers; KVFERRY_SECRET works too)."""

    def __init__(self, enable_prog_thread=True, enable_listen_thread=False, listen_port=0,
                 capture_telemetry=False, num_threads=0, backends=("UCX",),
                 listen_address="127.0.0.1:0", batch_timeout_ms=30_000, transport=None,
                 secret=None):
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        self.backends = list(backends)
        self.listen_address = listen_address
        self.batch_timeout_ms = batch_timeout_ms
        self.transport = transport
        self.secret = secret


class nixl_agent:
    def __init__(self, agent_name, nixl_conf=None, instantiate_all=False):
        conf = nixl_conf or nixl_agent_config()
        self.name = agent_name
        self.config = conf
        workers = conf.num_threads if conf.num_threads and conf.num_threads > 0 else 2
        self._core = _kvferry.NixlAgent(agent_name, conf.listen_address, conf.batch_timeout_ms,
                                        conf.transport, conf.secret, workers)
        self.backends = {b: b for b in conf.backends}
        self.notifs = {}
        self._lost = {}

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
        descs = self.get_reg_descs(reg_list, mem_type)
        self._core.register_memory(descs)
        return descs

    def deregister_memory(self, dereg_list, backends=()):
        self._core.deregister_memory(dereg_list)

    # ---- peers --------------------------------------------------------------------------
    def get_agent_metadata(self):
        return json.dumps({"format": _METADATA_FORMAT, "name": self.name,
                           "endpoint": self._core.endpoint,
                           "incarnation": self._core.incarnation}).encode()

    def add_remote_agent(self, metadata):
        try:
            md = json.loads(bytes(metadata).decode())
            if md.get("format") != _METADATA_FORMAT:
                raise ValueError(f"format {md.get('format')!r}")
            name, endpoint = str(md["name"]), str(md["endpoint"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise InvalidArgumentError(
                StatusCode.InvalidArgument, f"add_remote_agent: not kvferry agent metadata ({e})") from None
        self._core.add_remote(name, endpoint)
        return name

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
        return self._core.post(handle)

    def check_xfer_state(self, handle):
        return self._core.state(handle)

    def xfer_error(self, handle):
        """kvferry extension: why the transfer failed ("" when it did not)."""
        return self._core.error(handle)

    def get_xfer_telemetry(self, handle):
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
        for msg in self.notifs.get(remote_agent_name, []):
            if lookup_msg in msg:
                self.notifs[remote_agent_name].remove(msg)
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
