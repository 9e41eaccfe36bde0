//! felix-bench: helpers for the benchmark scripts under `bench/` (physical limits, result files).
//!
//! Owns: measuring the machine's limits and writing results. Never does: run inside the broker.
