"""kvferry.nixl: vLLM NixlConnector's calls (NIXL's Python API) on kvferry, in two processes.

The prefill side runs in nixl_peer.py; the decode side is this process. Every transfer moves
seeded random bytes and every byte is checked.
"""

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import (PROCESS_TIMEOUT_S, ScriptProcess, seeded_bytes, stop_process,
                      wait_for_any_address_port)
from kvferry import errors
from kvferry.nixl import _api, _metadata, install_as_nixl, shim_path
from kvferry.nixl._api import nixl_agent, nixl_agent_config
from kvferry.nixl._bindings import nixlNoTelemetryError, nixlNotFoundError, nixlXferTelemetry

BLOCK = 4096
BLOCKS = 64


class NixlPeer(ScriptProcess):
    """nixl_peer.py in a child process (the prefill worker)."""

    def __init__(self, name, nbytes, seed, scribble=False, launcher=(), env=None):
        super().__init__("nixl_peer.py", [name, nbytes, seed] + (["--scribble"] if scribble else []),
                         launcher, env)
        hello = json.loads(self._readline())
        self.metadata = bytes.fromhex(hello["metadata"])
        self.addr, self.length = hello["addr"], hello["length"]
        self.initial = seeded_bytes(seed, nbytes) if seed >= 0 else np.zeros(nbytes, np.uint8)

    def wait_notifs(self, count, timeout=10):
        return json.loads(self.command(f"wait {count} {timeout}", timeout + 5))


@pytest.fixture
def make_nixl_peer():
    peers = []

    def make(name="prefill", nbytes=BLOCK * BLOCKS, seed=11, scribble=False, launcher=(),
             env=None):
        peer = NixlPeer(name, nbytes, seed, scribble, launcher, env)
        peers.append(peer)
        return peer

    yield make
    for peer in peers:
        peer.close()


def sha(array):
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def decode_agent(name, nbytes=BLOCK * BLOCKS, timeout_ms=10_000, **config):
    agent = nixl_agent(name, nixl_agent_config(num_threads=2, batch_timeout_ms=timeout_ms,
                                               capture_telemetry=True, **config))
    buffer = np.zeros(nbytes, dtype=np.uint8)
    descs = agent.get_reg_descs([(buffer.ctypes.data, nbytes, 0, "")], "DRAM")
    agent.register_memory(descs, backends=["UCX"])
    return agent, buffer


def block_descs(base, count, size=BLOCK, offset=0, length=None):
    """Nx3 uint64 (addr, len, dev): vLLM builds these as numpy arrays."""
    length = size if length is None else length
    rows = np.zeros((count, 3), dtype=np.uint64)
    rows[:, 0] = base + offset + np.arange(count, dtype=np.uint64) * size
    rows[:, 1] = length
    return rows


def wait_state(agent, handle, timeout_s=15):
    deadline = time.monotonic() + timeout_s
    state = agent.check_xfer_state(handle)
    while state == "PROC" and time.monotonic() < deadline:
        time.sleep(0.001)
        state = agent.check_xfer_state(handle)
    return state


def test_pull_flow_reads_blocks_and_notifies_prefill_once_per_consumer(make_nixl_peer):
    prefill = make_nixl_peer(scribble=True)
    rng = np.random.default_rng(5)
    consumers = []
    for i in range(2):
        agent, buffer = decode_agent(f"decode{i}")
        assert agent.add_remote_agent(prefill.metadata) == b"prefill"
        local = agent.prep_xfer_dlist("NIXL_INIT_AGENT",
                                      agent.get_xfer_descs(block_descs(buffer.ctypes.data,
                                                                       BLOCKS), "DRAM"))
        remote = agent.prep_xfer_dlist("prefill",
                                       agent.get_xfer_descs(block_descs(prefill.addr, BLOCKS),
                                                            "DRAM"))
        remote_ids = rng.choice(BLOCKS, 20, replace=False)
        local_ids = list(range(20))  # a list here, a numpy array on the remote side
        handle = agent.make_prepped_xfer("READ", local, local_ids, remote, remote_ids,
                                         notif_msg=b"req-1")
        agent.transfer(handle)
        consumers.append((agent, buffer, remote_ids, handle))
    for agent, buffer, remote_ids, handle in consumers:
        assert wait_state(agent, handle) == "DONE", agent.xfer_error(handle)
        for local_id, remote_id in enumerate(remote_ids):
            got = buffer[local_id * BLOCK:(local_id + 1) * BLOCK]
            want = prefill.initial[remote_id * BLOCK:(remote_id + 1) * BLOCK]
            assert np.array_equal(got, want), f"block {remote_id}"
        telemetry = agent.get_xfer_telemetry(handle)
        assert isinstance(telemetry, nixlXferTelemetry)
        assert telemetry.totalBytes == 20 * BLOCK and telemetry.descCount == 20
        assert telemetry.xferDuration >= telemetry.postDuration > 0
        agent.release_xfer_handle(handle)
    # The prefill gets both notifications, exactly one per consumer, each after the data it
    # follows was read: its region was intact (unscribbled) when each arrived.
    seen = prefill.wait_notifs(2)
    assert seen["notifs"] == {"decode0": [b"req-1".hex()], "decode1": [b"req-1".hex()]}
    assert seen["digests"] == [sha(prefill.initial)] * 2
    assert prefill.wait_notifs(1, timeout=0.3)["notifs"] == {}  # nothing more


