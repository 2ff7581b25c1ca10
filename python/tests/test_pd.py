"""The PD session layer from Python: bootstrap server, PrefillServer / KvSender on one side,
DecodeClient / KvReceiver on the other, C++ request states, bytes verified."""

import threading
import time

import numpy as np
import pytest

import kvferry
from kvferry import RequestState

LAYERS, PAGE_TOKENS, BYTES_PER_TOKEN, POOL_PAGES = 4, 4, 72, 32
PAGE_BYTES = PAGE_TOKENS * BYTES_PER_TOKEN
AUX_ROWS, AUX_ROW_BYTES = 8, 64
TIMEOUT_MS = 10_000


def make_rank(engine):
    kv_bytes = kvferry.KvLayout.mla_region_bytes(LAYERS, PAGE_TOKENS, BYTES_PER_TOKEN, POOL_PAGES)
    memory = engine.shared_array(kv_bytes + AUX_ROWS * AUX_ROW_BYTES)
    base = memory.ctypes.data
    layout = kvferry.KvLayout.mla(LAYERS, PAGE_TOKENS, BYTES_PER_TOKEN, POOL_PAGES, base)
    aux = [(base + kv_bytes, AUX_ROWS * AUX_ROW_BYTES, AUX_ROW_BYTES)]
    return memory, layout, aux, kv_bytes


def page(memory, layer, index):
    start = (layer * POOL_PAGES + index) * PAGE_BYTES
    return memory[start:start + PAGE_BYTES]


# Every PD test runs without a secret and with one (every plane authenticated: handshake,
# shm, control channel, signed bootstrap HTTP).
@pytest.fixture(params=[None, "py-pd-secret"], ids=["no-secret", "secret"])
def pd_pair(request):
    secret = request.param
    timeouts = kvferry.PdTimeouts(heartbeat_interval_ms=100, bootstrap_timeout_ms=5000,
                                  waiting_timeout_ms=5000)
    bootstrap = kvferry.BootstrapServer(secret=secret)
    prefill_engine = kvferry.Engine(name="prefill", secret=secret)
    decode_engine = kvferry.Engine(name="decode", secret=secret)
    p_mem, p_layout, p_aux, p_kv = make_rank(prefill_engine)
    d_mem, d_layout, d_aux, d_kv = make_rank(decode_engine)
    p_mem[:] = np.random.default_rng(5).integers(0, 256, p_mem.size, dtype=np.uint8)
    prefill = kvferry.PrefillServer(prefill_engine, p_layout, aux=p_aux,
                                    bootstrap_address=bootstrap.address, timeouts=timeouts,
                                    max_open_rooms=4096, max_open_rooms_per_decode=1024)
    decode = kvferry.DecodeClient(decode_engine, d_layout, aux=d_aux, timeouts=timeouts)
    yield bootstrap, prefill, decode, (p_mem, p_kv), (d_mem, d_kv)
    del prefill, decode
    bootstrap.stop()


def test_pd_round_trip_moves_pages_and_aux_row(pd_pair):
    bootstrap, prefill, decode, (p_mem, p_kv), (d_mem, d_kv) = pd_pair
    room = 42
    receiver = decode.create_receiver(bootstrap.address, room)
    sender = prefill.create_sender(room)
    assert receiver.room == room and sender.room == room

    src_pages = np.array([7, 8, 9, 20, 3], dtype=np.uint32)
    dst_pages = np.array([0, 1, 2, 30, 31], dtype=np.uint32)
    receiver.init(dst_pages, aux_row=2)
    assert sender.wait_at_least(RequestState.WAITING_FOR_INPUT, TIMEOUT_MS) in (
        RequestState.WAITING_FOR_INPUT, RequestState.TRANSFERRING)
    sender.send(src_pages[:2])                           # a page-aligned chunk
    sender.send(src_pages[2:], last=True, aux_row=5)     # the last chunk with its aux row

    assert sender.wait_final(TIMEOUT_MS) == RequestState.SUCCESS, sender.failure()
    assert receiver.wait_final(TIMEOUT_MS) == RequestState.SUCCESS, receiver.failure()
    assert receiver.failure() is None
    assert receiver.transfer_time_ns > 0
    for layer in range(LAYERS):
        for s, d in zip(src_pages, dst_pages):
            np.testing.assert_array_equal(page(d_mem, layer, d), page(p_mem, layer, s))
    aux_src = p_kv + 5 * AUX_ROW_BYTES
    aux_dst = d_kv + 2 * AUX_ROW_BYTES
    np.testing.assert_array_equal(d_mem[aux_dst:aux_dst + AUX_ROW_BYTES],
                                  p_mem[aux_src:aux_src + AUX_ROW_BYTES])
    # The servers count a request when they retire it, just after its state became final.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (prefill.stats()["requests_succeeded"] == 0
                                           or decode.stats()["requests_succeeded"] == 0):
        time.sleep(0.01)
    assert prefill.stats()["requests_succeeded"] == 1
    assert decode.stats()["requests_succeeded"] == 1
    assert prefill.stats()["open_rooms"] == 0  # the finished room is not held


