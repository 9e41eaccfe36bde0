//! felix-storage: the durable logs of the shards that one core owns.
//!
//! Owns: the on-disk format, group commit, recovery, per-shard indexes and retention.
//! Never does: talk to the network, or share any state with another core. Everything in
//! this crate runs inside one glommio executor.
