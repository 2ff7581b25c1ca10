"""kvferry.plan: numpy page arrays in (uint32 read in place), calls out as read-only numpy
views of the C++ plan's own arrays, kept alive by the views."""

import gc

import numpy as np
import pytest

import kvferry

ITEM = 256  # bytes per page per entry


def layouts(entries=2, pages=64, src_base=0x10000, dst_base=0x900000):
    src = kvferry.KvLayout.from_pointers([src_base + e * pages * ITEM for e in range(entries)],
                                         [ITEM] * entries, [pages * ITEM] * entries)
    dst = kvferry.KvLayout.from_pointers([dst_base + e * pages * ITEM for e in range(entries)],
                                         [ITEM] * entries, [pages * ITEM] * entries)
    return src, dst


def test_page_runs_become_one_block_per_run_per_entry():
    src, dst = layouts()
    plan = kvferry.plan(src, dst, np.array([1, 2, 5], dtype=np.uint32),
                        np.array([11, 12, 15], dtype=np.uint32))
    assert (plan.num_calls, plan.num_blocks, plan.strategy) == (1, 4, "all_layers")
    s, d, n = plan.calls[0]
    entry1 = 64 * ITEM
    np.testing.assert_array_equal(
        s, [0x10000 + 1 * ITEM, 0x10000 + 5 * ITEM,
            0x10000 + entry1 + 1 * ITEM, 0x10000 + entry1 + 5 * ITEM])
    np.testing.assert_array_equal(
        d, [0x900000 + 11 * ITEM, 0x900000 + 15 * ITEM,
            0x900000 + entry1 + 11 * ITEM, 0x900000 + entry1 + 15 * ITEM])
    np.testing.assert_array_equal(n, [2 * ITEM, ITEM, 2 * ITEM, ITEM])
    assert plan.total_bytes == 6 * ITEM


def test_calls_are_read_only_views_that_keep_the_plan_alive():
    src, dst = layouts()
    plan = kvferry.plan(src, dst, np.arange(10, dtype=np.uint32), np.arange(10, dtype=np.uint32),
                        strategy="per_layer")
    calls = plan.calls
    assert len(calls) == 2 and len(plan) == 2
    s, d, n = calls[1]
    assert s.dtype == np.uint64 and not s.flags.owndata and not s.flags.writeable
    with pytest.raises(ValueError):
        s[0] = 1
    all_src, _, _ = plan.blocks
    # Views of one buffer: call 1's src starts where call 0's ended in the plan's array.
    assert s.__array_interface__["data"][0] == \
        all_src.__array_interface__["data"][0] + 8 * calls[0][0].size
    np.testing.assert_array_equal(plan.call_offsets, [0, 1, 2])
    expected = s.copy()
    del plan, calls, all_src
    gc.collect()
    np.testing.assert_array_equal(s, expected)  # the plan still lives under the view
    assert n[0] == 10 * ITEM


def test_page_arrays_are_read_in_place_or_converted_checked():
    pages = np.arange(8, dtype=np.uint32)
    assert kvferry.as_pages(pages) is pages
    int32 = np.arange(8, dtype=np.int32)
    view = kvferry.as_pages(int32)
    assert view.dtype == np.uint32 and np.shares_memory(view, int32)
    converted = kvferry.as_pages([3, 4, 5])
    assert converted.dtype == np.uint32
    with pytest.raises(kvferry.InvalidArgumentError, match="page -1"):
        kvferry.as_pages(np.array([0, -1], dtype=np.int64))
    with pytest.raises(kvferry.InvalidArgumentError, match="negative page"):
        kvferry.as_pages(np.array([0, -1], dtype=np.int32))
    with pytest.raises(kvferry.InvalidArgumentError):
        kvferry.as_pages(np.array([1 << 33]))
    src, dst = layouts()
    plan = kvferry.plan(src, dst, np.array([0, 1]), [4, 5])  # int64 and list inputs work
    assert plan.num_blocks == 2


def test_planner_errors_name_the_value():
    src, dst = layouts(pages=8)
    with pytest.raises(kvferry.OutOfRangeError):
        kvferry.plan(src, dst, np.array([100], dtype=np.uint32), np.array([0], dtype=np.uint32))
    with pytest.raises(kvferry.InvalidArgumentError, match="fast"):
        kvferry.plan(src, dst, [0], [0], strategy="fast")
    with pytest.raises(kvferry.InvalidArgumentError):
        kvferry.plan(src, dst, [0, 1], [0])


def test_index_sharded_and_deepseek_layout():
    src = kvferry.KvLayout.mla(num_layers=61, page_size_tokens=64, bytes_per_token=1152,
                               num_pages=256, base=0)
    dst = kvferry.KvLayout.mla(num_layers=61, page_size_tokens=64, bytes_per_token=1152,
                               num_pages=256, base=1 << 40)
    rng = np.random.default_rng(0)
    src_pages = rng.permutation(256)[:64].astype(np.uint32)
    dst_pages = rng.permutation(256)[:64].astype(np.uint32)
    plan = kvferry.plan(src, dst, src_pages, dst_pages, strategy="index_sharded",
                        max_pages_per_call=16)
    assert plan.num_calls == 4
    assert plan.total_bytes == 64 * 61 * 64 * 1152


def test_plan_executes_on_the_engine_with_bytes_verified():
    prefill = kvferry.Engine(transport="shm")
    decode = kvferry.Engine()
    pages, entries = 32, 3
    src_mem = prefill.shared_array(entries * pages * ITEM)
    dst_mem = decode.shared_array(entries * pages * ITEM)
    src_mem[:] = np.random.default_rng(1).integers(0, 256, src_mem.size, dtype=np.uint8)
    src_base, dst_base = src_mem.ctypes.data, dst_mem.ctypes.data
    src, dst = layouts(entries, pages, src_base, dst_base)
    src_pages = np.array([3, 4, 5, 9, 0], dtype=np.uint32)
    dst_pages = np.array([10, 11, 20, 21, 31], dtype=np.uint32)
    for strategy in ("all_layers", "per_layer"):
        dst_mem[:] = 0
        plan = kvferry.plan(src, dst, src_pages, dst_pages, strategy=strategy)
        prefill.execute_plan(plan, decode.endpoint)
        for e in range(entries):
            for s, d in zip(src_pages, dst_pages):
                so, do = (e * pages + s) * ITEM, (e * pages + d) * ITEM
                np.testing.assert_array_equal(dst_mem[do:do + ITEM], src_mem[so:so + ITEM])
        assert np.count_nonzero(dst_mem) <= entries * len(dst_pages) * ITEM
