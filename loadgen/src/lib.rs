//! felix-loadgen: the load generator that drives and measures Felix brokers.
//!
//! Owns: workloads, per-worker histograms and the reports built from them.
//! Never does: count its own send rate as throughput; the broker's stored bytes are the figure.