def test_push_flow_writes_blocks_before_the_notification(make_nixl_peer):
    decode = make_nixl_peer("decode", seed=-1)
    agent = nixl_agent("prefill", nixl_agent_config(backends=["UCX"]))
    kv = seeded_bytes(21, BLOCK * BLOCKS)
    agent.register_memory(agent.get_reg_descs([(kv.ctypes.data, kv.nbytes, 0, "")], "DRAM"))
    assert agent.add_remote_agent(decode.metadata) == b"decode"
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", block_descs(kv.ctypes.data, BLOCKS), "DRAM")
    remote = agent.prep_xfer_dlist("decode", block_descs(decode.addr, BLOCKS), "DRAM")
    ids = np.arange(BLOCKS)[::-1].copy()  # every block, reversed: nothing merges
    handle = agent.make_prepped_xfer("WRITE", local, ids, remote, ids, notif_msg=b"pushed")
    agent.transfer(handle)
    seen = decode.wait_notifs(1)
    assert seen["notifs"] == {"prefill": [b"pushed".hex()]}
    assert seen["digests"] == [sha(kv)]  # every byte was there when the notification came
    assert wait_state(agent, handle) == "DONE"


def test_heterogeneous_tp_reads_byte_sub_ranges_of_blocks(make_nixl_peer):
    # Prefill TP 1 holds 4 heads per block; decode TP 2 rank 1 takes heads 2..3 of each.
    prefill = make_nixl_peer()
    agent, buffer = decode_agent("decode-rank1")
    agent.add_remote_agent(prefill.metadata)
    half = BLOCK // 2
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT",
                                  block_descs(buffer.ctypes.data, 2 * BLOCKS, size=half), "DRAM")
    remote = agent.prep_xfer_dlist("prefill",
                                   block_descs(prefill.addr, BLOCKS, offset=half, length=half),
                                   "DRAM")
    ids = np.array([3, 9, 40, 63])
    handle = agent.make_prepped_xfer("READ", local, np.arange(4), remote, ids, notif_msg=b"tp")
    agent.transfer(handle)
    assert wait_state(agent, handle) == "DONE", agent.xfer_error(handle)
    for k, block in enumerate(ids):
        want = prefill.initial[block * BLOCK + half:(block + 1) * BLOCK]
        assert np.array_equal(buffer[k * half:(k + 1) * half], want)
    assert prefill.wait_notifs(1)["notifs"] == {"decode-rank1": [b"tp".hex()]}
    # A sub-range whose lengths differ on the two sides is refused, naming the pair.
    with pytest.raises(errors.InvalidArgumentError, match="remote descriptor 0 has 2048"):
        full = agent.prep_xfer_dlist("NIXL_INIT_AGENT", block_descs(buffer.ctypes.data, 4),
                                     "DRAM")
        agent.make_prepped_xfer("READ", full, [0], remote, [0])


def test_prefill_restart_old_handles_fail_then_readding_works(make_nixl_peer):
    first = make_nixl_peer(seed=31)
    agent, buffer = decode_agent("decode", timeout_ms=5000)
    agent.add_remote_agent(first.metadata)
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", block_descs(buffer.ctypes.data, BLOCKS),
                                  "DRAM")
    remote = agent.prep_xfer_dlist("prefill", block_descs(first.addr, BLOCKS), "DRAM")
    handle = agent.make_prepped_xfer("READ", local, [0, 1], remote, [5, 6])
    agent.transfer(handle)
    assert wait_state(agent, handle) == "DONE"
    first.kill()
    second = make_nixl_peer(seed=32)  # the restarted prefill, same agent name
    # The old handle's transfer fails: the peer it addressed is gone.
    agent.transfer(handle)
    assert wait_state(agent, handle) == "ERR"
    assert agent.xfer_error(handle)
    agent.release_xfer_handle(handle)
    agent.remove_remote_agent("prefill")
    with pytest.raises(errors.PeerDisconnectedError):
        agent.make_prepped_xfer("READ", local, [0], remote, [0])
    agent.release_dlist_handle(remote)
    assert agent.add_remote_agent(second.metadata) == b"prefill"
    remote = agent.prep_xfer_dlist("prefill", block_descs(second.addr, BLOCKS), "DRAM")
    handle = agent.make_prepped_xfer("READ", local, [0, 1], remote, [7, 8], notif_msg=b"again")
    agent.transfer(handle)
    assert wait_state(agent, handle) == "DONE", agent.xfer_error(handle)
    assert np.array_equal(buffer[:2 * BLOCK], second.initial[7 * BLOCK:9 * BLOCK])
    assert second.wait_notifs(1)["notifs"] == {"decode": [b"again".hex()]}


def test_dead_peer_turns_the_transfer_to_err_within_the_timeout(make_nixl_peer):
    prefill = make_nixl_peer(nbytes=BLOCK * BLOCKS)
    agent, buffer = decode_agent("decode", timeout_ms=3000)
    agent.add_remote_agent(prefill.metadata)
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", block_descs(buffer.ctypes.data, BLOCKS),
                                  "DRAM")
    remote = agent.prep_xfer_dlist("prefill", block_descs(prefill.addr, BLOCKS), "DRAM")
    handle = agent.make_prepped_xfer("READ", local, range(BLOCKS), remote, range(BLOCKS),
                                     notif_msg=b"never")
    prefill.kill()
    agent.transfer(handle)  # its return value is ignored by vLLM: the state must say it
    assert wait_state(agent, handle, timeout_s=10) == "ERR"
    assert agent.xfer_error(handle)
    with pytest.raises(errors.KvferryError):
        agent.send_notif("prefill", b"heartbeat")


