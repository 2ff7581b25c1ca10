"""NIXL's metadata exchange, over its listener (``nixl_agent_config(enable_listen_thread=True,
listen_port=...)``) or through etcd (``NIXL_ETCD_ENDPOINTS``).

The listener answers peers that fetch its agent's metadata, load theirs (send) or drop theirs
(invalidate). kvferry speaks its own framing here; both ends are kvferry agents.

Wire: the listener greets each connection with a 32-byte nonce. The client sends one frame,
a u32 little-endian length and that many bytes of JSON: {"op": "fetch" | "send" |
"invalidate", "metadata": hex (send), "name": str (invalidate), "proof": hex}. The proof is
HMAC-SHA256(secret, nonce), required when the agent has a secret. The listener answers one
frame, {"ok": true, "metadata": hex} (fetch) or {"ok": false, "error": str}, and closes.

Bounds (one thread, selectors): a request larger than MAX_REQUEST_BYTES is refused unread; a
connection must deliver its request within IO_TIMEOUT_S of being accepted; at most
MAX_CONNECTIONS are open, the oldest closed to make room for a new one, so a flood of
connections that never send anything cannot lock out a peer. Sent metadata is checked on the
listener's thread and loaded (connecting to the sender's engine) on the agent's exchange
thread, at most Exchanges.MAX_QUEUED waiting; past that a send is answered "not ok".

Metadata loaded this way is a hint like any other: add_remote_agent connects to the peer's
engine, which proves who it is (and the secret, when set) before anything moves.
"""

import base64
import hashlib
import hmac
import json
import os
import queue
import selectors
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future

from ..errors import FailedPreconditionError, StatusCode
from .logging import get_logger

logger = get_logger("nixl._metadata")

MAX_REQUEST_BYTES = 1 << 20
MAX_CONNECTIONS = 64
IO_TIMEOUT_S = 5.0
NONCE_BYTES = 32


def _proof(secret, nonce):
    return hmac.new(secret, nonce, hashlib.sha256).hexdigest() if secret else ""


def _frame(obj):
    body = json.dumps(obj).encode()
    return struct.pack("<I", len(body)) + body


class _Connection:
    def __init__(self, sock, nonce):
        self.sock = sock
        self.nonce = nonce
        self.accepted = time.monotonic()
        self.inbox = bytearray()
        self.outbox = bytearray(nonce)
        self.answered = False


class MetadataListener:
    """The listener of one agent. `handle(request) -> reply` runs on the listener's thread."""

    def __init__(self, host, port, secret, handle):
        self._secret = secret
        self._handle = handle
        self._sock = socket.create_server((host, port), reuse_port=False, backlog=128)
        self._sock.setblocking(False)
        self.port = self._sock.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._connections = {}  # the listener thread's own
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="kvf-nixl-md", daemon=True)
        self._thread.start()
        logger.info("MD listener is listening on port %d", self.port)

    def close(self):
        """Stops the listener; it closes its port on its way out (at once when called from
        its own thread, as an agent collected there is)."""
        if self._stopping:
            return
        self._stopping = True
        os.write(self._wake_w, b"x")
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=IO_TIMEOUT_S)

    def _run(self):
        try:
            while not self._stopping:
                for key, events in self._selector.select(timeout=0.25):
                    if key.data is None:
                        self._accept()
                    elif key.data != "wake":
                        self._serve(key.data, events)
                self._expire()
        finally:
            for conn in list(self._connections.values()):
                self._drop(conn)
            self._selector.close()
            self._sock.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _accept(self):
        try:
            sock, _ = self._sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:  # out of descriptors, say: the next round tries again
            logger.warning("metadata listener: accept failed: %s", e)
            return
        if len(self._connections) >= MAX_CONNECTIONS:
            self._drop(min(self._connections.values(), key=lambda c: c.accepted))
        sock.setblocking(False)
        conn = _Connection(sock, os.urandom(NONCE_BYTES))
        self._connections[sock.fileno()] = conn
        self._selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)

    def _serve(self, conn, events):
        try:
            if events & selectors.EVENT_WRITE and conn.outbox:
                sent = conn.sock.send(conn.outbox)
                del conn.outbox[:sent]
                if not conn.outbox:
                    if conn.answered:
                        self._drop(conn)
                        return
                    self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
            if events & selectors.EVENT_READ and not conn.answered:
                data = conn.sock.recv(65536)
                if not data:
                    self._drop(conn)
                    return
                conn.inbox += data
                self._answer_if_complete(conn)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._drop(conn)

    def _answer_if_complete(self, conn):
        if len(conn.inbox) < 4:
            return
        (length,) = struct.unpack_from("<I", conn.inbox)
        if length > MAX_REQUEST_BYTES:
            self._reply(conn, {"ok": False, "error": f"request of {length} bytes exceeds "
                                                     f"{MAX_REQUEST_BYTES}"})
            return
        if len(conn.inbox) < 4 + length:
            return
        try:
            request = json.loads(bytes(conn.inbox[4:4 + length]))
            if not isinstance(request, dict):
                raise ValueError("not a JSON object")
            if self._secret and not hmac.compare_digest(
                    str(request.get("proof", "")), _proof(self._secret, conn.nonce)):
                reply = {"ok": False, "error": "no valid proof of the secret"}
            else:
                reply = self._handle(request)
        except Exception as e:  # noqa: BLE001 - a bad request is answered, never fatal
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        self._reply(conn, reply)

    def _reply(self, conn, reply):
        conn.answered = True
        conn.inbox.clear()
        conn.outbox += _frame(reply)
        self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)

    def _expire(self):
        now = time.monotonic()
        for conn in [c for c in self._connections.values()
                     if now - c.accepted > IO_TIMEOUT_S]:
            self._drop(conn)

    def _drop(self, conn):
        self._connections.pop(conn.sock.fileno(), None)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()


