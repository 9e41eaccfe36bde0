//! The per-core QUIC endpoint: SO_REUSEPORT sockets, connection-ID steering, one sans-IO core
//! state per executor around quinn-proto (`core`) and the glommio shell that does its I/O
//! (`driver`). See `docs/net.md`.

pub mod cid;
pub mod config;
pub mod conn;
pub(crate) mod core;
pub(crate) mod driver;
mod recv;
pub mod server;
pub mod stats;
pub mod steering;
pub mod tls;
mod transmit;

#[cfg(test)]
mod pair;
#[cfg(test)]
mod tests;

pub use config::{NetConfig, TlsSource};
pub use conn::{Connection, ReadError, RecvStream, SendStream, WriteError};
pub use core::ConnectError;
pub use server::{CoreContext, Server, ServerHandle, StartError};
pub use stats::{CoreStatsSnapshot, NetSnapshot};