def test_in_process_agents_notify_and_refuse_bad_arguments():
    a, abuf = decode_agent("a")
    b, bbuf = decode_agent("b")
    bbuf[:] = seeded_bytes(3, bbuf.nbytes)
    assert a.add_remote_agent(b.get_agent_metadata()) == b"b"
    assert b.add_remote_agent(a.get_agent_metadata()) == b"a"
    for i in range(50):
        a.send_notif("b", f"hb{i}".encode())
    got = {}
    for _ in range(1000):
        for sender, messages in b.get_new_notifs().items():
            got.setdefault(sender, []).extend(messages)
        if len(got.get("a", [])) == 50:
            break
        time.sleep(0.005)
    assert got == {"a": [f"hb{i}".encode() for i in range(50)]}
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(abuf.ctypes.data, BLOCK, 0)], "DRAM")
    remote = a.prep_xfer_dlist("b", [(bbuf.ctypes.data, BLOCK, 0)], "DRAM")
    with pytest.raises(errors.OutOfRangeError, match="index pair 0"):
        a.make_prepped_xfer("READ", local, [1], remote, [0])
    with pytest.raises(errors.InvalidArgumentError, match="READ, WRITE"):
        a.make_prepped_xfer("COPY", local, [0], remote, [0])
    with pytest.raises(errors.InvalidArgumentError, match="exceeds max_notification_bytes"):
        a.make_prepped_xfer("READ", local, [0], remote, [0], notif_msg=b"x" * 5000)
    with pytest.raises(errors.NotRegisteredError, match="not loaded"):
        a.prep_xfer_dlist("nobody", [(0, 1, 0)], "DRAM")
    with pytest.raises(errors.InvalidArgumentError, match="memory type"):
        a.get_xfer_descs([(1, 1, 0)], "HBM")
    # Device memory goes to the engine's router: here no transport reaches it (no CUDA).
    fake_device = np.zeros(64, dtype=np.uint8)
    with pytest.raises(errors.KvferryError, match="cuda:0") as refused:
        a.register_memory(a.get_reg_descs([(fake_device.ctypes.data, 64, 0, "")], "VRAM"))
    print("VRAM registration here:", refused.value)
    # Many threads at once: transfers, notifications, drains.
    h = a.make_prepped_xfer("READ", local, [0], remote, [0])
    failures = []

    def work(k):
        try:
            for _ in range(20):
                b.send_notif("a", b"t%d" % k)
                a.get_new_notifs()
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    a.transfer(h)
    assert wait_state(a, h) == "DONE"
    for t in threads:
        t.join(timeout=PROCESS_TIMEOUT_S)
    assert not failures
    assert np.array_equal(abuf[:BLOCK], bbuf[:BLOCK])


