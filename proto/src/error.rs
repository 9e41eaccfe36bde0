//! Wire error codes and decoding errors.

use crate::header::FrameType;
use crate::RequestId;

/// An error code carried by `Error` and `PublishError` frames.
///
/// Codes are stable: a retired code is never reused. `Unknown` (0) stands for a code this build
/// does not recognise; the frame's message is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// The peer sent a code this build does not know.
    Unknown = 0,
    /// A frame body could not be decoded.
    Malformed = 1,
    /// The protocol or frame version is not supported.
    UnsupportedVersion = 2,
    /// The frame type is not known.
    UnknownFrameType = 3,
    /// The frame carries a flag bit the receiver does not know.
    UnknownFlags = 4,
    /// The frame carries a flag bit the receiver knows but did not advertise.
    FlagNotAdvertised = 5,
    /// The frame is larger than the advertised limit.
    FrameTooLarge = 6,
    /// The batch has more records than the advertised limit.
    TooManyRecords = 7,
    /// The key is longer than the advertised limit.
    KeyTooLong = 8,
    /// The stream does not exist.
    StreamNotFound = 9,
    /// The stream exists already, with other settings.
    StreamExists = 10,
    /// The stream name is not `tenant/namespace/stream` of allowed characters.
    InvalidStreamName = 11,
    /// A request arrived before a successful Hello, or without a token where one is required.
    Unauthenticated = 12,
    /// The token does not allow this action on this stream.
    Forbidden = 13,
    /// The token has expired.
    TokenExpired = 14,
    /// The token is malformed or its signature does not verify.
    InvalidToken = 15,
    /// The shard does not exist in the stream.
    InvalidShard = 16,
    /// The broker is over a budget; retry later.
    Overloaded = 17,
    /// The subscriber fell too far behind and was disconnected.
    SlowConsumer = 18,
    /// The broker's disk is full.
    StorageFull = 19,
    /// Storage failed for another reason.
    StorageFailed = 20,
    /// The broker hit an internal error.
    Internal = 21,
    /// The broker is shutting down.
    ShuttingDown = 22,
    /// The requested offset is outside the shard's retained range.
    OffsetOutOfRange = 23,
    /// The subscription id is not known on this connection.
    UnknownSubscription = 24,
    /// A request names a value outside its allowed range (shard count, ack mode, start kind).
    InvalidArgument = 25,
    /// A connection-level limit was reached (streams, subscriptions).
    LimitReached = 26,
    /// The shard lives on another broker of the cluster; the message names it. A client that
    /// advertised `CLUSTER` gets a `NotOwner` frame with the owner's address instead.
    NotOwner = 27,
    /// The shard cannot be served now: its owner is down, or this broker cannot confirm its
    /// cluster membership (its lease) and so must not acknowledge writes. Retry later.
    ShardUnavailable = 28,
    /// An idempotent batch's sequence number is ahead of the next one the shard expects from
    /// its producer (an earlier batch is missing): send the earlier batches first.
    OutOfOrderSequence = 29,
    /// An idempotent batch's sequence number is older than the ones the shard remembers for
    /// its producer: its outcome is no longer known.
    SequenceTooOld = 30,
    /// The batch was appended by the shard's leader, which then lost its leadership or its
    /// lease before the batch was committed: a new leader may keep it or drop it. Unlike
    /// `ShardUnavailable`, this does not mean nothing was stored: resending is safe only for an
    /// idempotent producer (which the shard deduplicates); a plain producer that resends may
    /// store the batch twice.
    OutcomeUnknown = 31,
}

impl ErrorCode {
    /// Every known code, in numeric order.
    pub const ALL: [ErrorCode; 32] = [
        Self::Unknown,
        Self::Malformed,
        Self::UnsupportedVersion,
        Self::UnknownFrameType,
        Self::UnknownFlags,
        Self::FlagNotAdvertised,
        Self::FrameTooLarge,
        Self::TooManyRecords,
        Self::KeyTooLong,
        Self::StreamNotFound,
        Self::StreamExists,
        Self::InvalidStreamName,
        Self::Unauthenticated,
        Self::Forbidden,
        Self::TokenExpired,
        Self::InvalidToken,
        Self::InvalidShard,
        Self::Overloaded,
        Self::SlowConsumer,
        Self::StorageFull,
        Self::StorageFailed,
        Self::Internal,
        Self::ShuttingDown,
        Self::OffsetOutOfRange,
        Self::UnknownSubscription,
        Self::InvalidArgument,
        Self::LimitReached,
        Self::NotOwner,
        Self::ShardUnavailable,
        Self::OutOfOrderSequence,
        Self::SequenceTooOld,
        Self::OutcomeUnknown,
    ];

