//! Client configuration, built in code or from `FELIX_*` environment variables.
//!
//! [`ClientConfig::from_env_map`] is the one place that reads variables: it takes the
//! environment as a map, so tests prove that every key in [`ENV_KEYS`] takes effect without
//! mutating the process environment. [`ClientConfig::from_env`] passes it `std::env::vars()`.
//! A value that does not parse is an error, never ignored; an empty value counts as unset.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use felix_proto::AckMode;
use rustls::pki_types::CertificateDer;

use crate::error::ConfigError;

/// The broker address used when none is configured.
pub const DEFAULT_ADDR: &str = "127.0.0.1:7400";
/// The TLS server name used when none is configured (the broker's dev certificate's name).
pub const DEFAULT_SERVER_NAME: &str = "localhost";
/// The most seed addresses in `addr`.
pub const SEEDS_MAX: usize = 16;
/// The most connections one client opens (per broker, in a cluster).
pub const CONNECTIONS_MAX: usize = 64;
/// The most publish streams per connection.
pub const STREAMS_PER_CONNECTION_MAX: usize = 64;
/// The most batches in flight (written, not yet acked) per connection.
pub const IN_FLIGHT_BATCHES_MAX: usize = 4096;
/// The shortest connection idle timeout, in milliseconds.
pub const IDLE_TIMEOUT_MS_MIN: u64 = 300;
/// The longest connection idle timeout, in milliseconds (1 h).
pub const IDLE_TIMEOUT_MS_MAX: u64 = 3_600_000;
/// The longest linger time, in microseconds (1 s).
pub const LINGER_US_MAX: u64 = 1_000_000;

/// The ack-eliciting packets the broker may receive before it must acknowledge, asked of it with
/// QUIC's ACK_FREQUENCY frame (quinn-proto's ack frequency extension; QUIC's default is 1, an
/// ACK every second packet). A publisher sends runs of full packets: one ACK per 10 of them
/// costs both sides a tenth of the ACK packets and of the client's ACK processing.
pub const ACK_ELICITING_THRESHOLD_PACKETS: u32 = 9;
/// The longest the broker may delay an ACK, asked with the same frame, in microseconds
/// (quinn clamps it to at least the broker's `min_ack_delay`, 1 ms, and at most the larger of
/// the RTT and 25 ms). Only QUIC's loss recovery waits on it: publish acks are stream data.
pub const REQUESTED_MAX_ACK_DELAY_US: u64 = 2_000;
/// quinn's send priority of the control stream (the publish lanes have the default, 0): a
/// request or a subscription's setup written behind megabytes of queued batches goes first
/// (with [`ClientConfig::send_in_write_order`] it would otherwise wait for all of them).
pub const CONTROL_STREAM_PRIORITY: i32 = 1;

/// Default ceiling of path MTU discovery: a 1500-byte path less IPv6 and UDP headers.
pub const MAX_UDP_PAYLOAD_DEFAULT: u16 = 1452;
/// Smallest allowed ceiling (QUIC's minimum datagram size).
pub const MAX_UDP_PAYLOAD_MIN: u16 = 1200;
/// Largest allowed ceiling.
pub const MAX_UDP_PAYLOAD_MAX: u16 = 65_527;

/// Every environment variable [`ClientConfig::from_env_map`] reads.
pub const ENV_KEYS: [&str; 27] = [
    "FELIX_ADDR",
    "FELIX_SERVER_NAME",
    "FELIX_CA_FILE",
    "FELIX_CERT_FINGERPRINT",
    "FELIX_DANGER_ACCEPT_ANY_CERT",
    "FELIX_TOKEN",
    "FELIX_TOKEN_FILE",
    "FELIX_CONNECTIONS",
    "FELIX_STREAMS_PER_CONNECTION",
    "FELIX_COVER_CORES",
    "FELIX_SUBSCRIBE_PER_CORE",
    "FELIX_CONNECT_TIMEOUT_MS",
    "FELIX_CONNECT_ATTEMPT_TIMEOUT_MS",
    "FELIX_ACK_TIMEOUT_MS",
    "FELIX_CLIENT_IDLE_TIMEOUT_MS",
    "FELIX_CLIENT_MAX_UDP_PAYLOAD",
    "FELIX_CLIENT_SEND_IN_WRITE_ORDER",
    "FELIX_RECONNECT_BACKOFF_MIN_MS",
    "FELIX_RECONNECT_BACKOFF_MAX_MS",
    "FELIX_RECONNECT_ATTEMPTS_MAX",
    "FELIX_ACK_MODE",
    "FELIX_LINGER_US",
    "FELIX_BATCH_RECORDS_MAX",
    "FELIX_BATCH_BYTES_MAX",
    "FELIX_IN_FLIGHT_BATCHES_MAX",
    "FELIX_IDEMPOTENT",
    "FELIX_RETRY_TIMEOUT_MS",
];

