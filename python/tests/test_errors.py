"""Errors: the Mooncake facade returns -int(StatusCode) (documented in kvferry/mooncake.py);
the Pythonic Engine raises the kvferry.errors class carrying the code."""

import logging
import socket

import numpy as np
import pytest

import kvferry
from kvferry import StatusCode, mooncake
from kvferry.engine import TransferEngine


def unused_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unknown_protocol_returns_minus_one_and_logs_its_name(caplog):
    engine = TransferEngine()
    with caplog.at_level(logging.ERROR, logger="kvferry"):
        assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "infiniband", "") == -1
    assert "unknown protocol 'infiniband'" in caplog.text
    assert engine.get_last_error().code == StatusCode.InvalidArgument
    # Nothing was started: every other call reports FailedPrecondition.
    assert engine.get_rpc_port() == -int(StatusCode.FailedPrecondition)


def test_rdma_protocol_is_accepted_and_routes_each_op(caplog):
    engine = TransferEngine()
    with caplog.at_level(logging.WARNING, logger="kvferry"):
        assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_0") == 0
    assert engine.get_rpc_port() > 0


def test_a_mooncake_protocol_kvferry_does_not_serve_fails_naming_it_and_the_offer(caplog):
    engine = TransferEngine()
    with caplog.at_level(logging.ERROR, logger="kvferry"):
        assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "efa", "") == -1
    message = engine.get_last_error().message
    assert "protocol 'efa' is a Mooncake transport kvferry does not serve" in message
    assert "kvferry offers: auto, rdma, shm, tcp, cma" in message
    assert "protocol 'efa'" in caplog.text
    assert engine.get_engine() is None


def test_bad_metadata_server_fails_initialize():
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "zookeeper://127.0.0.1:1", "tcp", "") < 0
    assert isinstance(engine.get_last_error(), kvferry.KvferryError)


def test_unregistered_addresses_return_not_registered(make_peer):
    peer = make_peer("tcp", 1 << 16)
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    registered = np.zeros(4096, dtype=np.uint8)
    unregistered = np.zeros(4096, dtype=np.uint8)
    assert engine.register_memory(registered.ctypes.data, registered.nbytes) == 0
    not_registered = -int(StatusCode.NotRegistered)
    # Local source outside every region.
    assert engine.transfer_sync_write(peer.session, unregistered.ctypes.data, peer.addr,
                                      64) == not_registered
    assert "outside every registered region" in engine.get_last_error().message
    # Remote target outside what the peer advertises.
    assert engine.transfer_sync_write(peer.session, registered.ctypes.data,
                                      peer.addr + peer.length, 64) == not_registered
    # Async: batch id 0.
    assert engine.batch_transfer_async_write(peer.session, [unregistered.ctypes.data],
                                             [peer.addr], [64]) == 0
    # Unregistering what was never registered.
    assert engine.unregister_memory(unregistered.ctypes.data) == not_registered
    # Overlapping registration.
    assert engine.register_memory(registered.ctypes.data + 8, 8) == -int(StatusCode.AlreadyExists)
    # Mismatched batch lists.
    assert engine.batch_transfer_sync_write(peer.session, [registered.ctypes.data],
                                            [peer.addr, peer.addr], [1]) == \
        -int(StatusCode.InvalidArgument)
    # Peer bytes untouched by all of the above.
    assert peer.digest(0, peer.length) == __import__("conftest").sha256(peer.initial)


def test_dead_peer_returns_peer_unreachable_or_disconnected(make_peer):
    peer = make_peer("tcp", 1 << 16)
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buffer = np.zeros(4096, dtype=np.uint8)
    assert engine.register_memory(buffer.ctypes.data, buffer.nbytes) == 0
    assert engine.transfer_sync_write(peer.session, buffer.ctypes.data, peer.addr, 64) == 0
    peer.kill()
    gone = {-int(StatusCode.PeerUnreachable), -int(StatusCode.PeerDisconnected)}
    assert engine.transfer_sync_write(peer.session, buffer.ctypes.data, peer.addr, 64) in gone
    # After the failure the peer is forgotten; the next call tries afresh and fails the same way.
    assert engine.transfer_sync_read(peer.session, buffer.ctypes.data, peer.addr, 64) in gone
    # A port nobody listens on.
    assert engine.transfer_sync_write(f"127.0.0.1:{unused_port()}", buffer.ctypes.data, 0,
                                      64) == -int(StatusCode.PeerUnreachable)


