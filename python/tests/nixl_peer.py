"""A second process for the kvferry.nixl tests: one nixl_agent with one registered region.

    python3 nixl_peer.py NAME NBYTES SEED [--scribble]

The region starts as conftest.seeded_bytes(SEED) (zeros when SEED < 0). The agent is created
exactly as vLLM's NixlConnector creates one. Prints one JSON line {"metadata" (hex), "addr",
"length"}, then answers stdin commands, one per line:

* ``wait N TIMEOUT_S``: drains get_new_notifs until N notifications arrived; for each, the
  sha256 of the whole region at the moment it was drained; with --scribble the region is
  overwritten once all N arrived (as vLLM's prefill frees and reuses blocks once every consumer is done), so a
  notification that arrived before a read had finished would corrupt what the reader got.
  (Scribbled once all N arrived: prefill frees blocks after one notification per consumer.)
  Answers {"notifs": {sender: [hex, ...]}, "digests": [...]}.
* ``digest OFFSET LENGTH`` (sha256 hex), ``quit``.
"""

import hashlib
import json
import sys
import time

import numpy as np

from kvferry.nixl._api import nixl_agent, nixl_agent_config


def main():
    name, nbytes, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    scribble = "--scribble" in sys.argv[4:]
    if seed >= 0:
        region = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    else:
        region = np.zeros(nbytes, dtype=np.uint8)
    # As vLLM's NixlConnector creates its agent: no kvferry option.
    agent = nixl_agent(name, nixl_agent_config(num_threads=4, capture_telemetry=True))
    agent.register_memory(agent.get_reg_descs([(region.ctypes.data, nbytes, 0, "")], "DRAM"))
    print(json.dumps({"metadata": agent.get_agent_metadata().hex(), "addr": region.ctypes.data,
                      "length": nbytes}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        if words[0] == "digest":
            offset, length = int(words[1]), int(words[2])
            print(hashlib.sha256(region[offset:offset + length].tobytes()).hexdigest(), flush=True)
        elif words[0] == "wait":
            want, deadline = int(words[1]), time.monotonic() + float(words[2])
            notifs, digests, count = {}, [], 0
            while count < want and time.monotonic() < deadline:
                new = agent.get_new_notifs()
                for sender, messages in new.items():
                    for message in messages:
                        digests.append(hashlib.sha256(region.tobytes()).hexdigest())
                        notifs.setdefault(sender, []).append(message.hex())
                        count += 1
                if scribble and count >= want:
                    region[:] = 0xEE  # every consumer is done: the blocks are reused
                if not new:
                    time.sleep(0.002)
            print(json.dumps({"notifs": notifs, "digests": digests}), flush=True)


if __name__ == "__main__":
    main()