/// How the client decides to trust the broker's certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trust {
    /// Certificates (PEM, or one DER certificate) from a file: the broker's CA, or its
    /// self-signed certificate. The server name is verified.
    CaFile(PathBuf),
    /// The same, given as DER certificates.
    CaCertificates(Vec<CertificateDer<'static>>),
    /// Accept exactly the certificate with this SHA-256 fingerprint (the broker's dev
    /// certificate); the name is not checked, the handshake signature is.
    Fingerprint(CertFingerprint),
    /// Accept any certificate. Anyone on the path can impersonate the broker: tests only.
    DangerAcceptAnyCertificate,
}

/// The SHA-256 digest of a DER certificate.
///
/// Parsed from 64 hex digits, with or without `:` between bytes, in either case.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CertFingerprint(pub [u8; 32]);

impl CertFingerprint {
    /// The fingerprint of a DER certificate.
    pub fn of_der(der: &[u8]) -> Self {
        use sha2::Digest;
        Self(sha2::Sha256::digest(der).into())
    }
}

impl FromStr for CertFingerprint {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let bad = || ConfigError::Fingerprint(s.to_owned());
        let digits: Vec<u8> = s.trim().bytes().filter(|b| *b != b':').collect();
        if digits.len() != 64 {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        for (i, pair) in digits.chunks_exact(2).enumerate() {
            let hi = hex_value(pair[0]).ok_or_else(bad)?;
            let lo = hex_value(pair[1]).ok_or_else(bad)?;
            out[i] = hi << 4 | lo;
        }
        Ok(Self(out))
    }
}

impl fmt::Display for CertFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for CertFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CertFingerprint({self})")
    }
}

fn hex_value(digit: u8) -> Option<u8> {
    (digit as char).to_digit(16).map(|v| v as u8)
}

/// Defaults for publishers: ack mode and batching.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishSettings {
    /// When the broker acks a batch. `AckMode::None` sends no `ACKED` flag at all.
    pub ack_mode: AckMode,
    /// How long a batch waits for more records before it is sent, in microseconds.
    pub linger_us: u64,
    /// The most records per batch (further capped by the broker's `max_batch_records`).
    pub batch_records_max: u32,
    /// The most bytes per batch, counting each record's payload and key (the broker stores the
    /// key with every record); the Publish frame is further capped by the broker's
    /// `max_frame_bytes`.
    pub batch_bytes_max: u32,
    /// The most batches written but not yet acked, per connection.
    pub in_flight_batches_max: usize,
    /// Idempotent publishing (when the broker advertises `IDEMPOTENT` and batches are acked):
    /// each batch carries a producer id and sequence number, so a batch sent again is stored
    /// once. A batch whose connection is lost, or whose ack times out, is then sent again on a
    /// new connection (in its original order) instead of failing with `ConnectionLost`, for up
    /// to `retry_timeout_ms` after it was first sent. Keyed batches are tagged only when the
    /// stream's shard count is known (the stream existed when the publisher started).
    pub idempotent: bool,
    /// How long an idempotent batch is retried after a lost connection or an ack timeout.
    pub retry_timeout_ms: u64,
}

impl Default for PublishSettings {
    fn default() -> Self {
        Self {
            ack_mode: AckMode::Durable,
            linger_us: 1_000,
            batch_records_max: 1024,
            batch_bytes_max: 1024 * 1024,
            in_flight_batches_max: 64,
            idempotent: true,
            retry_timeout_ms: 30_000,
        }
    }
}

