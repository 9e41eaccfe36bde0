//! Limits: every length on the wire is checked against one of these before anything is allocated.

/// The largest frame (header + body) a peer accepts unless it advertised less.
pub const MAX_FRAME_BYTES_DEFAULT: u32 = 8 * 1024 * 1024;
/// The most records one publish or event batch may carry unless advertised otherwise.
pub const MAX_BATCH_RECORDS_DEFAULT: u32 = 4096;
/// The longest key unless advertised otherwise.
pub const MAX_KEY_BYTES_DEFAULT: u16 = 1024;
/// The longest segment of a stream name (`tenant`, `namespace` or `stream`), in bytes.
pub const MAX_STREAM_SEGMENT_BYTES: usize = 64;
/// The longest stream name (`tenant/namespace/stream`), in bytes: three longest segments and
/// two `/`. Fixed by the protocol; the one limit every layer (wire, broker, storage, files)
/// enforces, so every valid name works end to end.
pub const MAX_STREAM_NAME_BYTES: usize = 3 * MAX_STREAM_SEGMENT_BYTES + 2;
/// The longest consumer group name, in bytes. Fixed by the protocol.
pub const MAX_GROUP_NAME_BYTES: usize = 255;
/// The longest auth token, in bytes. Fixed by the protocol.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// The longest human-readable error message, in bytes. Fixed by the protocol.
pub const MAX_MESSAGE_BYTES: usize = 4096;
/// The most shards a Subscribe may name, or a SubscribeOk may list.
pub const MAX_SUBSCRIBE_SHARDS: usize = 4096;
/// The most stream names one StreamList may carry.
pub const MAX_LISTED_STREAMS: usize = 4096;
/// The most shards a stream may have.
pub const MAX_SHARDS_PER_STREAM: u32 = 4096;

/// The limits a decoder enforces. A broker advertises its own in `HelloOk`; a client decodes
/// with the broker's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest frame, header included.
    pub max_frame_bytes: u32,
    /// The most records in one batch.
    pub max_batch_records: u32,
    /// The longest key.
    pub max_key_bytes: u16,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_frame_bytes: MAX_FRAME_BYTES_DEFAULT,
            max_batch_records: MAX_BATCH_RECORDS_DEFAULT,
            max_key_bytes: MAX_KEY_BYTES_DEFAULT,
        }
    }
}

const _: () = assert!(MAX_FRAME_BYTES_DEFAULT as usize > crate::header::HEADER_LEN);
const _: () = assert!(MAX_STREAM_NAME_BYTES <= u16::MAX as usize);
const _: () = assert!(MAX_TOKEN_BYTES <= u16::MAX as usize);
const _: () = assert!(MAX_MESSAGE_BYTES <= u16::MAX as usize);