def test_abort_fails_both_sides_with_a_reason(pd_pair):
    bootstrap, prefill, decode, _, _ = pd_pair
    receiver = decode.create_receiver(bootstrap.address, 7)
    sender = prefill.create_sender(7)
    receiver.init(np.arange(4, dtype=np.uint32))
    assert sender.wait_at_least(RequestState.WAITING_FOR_INPUT, TIMEOUT_MS) != \
        RequestState.FAILED
    receiver.abort("client went away")
    receiver.wait_abort_acked(TIMEOUT_MS)
    assert receiver.poll() == RequestState.FAILED
    assert isinstance(receiver.failure(), kvferry.KvferryError)
    assert sender.wait_final(TIMEOUT_MS) == RequestState.FAILED
    with pytest.raises(kvferry.KvferryError):
        sender.send(np.arange(4, dtype=np.uint32), last=True)


def test_sender_errors_raise_typed_exceptions(pd_pair):
    bootstrap, prefill, decode, _, _ = pd_pair
    sender = prefill.create_sender(9)
    with pytest.raises(kvferry.AlreadyExistsError):
        prefill.create_sender(9)
    # Decode has not given its pages yet.
    with pytest.raises(kvferry.FailedPreconditionError):
        sender.send(np.arange(2, dtype=np.uint32))
    with pytest.raises(kvferry.InvalidArgumentError):
        decode.create_receiver("not an address", 10)


def test_waits_release_the_gil():
    """A thread blocked in a kvferry wait leaves the interpreter to other threads."""
    bootstrap = kvferry.BootstrapServer()  # no prefill rank ever registers
    engine = kvferry.Engine()
    _, layout, aux, _ = make_rank(engine)
    decode = kvferry.DecodeClient(engine, layout, aux=aux)
    receiver = decode.create_receiver(bootstrap.address, 1)
    waited = {}

    def wait():
        start = time.monotonic()
        waited["state"] = receiver.wait_final(500)
        waited["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=wait)
    thread.start()
    spins, deadline = 0, time.monotonic() + 0.3
    while time.monotonic() < deadline:
        spins += 1
    thread.join(timeout=5)
    assert waited["state"] == RequestState.BOOTSTRAPPING
    assert waited["seconds"] >= 0.45
    # With the GIL held by the waiting thread this loop would barely have run.
    assert spins > 10_000
    receiver.abort("test over")
    bootstrap.stop()


def test_a_decode_without_the_secret_is_refused():
    timeouts = kvferry.PdTimeouts(heartbeat_interval_ms=100, bootstrap_timeout_ms=2000,
                                  waiting_timeout_ms=2000)
    bootstrap = kvferry.BootstrapServer(secret="py-pd-secret")
    prefill_engine = kvferry.Engine(name="prefill", secret="py-pd-secret")
    decode_engine = kvferry.Engine(name="decode")
    p_mem, p_layout, p_aux, _ = make_rank(prefill_engine)
    d_mem, d_layout, d_aux, _ = make_rank(decode_engine)
    prefill = kvferry.PrefillServer(prefill_engine, p_layout, aux=p_aux,
                                    bootstrap_address=bootstrap.address, timeouts=timeouts)
    decode = kvferry.DecodeClient(decode_engine, d_layout, aux=d_aux, timeouts=timeouts)
    receiver = decode.create_receiver(bootstrap.address, 5)
    # init reports a failure that came before it (the bootstrap's refusal may arrive first);
    # otherwise the request fails after it. Either way it ends Failed, Unauthenticated.
    try:
        receiver.init(np.array([0, 1], dtype=np.uint32))
    except kvferry.UnauthenticatedError:
        assert receiver.poll() == RequestState.FAILED
    assert receiver.wait_final(TIMEOUT_MS) == RequestState.FAILED
    assert isinstance(receiver.failure(), kvferry.UnauthenticatedError), receiver.failure()
    del prefill, decode
    bootstrap.stop()
