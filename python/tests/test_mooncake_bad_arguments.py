"""Bad pointers, sizes and arguments through the Mooncake-compatible API (and KvLayout) are
errors, never crashes or exceptions: every call returns its negative code (batch id 0 for the
async ones) and get_last_error() names the argument. Calls that would crash the process if
the check were missing run in a child interpreter, so a crash fails the test instead of
killing pytest."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import PROCESS_TIMEOUT_S, seeded_bytes
from kvferry import StatusCode
from kvferry.engine import TransferEngine

INVALID = -int(StatusCode.InvalidArgument)
NOT_REGISTERED = -int(StatusCode.NotRegistered)

# What every child script starts with: an initialized engine and libc's mmap/munmap.
CHILD_PROLOGUE = """
import ctypes
from kvferry.engine import TransferEngine
engine = TransferEngine()
assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS = 3, 0x22
"""


def run_in_child(script):
    """Runs CHILD_PROLOGUE + script in a fresh interpreter; returns its stdout. A crash (a
    signal: negative return code) or an assertion there fails the calling test."""
    result = subprocess.run([sys.executable, "-c", CHILD_PROLOGUE + textwrap.dedent(script)],
                            capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert result.returncode == 0, (
        f"child exited with {result.returncode} (negative: killed by that signal)\n"
        f"{result.stdout}\n{result.stderr}")
    return result.stdout


@pytest.fixture
def engine():
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    return engine


def test_a_garbage_pointer_to_write_bytes_to_buffer_is_an_error_not_a_crash():
    out = run_in_child("""
        import numpy as np
        unregistered = np.zeros(4096, dtype=np.uint8)
        for dest in (0, 8, 0x1000, 0xdead_beef_0000, 2**64 - 4, unregistered.ctypes.data):
            assert engine.write_bytes_to_buffer(dest, b"crash?", 6) == -2, hex(dest)
            assert "not inside one registered region" in engine.get_last_error().message
        assert not unregistered.any()
        print("survived")
    """)
    assert out.strip() == "survived"


def test_a_garbage_pointer_to_read_bytes_from_buffer_is_an_error_not_a_crash():
    out = run_in_child("""
        for source in (0, 0x1000, 0xdead_beef_0000, 2**64 - 4):
            assert engine.read_bytes_from_buffer(source, 64) == -2, hex(source)
        print("survived")
    """)
    assert out.strip() == "survived"


def test_byte_helpers_on_memory_unmapped_while_registered_are_errors_not_crashes():
    out = run_in_child("""
        addr = libc.mmap(None, 8192, PROT_READ_WRITE, MAP_PRIVATE_ANONYMOUS, -1, 0)
        assert engine.register_memory(addr, 8192) == 0
        assert libc.munmap(addr, 8192) == 0  # without unregistering it
        assert engine.write_bytes_to_buffer(addr + 100, b"crash?", 6) == -2
        assert "not mapped" in engine.get_last_error().message, engine.get_last_error()
        assert engine.read_bytes_from_buffer(addr, 8192) == -2
        print("survived")
    """)
    assert out.strip() == "survived"


def test_write_and_read_bytes_inside_registered_memory_move_every_byte(engine):
    buffer = seeded_bytes(31, 1 << 16)
    original = buffer.copy()
    assert engine.register_memory(buffer.ctypes.data, buffer.nbytes) == 0
    data = seeded_bytes(32, 5000).tobytes()
    assert engine.write_bytes_to_buffer(buffer.ctypes.data + 100, data, len(data)) == 0
    assert buffer[100:5100].tobytes() == data
    assert np.array_equal(buffer[:100], original[:100])
    assert np.array_equal(buffer[5100:], original[5100:])
    assert engine.read_bytes_from_buffer(buffer.ctypes.data + 100, len(data)) == data
    # A prefix of src_ptr, as Mooncake copies `length` bytes of it.
    assert engine.write_bytes_to_buffer(buffer.ctypes.data, bytearray(b"abcdef"), 3) == 0
    assert buffer[:3].tobytes() == b"abc" and buffer[3] == original[3]
    # A range that runs past the region's end is refused whole: nothing is written.
    before = buffer.copy()
    tail = buffer.ctypes.data + buffer.nbytes - 10
    assert engine.write_bytes_to_buffer(tail, b"x" * 20, 20) == NOT_REGISTERED
    assert engine.read_bytes_from_buffer(tail, 20) == NOT_REGISTERED
    assert np.array_equal(buffer, before)
    # Memory the engine allocated is registered too.
    managed = engine.allocate_managed_buffer(4096)
    assert managed != 0
    assert engine.write_bytes_to_buffer(managed, data, 4096) == 0
    assert engine.read_bytes_from_buffer(managed, 4096) == data[:4096]


def test_registering_unmapped_memory_is_an_error_not_a_later_crash(engine):
    assert engine.register_memory(0x1000, 4096) == INVALID
    message = engine.get_last_error().message
    assert "[0x1000, +4096)" in message and "not mapped in this process" in message


def test_a_negative_length_to_transfer_sync_write_is_an_error_not_a_type_error(engine):
    buffer = np.zeros(4096, dtype=np.uint8)
    assert engine.register_memory(buffer.ctypes.data, buffer.nbytes) == 0
    session = engine.get_session_id()
    assert engine.transfer_sync_write(session, buffer.ctypes.data, buffer.ctypes.data, -1) == \
        INVALID
    assert "length -1 out of range" in engine.get_last_error().message


# (call, arguments, what the error names): {addr} is a registered buffer, {session} the
# engine itself.
BAD_CALLS = [
    ("register_memory", ("{addr}", -5), "capacity -5"),
    ("register_memory", (-1, 4096), "buffer_addr -1"),
    ("register_memory", ("{addr}", 4096.0), "capacity must be an integer"),
    ("register_memory", ("{addr}", 4096, 7), "location must be a string"),
    ("unregister_memory", (None,), "buffer_addr must be an integer"),
    ("batch_register_memory", (["{addr}"], [-1]), "capacities[0] -1"),
    ("batch_register_memory", (["{addr}", "x"], [1, 1]), "buffer_addresses[1]"),
    ("batch_register_memory", (5, [1]), "buffer_addresses must be a list"),
    ("batch_unregister_memory", ([2**64],), "buffer_addresses[0] 18446744073709551616"),
    ("free_managed_buffer", (-1, 0), "buffer_addr -1"),
    ("write_bytes_to_buffer", ("{addr}", b"abc", -1), "length -1"),
    ("write_bytes_to_buffer", ("{addr}", b"abc", 10), "exceeds the 3 bytes"),
    ("write_bytes_to_buffer", ("{addr}", 12345, 3), "src_ptr must be bytes-like"),
    ("read_bytes_from_buffer", ("{addr}", -1), "length -1"),
    ("transfer_sync_write", ("{session}", "{addr}", "{addr}", -1), "length -1"),
    ("transfer_sync_write", (123, "{addr}", "{addr}", 1), "target_hostname must be a string"),
    ("transfer_sync_read", ("{session}", -1, "{addr}", 1), "buffer -1"),
    ("transfer_sync_read", ("{session}", "{addr}", 2**64, 1), "peer_buffer_address"),
    ("transfer_sync", ("{session}", "{addr}", "{addr}", 1, 7), "opcode 7"),
    ("batch_transfer_sync_write", ("{session}", ["{addr}"], ["{addr}"], [-1]), "lengths[0] -1"),
    ("batch_transfer_sync_write", ("{session}", ["{addr}"], ["{addr}"], [1.5]), "lengths[0]"),
    ("batch_transfer_sync_read", ("{session}", ["{addr}"], [-8], [1]),
     "peer_buffer_addresses[0] -8"),
    ("send_probe", (None,), "target_hostname must be a string"),
    ("get_batch_transfer_status", ([[1]],), "unknown batch id"),
    ("get_batch_transfer_status", (None,), "batch_ids must be a list"),
]


@pytest.mark.parametrize("call,arguments,named", BAD_CALLS,
                         ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(BAD_CALLS)])
def test_a_bad_argument_to_any_mooncake_call_is_a_negative_code_not_an_exception(
        engine, call, arguments, named):
    buffer = np.zeros(4096, dtype=np.uint8)
    assert engine.register_memory(buffer.ctypes.data, buffer.nbytes) == 0
    fill = {"{addr}": buffer.ctypes.data, "{session}": engine.get_session_id()}

    def resolve(value):
        if isinstance(value, list):
            return [resolve(v) for v in value]
        return fill.get(value, value) if isinstance(value, str) else value

    assert getattr(engine, call)(*[resolve(a) for a in arguments]) == INVALID
    error = engine.get_last_error()
    assert error.code == StatusCode.InvalidArgument
    assert named in error.message, error.message


def test_a_bad_argument_to_an_async_call_is_batch_id_zero_not_an_exception(engine):
    buffer = np.zeros(4096, dtype=np.uint8)
    assert engine.register_memory(buffer.ctypes.data, buffer.nbytes) == 0
    addr, session = buffer.ctypes.data, engine.get_session_id()
    assert engine.batch_transfer_async_write(session, [addr], [addr], [-1]) == 0
    assert "lengths[0] -1" in engine.get_last_error().message
    assert engine.transfer_submit_write(session, addr, addr, 2**64) == 0
    assert engine.allocate_managed_buffer(-1) == 0
    assert engine.transfer_check_status("x") == -1  # Mooncake's "failed"
    assert "unknown batch id" in engine.get_last_error().message


def test_a_bad_initialize_argument_is_a_negative_code_not_an_exception():
    engine = TransferEngine()
    assert engine.initialize(123, "P2PHANDSHAKE", "tcp", "") == INVALID
    assert "local_hostname must be a string" in engine.get_last_error().message
    assert engine.initialize("127.0.0.1", None, "tcp", "") == INVALID
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", 5, "") == INVALID
    assert engine.get_engine() is None


def test_a_huge_layer_count_to_kv_layout_is_a_value_error_not_a_16_gib_allocation():
    # Capped below what the missing check would allocate, so a regression fails here (with a
    # MemoryError) instead of taking the machine's memory.
    out = run_in_child("""
        import resource
        import kvferry
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
        cases = [
            (lambda: kvferry.KvLayout.mla(2**31, 64, 1152, 4, 0), "num_layers 2147483648"),
            (lambda: kvferry.KvLayout.mla(61, 64, 1152, 2**40, 0), "num_pages 1099511627776"),
            (lambda: kvferry.KvLayout.mha(2**20, 1, 1, 1, 1, 1, 1, 0), "num_layers 1048576"),
            (lambda: kvferry.KvLayout.mha(1, 2**20, 2**20, 2**20, 1, 1, 1, 0), "a K page"),
            (lambda: kvferry.KvLayout.mla_region_bytes(2**31, 1, 1, 1), "num_layers"),
        ]
        for make, named in cases:
            try:
                make()
            except kvferry.InvalidArgumentError as error:
                assert isinstance(error, ValueError)
                assert named in error.message, error.message
            else:
                raise AssertionError(f"accepted: {named}")
        print("refused")
    """)
    assert out.strip() == "refused"


def test_kv_layout_counts_at_their_limits_still_build():
    import kvferry

    layout = kvferry.KvLayout.mla(61, 64, 1152, 2**32, 1 << 40)
    assert layout.num_entries == 61 and layout.num_pages == 2**32