/// Everything a [`crate::Client`] needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientConfig {
    /// `host:port` of the broker, or of several seed brokers of a cluster separated by commas
    /// (`a:7400,b:7400`): the client connects to the first one that answers and, when that
    /// broker is in a cluster, learns the other brokers from it (see [`ClientConfig::seeds`]).
    pub addr: String,
    /// The name the broker's certificate must carry (also sent as SNI).
    pub server_name: String,
    /// How the broker's certificate is trusted. `None` fails [`ClientConfig::validate`].
    pub trust: Option<Trust>,
    /// A bearer token sent in Hello.
    pub token: Option<String>,
    /// Connections to open (per broker, in a cluster); `None` opens one per broker core
    /// (HelloOk's `core_count`).
    pub connections: Option<usize>,
    /// Bidirectional streams each connection uses for publishing.
    pub streams_per_connection: usize,
    /// Whether to reopen connections that landed on an already covered core, until every core
    /// is reached or the bounded attempts are spent (see `docs/client.md`).
    pub cover_cores: bool,
    /// Whether a subscription to several shards of one broker is split into one part per
    /// broker core that owns some of them, each on the pool's connection owned by that core,
    /// so every core encrypts and sends its own shards' records (see `docs/client.md`). Off:
    /// one Subscribe on one connection, whose core sends every shard's records.
    pub subscribe_per_core: bool,
    /// The limit on the QUIC handshake plus Hello/HelloOk, in milliseconds. A client with one
    /// address and no other broker known spends it on each attempt; with several seeds it is
    /// the bound on reaching the first of them (see `connect_attempt_timeout_ms`).
    pub connect_timeout_ms: u64,
    /// The limit on one connection attempt when another broker could answer instead (several
    /// seeds, or a cluster), in milliseconds, capped by `connect_timeout_ms`: a broker that
    /// died (or is paused, or cut off) costs this much, not a whole connect timeout, before
    /// the client turns to the others.
    pub connect_attempt_timeout_ms: u64,
    /// The limit on waiting for an ack or any answer, in milliseconds.
    pub ack_timeout_ms: u64,
    /// How long a silent connection lives, in milliseconds: a broker that died without closing
    /// is noticed after this long (keep-alives every third of it). Its own idle timeout applies
    /// too; the smaller wins.
    pub idle_timeout_ms: u64,
    /// The largest UDP payload path MTU discovery may grow to (1200..=65527); 1452 models a
    /// 1500-byte Ethernet path even on loopback.
    pub max_udp_payload: u16,
    /// How the connection's streams share the sending (quinn's `send_fairness`, inverted).
    /// `false` (the default): round-robin, every stream with data gets a turn, so a small batch
    /// is not held behind large ones. `true`: each stream's written data goes out before the
    /// next one's, in the order it was written. A throughput-bound publisher of large batches
    /// then has each batch arrive in one piece, complete sooner and still in the broker's
    /// cache when it is copied to the log. Measured on a 2-CPU machine: 0.95-1.11x stored per
    /// broker CPU-second saturated (six comparisons), fixed-rate latency worse in
    /// two series of five (bench/results/2026-12-02-send-order/), so it is off by default.
    pub send_in_write_order: bool,
    /// The first delay between reconnect attempts, in milliseconds; doubled after each failure.
    pub reconnect_backoff_min_ms: u64,
    /// The largest delay between reconnect attempts, in milliseconds.
    pub reconnect_backoff_max_ms: u64,
    /// Reconnect attempts before an operation fails.
    pub reconnect_attempts_max: u32,
    /// Publisher defaults.
    pub publish: PublishSettings,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            addr: DEFAULT_ADDR.to_owned(),
            server_name: DEFAULT_SERVER_NAME.to_owned(),
            trust: None,
            token: None,
            connections: None,
            streams_per_connection: 4,
            cover_cores: true,
            subscribe_per_core: true,
            connect_timeout_ms: 5_000,
            connect_attempt_timeout_ms: 500,
            ack_timeout_ms: 30_000,
            idle_timeout_ms: 10_000,
            max_udp_payload: MAX_UDP_PAYLOAD_DEFAULT,
            send_in_write_order: false,
            reconnect_backoff_min_ms: 50,
            reconnect_backoff_max_ms: 5_000,
            reconnect_attempts_max: 8,
            publish: PublishSettings::default(),
        }
    }
}

impl ClientConfig {
    /// Defaults for `addr`, with `trust`.
    pub fn new(addr: impl Into<String>, trust: Trust) -> Self {
        Self { addr: addr.into(), trust: Some(trust), ..Self::default() }
    }