def test_shim_exposes_kvferry_as_nixl():
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from nixl._api import nixl_agent, nixl_agent_config\n"
            "from nixl._bindings import nixlXferTelemetry\n"
            "import kvferry.nixl._api as k\n"
            "assert nixl_agent is k.nixl_agent, nixl_agent\n"
            "print('ok')\n") % shim_path()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=PROCESS_TIMEOUT_S, env=dict(os.environ))
    assert out.stdout.strip() == "ok", out.stderr
    code = ("import kvferry.nixl as k; k.install_as_nixl()\n"
            "from nixl._api import nixl_agent\nimport nixl._bindings\n"
            "assert nixl_agent is k.nixl_agent\nprint('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=PROCESS_TIMEOUT_S)
    assert out.stdout.strip() == "ok", out.stderr
    assert _api.LOCAL_AGENT == "NIXL_INIT_AGENT"
    assert callable(install_as_nixl)


def read_blocks_with(agent, prefill, ids, notif):
    """READ prefill blocks `ids` into the agent's first len(ids) blocks; the handle."""
    buffer_base = agent._test_buffer.ctypes.data
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", block_descs(buffer_base, BLOCKS), "DRAM")
    remote = agent.prep_xfer_dlist("prefill", block_descs(prefill.addr, BLOCKS), "DRAM")
    handle = agent.make_prepped_xfer("READ", local, range(len(ids)), remote, ids, notif_msg=notif)
    agent.transfer(handle)
    return handle


def assert_blocks(buffer, prefill, ids):
    for k, block in enumerate(ids):
        want = prefill.initial[block * BLOCK:(block + 1) * BLOCK]
        assert np.array_equal(buffer[k * BLOCK:(k + 1) * BLOCK], want), f"block {block}"


def test_repost_with_a_new_notification_delivers_the_new_one(make_nixl_peer):
    prefill = make_nixl_peer()
    agent, buffer = decode_agent("decode")
    agent._test_buffer = buffer
    agent.add_remote_agent(prefill.metadata)
    handle = read_blocks_with(agent, prefill, [4, 5], b"first")
    assert wait_state(agent, handle) == "DONE", agent.xfer_error(handle)
    assert agent.transfer(handle, b"second") in ("PROC", "DONE")
    assert wait_state(agent, handle) == "DONE", agent.xfer_error(handle)
    agent.transfer(handle)  # no message given: the last one stays
    assert wait_state(agent, handle) == "DONE", agent.xfer_error(handle)
    assert_blocks(buffer, prefill, [4, 5])
    got = prefill.wait_notifs(3)["notifs"]
    assert got == {"decode": [b"first".hex(), b"second".hex(), b"second".hex()]}


@pytest.mark.parametrize("acknowledged", [False, True], ids=["nixl-semantics", "acknowledged"])
def test_stalled_prefill_does_not_hold_a_read_whose_data_landed(make_nixl_peer, acknowledged):
    """The prefill is stopped (SIGSTOP: a GC pause, an overload) while a READ from it runs.
    The bytes move without it (same host); with NIXL's semantics DONE comes while it is still
    stopped, and the notification reaches it once it runs again. Acknowledged: DONE waits for
    the prefill."""
    prefill = make_nixl_peer()
    agent, buffer = decode_agent("decode", acknowledged_notifications=acknowledged)
    agent._test_buffer = buffer
    agent.add_remote_agent(prefill.metadata)
    stop_process(prefill.process.pid)
    try:
        ids = [9, 2, 30]
        handle = read_blocks_with(agent, prefill, ids, b"stalled")
        # Bounded generously for a loaded machine; the time it takes is a figure of
        # docs/PERFORMANCE.md, not of this test.
        state = wait_state(agent, handle, timeout_s=1.0 if acknowledged else 8.0)
        if acknowledged:
            assert state == "PROC"  # waits for the stopped prefill's acknowledgement
        else:
            assert state == "DONE", agent.xfer_error(handle)
            assert_blocks(buffer, prefill, ids)
    finally:
        os.kill(prefill.process.pid, signal.SIGCONT)
    assert wait_state(agent, handle) == "DONE", agent.xfer_error(handle)
    assert_blocks(buffer, prefill, [9, 2, 30])
    assert prefill.wait_notifs(1)["notifs"] == {"decode": [b"stalled".hex()]}


def test_backends_kvferry_lacks_are_skipped_with_a_warning_and_refused_by_name(caplog):
    assert nixl_agent("plain", nixl_agent_config()).get_plugin_list() == ["UCX"]
    with caplog.at_level(logging.WARNING, logger="kvferry.nixl._api"):
        agent = nixl_agent("fabric", nixl_agent_config(backends=["LIBFABRIC"]))
    assert "Skipping backend registration LIBFABRIC" in caplog.text
    assert agent.backends == {}
    buffer = np.zeros(BLOCK, dtype=np.uint8)
    descs = agent.get_reg_descs([(buffer.ctypes.data, BLOCK, 0, "")], "DRAM")
    with pytest.raises(nixlNotFoundError, match="no backend"):
        agent.register_memory(descs)  # nothing moves on a backend that was never made
    with pytest.raises(nixlNotFoundError, match="'GDS'"):
        agent.create_backend("GDS")
    agent.create_backend("UCX", {"num_threads": "2"})
    assert agent.get_backend_mem_types("UCX") == ["DRAM", "VRAM"]
    agent.register_memory(descs, backends=["UCX"])
    with pytest.raises(KeyError):
        agent.register_memory(descs, backends=["POSIX"])
    with pytest.raises(nixlNoTelemetryError, match="capture_telemetry"):
        agent.get_xfer_telemetry(1)


def test_env_overrides_what_vllm_cannot_pass(monkeypatch):
    monkeypatch.setenv("KVFERRY_LISTEN_ADDRESS", "127.0.0.1:0")
    monkeypatch.setenv("KVFERRY_BATCH_TIMEOUT_MS", "1234")
    monkeypatch.setenv("KVFERRY_TRANSPORT", "tcp")
    config = nixl_agent_config(num_threads=4, capture_telemetry=True)
    assert (config.listen_address, config.batch_timeout_ms, config.transport) == (
        "127.0.0.1:0", 1234, "tcp")
    agent = nixl_agent("env", config)
    endpoints = json.loads(agent.get_agent_metadata())["endpoints"]
    assert len(endpoints) == 1 and endpoints[0].startswith("127.0.0.1:")
    monkeypatch.setenv("KVFERRY_BATCH_TIMEOUT_MS", "soon")
    with pytest.raises(errors.InvalidArgumentError, match="KVFERRY_BATCH_TIMEOUT_MS='soon'"):
        nixl_agent_config()


def test_metadata_of_an_agent_on_every_interface_lists_no_wildcard(monkeypatch):
    for name in ("KVFERRY_LISTEN_ADDRESS", "VLLM_NIXL_SIDE_CHANNEL_HOST"):
        monkeypatch.delenv(name, raising=False)
    wait_for_any_address_port()
    agent = nixl_agent("everywhere", nixl_agent_config(num_threads=4, capture_telemetry=True))
    endpoints = json.loads(agent.get_agent_metadata())["endpoints"]
    assert endpoints and not any(e.startswith("0.0.0.0:") for e in endpoints), endpoints
    other, _ = decode_agent("other")
    assert other.add_remote_agent(agent.get_agent_metadata()) == b"everywhere"
    other.make_connection("everywhere")
    with pytest.raises(errors.NotRegisteredError, match="nobody"):
        other.make_connection("nobody")
    # Metadata whose endpoints answer as nobody, or as another agent, is refused, naming each.
    lie = json.loads(agent.get_agent_metadata())
    lie["endpoints"] = ["127.0.0.1:9"] + json.loads(other.get_agent_metadata())["endpoints"]
    lie["name"] = "liar"
    with pytest.raises(errors.PeerUnreachableError, match="127.0.0.1:9.*another engine"):
        other.add_remote_agent(json.dumps(lie).encode())


class OtherHost:
    """A network namespace joined to this one by a veth pair (a /30 of 203.0.113.0/24, a range
    reserved for documentation: the C++ tests that run alongside take theirs from
    198.18.0.0/15); a child started with `launcher` runs there, in its own pid namespace too,
    so kvferry sees another host."""

    def __init__(self):
        if os.geteuid() != 0:
            pytest.skip("network namespaces need root")
        for tool in ("ip", "unshare"):
            if shutil.which(tool) is None:
                pytest.skip(f"{tool} is not installed")
        pid = os.getpid()
        self.ns = f"kvn{pid}"
        base = (pid % 64) * 4
        self.local_ip, self.peer_ip = f"203.0.113.{base + 1}", f"203.0.113.{base + 2}"
        self.dev = f"kvn{pid}a"
        steps = [
            f"ip netns add {self.ns}",
            f"ip -n {self.ns} link set lo up",
            f"ip link add {self.dev} type veth peer name {self.dev[:-1]}b",
            f"ip link set {self.dev[:-1]}b netns {self.ns}",
            f"ip addr add {self.local_ip}/30 dev {self.dev}",
            f"ip link set {self.dev} up",
            f"ip -n {self.ns} addr add {self.peer_ip}/30 dev {self.dev[:-1]}b",
            f"ip -n {self.ns} link set {self.dev[:-1]}b up",
        ]
        for step in steps:
            out = subprocess.run(step.split(), capture_output=True, text=True,
                                 timeout=PROCESS_TIMEOUT_S)
            if out.returncode != 0:
                self.close()
                pytest.skip(f"cannot build the other host ({step}: {out.stderr.strip()})")
        self.launcher = ["ip", "netns", "exec", self.ns, "unshare", "--pid", "--fork",
                         "--kill-child", "--mount-proc"]

    def close(self):
        subprocess.run(["ip", "link", "del", self.dev], capture_output=True,
                       timeout=PROCESS_TIMEOUT_S)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True,
                       timeout=PROCESS_TIMEOUT_S)


