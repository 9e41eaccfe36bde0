//! felix-client: the async Rust client (tokio + quinn) for a Felix broker.
//!
//! Owns: connecting, publishing, subscribing and capability negotiation from the client side.
//! Never does: run inside the broker, or assume anything of the broker beyond `docs/protocol.md`.