    /// The configuration from the process environment (see [`ClientConfig::from_env_map`]).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_env_map(std::env::vars())
    }

    /// The defaults overridden by the `FELIX_*` variables of `vars` (see [`ENV_KEYS`] and
    /// `docs/client.md`). Other variables are ignored. The result is validated.
    pub fn from_env_map<K, V>(vars: impl IntoIterator<Item = (K, V)>) -> Result<Self, ConfigError>
    where
        K: Into<String>,
        V: Into<String>,
    {
        let c = Self::parse_env_map(vars)?;
        c.validate()?;
        Ok(c)
    }

    /// [`ClientConfig::parse_env_map`] of the process environment.
    pub fn parse_env() -> Result<Self, ConfigError> {
        Self::parse_env_map(std::env::vars())
    }

    /// Like [`ClientConfig::from_env_map`] without the final [`ClientConfig::validate`], for
    /// callers that add settings afterwards (the CLI's flags) and validate then. Every value
    /// is still parsed, and one that does not parse is an error.
    pub fn parse_env_map<K, V>(vars: impl IntoIterator<Item = (K, V)>) -> Result<Self, ConfigError>
    where
        K: Into<String>,
        V: Into<String>,
    {
        let env: HashMap<String, String> = vars
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .filter(|(k, v)| k.starts_with("FELIX_") && !v.trim().is_empty())
            .collect();
        let get = |key: &'static str| env.get(key).map(|v| (key, v.trim().to_owned()));
        let mut c = Self::default();
        if let Some((_, v)) = get("FELIX_ADDR") {
            c.addr = v;
        }
        if let Some((_, v)) = get("FELIX_SERVER_NAME") {
            c.server_name = v;
        }
        let mut trusts = Vec::new();
        if let Some((_, v)) = get("FELIX_CA_FILE") {
            trusts.push(Trust::CaFile(PathBuf::from(v)));
        }
        if let Some((key, v)) = get("FELIX_CERT_FINGERPRINT") {
            let pin = v.parse().map_err(|e: ConfigError| invalid(key, &v, e.to_string()))?;
            trusts.push(Trust::Fingerprint(pin));
        }
        if let Some((key, v)) = get("FELIX_DANGER_ACCEPT_ANY_CERT") {
            if parse_bool(key, &v)? {
                trusts.push(Trust::DangerAcceptAnyCertificate);
            }
        }
        if trusts.len() > 1 {
            return Err(ConfigError::ConflictingTrust);
        }
        if let Some(t) = trusts.pop() {
            c.trust = Some(t);
        }
        match (get("FELIX_TOKEN"), get("FELIX_TOKEN_FILE")) {
            (Some(_), Some(_)) => return Err(ConfigError::ConflictingToken),
            (Some((_, v)), None) => c.token = Some(v),
            (None, Some((_, v))) => c.token = Some(read_token_file(Path::new(&v))?),
            (None, None) => {}
        }
        if let Some((key, v)) = get("FELIX_CONNECTIONS") {
            c.connections = Some(parse_num(key, &v)?);
        }
        if let Some((key, v)) = get("FELIX_STREAMS_PER_CONNECTION") {
            c.streams_per_connection = parse_num(key, &v)?;
        }
        if let Some((key, v)) = get("FELIX_COVER_CORES") {
            c.cover_cores = parse_bool(key, &v)?;
        }
        if let Some((key, v)) = get("FELIX_SUBSCRIBE_PER_CORE") {
            c.subscribe_per_core = parse_bool(key, &v)?;
        }
        if let Some((key, v)) = get("FELIX_CONNECT_TIMEOUT_MS") {
            c.connect_timeout_ms = parse_num(key, &v)?;
        }
        if let Some((key, v)) = get("FELIX_CONNECT_ATTEMPT_TIMEOUT_MS") {
            c.connect_attempt_timeout_ms = parse_num(key, &v)?;
        }
        if let Some((key, v)) = get("FELIX_ACK_TIMEOUT_MS") {
            c.ack_timeout_ms = parse_num(key, &v)?;
        }
        if let Some((key, v)) = get("FELIX_CLIENT_IDLE_TIMEOUT_MS") {
            c.idle_timeout_ms = parse_num(key, &v)?;
        }
        if let Some((key, v)) = get("FELIX_CLIENT_MAX_UDP_PAYLOAD") {
            c.max_udp_payload = parse_num(key, &v)?;
        }
        if let Some((key, v)) = get("FELIX_CLIENT_SEND_IN_WRITE_ORDER") {
            c.send_in_write_order = parse_bool(key, &v)?;
        }
        if let Some((key, v)) = get("FELIX_RECONNECT_BACKOFF_MIN_MS") {
            c.reconnect_backoff_min_ms = parse_num(key, &v)?;
        }
        if let Some((key, v)) = get("FELIX_RECONNECT_BACKOFF_MAX_MS") {
            c.reconnect_backoff_max_ms = parse_num(key, &v)?;
        }
        if let Some((key, v)) = get("FELIX_RECONNECT_ATTEMPTS_MAX") {
            c.reconnect_attempts_max = parse_num(key, &v)?;
        }
        if let Some((key, v)) = get("FELIX_ACK_MODE") {
            c.publish.ack_mode = parse_ack_mode(&v).map_err(|e| invalid(key, &v, e))?;
        }
        if let Some((key, v)) = get("FELIX_LINGER_US") {
            c.publish.linger_us = parse_num(key, &v)?;
        }
        if let Some((key, v)) = get("FELIX_BATCH_RECORDS_MAX") {
            c.publish.batch_records_max = parse_num(key, &v)?;
        }
        if let Some((key, v)) = get("FELIX_BATCH_BYTES_MAX") {
            c.publish.batch_bytes_max = parse_num(key, &v)?;
        }
        if let Some((key, v)) = get("FELIX_IN_FLIGHT_BATCHES_MAX") {
            c.publish.in_flight_batches_max = parse_num(key, &v)?;
        }
        if let Some((key, v)) = get("FELIX_IDEMPOTENT") {
            c.publish.idempotent = match v.to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => true,
                "0" | "false" | "no" | "off" => false,
                _ => return Err(invalid(key, &v, "expected true or false")),
            };
        }
        if let Some((key, v)) = get("FELIX_RETRY_TIMEOUT_MS") {
            c.publish.retry_timeout_ms = parse_num(key, &v)?;
        }
        Ok(c)
    }

    /// Checks every setting against its range and that trust is configured.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let range = |field, ok: bool, reason: &str| {
            if ok {
                Ok(())
            } else {
                Err(ConfigError::OutOfRange { field, reason: reason.to_owned() })
            }
        };
        if self.trust.is_none() {
            return Err(ConfigError::NoTrust);
        }
        let seeds = self.seeds();
        range(
            "addr",
            !seeds.is_empty() && seeds.iter().all(|s| is_host_port(s)),
            "must be host:port, or a comma-separated list of them",
        )?;
        range("addr", seeds.len() <= SEEDS_MAX, "at most 16 seed addresses")?;
        range("server_name", !self.server_name.is_empty(), "must not be empty")?;
        range(
            "token",
            self.token.as_ref().is_none_or(|t| t.len() <= felix_proto::limits::MAX_TOKEN_BYTES),
            "at most 16 KiB",
        )?;
        if let Some(n) = self.connections {
            range("connections", (1..=CONNECTIONS_MAX).contains(&n), "1..=64")?;
        }
        range(
            "streams_per_connection",
            (1..=STREAMS_PER_CONNECTION_MAX).contains(&self.streams_per_connection),
            "1..=64",
        )?;
        range("connect_timeout_ms", self.connect_timeout_ms > 0, "must be > 0")?;
        range("connect_attempt_timeout_ms", self.connect_attempt_timeout_ms > 0, "must be > 0")?;
        range("ack_timeout_ms", self.ack_timeout_ms > 0, "must be > 0")?;
        range(
            "idle_timeout_ms",
            (IDLE_TIMEOUT_MS_MIN..=IDLE_TIMEOUT_MS_MAX).contains(&self.idle_timeout_ms),
            "300..=3600000",
        )?;
        range(
            "max_udp_payload",
            (MAX_UDP_PAYLOAD_MIN..=MAX_UDP_PAYLOAD_MAX).contains(&self.max_udp_payload),
            "1200..=65527",
        )?;
        range(
            "reconnect_backoff_max_ms",
            self.reconnect_backoff_min_ms <= self.reconnect_backoff_max_ms,
            "must be >= reconnect_backoff_min_ms",
        )?;
        let p = &self.publish;
        range("linger_us", p.linger_us <= LINGER_US_MAX, "at most 1000000")?;
        range("batch_records_max", p.batch_records_max >= 1, "must be >= 1")?;
        range("batch_bytes_max", p.batch_bytes_max >= 1, "must be >= 1")?;
        range(
            "in_flight_batches_max",
            (1..=IN_FLIGHT_BATCHES_MAX).contains(&p.in_flight_batches_max),
            "1..=4096",
        )
    }

    /// The seed addresses of `addr`, in order: split at commas, trimmed, empty parts dropped.
    pub fn seeds(&self) -> Vec<String> {
        self.addr.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect()
    }

    /// The connect limit.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// The limit on one connection attempt when other brokers can answer instead
    /// (`connect_attempt_timeout_ms`, at most the connect timeout).
    pub fn connect_attempt_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_attempt_timeout_ms.min(self.connect_timeout_ms))
    }

    /// The ack and request limit.
    pub fn ack_timeout(&self) -> Duration {
        Duration::from_millis(self.ack_timeout_ms)
    }

    /// The connection idle timeout.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }
}

