//! Errors: one enum for configuration, one for everything a connected client can meet.
//!
//! Both are `Clone` so that one failure (a lost connection, a refused batch) can be handed to
//! every record of the batch it concerns.

use felix_proto::{ErrorCode, ShardId, ShardOwner};

/// A configuration value is missing, malformed or out of range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// An environment variable holds a value that does not parse.
    #[error("{key}={value:?}: {reason}")]
    InvalidEnv {
        /// The variable.
        key: &'static str,
        /// Its value.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// A setting is outside its allowed range.
    #[error("{field}: {reason}")]
    OutOfRange {
        /// The setting.
        field: &'static str,
        /// The allowed range.
        reason: String,
    },
    /// More than one way of trusting the broker was configured.
    #[error("choose one of FELIX_CA_FILE, FELIX_CERT_FINGERPRINT, FELIX_DANGER_ACCEPT_ANY_CERT")]
    ConflictingTrust,
    /// Both `FELIX_TOKEN` and `FELIX_TOKEN_FILE` are set.
    #[error("choose one of FELIX_TOKEN, FELIX_TOKEN_FILE")]
    ConflictingToken,
    /// The token file could not be read or is empty.
    #[error("token file {path}: {reason}")]
    TokenFile {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// No way of trusting the broker was configured.
    #[error(
        "no trust configured: set a CA file (FELIX_CA_FILE), a certificate fingerprint \
         (FELIX_CERT_FINGERPRINT), or explicitly FELIX_DANGER_ACCEPT_ANY_CERT=1"
    )]
    NoTrust,
    /// The CA or certificate file could not be read or holds no certificate.
    #[error("CA file {path}: {reason}")]
    CaFile {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// A certificate fingerprint is not 32 bytes of hex.
    #[error("fingerprint {0:?} is not a SHA-256 digest in hex (64 digits, colons allowed)")]
    Fingerprint(String),
    /// The TLS configuration could not be built.
    #[error("TLS configuration: {0}")]
    Tls(String),
}

/// Why a client operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The configuration is invalid (displayed as the [`ConfigError`] alone: it names the
    /// setting).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The broker address did not resolve.
    #[error("cannot resolve {addr}: {reason}")]
    Resolve {
        /// The address as configured.
        addr: String,
        /// What went wrong.
        reason: String,
    },
    /// The QUIC or TLS handshake failed for a reason other than certificate verification.
    #[error("connect failed: {0}")]
    Connect(String),
    /// Nothing listens on the broker's UDP port: the host answered a datagram with an ICMP
    /// port unreachable (the connection attempt fails at once instead of at the timeout).
    #[error(
        "{addr} refused the connection (ICMP port unreachable: nothing listens on that UDP port)"
    )]
    PortUnreachable {
        /// The address tried.
        addr: std::net::SocketAddr,
    },
    /// The broker's certificate was refused (wrong pin, unknown CA, wrong name).
    #[error("broker certificate rejected: {0}")]
    CertificateRejected(String),
    /// The broker answered Hello with an error (version, token).
    #[error("broker refused the connection: {code:?}: {message}")]
    Refused {
        /// The broker's code.
        code: ErrorCode,
        /// The broker's message.
        message: String,
    },
    /// An operation did not complete in time.
    #[error("{what} timed out after {after_ms} ms")]
    Timeout {
        /// The operation (connect, ack, request, subscription stream).
        what: &'static str,
        /// The limit that expired.
        after_ms: u64,
    },
    /// The connection or stream carrying the operation was lost; the operation's outcome is
    /// unknown (a batch may or may not have been stored).
    #[error("connection lost: {0}")]
    ConnectionLost(String),
    /// The broker did not advertise the capability the operation needs; nothing was sent.
    #[error("the broker does not support {0}")]
    Unsupported(&'static str),
    /// The broker refused the request.
    #[error("broker error {code:?}: {message}")]
    Broker {
        /// The broker's code.
        code: ErrorCode,
        /// The broker's message.
        message: String,
    },
    /// The broker sent something the protocol does not allow here.
    #[error("protocol violation by the broker: {0}")]
    Protocol(String),
    /// A key is longer than the broker's limit.
    #[error("key of {len} bytes exceeds the broker's limit of {max}")]
    KeyTooLong {
        /// The key's length.
        len: usize,
        /// The broker's limit.
        max: u16,
    },
    /// One record does not fit in a frame within the broker's limits.
    #[error("record of {len} bytes exceeds the largest publishable record of {max} bytes")]
    RecordTooLarge {
        /// The record's length.
        len: usize,
        /// The largest record that fits.
        max: usize,
    },
    /// A stream or group name is invalid.
    #[error("invalid name: {0}")]
    InvalidName(String),
    /// The argument is outside its allowed range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The publisher or client was closed.
    #[error("closed")]
    Closed,
    /// In a cluster: the broker does not own the shard and named its owner. The client follows
    /// such answers itself (refreshing its placement and resending to the owner: nothing was
    /// stored); it returns this error only when the brokers kept naming other owners
    /// (`cluster::NOT_OWNER_REDIRECTS_MAX` redirects in a row, paused and followed again) until
    /// the operation's patience ran out.
    #[error("shard {} of {stream} is owned by {} ({}); gave up after redirects", shard.0, owner.node, owner.address)]
    NotOwner {
        /// The stream.
        stream: String,
        /// The shard.
        shard: ShardId,
        /// Its owner, as the last answering broker named it.
        owner: ShardOwner,
    },
    /// In a cluster: the shard cannot be served now, because its owner is down or cannot
    /// confirm its cluster membership. The client retried for at most
    /// `cluster::SHARD_UNAVAILABLE_DEADLINE_MS`; nothing of the operation was stored. Other
    /// shards keep working; retry later.
    #[error("{} of {stream} is unavailable (owner down or fenced); gave up after {waited_ms} ms", shard_text(*shard))]
    ShardUnavailable {
        /// The stream.
        stream: String,
        /// The shard, when the operation had one (keyed publish, subscription, commit).
        shard: Option<ShardId>,
        /// How long the client retried.
        waited_ms: u64,
    },
}

fn shard_text(shard: Option<ShardId>) -> String {
    shard.map_or_else(|| "a shard".to_owned(), |s| format!("shard {}", s.0))
}

impl ClientError {
    /// Maps an error answer of the broker.
    pub(crate) fn from_broker(code: ErrorCode, message: String) -> Self {
        Self::Broker { code, message }
    }

    /// Whether the error means the connection is gone (a reconnect may help).
    pub fn is_connection_lost(&self) -> bool {
        matches!(self, Self::ConnectionLost(_))
    }

    /// Whether the broker answered that the shard is unavailable (owner down or fenced).
    pub(crate) fn is_shard_unavailable(&self) -> bool {
        matches!(
            self,
            Self::ShardUnavailable { .. } | Self::Broker { code: ErrorCode::ShardUnavailable, .. }
        )
    }
}