def test_unknown_batch_id_is_an_error():
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "auto", "") == 0
    assert engine.get_batch_transfer_status([12345]) == -int(StatusCode.InvalidArgument)
    assert engine.transfer_check_status(12345) == -1


def test_pythonic_engine_raises_typed_errors_with_codes():
    engine = kvferry.Engine()
    buffer = np.zeros(4096, dtype=np.uint8)
    with pytest.raises(kvferry.NotRegisteredError) as raised:
        engine.unregister_memory(buffer.ctypes.data)
    assert raised.value.code == StatusCode.NotRegistered
    assert isinstance(raised.value, ValueError)
    with pytest.raises(kvferry.PeerUnreachableError) as raised:
        engine.write(f"127.0.0.1:{unused_port()}", [buffer.ctypes.data], [0], [8])
    assert raised.value.code == StatusCode.PeerUnreachable
    assert isinstance(raised.value, ConnectionError)
    with pytest.raises(kvferry.InvalidArgumentError):
        kvferry.Engine(transport="carrier-pigeon")


def test_registered_context_manager_unregisters_on_exit():
    engine = kvferry.Engine()
    a = np.arange(4096, dtype=np.uint8)
    b = np.zeros(4096, dtype=np.uint8)
    with engine.registered(a, b) as regions:
        assert regions == [(a.ctypes.data, 4096), (b.ctypes.data, 4096)]
        # local transport: the engine's own endpoint.
        engine.write(engine.endpoint, [a.ctypes.data], [b.ctypes.data], [4096])
        np.testing.assert_array_equal(a, b)
        with pytest.raises(kvferry.AlreadyExistsError):
            engine.register_memory(a.ctypes.data, 16)
    with pytest.raises(kvferry.NotRegisteredError):
        engine.unregister_memory(a.ctypes.data)
    # An exception inside the block still unregisters.
    with pytest.raises(RuntimeError):
        with engine.registered(a):
            raise RuntimeError("boom")
    engine.register_memory(a.ctypes.data, a.nbytes)
    engine.unregister_memory(a.ctypes.data)


def test_every_status_code_up_to_the_last_has_its_own_exception_class():
    from kvferry import errors

    assert errors.LAST_STATUS_CODE == max(StatusCode)
    for code in range(1, int(errors.LAST_STATUS_CODE) + 1):
        err = errors.error_from_status(code, "x")
        assert type(err) is not errors.KvferryError, StatusCode(code).name
        assert err.code == code


def test_rdma_means_ucx_where_hardware_rma_is_present_else_tcp_with_one_warning(
        caplog, monkeypatch):
    # The seam that decides "hardware RMA present" (no RDMA device on these machines).
    monkeypatch.setattr(TransferEngine, "_rdma_warned", False)
    monkeypatch.setattr(mooncake, "_hardware_rma_here", lambda: True)
    with caplog.at_level(logging.WARNING, logger="kvferry"):
        engine = TransferEngine()
        assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_0") == 0
    assert "protocol 'rdma'" not in caplog.text
    assert not TransferEngine._rdma_warned

    monkeypatch.setattr(mooncake, "_hardware_rma_here", lambda: False)
    with caplog.at_level(logging.WARNING, logger="kvferry"):
        for _ in range(2):
            engine = TransferEngine()
            assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_0") == 0
    assert caplog.text.count("protocol 'rdma': UCX here has no hardware RMA transport") == 1
    # Routed either way: the engine picks ucx per peer only where both sides have hardware RMA.
    assert engine.get_engine() is not None

