//! felix-client: the async Rust client (tokio + quinn) for a Felix broker.
//!
//! Owns: connecting (TLS trust, Hello/HelloOk, a pool of connections spread over the broker's
//! cores, reconnect with backoff), cluster routing (seed addresses, placement from Metadata, a
//! pool per broker, following NotOwner), publishing (batching, keys, ack modes), subscribing (start
//! positions, consumer groups, commits), capability negotiation from the client side, the
//! `FELIX_*` configuration and the `felix publish|subscribe|streams` commands.
//! Never does: run inside the broker, assume anything of the broker beyond `docs/protocol.md`,
//! or write a frame carrying a flag bit the broker did not advertise (see `conn`'s
//! `encode_checked`). `docs/client.md` is the user guide.
// One unsafe call, in `timer` (registering the linger timerfd with tokio's reactor).
#![deny(unsafe_code)]

mod batch;
pub mod cli;
mod client;
pub mod cluster;
pub mod config;
mod conn;
pub mod error;
mod pool;
mod producer;
pub mod publisher;
mod race;
mod resend;
pub mod send_stats;
mod socket;
pub mod subscriber;
pub(crate) mod timer;
pub mod tls;
mod worker;

pub use client::{Client, QuicStats, StreamDescription, COVER_ATTEMPTS_PER_CONNECTION};
pub use config::{CertFingerprint, ClientConfig, PublishSettings, Trust, ENV_KEYS};
pub use error::{ClientError, ConfigError};
pub use felix_proto::{
    AckMode, Capabilities, CoreId, Offset, Record, Retention, ShardId, ShardOwner, StartAt,
};
pub use publisher::{PublishResult, PublishTicket, Publisher, Receipt};
pub use send_stats::{SendStats, SendStatsReader};
pub use subscriber::{ReceivedRecord, SubscribeOptions, Subscriber, SubscriptionState};
