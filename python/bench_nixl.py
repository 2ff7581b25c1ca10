"""kvferry.nixl (NIXL's Python API) against the same work done by the C++ engine directly.

    PYTHONPATH=build/python /usr/bin/python3 python/bench_nixl.py [--rounds 5] [--append FILE]

Two cases, each as descriptors per second and the ratio C++ / Python (> 1: Python is slower):

* prep: get_xfer_descs + prep_xfer_dlist of 1,000,000 descriptors given as an Nx3 uint64
  numpy array (as vLLM builds them). C++ reference: the same flat columns built from the same
  array in a C++ loop (_kvferry.nixl_reference_desc_list_ns).
* transfer: make_prepped_xfer + transfer + check_xfer_state polling until DONE of 100,000
  64-byte READs of random blocks, between two agents of this process (the cma route). C++
  reference: ops gathered from the same index arrays, one TransferEngine::submit, one wait
  (NixlAgent.reference_transfer_ns), on the same engines and memory.

Both are measured in the same process, interleaved round by round; each figure is the median.

--pull adds vLLM's pull flow as latency: a decode agent READs 1 MiB in 256 random 4 KiB blocks
from a prefill agent of another process with a notification, and polls check_xfer_state to
DONE; p50 and p99 over --pull-reads reads, same host (the engine's route) and over tcp, for
DONE as NIXL has it (the notification queued) and for DONE on the prefill's acknowledgement
(acknowledged_notifications=True), interleaved; then up to 50 same-host reads, queued, while
the prefill is stopped (SIGSTOP).
"""

import argparse
import os
import platform
import select
import signal
import statistics
import subprocess
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

from kvferry import _kvferry  # noqa: E402
from kvferry.nixl._api import nixl_agent, nixl_agent_config  # noqa: E402

PREP_DESCS = 1_000_000
XFER_DESCS = 100_000
DESC_BYTES = 64


PULL_BLOCKS = 256
PULL_BLOCK_BYTES = 4096
PULL_POOL_BLOCKS = 4096


def pull_prefill():
    """The prefill side of --pull, run as a child: one agent, one region of seeded blocks;
    prints its metadata and address, drains notifications until stdin closes."""
    agent = nixl_agent("prefill", nixl_agent_config(num_threads=4, capture_telemetry=True))
    region = np.random.default_rng(3).integers(0, 256, PULL_POOL_BLOCKS * PULL_BLOCK_BYTES,
                                               dtype=np.uint8)
    agent.register_memory(agent.get_reg_descs([(region.ctypes.data, region.nbytes, 0, "")],
                                              "DRAM"))
    print(agent.get_agent_metadata().hex(), region.ctypes.data, flush=True)
    while not select.select([sys.stdin], [], [], 0.01)[0]:
        agent.get_new_notifs()
    sys.stdin.read()


def pull_latency(reads):
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--pull-prefill"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, KVFERRY_LOG_LEVEL="error"))
    try:
        metadata, addr = child.stdout.readline().split()
        metadata, addr = bytes.fromhex(metadata), int(addr)
        want = np.random.default_rng(3).integers(0, 256, PULL_POOL_BLOCKS * PULL_BLOCK_BYTES,
                                                 dtype=np.uint8)
        cases = {}
        for route in ("same host", "tcp"):
            for acknowledged in (False, True):
                agent = nixl_agent(f"decode-{route}-{acknowledged}", nixl_agent_config(
                    num_threads=4, transport="tcp" if route == "tcp" else None,
                    acknowledged_notifications=acknowledged))
                buffer = np.zeros(PULL_BLOCKS * PULL_BLOCK_BYTES, dtype=np.uint8)
                agent.register_memory(agent.get_reg_descs(
                    [(buffer.ctypes.data, buffer.nbytes, 0, "")], "DRAM"))
                name = agent.add_remote_agent(metadata)
                local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", _rows(
                    buffer.ctypes.data, PULL_BLOCKS, PULL_BLOCK_BYTES), "DRAM")
                remote = agent.prep_xfer_dlist(name, _rows(addr, PULL_POOL_BLOCKS,
                                                           PULL_BLOCK_BYTES), "DRAM")
                cases[(route, acknowledged)] = (agent, buffer, local, remote, [])
        rng = np.random.default_rng(4)
        want = want.reshape(-1, PULL_BLOCK_BYTES)

        def read(agent, buffer, local, remote, times, notif):
            """One timed READ of random blocks, its bytes checked."""
            ids = rng.permutation(PULL_POOL_BLOCKS)[:PULL_BLOCKS].astype(np.int64)
            t = time.perf_counter_ns()
            x = agent.make_prepped_xfer("READ", local, np.arange(PULL_BLOCKS), remote, ids,
                                        notif_msg=notif)
            state = agent.transfer(x)
            while state == "PROC":
                state = agent.check_xfer_state(x)
            times.append(time.perf_counter_ns() - t)
            assert state == "DONE", agent.xfer_error(x)
            agent.release_xfer_handle(x)
            got = buffer.reshape(PULL_BLOCKS, PULL_BLOCK_BYTES)
            assert np.array_equal(got, want[ids]), "bytes differ"

        for i in range(reads):
            for case in cases.values():
                read(*case, b"req-%d" % i)
        # The same reads from the stopped prefill (SIGSTOP): same host, queued DONE only (an
        # acknowledged one waits for the prefill, and tcp needs it to send the bytes).
        agent, buffer, local, remote, _ = cases[("same host", False)]
        stalled = []
        os.kill(child.pid, signal.SIGSTOP)
        try:
            for i in range(min(reads, 50)):
                read(agent, buffer, local, remote, stalled, b"stalled-%d" % i)
        finally:
            os.kill(child.pid, signal.SIGCONT)
        cases[("same host, prefill stopped", False)] = (None, None, None, None, stalled)
        lines = ["| route | DONE when | p50 µs | p99 µs |", "|---|---|---:|---:|"]
        for (route, acknowledged), (_, _, _, _, times) in cases.items():
            times = sorted(times)
            lines.append(f"| {route} | {'acknowledged' if acknowledged else 'queued (NIXL)'} | "
                         f"{times[len(times) // 2] / 1e3:,.0f} | "
                         f"{times[min(len(times) - 1, len(times) * 99 // 100)] / 1e3:,.0f} |")
        return "\n".join(lines)
    finally:
        child.stdin.close()
        child.wait(timeout=20)


