//! felix-proto: the Felix wire protocol.
//!
//! Owns: frame layouts, their encoding and decoding, limits and wire error codes.
//! Never does: any I/O, clock reads or allocation beyond what a decoded frame needs.
#![forbid(unsafe_code)]

pub mod ids;
pub mod record;

pub use ids::{CoreId, Offset, ShardId};
pub use record::{AckMode, Record};
