"""A second process for the tests: a kvferry.TransferEngine (Mooncake API) holding one
registered buffer of seeded random bytes.

    python3 peer_process.py PROTOCOL NBYTES SEED

PROTOCOL "sglang" runs sglang_style_engine.SglangStyleTransferEngine (its "rdma" protocol,
batch_register) instead of calling the API directly.

Prints one JSON line {"session", "addr", "length"}, then answers stdin commands, one per line:
``digest OFFSET LENGTH`` (sha256 hex of that part of its buffer) and ``quit``.
"""

import ctypes
import hashlib
import json
import sys

import numpy as np

from kvferry.engine import TransferEngine


def main():
    protocol, nbytes, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if protocol == "sglang":
        from sglang_style_engine import SglangStyleTransferEngine

        wrapper = SglangStyleTransferEngine("127.0.0.1", gpu_id=0)
        engine = wrapper.engine
        buffer = np.empty(nbytes, dtype=np.uint8)
        addr = buffer.ctypes.data
        assert wrapper.batch_register([addr], [nbytes]) == 0
    else:
        engine = TransferEngine()
        if engine.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") != 0:
            print(json.dumps({"error": str(engine.get_last_error())}), flush=True)
            return 1
    if protocol == "sglang":
        pass
    elif protocol == "shm":
        addr = engine.allocate_managed_buffer(nbytes)
        buffer = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(addr))
    else:
        buffer = np.empty(nbytes, dtype=np.uint8)
        addr = buffer.ctypes.data
        assert engine.register_memory(addr, nbytes) == 0
    buffer[:] = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    session = f"127.0.0.1:{engine.get_rpc_port()}"
    print(json.dumps({"session": session, "addr": addr, "length": nbytes}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "digest":
            offset, length = int(words[1]), int(words[2])
            digest = hashlib.sha256(buffer[offset:offset + length].tobytes()).hexdigest()
            print(digest, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