/// The effective configuration, one `key=value` per line; the token is never printed.
impl fmt::Display for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let trust = match &self.trust {
            None => "none".to_owned(),
            Some(Trust::CaFile(p)) => format!("ca-file {}", p.display()),
            Some(Trust::CaCertificates(c)) => format!("{} CA certificates", c.len()),
            Some(Trust::Fingerprint(fp)) => format!("fingerprint {fp}"),
            Some(Trust::DangerAcceptAnyCertificate) => "DANGER accept any certificate".into(),
        };
        let connections = self.connections.map_or("broker core count".into(), |n| n.to_string());
        writeln!(f, "addr={}", self.addr)?;
        writeln!(f, "server_name={}", self.server_name)?;
        writeln!(f, "trust={trust}")?;
        writeln!(f, "token={}", if self.token.is_some() { "<set>" } else { "<none>" })?;
        writeln!(f, "connections={connections}")?;
        writeln!(f, "streams_per_connection={}", self.streams_per_connection)?;
        writeln!(f, "cover_cores={}", self.cover_cores)?;
        writeln!(f, "subscribe_per_core={}", self.subscribe_per_core)?;
        writeln!(f, "connect_timeout_ms={}", self.connect_timeout_ms)?;
        writeln!(f, "connect_attempt_timeout_ms={}", self.connect_attempt_timeout_ms)?;
        writeln!(f, "ack_timeout_ms={}", self.ack_timeout_ms)?;
        writeln!(f, "idle_timeout_ms={}", self.idle_timeout_ms)?;
        writeln!(f, "max_udp_payload={}", self.max_udp_payload)?;
        writeln!(f, "send_in_write_order={}", self.send_in_write_order)?;
        writeln!(
            f,
            "reconnect_backoff_ms={}..{} attempts_max={}",
            self.reconnect_backoff_min_ms,
            self.reconnect_backoff_max_ms,
            self.reconnect_attempts_max
        )?;
        let p = &self.publish;
        write!(
            f,
            "ack_mode={} linger_us={} batch_records_max={} batch_bytes_max={} \
             in_flight_batches_max={} idempotent={} retry_timeout_ms={}",
            ack_mode_name(p.ack_mode),
            p.linger_us,
            p.batch_records_max,
            p.batch_bytes_max,
            p.in_flight_batches_max,
            p.idempotent,
            p.retry_timeout_ms
        )
    }
}