@pytest.fixture
def other_host():
    host = OtherHost()
    yield host
    host.close()


@pytest.mark.parametrize("side_channel_host", [False, True],
                         ids=["no-configuration", "VLLM_NIXL_SIDE_CHANNEL_HOST"])
def test_decode_reads_from_a_prefill_on_another_host_with_vllms_configuration_only(
        make_nixl_peer, other_host, monkeypatch, side_channel_host):
    for name in ("KVFERRY_LISTEN_ADDRESS", "KVFERRY_TRANSPORT", "KVFERRY_SECRET",
                 "KVFERRY_BATCH_TIMEOUT_MS", "VLLM_NIXL_SIDE_CHANNEL_HOST"):
        monkeypatch.delenv(name, raising=False)
    wait_for_any_address_port()  # the decode, here, listens on every interface
    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": other_host.peer_ip} if side_channel_host else {}
    prefill = make_nixl_peer(launcher=other_host.launcher, env=env)
    endpoints = json.loads(prefill.metadata)["endpoints"]
    # The other host has one interface besides lo: its veth end.
    assert [e.rsplit(":", 1)[0] for e in endpoints] == [other_host.peer_ip], endpoints
    # The decode, as vLLM creates it.
    agent = nixl_agent("decode", nixl_agent_config(num_threads=4, capture_telemetry=True))
    buffer = np.zeros(BLOCK * BLOCKS, dtype=np.uint8)
    agent.register_memory(agent.get_reg_descs([(buffer.ctypes.data, buffer.nbytes, 0, "")],
                                              "DRAM"))
    agent._test_buffer = buffer
    assert agent.add_remote_agent(prefill.metadata) == b"prefill"
    ids = list(np.random.default_rng(8).choice(BLOCKS, 24, replace=False))
    handle = read_blocks_with(agent, prefill, ids, b"cross-host")
    assert wait_state(agent, handle) == "DONE", agent.xfer_error(handle)
    assert_blocks(buffer, prefill, ids)
    assert prefill.wait_notifs(1)["notifs"] == {"decode": [b"cross-host".hex()]}


def listening_agent(name, nbytes=BLOCK * BLOCKS, seed=None, **config):
    """An agent with NIXL's metadata listener on a free port, and one registered region."""
    agent = nixl_agent(name, nixl_agent_config(True, True, 0, backends=["UCX"], **config))
    buffer = (seeded_bytes(seed, nbytes) if seed is not None
              else np.zeros(nbytes, dtype=np.uint8))
    agent.register_memory(agent.get_reg_descs([(buffer.ctypes.data, nbytes, 0, "")], "DRAM"))
    return agent, buffer


