"""Felix's exceptions: one class per error code, all under :class:`FelixError`.

The native module raises them through :func:`_make`, by the code's name (the broker's
``ErrorCode`` names, and the Rust client's own error kinds).
"""

from __future__ import annotations


class FelixError(Exception):
    """Any error of the Felix client or broker.

    Attributes:
        code: the error's code name (``"StorageFull"``, ``"Timeout"``, ...).
        message: the broker's or client's message.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ConnectError(FelixError):
    """Connecting failed (address, handshake, nothing listening). Codes ``Resolve``,
    ``Connect``, ``PortUnreachable``."""


class CertificateRejected(ConnectError):
    """The broker's certificate was refused (wrong fingerprint, unknown CA, wrong name)."""


class Unauthorized(FelixError):
    """The token is missing, invalid, expired, or does not allow the action."""


class Unauthenticated(Unauthorized):
    """No token, where the broker requires one."""


class Forbidden(Unauthorized):
    """The token does not allow this action on this stream."""


class TokenExpired(Unauthorized):
    """The token has expired."""


class InvalidToken(Unauthorized):
    """The token is malformed or its signature does not verify."""


class ConfigError(FelixError, ValueError):
    """A client setting (argument or ``FELIX_*`` variable) is invalid or missing."""


class InvalidArgument(FelixError, ValueError):
    """A value is outside its allowed range."""


class InvalidName(InvalidArgument):
    """A stream or group name is invalid."""


class InvalidStreamName(InvalidName):
    """The stream name is not ``tenant/namespace/stream`` of allowed characters."""


class KeyTooLong(InvalidArgument):
    """A key is longer than the broker's limit."""


class RecordTooLarge(InvalidArgument):
    """A record does not fit in a frame within the broker's limits."""


class FrameTooLarge(RecordTooLarge):
    """A frame exceeded the broker's advertised limit."""


class TooManyRecords(InvalidArgument):
    """A batch has more records than the broker's limit."""


class InvalidShard(InvalidArgument):
    """The shard does not exist in the stream."""


class OffsetOutOfRange(InvalidArgument):
    """The offset is outside the shard's retained range."""


class StreamNotFound(FelixError, LookupError):
    """The stream does not exist."""


class StreamExists(FelixError):
    """The stream exists already, with other settings."""


class Timeout(FelixError):
    """An operation did not complete in time."""


class ConnectionLost(FelixError):
    """The connection carrying the operation was lost; its outcome is unknown."""


class Closed(FelixError):
    """The client or subscription was closed."""


class Unsupported(FelixError):
    """The broker does not support what the operation needs."""


class ProtocolError(FelixError):
    """Either side broke the protocol (``Protocol``, ``Malformed``, ``UnknownFrameType``,
    ``UnknownFlags``, ``FlagNotAdvertised``, ``UnsupportedVersion``, ``Unknown``)."""


class NotOwner(FelixError):
    """In a cluster: the shard kept moving while the client followed its owner."""


class ShardUnavailable(FelixError):
    """In a cluster: the shard's owner is down or fenced; nothing was stored. Retry later."""


class OutcomeUnknown(FelixError):
    """The shard's leader lost its leadership before committing the batch."""


class Overloaded(FelixError):
    """The broker is over a budget; retry later."""


class SlowConsumer(FelixError):
    """The subscriber fell too far behind and was disconnected."""


class StorageFull(FelixError):
    """The broker's disk is full (below its free-space floor)."""


class StorageFailed(FelixError):
    """The broker's storage failed."""


class Internal(FelixError):
    """The broker hit an internal error."""


class ShuttingDown(FelixError):
    """The broker is shutting down."""


class UnknownSubscription(FelixError):
    """The subscription is not known on this connection."""


class LimitReached(FelixError):
    """A connection-level limit was reached (streams, subscriptions)."""


class SequenceError(FelixError):
    """An idempotent batch's sequence number was out of order or too old
    (``OutOfOrderSequence``, ``SequenceTooOld``)."""


_BY_CODE: dict[str, type[FelixError]] = {
    "Resolve": ConnectError,
    "Connect": ConnectError,
    "PortUnreachable": ConnectError,
    "CertificateRejected": CertificateRejected,
    "Unauthenticated": Unauthenticated,
    "Forbidden": Forbidden,
    "TokenExpired": TokenExpired,
    "InvalidToken": InvalidToken,
    "Config": ConfigError,
    "InvalidArgument": InvalidArgument,
    "InvalidName": InvalidName,
    "InvalidStreamName": InvalidStreamName,
    "KeyTooLong": KeyTooLong,
    "RecordTooLarge": RecordTooLarge,
    "FrameTooLarge": FrameTooLarge,
    "TooManyRecords": TooManyRecords,
    "InvalidShard": InvalidShard,
    "OffsetOutOfRange": OffsetOutOfRange,
    "StreamNotFound": StreamNotFound,
    "StreamExists": StreamExists,
    "Timeout": Timeout,
    "ConnectionLost": ConnectionLost,
    "Closed": Closed,
    "Unsupported": Unsupported,
    "Protocol": ProtocolError,
    "Malformed": ProtocolError,
    "UnknownFrameType": ProtocolError,
    "UnknownFlags": ProtocolError,
    "FlagNotAdvertised": ProtocolError,
    "UnsupportedVersion": ProtocolError,
    "Unknown": ProtocolError,
    "NotOwner": NotOwner,
    "ShardUnavailable": ShardUnavailable,
    "OutcomeUnknown": OutcomeUnknown,
    "Overloaded": Overloaded,
    "SlowConsumer": SlowConsumer,
    "StorageFull": StorageFull,
    "StorageFailed": StorageFailed,
    "Internal": Internal,
    "ShuttingDown": ShuttingDown,
    "UnknownSubscription": UnknownSubscription,
    "LimitReached": LimitReached,
    "OutOfOrderSequence": SequenceError,
    "SequenceTooOld": SequenceError,
}


def _make(code: str, message: str) -> FelixError:
    """The exception for ``code`` (``FelixError`` itself for a code not listed)."""
    return _BY_CODE.get(code, FelixError)(code, message)