/// The token held in `path` (`--token-file`, `FELIX_TOKEN_FILE`), surrounding whitespace
/// (a trailing newline) removed; an empty file is an error, as is one over
/// `felix_proto::limits::MAX_TOKEN_BYTES` (checked by [`ClientConfig::validate`]).
pub fn read_token_file(path: &Path) -> Result<String, ConfigError> {
    let refuse =
        |reason: String| ConfigError::TokenFile { path: path.display().to_string(), reason };
    let text = std::fs::read_to_string(path).map_err(|e| refuse(e.to_string()))?;
    match text.trim() {
        "" => Err(refuse("the file is empty".into())),
        token => Ok(token.to_owned()),
    }
}

/// Parses `none`, `written` or `durable`.
pub fn parse_ack_mode(s: &str) -> Result<AckMode, String> {
    match s.to_ascii_lowercase().as_str() {
        "none" => Ok(AckMode::None),
        "written" => Ok(AckMode::Written),
        "durable" => Ok(AckMode::Durable),
        _ => Err("expected none, written or durable".into()),
    }
}

/// The name [`parse_ack_mode`] accepts for `mode`.
pub fn ack_mode_name(mode: AckMode) -> &'static str {
    match mode {
        AckMode::None => "none",
        AckMode::Written => "written",
        AckMode::Durable => "durable",
    }
}

