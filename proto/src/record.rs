//! Records and ack modes: the vocabulary that the protocol and storage share.

use bytes::Bytes;

use crate::payload::Payload;

/// One record: an optional key and a payload. Both are zero-copy slices of received buffers
/// (the payload of a published record is the slices of the QUIC chunks it arrived in).
///
/// An empty key (`Some(Bytes::new())`) is a key and differs from no key (`None`).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Record {
    /// The record's key, if it has one.
    pub key: Option<Bytes>,
    /// The record's payload.
    pub value: Payload,
}

impl Record {
    /// A record without a key.
    pub fn unkeyed(value: impl Into<Payload>) -> Self {
        Self { key: None, value: value.into() }
    }

    /// A record with a key.
    pub fn keyed(key: impl Into<Bytes>, value: impl Into<Payload>) -> Self {
        Self { key: Some(key.into()), value: value.into() }
    }
}

/// When the broker acknowledges a publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum AckMode {
    /// No acknowledgement is sent.
    None = 0,
    /// After the write of the batch completed (it may still be in the page cache).
    Written = 1,
    /// After the fdatasync covering the batch completed.
    #[default]
    Durable = 2,
}

impl AckMode {
    /// The mode for a wire byte, or `None` if the byte names no mode.
    pub fn from_u8(byte: u8) -> Option<Self> {
        match byte {
            0 => Some(Self::None),
            1 => Some(Self::Written),
            2 => Some(Self::Durable),
            _ => None,
        }
    }
}
