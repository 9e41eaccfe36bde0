//! Connection-ID layout: every CID the broker issues names the core that owns the connection.