/// Whether `s` is `host:port` with a non-empty host and a numeric port (`[v6]:port` too).
fn is_host_port(s: &str) -> bool {
    s.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

fn invalid(key: &'static str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::InvalidEnv { key, value: value.to_owned(), reason: reason.into() }
}

fn parse_num<T: FromStr>(key: &'static str, value: &str) -> Result<T, ConfigError>
where
    T::Err: fmt::Display,
{
    value.parse().map_err(|e: T::Err| invalid(key, value, e.to_string()))
}

fn parse_bool(key: &'static str, value: &str) -> Result<bool, ConfigError> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(invalid(key, value, "expected 1/0, true/false, yes/no or on/off")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PIN: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    #[test]
    fn fingerprints_parse_with_or_without_colons() {
        let plain: CertFingerprint = PIN.parse().unwrap();
        let colons: String = PIN
            .as_bytes()
            .chunks(2)
            .map(|c| std::str::from_utf8(c).unwrap().to_ascii_uppercase())
            .collect::<Vec<_>>()
            .join(":");
        assert_eq!(colons.parse::<CertFingerprint>().unwrap(), plain);
        assert_eq!(plain.to_string(), PIN);
        assert!("abcd".parse::<CertFingerprint>().is_err());
        assert!(PIN.replace('0', "g").parse::<CertFingerprint>().is_err());
    }

    #[test]
    fn no_trust_is_an_error_and_conflicting_trust_too() {
        let none: [(&str, &str); 0] = [];
        assert_eq!(ClientConfig::from_env_map(none), Err(ConfigError::NoTrust));
        let both = [("FELIX_CA_FILE", "/ca.pem"), ("FELIX_CERT_FINGERPRINT", PIN)];
        assert_eq!(ClientConfig::from_env_map(both), Err(ConfigError::ConflictingTrust));
    }

    #[test]
    fn bad_values_are_refused_not_ignored() {
        for (key, value) in [
            ("FELIX_CONNECTIONS", "many"),
            ("FELIX_CONNECTIONS", "0"),
            ("FELIX_ACK_MODE", "sometimes"),
            ("FELIX_COVER_CORES", "maybe"),
            ("FELIX_SUBSCRIBE_PER_CORE", "sometimes"),
            ("FELIX_LINGER_US", "-1"),
            ("FELIX_CERT_FINGERPRINT", "zz"),
            ("FELIX_RECONNECT_BACKOFF_MIN_MS", "999999"),
        ] {
            let env = [("FELIX_DANGER_ACCEPT_ANY_CERT", "1"), (key, value)];
            assert!(ClientConfig::from_env_map(env).is_err(), "{key}={value} was accepted");
        }
    }

    #[test]
    fn addr_takes_a_list_of_seeds() {
        let mut c =
            ClientConfig::new(" a:1 , [::1]:2,,b.example:3 ", Trust::DangerAcceptAnyCertificate);
        assert_eq!(c.seeds(), ["a:1", "[::1]:2", "b.example:3"]);
        assert_eq!(c.validate(), Ok(()));
        for bad in ["", ",", "a", "a:1,b", "a:x", ":7400", "a:70000"] {
            c.addr = bad.into();
            assert!(c.validate().is_err(), "{bad:?} was accepted");
        }
        c.addr = vec!["h:1"; SEEDS_MAX + 1].join(",");
        assert!(c.validate().is_err(), "too many seeds");
        let env = [("FELIX_DANGER_ACCEPT_ANY_CERT", "1"), ("FELIX_ADDR", "x:1,y:2")];
        let c = ClientConfig::from_env_map(env).unwrap();
        assert_eq!(c.seeds(), ["x:1", "y:2"]);
        assert!(c.to_string().contains("addr=x:1,y:2"));
    }

    #[test]
    fn display_never_prints_the_token() {
        let mut c = ClientConfig::new("127.0.0.1:1", Trust::DangerAcceptAnyCertificate);
        c.token = Some("secret-token".into());
        let shown = c.to_string();
        assert!(!shown.contains("secret-token"));
        assert!(shown.contains("token=<set>"));
    }
}
