"""kvferry.plan from numpy vs the pure C++ planner, for a deepseek-v3 128k-token request.

    PYTHONPATH=build/python /usr/bin/python3 python/bench_plan.py [--rounds 30] [--append FILE]

deepseek-v3: MLA, 61 layers, 1152 bytes per token per layer, page size 64, so 2048 pages out
of a pool four times larger, drawn at random (the planner's worst case: no page runs). The C++
figure is measured in the same process by kvferry._kvferry.time_build_plan_ns (a C++ loop with
no Python in it), interleaved with the Python measurements so machine drift hits both. Each
figure is the median over rounds. Ratios > 1 mean Python costs more.
"""

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np

# Run as a script, this file's folder (python/, the package sources without the built
# extension) would shadow build/python on the import path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import kvferry  # noqa: E402
from kvferry import _kvferry  # noqa: E402

LAYERS, PAGE_TOKENS, BYTES_PER_TOKEN, TOKENS = 61, 64, 1152, 131072


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--append", help="append a markdown table to this file")
    args = parser.parse_args()

    pages = TOKENS // PAGE_TOKENS
    pool = pages * 4
    src = kvferry.KvLayout.mla(LAYERS, PAGE_TOKENS, BYTES_PER_TOKEN, pool, base=0)
    dst = kvferry.KvLayout.mla(LAYERS, PAGE_TOKENS, BYTES_PER_TOKEN, pool, base=1 << 40)
    rng = np.random.default_rng(1)
    src_pages = rng.permutation(pool)[:pages].astype(np.uint32)
    dst_pages = rng.permutation(pool)[:pages].astype(np.uint32)
    src_pages64, dst_pages64 = src_pages.astype(np.int64), dst_pages.astype(np.int64)

    cases = {
        "C++ build_transfer_plan (no Python)": [],
        "kvferry.plan, uint32 pages (in place)": [],
        "kvferry.plan + plan.calls (numpy views)": [],
        "kvferry.plan, int64 pages (converted)": [],
    }
    names = list(cases)
    blocks = 0
    for _ in range(args.rounds):
        cases[names[0]].append(statistics.median(
            _kvferry.time_build_plan_ns(src, dst, src_pages, dst_pages, iterations=5)))
        for name, pages_in, views in ((names[1], (src_pages, dst_pages), False),
                                      (names[2], (src_pages, dst_pages), True),
                                      (names[3], (src_pages64, dst_pages64), False)):
            start = time.perf_counter_ns()
            plan = kvferry.plan(src, dst, *pages_in)
            if views:
                calls = plan.calls
            elapsed = time.perf_counter_ns() - start
            blocks = plan.num_blocks
            if views:
                del calls
            del plan  # freeing the plan is outside the timed region, as in the C++ loop
            cases[name].append(elapsed)

    reference = statistics.median(cases[names[0]])
    lines = [
        f"deepseek-v3 {TOKENS // 1024}k tokens, random pages, all_layers: {pages} pages, "
        f"{blocks} blocks; median of {args.rounds} rounds",
        "",
        "| case | time | vs C++ |",
        "|---|---|---|",
    ]
    for name in names:
        median = statistics.median(cases[name])
        lines.append(f"| {name} | {median / 1000:.0f} µs | {median / reference:.2f}x |")
    report = "\n".join(lines)
    print(report)
    if args.append:
        with open(args.append, "a", encoding="utf-8") as out:
            out.write(f"\n## {time.strftime('%Y-%m-%d')} on {platform.node()} "
                      f"({os.cpu_count()} CPUs, Python {platform.python_version()}, "
                      f"numpy {np.__version__})\n\n")
            out.write("`PYTHONPATH=build/python /usr/bin/python3 python/bench_plan.py "
                      f"--rounds {args.rounds} --append {args.append}`\n\n")
            out.write(report + "\n")


if __name__ == "__main__":
    main()
