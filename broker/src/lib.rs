//! felix-broker: the thread-per-core broker.
//!
//! Owns: the per-core executors, their QUIC endpoints, the core mesh, and the glue between the
//! wire protocol and storage. Never does: share mutable state between cores on the hot path;
//! cores exchange owned messages only.

pub mod net;
pub mod sys;
