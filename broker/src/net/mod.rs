//! The per-core QUIC endpoint: SO_REUSEPORT sockets, connection-ID steering and the sans-IO
//! quinn-proto driver.

pub mod cid;
pub mod steering;