def request(host, port, secret, message, timeout_s=IO_TIMEOUT_S):
    """One request to an agent's listener; its reply (a dict). Raises OSError or
    ValueError when the peer does not answer as a listener does."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.settimeout(timeout_s)
        nonce = _recv_exactly(sock, NONCE_BYTES)
        sock.sendall(_frame(dict(message, proof=_proof(secret, nonce))))
        (length,) = struct.unpack("<I", _recv_exactly(sock, 4))
        if length > MAX_REQUEST_BYTES:
            raise ValueError(f"reply of {length} bytes exceeds {MAX_REQUEST_BYTES}")
        reply = json.loads(_recv_exactly(sock, length))
        if not isinstance(reply, dict):
            raise ValueError("reply is not a JSON object")
        return reply


def _recv_exactly(sock, n):
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the listener closed the connection")
        data += chunk
    return bytes(data)


class Exchanges:
    """The agent's outgoing exchanges, run one at a time on a daemon thread of their own (NIXL's
    fetch/send/invalidate return at once; check_remote_metadata polls for the result). Each
    submit returns a Future of its end; a failure is logged, as in NIXL."""

    MAX_QUEUED = 256

    def __init__(self):
        self._queue = queue.Queue(self.MAX_QUEUED)
        self._thread = threading.Thread(target=self._run, name="kvf-nixl-mdx", daemon=True)
        self._thread.start()

    def submit(self, what, fn):
        """The exchange's Future; FailedPreconditionError when MAX_QUEUED are waiting."""
        future = Future()
        try:
            self._queue.put_nowait((what, fn, future))
        except queue.Full:
            raise FailedPreconditionError(
                StatusCode.FailedPrecondition,
                f"{what}: {self.MAX_QUEUED} metadata exchanges are already queued") from None
        return future

    def close(self):
        try:
            self._queue.put_nowait(None)
        except queue.Full:  # the daemon thread ends with the process
            pass

    def _run(self):
        while (item := self._queue.get()) is not None:
            what, fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except Exception as e:  # noqa: BLE001 - NIXL logs a failed exchange
                logger.error("%s failed: %s", what, e)
                future.set_exception(e)


class Etcd:
    """Agents' metadata in etcd, as NIXL keeps it there: under NIXL_ETCD_NAMESPACE (default
    "/nixl/agents"), one key per agent and label, "<namespace>/<agent>/<label>". Through
    etcd's v3 JSON gateway; `endpoints` is NIXL_ETCD_ENDPOINTS ("http://host:port[,...]"),
    each tried in turn."""

    MAX_VALUE_BYTES = 1 << 20

    def __init__(self, endpoints, namespace):
        self._endpoints = [e.strip().rstrip("/") for e in endpoints.split(",") if e.strip()]
        self._namespace = namespace.rstrip("/")

    @classmethod
    def from_env(cls):
        """The etcd NIXL_ETCD_ENDPOINTS names, or None when it is unset."""
        endpoints = os.environ.get("NIXL_ETCD_ENDPOINTS", "")
        if not endpoints:
            return None
        return cls(endpoints, os.environ.get("NIXL_ETCD_NAMESPACE", "/nixl/agents"))

    def key(self, agent, label):
        return f"{self._namespace}/{agent}/{label}"

    def put(self, key, value):
        self._call("/v3/kv/put", {"key": _b64(key.encode()), "value": _b64(value)})

    def get(self, key):
        """The value at `key`, or None."""
        reply = self._call("/v3/kv/range", {"key": _b64(key.encode())})
        kvs = reply.get("kvs") or []
        return base64.b64decode(kvs[0].get("value", "")) if kvs else None

    def delete_prefix(self, prefix):
        start = prefix.encode()
        end = start[:-1] + bytes([start[-1] + 1])  # every key that starts with `prefix`
        self._call("/v3/kv/deleterange", {"key": _b64(start), "range_end": _b64(end)})

    def _call(self, path, body):
        failures = []
        for endpoint in self._endpoints:
            request = urllib.request.Request(endpoint + path, data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=IO_TIMEOUT_S) as response:
                    data = response.read(self.MAX_VALUE_BYTES * 2)
                reply = json.loads(data)
                if not isinstance(reply, dict):
                    raise ValueError("not a JSON object")
                return reply
            except (OSError, ValueError, urllib.error.URLError) as e:
                failures.append(f"{endpoint}: {e}")
        raise ConnectionError(f"etcd {path}: " + "; ".join(failures))


def _b64(data):
    return base64.b64encode(data).decode()
