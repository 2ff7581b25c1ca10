"""Shared fixtures: a peer process (peer_process.py) and local buffers for either protocol."""

import ctypes
import hashlib
import json
import os
import select
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_configure(config):
    """KVFERRY_PYTHON_PREFIX (scripts/test.sh's pip pass): the module under test must be the
    one installed there, not a build tree's."""
    prefix = os.environ.get("KVFERRY_PYTHON_PREFIX")
    if prefix:
        import kvferry
        where = os.path.realpath(kvferry.__file__)
        if not where.startswith(os.path.realpath(prefix) + os.sep):
            raise pytest.UsageError(f"kvferry imported from {where}, not from {prefix}")


# Every wait on another process is bounded by this.
PROCESS_TIMEOUT_S = 20

# NIXL agents listen on loopback in these tests (children inherit it), unless a test asks for
# every interface: it removes this and first waits for wait_for_any_address_port.
os.environ.setdefault("KVFERRY_LISTEN_ADDRESS", "127.0.0.1:0")


def wait_for_any_address_port(timeout_s=90):
    """Waits until a listener on every interface can take a port of its own. Such a listener
    needs a port that no socket holds on any address, where a loopback one needs it free on
    127.0.0.1 only; the flood tests connect from 20 loopback addresses, and once all agents
    here failed to bind 0.0.0.0:0 (EADDRINUSE) right after them in a CI run."""
    import socket
    import time
    deadline = time.monotonic() + timeout_s
    while True:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", 0))
                return
            except OSError as e:
                assert time.monotonic() < deadline, f"no port free on every address: {e}"
        time.sleep(0.5)


def stop_process(pid, timeout_s=PROCESS_TIMEOUT_S):
    """SIGSTOP, then waits until every thread of the process is stopped (the signal takes
    effect asynchronously: a thread may still answer a request in between)."""
    import glob
    import signal
    import time
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s

    def state(stat_path):
        with open(stat_path) as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    while not all(state(p) in ("T", "t") for p in glob.glob(f"/proc/{pid}/task/*/stat")):
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.001)


def seeded_bytes(seed, nbytes):
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def sha256(array):
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


class ScriptProcess:
    """A test script of this folder in a child process, driven by lines on its stdin; it answers
    each command with one line. Every wait is bounded (PROCESS_TIMEOUT_S unless told)."""

    def __init__(self, script, args, launcher=(), env=None):
        """`launcher`: words that run the script elsewhere (another network namespace, say);
        `env`: variables set for it besides this process's."""
        env = dict(os.environ, KVFERRY_LOG_LEVEL=os.environ.get("KVFERRY_LOG_LEVEL", "warn"),
                   **(env or {}))
        self.name = script
        self.process = subprocess.Popen(
            list(launcher) + [sys.executable, os.path.join(HERE, script)] + [str(a) for a in args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def _readline(self, timeout=PROCESS_TIMEOUT_S):
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        assert ready, f"{self.name} did not answer in time"
        line = self.process.stdout.readline()
        assert line, f"{self.name} exited"
        return line

    def command(self, text, timeout=PROCESS_TIMEOUT_S):
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()
        return self._readline(timeout)

    def digest(self, offset, length):
        return self.command(f"digest {offset} {length}").strip()

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=PROCESS_TIMEOUT_S)

    def close(self):
        if self.process.poll() is None:
            try:
                self.process.stdin.write("quit\n")
                self.process.stdin.flush()
                self.process.wait(timeout=PROCESS_TIMEOUT_S)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        self.kill()


class PeerProcess(ScriptProcess):
    """peer_process.py running in a child process; its buffer starts as seeded_bytes(seed)."""

    def __init__(self, protocol, nbytes, seed):
        super().__init__("peer_process.py", [protocol, nbytes, seed])
        hello = json.loads(self._readline())
        assert "error" not in hello, hello
        self.session, self.addr, self.length = hello["session"], hello["addr"], hello["length"]
        self.initial = seeded_bytes(seed, nbytes)


@pytest.fixture
def make_peer():
    peers = []

    def make(protocol, nbytes=1 << 20, seed=7):
        peer = PeerProcess(protocol, nbytes, seed)
        peers.append(peer)
        return peer

    yield make
    for peer in peers:
        peer.close()


def local_buffer(engine, protocol, nbytes):
    """A numpy uint8 buffer registered with `engine` (Mooncake API), shared memory for shm."""
    if protocol == "shm":
        addr = engine.allocate_managed_buffer(nbytes)
        assert addr != 0
        return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(addr))
    buffer = np.zeros(nbytes, dtype=np.uint8)
    assert engine.register_memory(buffer.ctypes.data, nbytes) == 0
    return buffer
