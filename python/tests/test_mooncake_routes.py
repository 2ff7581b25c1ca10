"""sglang's remaining Mooncake calls and the same-host route for ordinary host memory: with
protocol auto, rdma or shm, a batch to a same-host peer's registered numpy memory goes over
cma (cross-memory attach), not tcp; send_probe answers 0 for a live peer, < 0 for a dead one;
get_engine returns the kvferry.Engine underneath."""

import numpy as np
import pytest

import kvferry
from conftest import seeded_bytes, sha256
from kvferry.engine import TransferEngine

NBYTES = 1 << 20


def host_route(engine, session):
    """The (transport, reason) of the host -> host route to the peer."""
    for local, remote, transport, reason in engine.get_engine().routes(session):
        if (local, remote) == ("host", "host"):
            return transport, reason
    raise AssertionError("no host -> host route listed")


@pytest.mark.parametrize("protocol", ["auto", "rdma", "shm"])
def test_same_host_batches_on_registered_host_memory_take_cma(make_peer, protocol):
    peer = make_peer("tcp", NBYTES, seed=5)  # plain registered numpy memory on its side
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
    buffer = np.zeros(NBYTES, dtype=np.uint8)
    assert engine.register_memory(buffer.ctypes.data, NBYTES) == 0
    buffer[:] = seeded_bytes(9, NBYTES)
    base = buffer.ctypes.data
    # A scattered batch write, then a batch read back into another registered buffer.
    locals_ = [base + i * 8192 for i in range(64)]
    remotes = [peer.addr + NBYTES - (i + 1) * 8192 for i in range(64)]
    assert engine.batch_transfer_sync_write(peer.session, locals_, remotes, [4096] * 64) == 0
    transport, reason = host_route(engine, peer.session)
    assert transport == "cma", reason
    for local, remote in zip(locals_, remotes):
        assert peer.digest(remote - peer.addr, 4096) == sha256(
            buffer[local - base:local - base + 4096])
    back = np.zeros(64 * 4096, dtype=np.uint8)
    assert engine.register_memory(back.ctypes.data, back.nbytes) == 0
    assert engine.batch_transfer_sync_read(
        peer.session, [back.ctypes.data + i * 4096 for i in range(64)], remotes,
        [4096] * 64) == 0
    for i, local in enumerate(locals_):
        np.testing.assert_array_equal(back[i * 4096:(i + 1) * 4096],
                                      buffer[local - base:local - base + 4096])


def test_forced_tcp_stays_on_tcp(make_peer):
    peer = make_peer("tcp", NBYTES, seed=5)
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buffer = np.zeros(4096, dtype=np.uint8)
    assert engine.register_memory(buffer.ctypes.data, buffer.nbytes) == 0
    assert engine.transfer_sync_read(peer.session, buffer.ctypes.data, peer.addr, 4096) == 0
    np.testing.assert_array_equal(buffer, peer.initial[:4096])
    assert host_route(engine, peer.session)[0] == "tcp"


def test_send_probe_is_zero_for_a_live_peer_and_negative_for_a_dead_one(make_peer):
    peer = make_peer("tcp", 1 << 16)
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") == 0
    assert engine.send_probe(peer.session) == 0
    peer.kill()
    code = engine.send_probe(peer.session)
    assert code < 0
    assert code == -int(kvferry.StatusCode.PeerUnreachable), engine.get_last_error()


def test_get_engine_returns_the_kvferry_engine():
    engine = TransferEngine()
    assert engine.get_engine() is None
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "auto", "") == 0
    inner = engine.get_engine()
    assert isinstance(inner, kvferry.Engine)
    assert inner.endpoint == engine.get_session_id()