def wait_for(predicate, timeout_s=PROCESS_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the state never came"
        time.sleep(0.005)


def test_metadata_listener_exchanges_whole_and_partial_metadata_and_invalidates(monkeypatch):
    monkeypatch.delenv("NIXL_ETCD_ENDPOINTS", raising=False)
    target, tbuf = listening_agent("target", seed=61)
    initiator, ibuf = listening_agent("initiator")
    half = BLOCK * BLOCKS // 2
    first = target.get_xfer_descs([(tbuf.ctypes.data, half, 0)], "DRAM")
    second = target.get_xfer_descs([(tbuf.ctypes.data + half, half, 0)], "DRAM")
    # Partial: the initiator learns the target's first half only.
    target.send_partial_agent_metadata(target.get_reg_descs([(tbuf.ctypes.data, half, 0, "")],
                                                            "DRAM"),
                                       True, ["UCX"], "127.0.0.1", initiator.listen_port)
    wait_for(lambda: initiator.check_remote_metadata("target", first))
    assert not initiator.check_remote_metadata("target", second)
    with pytest.raises(nixlNotFoundError, match="not in the metadata it sent"):
        initiator.initialize_xfer("READ", initiator.get_xfer_descs(
            [(ibuf.ctypes.data, half, 0)], "DRAM"), second, "target")
    local = initiator.get_xfer_descs([(ibuf.ctypes.data, half, 0)], "DRAM")
    handle = initiator.initialize_xfer("READ", local, first, "target", b"first")
    initiator.transfer(handle)
    assert wait_state(initiator, handle) == "DONE", initiator.xfer_error(handle)
    assert np.array_equal(ibuf[:half], tbuf[:half])
    # The whole metadata, fetched from the target's listener, shows the rest.
    initiator.fetch_remote_metadata("target", "127.0.0.1", target.listen_port)
    wait_for(lambda: initiator.check_remote_metadata("target", second))
    handle = initiator.initialize_xfer("READ", initiator.get_xfer_descs(
        [(ibuf.ctypes.data + half, half, 0)], "DRAM"), second, "target", b"second")
    initiator.transfer(handle)
    assert wait_state(initiator, handle) == "DONE", initiator.xfer_error(handle)
    assert np.array_equal(ibuf, tbuf)
    wait_for(lambda: target.check_remote_xfer_done("initiator", b"second") is not None)
    target.invalidate_local_metadata("127.0.0.1", initiator.listen_port)
    wait_for(lambda: not initiator.check_remote_metadata("target"))
    # Without an address the exchange goes through etcd, which needs NIXL_ETCD_ENDPOINTS.
    with pytest.raises(errors.InvalidArgumentError, match="NIXL_ETCD_ENDPOINTS is not set"):
        initiator.fetch_remote_metadata("target")


def test_metadata_through_etcd_whole_partial_and_invalidated(monkeypatch):
    etcd = os.environ.get("KVFERRY_TEST_ETCD", "")
    if not etcd.startswith("etcd://"):
        pytest.skip("KVFERRY_TEST_ETCD (scripts/services.sh) names no etcd")
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", "http://" + etcd[len("etcd://"):].split(",")[0])
    monkeypatch.setenv("NIXL_ETCD_NAMESPACE", f"/kvferry-test/{os.getpid()}-{time.time_ns()}")
    target, tbuf = listening_agent("target", seed=62)
    initiator, ibuf = listening_agent("initiator")
    half = BLOCK * BLOCKS // 2
    first = target.get_xfer_descs([(tbuf.ctypes.data, half, 0)], "DRAM")
    whole = target.get_xfer_descs([(tbuf.ctypes.data, 2 * half, 0)], "DRAM")
    target.send_partial_agent_metadata(first, True, ["UCX"], label="first").result(
        PROCESS_TIMEOUT_S)
    initiator.fetch_remote_metadata("target", label="first")
    wait_for(lambda: initiator.check_remote_metadata("target", first))
    assert not initiator.check_remote_metadata("target", whole)
    target.send_local_metadata().result(PROCESS_TIMEOUT_S)
    initiator.fetch_remote_metadata("target")
    wait_for(lambda: initiator.check_remote_metadata("target", whole))
    handle = initiator.initialize_xfer("READ", initiator.get_xfer_descs(
        [(ibuf.ctypes.data, 2 * half, 0)], "DRAM"), whole, "target", b"via etcd")
    initiator.transfer(handle)
    assert wait_state(initiator, handle) == "DONE", initiator.xfer_error(handle)
    assert np.array_equal(ibuf, tbuf)
    store = _metadata.Etcd.from_env()
    assert store.get(store.key("target", "metadata")) is not None
    target.invalidate_local_metadata().result(PROCESS_TIMEOUT_S)
    assert store.get(store.key("target", "metadata")) is None
    assert store.get(store.key("target", "first")) is None


def raw_request(port, frame, read_nonce=True):
    """One raw exchange with a metadata listener: the reply frame's JSON, or None when the
    listener closed the connection without one."""
    import socket
    import struct
    with socket.create_connection(("127.0.0.1", port), timeout=PROCESS_TIMEOUT_S) as sock:
        if read_nonce:
            nonce = b""
            while len(nonce) < 32:
                nonce += sock.recv(32 - len(nonce))
        sock.sendall(frame)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        if len(data) < 4:
            return None
        (length,) = struct.unpack_from("<I", data)
        return json.loads(data[4:4 + length])


def json_frame(obj):
    import struct
    body = json.dumps(obj).encode()
    return struct.pack("<I", len(body)) + body


def test_metadata_listener_outlasts_floods_and_clients_that_never_finish():
    """Attack classes: connections that never send (a flood past the listener's cap) and a
    client that stops mid-request. The oldest connection makes room for a new one, so a peer
    still gets in while they hold on."""
    import socket
    target, _ = listening_agent("target")
    port = target.listen_port
    idle = [socket.create_connection(("127.0.0.1", port), timeout=PROCESS_TIMEOUT_S)
            for _ in range(_metadata.MAX_CONNECTIONS + 36)]
    stalled = socket.create_connection(("127.0.0.1", port), timeout=PROCESS_TIMEOUT_S)
    stalled.sendall(b"\x10\x00")  # half a length, then nothing
    try:
        reply = raw_request(port, json_frame({"op": "fetch"}))
        assert reply["ok"], reply
        assert json.loads(bytes.fromhex(reply["metadata"]))["name"] == "target"
    finally:
        for sock in idle + [stalled]:
            sock.close()


def test_metadata_listener_answers_oversized_and_malformed_requests_and_keeps_serving():
    """Attack classes: a length that claims far more than a request may hold (refused unread),
    bytes that are not JSON, an op it does not have, metadata that lies about its shape."""
    import struct
    target, _ = listening_agent("target")
    port = target.listen_port
    huge = raw_request(port, struct.pack("<I", 1 << 31))
    assert not huge["ok"] and "exceeds" in huge["error"]
    garbage = raw_request(port, struct.pack("<I", 5) + b"\xff{[}x")
    assert not garbage["ok"]
    assert not raw_request(port, json_frame({"op": "format-disk"}))["ok"]
    lying = raw_request(port, json_frame({"op": "send", "metadata": b"not json".hex()}))
    assert not lying["ok"] and "not kvferry agent metadata" in lying["error"]
    assert raw_request(port, json_frame({"op": "fetch"}))["ok"]


def test_metadata_listener_with_a_secret_loads_nothing_without_its_proof():
    """Attack class: a peer without the secret pushes metadata naming an agent (to be read
    from, or written to, in its place). Refused; an agent holding the secret gets in."""
    target, _ = listening_agent("target", secret="s3cret")
    liar, _ = listening_agent("liar", secret="other")
    forged = raw_request(target.listen_port,
                         json_frame({"op": "send", "metadata": liar.get_agent_metadata().hex(),
                                     "proof": "00" * 32}))
    assert not forged["ok"] and "proof" in forged["error"]
    assert not target.check_remote_metadata("liar")
    # With the wrong secret its proof is refused too.
    with pytest.raises(RuntimeError, match="no valid proof of the secret"):
        liar.send_local_metadata("127.0.0.1", target.listen_port).result(PROCESS_TIMEOUT_S)
    friend, _ = listening_agent("friend", secret="s3cret")
    friend.send_local_metadata("127.0.0.1", target.listen_port)
    wait_for(lambda: target.check_remote_metadata("friend"))
    assert not target.check_remote_metadata("liar")


def test_descriptor_lists_as_nixl_has_them():
    from kvferry.nixl._bindings import DRAM_SEG, nixlRegDList, nixlXferDList
    agent = nixl_agent("lists", nixl_agent_config(backends=["UCX"]))
    rows = np.array([[4096, 64, 0], [8192, 128, 0]], dtype=np.uint64)
    xfer = nixlXferDList(DRAM_SEG, rows)
    assert (xfer.descCount(), xfer.getType(), len(xfer)) == (2, "DRAM", 2)
    assert xfer[1] == (8192, 128, 0) and xfer[-1] == xfer[1]
    assert xfer == nixlXferDList(DRAM_SEG, [(4096, 64, 0), (8192, 128, 0)])
    assert xfer != nixlXferDList(DRAM_SEG, [(4096, 64, 0)])
    assert agent.deserialize_descs(agent.get_serialized_descs(xfer)) == xfer
    reg = agent.get_reg_descs([(4096, 64, 0, "a"), (8192, 128, 0, "b")], "DRAM")
    assert isinstance(reg, nixlRegDList) and reg.trim() == xfer
    assert nixlXferDList(DRAM_SEG, 3).descCount() == 3 and nixlXferDList(DRAM_SEG).isEmpty()
    with pytest.raises(IndexError):
        xfer[2]
    # NIXL's answers to input of the wrong shape: None (logged), KeyError for a bad name.
    assert agent.get_xfer_descs([(1, 2, 3, 4)], "DRAM") is None
    assert agent.get_xfer_descs([(1, 2, 3)]) is None
    assert agent.get_xfer_descs(reg) is None and agent.get_reg_descs(xfer) is None
    assert agent.get_reg_descs(np.zeros((2, 4), dtype=np.uint64), "DRAM") is None
    with pytest.raises(KeyError):
        agent.get_xfer_descs([(1, 2, 3)], "V-RAM")
    with pytest.raises(KeyError):
        agent.make_prepped_xfer("RD", 0, [], 0, [])


def test_an_agent_reads_its_own_memory_by_its_own_name():
    agent = nixl_agent("self", nixl_agent_config(backends=["UCX"]))
    memory = seeded_bytes(71, 2 * BLOCK)
    agent.register_memory(agent.get_reg_descs([(memory.ctypes.data, memory.nbytes, 0, "")],
                                              "DRAM"))
    local = agent.prep_xfer_dlist("", [(memory.ctypes.data, BLOCK, 0)], "DRAM")
    remote = agent.prep_xfer_dlist("self", [(memory.ctypes.data + BLOCK, BLOCK, 0)], "DRAM")
    handle = agent.make_prepped_xfer("READ", local, [0], remote, [0])
    agent.transfer(handle)
    want = memory[BLOCK:].copy()
    assert wait_state(agent, handle) == "DONE", agent.xfer_error(handle)
    assert np.array_equal(memory[:BLOCK], want)


def test_tensors_and_lists_of_row_tensors_are_descriptors():
    torch = pytest.importorskip("torch")
    agent = nixl_agent("tensors", nixl_agent_config(backends=["UCX"]))
    tensor = torch.ones((4, 8), dtype=torch.float32)
    reg = agent.get_reg_descs(tensor)
    assert reg[0] == (tensor.data_ptr(), 4 * 8 * 4, 0) and reg.getType() == "DRAM"
    rows = agent.get_xfer_descs([tensor[i, :] for i in range(4)])
    assert [rows[i][0] for i in range(4)] == [tensor[i, :].data_ptr() for i in range(4)]
    assert agent.get_xfer_descs(torch.transpose(tensor, 0, 1)) is None  # not contiguous


def test_sglangs_nixl_sequence_pushes_kv_with_write_and_notifies(make_nixl_peer):
    """sglang's NIXL backend: no backend at creation, strict thread sync, UCX created by name
    after checking the plugin list, local lists prepared with "", WRITE through both
    initialize_xfer and make_prepped_xfer, then send_notif."""
    from kvferry.nixl import nixl_thread_sync_t
    decode = make_nixl_peer("decode", seed=-1)
    agent = nixl_agent("prefill", nixl_agent_config(
        backends=[], num_threads=2, sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT))
    assert "UCX" in agent.get_plugin_list()
    agent.create_backend("UCX", {"num_threads": "2"})
    kv = seeded_bytes(23, BLOCK * BLOCKS)
    agent.register_memory(agent.get_reg_descs([(kv.ctypes.data, kv.nbytes, 0, "")], "DRAM"))
    agent.add_remote_agent(decode.metadata)
    local = agent.prep_xfer_dlist("", block_descs(kv.ctypes.data, BLOCKS), "DRAM")
    remote = agent.prep_xfer_dlist("decode", block_descs(decode.addr, BLOCKS), "DRAM")
    first = agent.make_prepped_xfer("WRITE", local, np.arange(0, 32), remote, np.arange(0, 32))
    rest = agent.initialize_xfer(
        "WRITE", agent.get_xfer_descs(block_descs(kv.ctypes.data + 32 * BLOCK, 32), "DRAM"),
        agent.get_xfer_descs(block_descs(decode.addr + 32 * BLOCK, 32), "DRAM"), "decode")
    for handle in (first, rest):
        agent.transfer(handle)
        assert wait_state(agent, handle) == "DONE", agent.xfer_error(handle)
    agent.send_notif("decode", b"room-7 done")
    seen = decode.wait_notifs(1)
    assert seen["notifs"] == {"prefill": [b"room-7 done".hex()]}
    assert seen["digests"] == [sha(kv)]


def test_a_killed_prefill_fails_an_in_flight_read(make_nixl_peer):
    """The READ is in flight (tcp, the prefill stopped so it cannot answer) when the prefill is
    killed: ERR, well within the batch timeout (the kernel reports the death)."""
    prefill = make_nixl_peer()
    agent, buffer = decode_agent("decode", timeout_ms=30_000, transport="tcp")
    agent._test_buffer = buffer
    agent.add_remote_agent(prefill.metadata)
    warm = read_blocks_with(agent, prefill, [4], b"warm")  # the tcp lanes are up
    assert wait_state(agent, warm) == "DONE", agent.xfer_error(warm)
    stop_process(prefill.process.pid)
    handle = read_blocks_with(agent, prefill, [1, 2, 3], b"never")
    assert wait_state(agent, handle, timeout_s=0.2) == "PROC"
    killed = time.monotonic()
    prefill.kill()
    assert wait_state(agent, handle, timeout_s=15) == "ERR"
    print(f"ERR {1e3 * (time.monotonic() - killed):.1f} ms after SIGKILL:",
          agent.xfer_error(handle))


def test_a_process_that_exits_right_after_done_still_delivers_its_notification(make_nixl_peer):
    """NIXL's DONE means the notification is queued, not delivered: a prefill that pushes KV
    and exits at once must not lose it (the agent closes at interpreter exit, delivering what
    is queued)."""
    decode = make_nixl_peer("decode", seed=-1)
    code = f"""
import numpy as np
from kvferry.nixl._api import nixl_agent, nixl_agent_config
agent = nixl_agent("pusher", nixl_agent_config(num_threads=2))
kv = np.full({BLOCK * 8}, 7, dtype=np.uint8)
agent.register_memory(agent.get_reg_descs([(kv.ctypes.data, kv.nbytes, 0, "")], "DRAM"))
agent.add_remote_agent(bytes.fromhex("{decode.metadata.hex()}"))
rows = lambda base: [(base + i * {BLOCK}, {BLOCK}, 0) for i in range(8)]
for i in range(10):
    h = agent.initialize_xfer("WRITE", agent.get_xfer_descs(rows(kv.ctypes.data), "DRAM"),
                              agent.get_xfer_descs(rows({decode.addr}), "DRAM"), "decode",
                              b"pushed-%d" % i)
    state = agent.transfer(h)
    while state == "PROC":
        state = agent.check_xfer_state(h)
    assert state == "DONE", state
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=PROCESS_TIMEOUT_S)
    assert out.returncode == 0, out.stderr
    seen = decode.wait_notifs(10)
    assert seen["notifs"] == {"pusher": [(b"pushed-%d" % i).hex() for i in range(10)]}