def _rows(base, n, size):
    r = np.zeros((n, 3), dtype=np.uint64)
    r[:, 0] = base + np.arange(n, dtype=np.uint64) * size
    r[:, 1] = size
    return r


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--append", help="append a markdown table to this file")
    parser.add_argument("--pull", action="store_true", help="also measure the pull-flow READ")
    parser.add_argument("--pull-reads", type=int, default=400)
    parser.add_argument("--pull-prefill", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pull_prefill:
        return pull_prefill()

    pool = XFER_DESCS * 4
    a = nixl_agent("bench-decode", nixl_agent_config(num_threads=2))
    b = nixl_agent("bench-prefill", nixl_agent_config(num_threads=2))
    local_mem = np.zeros(pool * DESC_BYTES, dtype=np.uint8)
    remote_mem = np.random.default_rng(1).integers(0, 256, pool * DESC_BYTES, dtype=np.uint8)
    a.register_memory(a.get_reg_descs([(local_mem.ctypes.data, local_mem.nbytes, 0, "")], "DRAM"))
    b.register_memory(b.get_reg_descs([(remote_mem.ctypes.data, remote_mem.nbytes, 0, "")],
                                      "DRAM"))
    a.add_remote_agent(b.get_agent_metadata())

    def rows(base, n):
        return _rows(base, n, DESC_BYTES)

    prep_rows = rows(remote_mem.ctypes.data, PREP_DESCS)
    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", rows(local_mem.ctypes.data, pool), "DRAM")
    remote = a.prep_xfer_dlist("bench-prefill", rows(remote_mem.ctypes.data, pool), "DRAM")
    rng = np.random.default_rng(2)

    results = {"prep": ([], []), "transfer": ([], [])}
    for _ in range(args.rounds):
        results["prep"][0].append(_kvferry.nixl_reference_desc_list_ns(prep_rows))
        t = time.perf_counter_ns()
        h = a.prep_xfer_dlist("bench-prefill", a.get_xfer_descs(prep_rows, "DRAM"))
        results["prep"][1].append(time.perf_counter_ns() - t)
        a.release_dlist_handle(h)

        local_ids = rng.permutation(pool)[:XFER_DESCS].astype(np.int64)
        remote_ids = rng.permutation(pool)[:XFER_DESCS].astype(np.int64)
        results["transfer"][0].append(a._core.reference_transfer_ns(
            "bench-prefill", local, local_ids, remote, remote_ids))
        local_mem[:] = 0
        t = time.perf_counter_ns()
        x = a.make_prepped_xfer("READ", local, local_ids, remote, remote_ids)
        a.transfer(x)
        state = a.check_xfer_state(x)
        while state == "PROC":
            state = a.check_xfer_state(x)
        results["transfer"][1].append(time.perf_counter_ns() - t)
        assert state == "DONE", a.xfer_error(x)
        a.release_xfer_handle(x)
        got = local_mem.reshape(pool, DESC_BYTES)[local_ids]
        want = remote_mem.reshape(pool, DESC_BYTES)[remote_ids]
        assert np.array_equal(got, want), "bytes differ"

    lines = [f"| case | descriptors | C++ descs/s | Python descs/s | C++ / Python |",
             "|---|---:|---:|---:|---:|"]
    for name, n in (("prep", PREP_DESCS), ("transfer", XFER_DESCS)):
        cxx = statistics.median(results[name][0])
        py = statistics.median(results[name][1])
        label = ("get_xfer_descs + prep_xfer_dlist" if name == "prep" else
                 "make_prepped_xfer + transfer + completion (64 B READs)")
        lines.append(f"| {label} | {n:,} | {n / cxx * 1e9:,.0f} | {n / py * 1e9:,.0f} | "
                     f"{py / cxx:.2f} |")
    table = "\n".join(lines)
    print(table)
    print(f"({args.rounds} rounds, medians; {platform.python_implementation()} "
          f"{platform.python_version()}, numpy {np.__version__})")
    if args.pull:
        pull = pull_latency(args.pull_reads)
        print(pull)
        print(f"(pull flow: {args.pull_reads} reads of {PULL_BLOCKS} x {PULL_BLOCK_BYTES} B "
              "per case, interleaved)")
        table += "\n\n" + pull
    if args.append:
        with open(args.append, "a") as f:
            f.write("\n" + table + "\n")


if __name__ == "__main__":
    main()
