"""kvferry's exceptions: one class per C++ StatusCode, each carrying the code.

Every failing call of the Pythonic API (kvferry.Engine, kvferry.plan, the PD session classes)
raises a KvferryError subclass; ``err.code`` is a :class:`StatusCode` and ``err.message`` the
C++ message, which names the offending value. Classes also derive from the closest builtin
(ValueError, IndexError, ConnectionError, TimeoutError, ...) so generic handlers work.

The Mooncake-compatible :class:`kvferry.TransferEngine` never raises these: it returns
``-int(code)`` instead (0 on success), e.g. -2 for NotRegistered.
"""

import enum

from . import _kvferry

# Built from the C++ enum so the two can never disagree.
StatusCode = enum.IntEnum(
    "StatusCode", {name: int(value) for name, value in _kvferry.StatusCode.__members__.items()}
)

# The highest code (C++ kLastStatusCode), taken from the extension rather than repeated here.
LAST_STATUS_CODE = StatusCode(_kvferry.LAST_STATUS_CODE)


class KvferryError(Exception):
    """A failed kvferry call: ``code`` (StatusCode) and ``message``."""

    code = None

    def __init__(self, code, message):
        super().__init__(f"{StatusCode(code).name}: {message}")
        self.code = StatusCode(code)
        self.message = message


class InvalidArgumentError(KvferryError, ValueError):
    pass


class NotRegisteredError(KvferryError, ValueError):
    pass


class OutOfRangeError(KvferryError, IndexError):
    pass


class AlreadyExistsError(KvferryError, ValueError):
    pass


class FailedPreconditionError(KvferryError, RuntimeError):
    pass


class NotSupportedError(KvferryError, NotImplementedError):
    pass


class PeerUnreachableError(KvferryError, ConnectionError):
    pass


class PeerDisconnectedError(KvferryError, ConnectionError):
    pass


class TransferTimeoutError(KvferryError, TimeoutError):
    pass


class CancelledError(KvferryError, RuntimeError):
    pass


class UnauthenticatedError(KvferryError, PermissionError):
    pass


class ProtocolError(KvferryError, RuntimeError):
    pass


class InternalError(KvferryError, RuntimeError):
    pass


class DataCorruptedError(KvferryError, RuntimeError):
    pass


_CLASS_BY_CODE = {
    StatusCode.InvalidArgument: InvalidArgumentError,
    StatusCode.NotRegistered: NotRegisteredError,
    StatusCode.OutOfRange: OutOfRangeError,
    StatusCode.AlreadyExists: AlreadyExistsError,
    StatusCode.FailedPrecondition: FailedPreconditionError,
    StatusCode.NotSupported: NotSupportedError,
    StatusCode.PeerUnreachable: PeerUnreachableError,
    StatusCode.PeerDisconnected: PeerDisconnectedError,
    StatusCode.Timeout: TransferTimeoutError,
    StatusCode.Cancelled: CancelledError,
    StatusCode.Unauthenticated: UnauthenticatedError,
    StatusCode.ProtocolError: ProtocolError,
    StatusCode.Internal: InternalError,
    StatusCode.DataCorrupted: DataCorruptedError,
}


def error_from_status(code, message):
    """The exception instance for a C++ status (used by the extension's error translator)."""
    return _CLASS_BY_CODE.get(StatusCode(code), KvferryError)(code, message)
