//! felix-broker: the thread-per-core broker.
//!
//! Owns: the per-core executors, their QUIC endpoints (`net`), the core mesh and the broker
//! logic between the wire protocol and storage (`app`), configuration (`config`) and the admin
//! thread (`admin`). Never does: share mutable state between cores on the hot path; cores
//! exchange owned messages only. Every `unsafe` block and raw syscall lives in `sys`.

pub mod admin;
pub mod app;
pub mod config;
pub mod net;
pub mod ready;
pub mod sys;
