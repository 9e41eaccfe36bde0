//! The per-core QUIC endpoint: SO_REUSEPORT sockets, connection-ID steering and the sans-IO
//! quinn-proto driver.

pub mod cid;
pub mod config;
pub mod conn;
pub mod core;
pub mod driver;
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
pub use server::{CoreContext, Server, ServerHandle, StartError};
pub use stats::{CoreStatsSnapshot, NetSnapshot};
