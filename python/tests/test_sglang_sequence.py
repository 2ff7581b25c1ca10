"""sglang's Mooncake wrapper call sequence, with only its import changed, moves a paged KV
cache between two processes (prefill here, decode in a child process)."""

import numpy as np

from conftest import sha256
from sglang_style_engine import SglangStyleTransferEngine

LAYERS = 4
PAGES = 16
PAGE_BYTES = 4096


def test_sglang_call_sequence_moves_pages_between_processes(make_peer):
    decode = make_peer("sglang", LAYERS * PAGES * PAGE_BYTES, seed=3)

    prefill = SglangStyleTransferEngine("127.0.0.1", gpu_id=0)
    assert prefill.get_session_id() == f"127.0.0.1:{prefill.engine.get_rpc_port()}"
    kv = [np.random.default_rng(100 + layer).integers(0, 256, PAGES * PAGE_BYTES,
                                                      dtype=np.uint8) for layer in range(LAYERS)]
    assert prefill.batch_register([a.ctypes.data for a in kv], [a.nbytes for a in kv]) == 0

    # Prefill pages [2, 3, 9] go to decode pages [5, 6, 0] of every layer: one block per run.
    runs = [(2, 5, 2), (9, 0, 1)]
    buffers, peers, lengths = [], [], []
    for layer in range(LAYERS):
        decode_layer = decode.addr + layer * PAGES * PAGE_BYTES
        for src, dst, n in runs:
            buffers.append(kv[layer].ctypes.data + src * PAGE_BYTES)
            peers.append(decode_layer + dst * PAGE_BYTES)
            lengths.append(n * PAGE_BYTES)
    assert prefill.batch_transfer_sync(decode.session, buffers, peers, lengths) == 0

    for layer in range(LAYERS):
        decode_layer = layer * PAGES * PAGE_BYTES
        for src, dst, n in runs:
            expected = kv[layer][src * PAGE_BYTES:(src + n) * PAGE_BYTES]
            assert decode.digest(decode_layer + dst * PAGE_BYTES, n * PAGE_BYTES) == \
                sha256(expected)
    # A page no run wrote still holds decode's own bytes.
    assert decode.digest(PAGE_BYTES, PAGE_BYTES) == sha256(
        decode.initial[PAGE_BYTES:2 * PAGE_BYTES])

    # The single-transfer path of the wrapper too.
    assert prefill.transfer_sync(decode.session, kv[0].ctypes.data, decode.addr, 100) == 0
    assert decode.digest(0, 100) == sha256(kv[0][:100])
    assert prefill.batch_deregister([a.ctypes.data for a in kv]) == 0