    /// The code for a wire value; unknown values become [`ErrorCode::Unknown`].
    pub fn from_u16(value: u16) -> Self {
        Self::ALL.get(usize::from(value)).copied().unwrap_or(Self::Unknown)
    }

    /// The wire value.
    pub fn as_u16(self) -> u16 {
        self as u16
    }
}

const _: () = {
    // ALL is indexed by value: keep it dense and in order.
    let mut i = 0;
    while i < ErrorCode::ALL.len() {
        assert!(ErrorCode::ALL[i] as usize == i);
        i += 1;
    }
};

/// Why a frame could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The first two bytes are not the Felix magic: the byte stream is not Felix framing.
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    /// The frame header's version is not one this build speaks.
    #[error("unsupported frame version {0}")]
    UnsupportedVersion(u8),
    /// The header names a frame type this build does not know.
    #[error("unknown frame type {0:#04x}")]
    UnknownFrameType(u8),
    /// The header carries flag bits that are not defined for this frame type.
    #[error("unknown flag bits {flags:#06x} on {frame_type:?}")]
    UnknownFlags {
        /// The frame's type.
        frame_type: FrameType,
        /// The offending bits.
        flags: u16,
    },
    /// The header carries flag bits that the receiver knows but did not advertise.
    #[error("flag bits {flags:#06x} on {frame_type:?} were not advertised")]
    FlagNotAdvertised {
        /// The frame's type.
        frame_type: FrameType,
        /// The offending bits.
        flags: u16,
    },
    /// The frame is larger than the limit.
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    FrameTooLarge {
        /// The frame's length, header included.
        len: u64,
        /// The limit.
        max: u32,
    },
    /// The body ended before `what` could be read.
    #[error("frame body truncated while reading {what}")]
    Truncated {
        /// The field being read.
        what: &'static str,
    },
    /// The body has bytes after its last field.
    #[error("{0} trailing bytes after the frame body")]
    TrailingBytes(usize),
    /// A batch has more records than the limit.
    #[error("batch of {count} records exceeds the limit of {max}")]
    TooManyRecords {
        /// The record count the frame claims.
        count: u64,
        /// The limit.
        max: u32,
    },
    /// A key is longer than the limit.
    #[error("key of {len} bytes exceeds the limit of {max}")]
    KeyTooLong {
        /// The key's length.
        len: usize,
        /// The limit.
        max: u16,
    },
    /// A length-prefixed field is longer than its fixed limit.
    #[error("{what} of {len} bytes exceeds the limit of {max}")]
    FieldTooLong {
        /// The field.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A text field is not UTF-8.
    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 {
        /// The field.
        what: &'static str,
    },
    /// A field holds a value outside its range.
    #[error("{what} has invalid value {value}")]
    InvalidValue {
        /// The field.
        what: &'static str,
        /// The value found.
        value: u64,
    },
}

impl DecodeError {
    /// The wire code that answers this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::BadMagic(_) | Self::Truncated { .. } | Self::TrailingBytes(_) => {
                ErrorCode::Malformed
            }
            Self::InvalidUtf8 { .. } => ErrorCode::Malformed,
            // The frame is intact (its length prefix was read); one field breaks a limit.
            Self::FieldTooLong { .. } => ErrorCode::InvalidArgument,
            Self::UnsupportedVersion(_) => ErrorCode::UnsupportedVersion,
            Self::UnknownFrameType(_) => ErrorCode::UnknownFrameType,
            Self::UnknownFlags { .. } => ErrorCode::UnknownFlags,
            Self::FlagNotAdvertised { .. } => ErrorCode::FlagNotAdvertised,
            Self::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
            Self::TooManyRecords { .. } => ErrorCode::TooManyRecords,
            Self::KeyTooLong { .. } => ErrorCode::KeyTooLong,
            Self::InvalidValue { .. } => ErrorCode::InvalidArgument,
        }
    }
}

/// A decoding error with what is known of the frame it came from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{error}")]
pub struct FrameError {
    /// The frame type, when the header could be read.
    pub frame_type: Option<FrameType>,
    /// The request id, when the body starts with one that could be read: answer with it.
    pub request_id: Option<RequestId>,
    /// Whether the framing is lost: the byte stream cannot be resynchronised and must be closed.
    /// When false, the bad frame has been skipped and the next frame can be read.
    pub fatal: bool,
    /// What went wrong.
    pub error: DecodeError,
}

impl FrameError {
    /// The wire code that answers this error.
    pub fn code(&self) -> ErrorCode {
        self.error.code()
    }
}
