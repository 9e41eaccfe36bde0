//! felix-loadgen: the load generator that drives and measures Felix brokers.
//!
//! Owns: workloads (publish, subscribe/fanout, mixed, soak) run by pinned worker threads that
//! each have their own runtime and client, the per-second sampling of the broker's `/metrics`
//! and /proc, per-worker HDR histograms, the JSON result, `merge` of several generators'
//! results, plots, and the AES-GCM limit benchmark.
//! Never does: count its own send rate as throughput (the broker's stored bytes are the
//! figure), or share a runtime or connection between workers.
//! `docs/loadgen.md` is the user guide.

pub mod aead;
pub mod config;
pub mod metrics;
pub mod plot;
pub mod report;
pub mod run;
pub mod sys;
pub mod worker;
