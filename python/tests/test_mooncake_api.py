"""kvferry.TransferEngine answers Mooncake's Python API: two processes move numpy buffers
through every call, and the bytes that arrive are checked on both sides."""

import numpy as np
import pytest

from conftest import local_buffer, seeded_bytes, sha256
from kvferry.engine import TransferEngine

NBYTES = 1 << 20
PROTOCOLS = ["tcp", "shm"]


# Each protocol without a secret and with one (KVFERRY_SECRET, as a Mooncake user would set
# it: both processes read it).
@pytest.fixture(params=[(p, s) for p in PROTOCOLS for s in (None, "py-mooncake-secret")],
                ids=lambda c: f"{c[0]}-{'secret' if c[1] else 'no-secret'}")
def pair(request, make_peer, monkeypatch):
    protocol, secret = request.param
    if secret:
        monkeypatch.setenv("KVFERRY_SECRET", secret)
    else:
        monkeypatch.delenv("KVFERRY_SECRET", raising=False)
    peer = make_peer(protocol, NBYTES, seed=11)
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0
    buffer = local_buffer(engine, protocol, NBYTES)
    buffer[:] = seeded_bytes(22, NBYTES)
    return engine, buffer, peer


def test_transfer_sync_write_lands_in_peer_memory(pair):
    engine, buffer, peer = pair
    assert engine.transfer_sync_write(peer.session, buffer.ctypes.data + 100, peer.addr + 5000,
                                      4096) == 0
    assert peer.digest(5000, 4096) == sha256(buffer[100:100 + 4096])
    # Bytes around the write are untouched.
    assert peer.digest(0, 5000) == sha256(peer.initial[:5000])


def test_transfer_sync_read_copies_peer_memory(pair):
    engine, buffer, peer = pair
    assert engine.transfer_sync_read(peer.session, buffer.ctypes.data, peer.addr + 64,
                                     65536) == 0
    np.testing.assert_array_equal(buffer[:65536], peer.initial[64:64 + 65536])


def test_batch_transfer_sync_write_and_read(pair):
    engine, buffer, peer = pair
    base = buffer.ctypes.data
    locals_ = [base, base + 10_000, base + 300_000]
    remotes = [peer.addr + 500_000, peer.addr + 20_000, peer.addr + 200_000]
    lengths = [7000, 1, 123_456]
    assert engine.batch_transfer_sync_write(peer.session, locals_, remotes, lengths) == 0
    for (local, remote, length) in zip(locals_, remotes, lengths):
        assert peer.digest(remote - peer.addr, length) == sha256(
            buffer[local - base:local - base + length])

    target = np.zeros(2 * 4096, dtype=np.uint8)
    assert engine.register_memory(target.ctypes.data, target.nbytes) == 0
    assert engine.batch_transfer_sync_read(
        peer.session, [target.ctypes.data, target.ctypes.data + 4096],
        [peer.addr + 500_000, peer.addr + 900_000], [4096, 4096]) == 0
    np.testing.assert_array_equal(target[:4096], buffer[:4096])  # written just above
    np.testing.assert_array_equal(target[4096:], peer.initial[900_000:904_096])
    assert engine.unregister_memory(target.ctypes.data) == 0


def test_batch_transfer_async_write_and_read_with_status(pair):
    engine, buffer, peer = pair
    base = buffer.ctypes.data
    write_ids = [
        engine.batch_transfer_async_write(peer.session, [base + i * 65536], [peer.addr + i * 65536],
                                          [65536])
        for i in range(4)
    ]
    assert all(batch_id > 0 for batch_id in write_ids)
    assert len(set(write_ids)) == 4
    assert engine.get_batch_transfer_status(write_ids) == 0
    assert peer.digest(0, 4 * 65536) == sha256(buffer[:4 * 65536])

    read_id = engine.batch_transfer_async_read(
        peer.session, [base + 600_000, base + 700_000], [peer.addr + 800_000, peer.addr + 0],
        [1000, 2000])
    assert read_id > 0
    assert engine.get_batch_transfer_status([read_id]) == 0
    np.testing.assert_array_equal(buffer[600_000:601_000], peer.initial[800_000:801_000])
    np.testing.assert_array_equal(buffer[700_000:702_000], buffer[0:2000])
    # A batch id is forgotten once its status was collected.
    assert engine.get_batch_transfer_status([read_id]) < 0


def test_transfer_submit_write_and_check_status(pair):
    engine, buffer, peer = pair
    batch_id = engine.transfer_submit_write(peer.session, buffer.ctypes.data, peer.addr + 4096,
                                            8192)
    assert batch_id > 0
    status = 0
    for _ in range(10_000):
        status = engine.transfer_check_status(batch_id)
        if status != 0:
            break
    assert status == 1
    assert peer.digest(4096, 8192) == sha256(buffer[:8192])


def test_batch_register_and_unregister_memory(pair):
    engine, _, peer = pair
    arrays = [np.full(4096, i, dtype=np.uint8) for i in range(3)]
    addrs = [a.ctypes.data for a in arrays]
    assert engine.batch_register_memory(addrs, [a.nbytes for a in arrays]) == 0
    for i, a in enumerate(arrays):
        assert engine.transfer_sync_write(peer.session, a.ctypes.data, peer.addr + i * 4096,
                                          4096) == 0
        assert peer.digest(i * 4096, 4096) == sha256(a)
    assert engine.batch_unregister_memory(addrs) == 0
    # Unregistered memory can no longer be a source.
    assert engine.transfer_sync_write(peer.session, addrs[0], peer.addr, 4096) < 0


def test_get_rpc_port_names_the_session_peers_use(pair):
    engine, buffer, _ = pair
    port = engine.get_rpc_port()
    assert 0 < port < 65536
    assert engine.get_session_id() == f"127.0.0.1:{port}"
