"""``nixl._utils``: the test helpers NIXL's own tests and examples import (aligned host
buffers given as integer addresses)."""

import ctypes

_libc = ctypes.CDLL(None)
_libc.aligned_alloc.restype = ctypes.c_void_p
_libc.aligned_alloc.argtypes = (ctypes.c_size_t, ctypes.c_size_t)
_libc.free.argtypes = (ctypes.c_void_p,)

# NIXL aligns these for O_DIRECT storage I/O.
_ALIGNMENT = 4096


def malloc_passthru(size):
    """The address of `size` bytes of new host memory, 4 KiB aligned (0 when none is left)."""
    rounded = (int(size) + _ALIGNMENT - 1) // _ALIGNMENT * _ALIGNMENT
    return _libc.aligned_alloc(_ALIGNMENT, max(rounded, _ALIGNMENT)) or 0


def free_passthru(addr):
    _libc.free(ctypes.c_void_p(addr))


def ba_buf(addr, size):
    """Fills `size` bytes at `addr` with 0xba."""
    ctypes.memset(addr, 0xBA, size)


def verify_transfer(addr1, addr2, size):
    """Raises AssertionError unless the `size` bytes at the two addresses are equal."""
    assert ctypes.string_at(addr1, size) == ctypes.string_at(addr2, size), "buffers differ"
