//! `felix serve` configuration: flags, their `FELIX_*` environment twins and an optional TOML
//! file.
//!
//! Precedence, highest first: command-line flag, environment variable, config file
//! (`--config`), built-in default. The effective configuration is printed at start.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser};
use serde::Deserialize;

use crate::net::steering::SteeringMode;

/// Default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7400";
/// Default metrics address.
pub const DEFAULT_METRICS: &str = "127.0.0.1:9400";
/// Default of `--cluster-name`.
pub const DEFAULT_CLUSTER_NAME: &str = "felix";
/// Default of `--max-streams-per-tenant`.
pub const DEFAULT_MAX_STREAMS_PER_TENANT: u32 = 1000;
/// Default of `--max-group-positions-per-core`.
pub const DEFAULT_MAX_GROUP_POSITIONS_PER_CORE: usize = 100_000;
/// `--min-free-bytes auto` keeps this share of the data file system free, in percent...
pub const MIN_FREE_AUTO_PERCENT: u64 = 5;
/// ...but never asks for more than this many bytes.
pub const MIN_FREE_AUTO_CAP_BYTES: u64 = 4 << 30;

/// Default of `--producer-expiry`.
pub const DEFAULT_PRODUCER_EXPIRY: &str = "7d";

/// A duration flag that takes units: `7d`, `12h`, `30m`, `90s`, `250ms`, `1h 30m`; a plain
/// number is milliseconds. In the config file, a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct DurationMs(pub u64);

impl std::str::FromStr for DurationMs {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if let Ok(ms) = s.parse::<u64>() {
            return Ok(DurationMs(ms));
        }
        humantime::parse_duration(s)
            .map(|d| DurationMs(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
            .map_err(|e| format!("{s:?} is not a duration (7d, 12h, 30m, 90s, 250ms): {e}"))
    }
}

impl TryFrom<String> for DurationMs {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl std::fmt::Display for DurationMs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = std::time::Duration::from_millis(self.0);
        write!(f, "{}", humantime::format_duration(d))
    }
}

/// A byte size as flags, the environment and the config file take it: a number of bytes, or
/// a number with a unit, `B`, `KiB`, `MiB`, `GiB`, `TiB` (powers of 1,024) or `kB`, `MB`,
/// `GB`, `TB` (powers of 1,000), case-insensitive, with or without a space: `64MiB`, `1.5 GiB`,
/// `500MB`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = (t[..split].trim(), t[split..].trim());
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        "t" | "tb" => 1_000_000_000_000,
        "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?} (B, KiB, MiB, GiB, TiB, kB, MB, GB, TB)"
            ))
        }
    };
    if let Ok(n) = number.parse::<u64>() {
        return n.checked_mul(scale).ok_or_else(|| format!("{s:?} is too large"));
    }
    match number.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 && x * (scale as f64) < u64::MAX as f64 => {
            Ok((x * scale as f64).round() as u64)
        }
        _ => Err(format!("{s:?} is not a size (a number of bytes, or with a unit: 64MiB, 1GB)")),
    }
}

/// [`parse_bytes`] for a `usize` setting.
pub fn parse_bytes_usize(s: &str) -> Result<usize, String> {
    parse_bytes(s).and_then(|b| usize::try_from(b).map_err(|_| format!("{s:?} is too large")))
}

/// A duration setting kept in milliseconds: a number (milliseconds) or with units, as
/// [`DurationMs`] takes it (`7d`, `12h`, `250ms`).
pub fn parse_ms(s: &str) -> Result<u64, String> {
    s.parse::<DurationMs>().map(|d| d.0)
}

/// A byte size or duration in the config file: a number, or a string with a unit.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum TomlUnits {
    Number(u64),
    Text(String),
}

/// A byte size in the config file (`segment_bytes = "64MiB"` or `= 67108864`).
#[derive(Deserialize, Debug)]
#[serde(try_from = "TomlUnits")]
struct TomlBytes(u64);

impl TryFrom<TomlUnits> for TomlBytes {
    type Error = String;

    fn try_from(v: TomlUnits) -> Result<Self, String> {
        match v {
            TomlUnits::Number(n) => Ok(TomlBytes(n)),
            TomlUnits::Text(t) => parse_bytes(&t).map(TomlBytes),
        }
    }
}

impl From<TomlBytes> for u64 {
    fn from(b: TomlBytes) -> u64 {
        b.0
    }
}

impl From<TomlBytes> for usize {
    fn from(b: TomlBytes) -> usize {
        usize::try_from(b.0).unwrap_or(usize::MAX)
    }
}

/// A duration in milliseconds in the config file (`retention_ms = "7d"` or `= 604800000`).
#[derive(Deserialize, Debug)]
#[serde(try_from = "TomlUnits")]
struct TomlMs(u64);

impl TryFrom<TomlUnits> for TomlMs {
    type Error = String;

    fn try_from(v: TomlUnits) -> Result<Self, String> {
        match v {
            TomlUnits::Number(n) => Ok(TomlMs(n)),
            TomlUnits::Text(t) => parse_ms(&t).map(TomlMs),
        }
    }
}

impl From<TomlMs> for u64 {
    fn from(b: TomlMs) -> u64 {
        b.0
    }
}

/// The free-space floor of the data directory's file system (`--min-free-bytes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MinFreeBytes {
    /// `MIN_FREE_AUTO_PERCENT` of the file system's size, at most `MIN_FREE_AUTO_CAP_BYTES`.
    Auto,
    /// This many bytes; 0 turns the floor off.
    Bytes(u64),
}

impl MinFreeBytes {
    /// The floor in bytes on a file system of `total_bytes`.
    pub fn resolve(self, total_bytes: u64) -> u64 {
        match self {
            MinFreeBytes::Auto => {
                (total_bytes / 100 * MIN_FREE_AUTO_PERCENT).min(MIN_FREE_AUTO_CAP_BYTES)
            }
            MinFreeBytes::Bytes(b) => b,
        }
    }
}

impl std::str::FromStr for MinFreeBytes {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(MinFreeBytes::Auto);
        }
        parse_bytes(s)
            .map(MinFreeBytes::Bytes)
            .map_err(|e| format!("{s:?} is neither `auto` nor a size: {e}"))
    }
}

/// Most CPUs one `--cpus` range may name (a typo like `0-40000000` is refused, not expanded).
pub const CPU_RANGE_MAX: usize = 4096;

/// The CPUs of `--cpus`: numbers and inclusive ranges, comma-separated (`1-15`, `0,2,4-7`), in
/// the order given; core *i* is pinned to the *i*-th. Empty: core *i* to CPU *i*.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

impl std::str::FromStr for CpuList {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut cpus = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let number = |n: &str| {
                n.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("{item:?} is not a CPU number or a range a-b"))
            };
            match item.split_once('-') {
                None => cpus.push(number(item)?),
                Some((a, b)) => {
                    let (a, b) = (number(a)?, number(b)?);
                    if a > b {
                        return Err(format!("CPU range {item:?} runs backwards"));
                    }
                    if b - a >= CPU_RANGE_MAX {
                        return Err(format!(
                            "CPU range {item:?} names more than {CPU_RANGE_MAX} CPUs"
                        ));
                    }
                    cpus.extend(a..=b);
                }
            }
        }
        Ok(CpuList(cpus))
    }
}

impl std::fmt::Display for MinFreeBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MinFreeBytes::Auto => f.write_str("auto"),
            MinFreeBytes::Bytes(b) => write!(f, "{b}"),
        }
    }
}

/// Flags of `felix serve`.
#[derive(Args, Clone, Debug)]
pub struct ServeArgs {
    /// UDP address to listen on.
    #[arg(long, env = "FELIX_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Cores (executors) to run; 0 means one per online CPU.
    #[arg(long, env = "FELIX_CORES", default_value_t = 0)]
    pub cores: usize,
    /// CPUs to pin the cores to: numbers and ranges, comma-separated (`1-15`, `0,2,4-7`; core i gets the i-th); empty pins core i to CPU i.
    #[arg(long, env = "FELIX_CPUS", default_value = "", hide_default_value = true)]
    pub cpus: CpuList,
    /// Do not pin cores to CPUs.
    #[arg(long, env = "FELIX_NO_PIN", default_value_t = false)]
    pub no_pin: bool,
    /// Data directory (created if missing).
    #[arg(long, env = "FELIX_DATA_DIR", default_value = "./felix-data")]
    pub data_dir: PathBuf,
    /// TLS certificate chain (PEM). Without it a development certificate is generated into the data directory.
    #[arg(long, env = "FELIX_CERT", requires = "key")]
    pub cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, env = "FELIX_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
    /// Metrics, histograms and health HTTP address (`/metrics`, `/histograms`, `/health`); `off` disables it.
    #[arg(long, env = "FELIX_METRICS", default_value = DEFAULT_METRICS)]
    pub metrics: String,
    /// Connection-ID steering: auto (eBPF, else classic BPF), ebpf, cbpf, off.
    #[arg(long, env = "FELIX_STEERING", default_value = "auto")]
    pub steering: SteeringMode,
    /// Largest UDP payload the QUIC path may grow to (path MTU discovery ceiling).
    #[arg(long, env = "FELIX_MAX_UDP_PAYLOAD", default_value_t = crate::net::config::DEFAULT_MAX_UDP_PAYLOAD)]
    pub max_udp_payload: u16,
    /// Idle timeout of a connection, in milliseconds.
    #[arg(long, env = "FELIX_IDLE_TIMEOUT_MS", value_parser = parse_ms, default_value_t = 30_000)]
    pub idle_timeout_ms: u64,
    /// Connections one core accepts.
    #[arg(long, env = "FELIX_MAX_CONNS_PER_CORE", default_value_t = crate::net::config::DEFAULT_MAX_CONNS_PER_CORE)]
    pub max_conns_per_core: usize,
    /// Concurrent streams a connection may open, per direction.
    #[arg(long, env = "FELIX_MAX_STREAMS_PER_CONN", default_value_t = crate::net::config::DEFAULT_MAX_STREAMS_PER_CONN)]
    pub max_streams_per_conn: u32,
    /// Handshakes a core completes per second before it answers with stateless retry.
    #[arg(long, env = "FELIX_HANDSHAKES_PER_SEC_PER_CORE", default_value_t = crate::net::config::DEFAULT_HANDSHAKES_PER_SEC_PER_CORE)]
    pub handshakes_per_sec_per_core: u32,
    /// Create a stream on first publish (a subscribe never creates one). Default: true without
    /// --auth-keys, false with them (then streams are created with CreateStream only).
    #[arg(long, env = "FELIX_AUTO_CREATE", default_value_t = true, hide_default_value = true, action = clap::ArgAction::Set)]
    pub auto_create: bool,
    /// Most streams one tenant may have; creating (or auto-creating) one more gets LimitReached.
    #[arg(long, env = "FELIX_MAX_STREAMS_PER_TENANT", default_value_t = DEFAULT_MAX_STREAMS_PER_TENANT)]
    pub max_streams_per_tenant: u32,
    /// Most consumer-group positions (one per group, stream and shard) one core keeps; a
    /// commit that would add one more gets LimitReached (moving a kept one always works).
    #[arg(long, env = "FELIX_MAX_GROUP_POSITIONS_PER_CORE", default_value_t = DEFAULT_MAX_GROUP_POSITIONS_PER_CORE)]
    pub max_group_positions_per_core: usize,
    /// Free-space floor of the data directory's file system, in bytes: below it new streams and
    /// appends get StorageFull while reads and consumer commits go on. `auto`: 5 % of the file
    /// system, at most 4 GiB; 0 turns it off.
    #[arg(long, env = "FELIX_MIN_FREE_BYTES", default_value = "auto")]
    pub min_free_bytes: MinFreeBytes,
    /// Shard count of auto-created streams; 0 means one per core.
    #[arg(long, env = "FELIX_DEFAULT_SHARDS", default_value_t = 0)]
    pub default_shards: u32,
    /// Segment size at which a log rolls, in bytes.
    #[arg(long, env = "FELIX_SEGMENT_BYTES", value_parser = parse_bytes, default_value_t = 256 << 20)]
    pub segment_bytes: u64,
    /// Bytes of recently read log blocks each core keeps for its subscribers, whole 1 MiB
    /// blocks (catch-up readers of a core's shards share one read of each block); 0 turns it
    /// off.
    #[arg(long, env = "FELIX_READ_CACHE_BYTES", value_parser = parse_bytes, default_value_t = felix_storage::READ_CACHE_BYTES_DEFAULT)]
    pub read_cache_bytes: u64,
    /// How durable appends reach the disk: `fdatasync` (plain writes, then a group-commit
    /// fdatasync) or `dsync` (segments opened O_DSYNC: an ack waits for its write alone).
    #[arg(long, env = "FELIX_WRITE_SYNC", default_value_t = felix_storage::WriteSync::Fdatasync)]
    pub write_sync: felix_storage::WriteSync,
    /// How a segment's space is prepared ahead of its writes: `reserve` (blocks reserved with
    /// fallocate; each fdatasync commits the file system's journal) or `zero` (zeros written
    /// a few MiB ahead, so a group-commit fdatasync needs no journal commit; every byte is
    /// written twice).
    #[arg(long, env = "FELIX_PREALLOCATE", default_value_t = felix_storage::Preallocate::Reserve)]
    pub preallocate: felix_storage::Preallocate,
    /// Default retention by size per stream log, in bytes; 0 keeps everything.
    #[arg(long, env = "FELIX_RETENTION_BYTES", value_parser = parse_bytes, default_value_t = 0)]
    pub retention_bytes: u64,
    /// Default retention by age, in milliseconds; 0 keeps everything.
    #[arg(long, env = "FELIX_RETENTION_MS", value_parser = parse_ms, default_value_t = 0)]
    pub retention_ms: u64,
    /// Publish bytes in flight (received, not yet acked) per connection before the broker stops reading it.
    #[arg(long, env = "FELIX_INFLIGHT_BYTES_PER_CONN", value_parser = parse_bytes_usize, default_value_t = 16 << 20)]
    pub inflight_bytes_per_conn: usize,
    /// Publish bytes in flight per core before the core stops reading publishes.
    #[arg(long, env = "FELIX_INFLIGHT_BYTES_PER_CORE", value_parser = parse_bytes_usize, default_value_t = 64 << 20)]
    pub inflight_bytes_per_core: usize,
    /// Seconds a subscriber may stay blocked by flow control before it is disconnected (SlowConsumer).
    #[arg(long, env = "FELIX_SLOW_CONSUMER_SECS", default_value_t = 30)]
    pub slow_consumer_secs: u64,
    /// PEM public keys (Ed25519 or P-256) that verify client tokens, comma-separated. With
    /// keys, every connection must present a valid token; without, authentication is off.
    #[arg(long, env = "FELIX_AUTH_KEYS", value_delimiter = ',')]
    pub auth_keys: Vec<PathBuf>,
    /// Allow clients without a token on a non-loopback address.
    #[arg(long, env = "FELIX_ALLOW_ANONYMOUS", default_value_t = false)]
    pub allow_anonymous: bool,
    /// Repair corruption found in the middle of a log by truncating there (reported) instead of refusing to start.
    #[arg(long, env = "FELIX_REPAIR", default_value_t = false)]
    pub repair: bool,
    /// etcd endpoints (`http://host:port`, comma-separated): run as a member of a cluster.
    /// Without it the broker is a single node and needs no etcd.
    #[arg(long, env = "FELIX_CLUSTER_ETCD", value_delimiter = ',')]
    pub cluster_etcd: Vec<String>,
    /// This broker's name in the cluster, unique among its brokers (1-64 bytes of
    /// A-Z a-z 0-9 . _ -). Required with --cluster-etcd.
    #[arg(long, env = "FELIX_NODE_ID")]
    pub node_id: Option<String>,
    /// Where clients and other brokers reach this broker (`host:port`, UDP). Required with
    /// --cluster-etcd.
    #[arg(long, env = "FELIX_ADVERTISE")]
    pub advertise: Option<String>,
    /// The cluster's name: its brokers share the etcd key prefix `/felix/<name>/`.
    #[arg(long, env = "FELIX_CLUSTER_NAME", default_value = DEFAULT_CLUSTER_NAME)]
    pub cluster_name: String,
    /// Membership lease TTL in seconds: a broker that cannot renew its lease for this long
    /// stops acknowledging writes, and the others see it as down.
    #[arg(long, env = "FELIX_LEASE_TTL_S", default_value_t = felix_cluster::agent::LEASE_TTL_S_DEFAULT)]
    pub lease_ttl_s: u32,
    /// Replication factor of streams this broker creates in a cluster (1..=5): each shard
    /// kept on this many brokers, acks `durable` once fdatasync'd on a quorum. Default: 3, or
    /// the number of live brokers when fewer.
    #[arg(long, env = "FELIX_DEFAULT_REPLICAS")]
    pub default_replicas: Option<u8>,
    /// In-sync replicas a durable append to a replicated shard needs (leader included);
    /// 0: a majority of its replicas.
    #[arg(long, env = "FELIX_MIN_INSYNC", default_value_t = 0)]
    pub min_insync: usize,
    /// Payload bytes of each replicated shard's newest committed batches kept in memory, for
    /// followers' fetches and subscribers; older batches leave memory but for a small index
    /// (about 16 bytes per MiB of log plus one entry per leader epoch) and are read back from
    /// the log when a follower fetches them.
    #[arg(long, env = "FELIX_REPLICA_RESIDENT_BYTES", value_parser = parse_bytes, default_value_t = 4 << 20)]
    pub replica_resident_bytes: u64,
    /// An idempotent producer idle this long (by its shard's batch times) is forgotten: its
    /// next batch starts it again, and a retry of a batch it sent before is stored as new.
    /// Units: 7d, 12h, 30m, 90s, 250ms (a plain number is ms). Every broker of a cluster
    /// should use the same value (replicas decide from their logs).
    #[arg(long, env = "FELIX_PRODUCER_EXPIRY", default_value = DEFAULT_PRODUCER_EXPIRY)]
    pub producer_expiry: DurationMs,
    /// Idempotent producers each shard remembers at most; beyond it the one idle longest is
    /// forgotten first. Same on every broker of a cluster.
    #[arg(long, env = "FELIX_MAX_PRODUCERS_PER_SHARD", default_value_t = felix_storage::PRODUCERS_PER_SHARD_MAX)]
    pub max_producers_per_shard: usize,
    /// Leader balance: a broker leading a replicated shard whose preferred replica (the first
    /// of its replicas) is another, live and in sync, hands the leadership back to it after
    /// leading 5 s, so that every broker leads its share again after restarts.
    #[arg(long, env = "FELIX_LEADER_BALANCE", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_balance: bool,
    /// Certificates (PEM) the other brokers' certificates are verified against for
    /// replication, both when this broker connects to them and when they connect to it with
    /// their certificate as a TLS client certificate (mutual TLS). Default: this broker's own
    /// certificate (--cert, or the development certificate), i.e. brokers sharing one.
    #[arg(long, env = "FELIX_PEER_CA")]
    pub peer_ca: Option<PathBuf>,
    /// The name the other brokers' certificates must carry (as servers and as clients), and
    /// this broker's own.
    #[arg(long, env = "FELIX_PEER_SERVER_NAME", default_value = "localhost")]
    pub peer_server_name: String,
    /// A TOML file with any of these settings (names as the flags, with underscores).
    #[arg(long, env = "FELIX_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration and exit.
    #[arg(long, default_value_t = false)]
    pub print_config: bool,
}

/// The config file: every field optional, names as the flags with underscores.
#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<SocketAddr>,
    cores: Option<usize>,
    cpus: Option<TomlCpus>,
    no_pin: Option<bool>,
    data_dir: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    metrics: Option<String>,
    steering: Option<String>,
    max_udp_payload: Option<u16>,
    idle_timeout_ms: Option<TomlMs>,
    max_conns_per_core: Option<usize>,
    max_streams_per_conn: Option<u32>,
    handshakes_per_sec_per_core: Option<u32>,
    auto_create: Option<bool>,
    max_streams_per_tenant: Option<u32>,
    max_group_positions_per_core: Option<usize>,
    min_free_bytes: Option<TomlMinFree>,
    default_shards: Option<u32>,
    segment_bytes: Option<TomlBytes>,
    read_cache_bytes: Option<TomlBytes>,
    write_sync: Option<String>,
    preallocate: Option<String>,
    retention_bytes: Option<TomlBytes>,
    retention_ms: Option<TomlMs>,
    inflight_bytes_per_conn: Option<TomlBytes>,
    inflight_bytes_per_core: Option<TomlBytes>,
    slow_consumer_secs: Option<u64>,
    allow_anonymous: Option<bool>,
    repair: Option<bool>,
    auth_keys: Option<Vec<PathBuf>>,
    cluster_etcd: Option<Vec<String>>,
    node_id: Option<String>,
    advertise: Option<String>,
    cluster_name: Option<String>,
    lease_ttl_s: Option<u32>,
    default_replicas: Option<u8>,
    min_insync: Option<usize>,
    replica_resident_bytes: Option<TomlBytes>,
    producer_expiry: Option<DurationMs>,
    max_producers_per_shard: Option<usize>,
    leader_balance: Option<bool>,
    peer_ca: Option<PathBuf>,
    peer_server_name: Option<String>,
}

/// `cpus` in the config file: an array of CPU numbers or a string as `--cpus` takes it.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum TomlCpus {
    List(Vec<usize>),
    Text(String),
}

/// `min_free_bytes` in the config file: a number of bytes or `"auto"`.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum TomlMinFree {
    Bytes(u64),
    Word(String),
}

/// Why the configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The config file is not valid TOML of known settings.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A setting has an invalid value.
    #[error("{0}")]
    Invalid(String),
}

impl ServeArgs {
    /// Fills in settings from the config file where neither a flag nor an environment variable
    /// set them, then resolves derived defaults (`cores` 0, `default_shards` 0).
    ///
    /// `auto_create` given nowhere is true without `--auth-keys` and false with them: with
    /// authentication on, a token that may publish must not be able to create streams just by
    /// naming them.
    pub fn resolve(mut self, matches: &ArgMatches) -> Result<Self, ConfigError> {
        let mut auto_create_given = !is_default(matches, "auto_create");
        if let Some(path) = self.config.clone() {
            let text = std::fs::read_to_string(&path)
                .map_err(|source| ConfigError::Read { path: path.clone(), source })?;
            let file: FileConfig = toml::from_str(&text)
                .map_err(|e| ConfigError::Parse { path: path.clone(), message: e.to_string() })?;
            auto_create_given |= file.auto_create.is_some();
            self.apply_file(file, matches)?;
        }
        if !auto_create_given && !self.auth_keys.is_empty() {
            self.auto_create = false;
        }
        self.check_cluster()?;
        if self.max_streams_per_tenant == 0 {
            return Err(ConfigError::Invalid("--max-streams-per-tenant must be at least 1".into()));
        }
        if self.max_group_positions_per_core == 0 {
            return Err(ConfigError::Invalid(
                "--max-group-positions-per-core must be at least 1".into(),
            ));
        }
        if self.cores == 0 {
            self.cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        }
        if self.default_shards == 0 {
            self.default_shards = self.cores as u32;
        }
        if self.default_shards > felix_proto::limits::MAX_SHARDS_PER_STREAM {
            return Err(ConfigError::Invalid(format!(
                "--default-shards {} exceeds {}",
                self.default_shards,
                felix_proto::limits::MAX_SHARDS_PER_STREAM
            )));
        }
        if !self.listen.ip().is_loopback() && !self.allow_anonymous && self.auth_keys.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "refusing to listen on non-loopback {} without authentication; give --auth-keys, \
                 or pass --allow-anonymous (FELIX_ALLOW_ANONYMOUS=true) to accept unauthenticated clients",
                self.listen
            )));
        }
        Ok(self)
    }

    fn apply_file(&mut self, f: FileConfig, m: &ArgMatches) -> Result<(), ConfigError> {
        let unset = |id: &str| is_default(m, id);
        macro_rules! take {
            ($($field:ident),*) => {$(
                if let Some(v) = f.$field {
                    if unset(stringify!($field)) {
                        self.$field = v.into();
                    }
                }
            )*};
        }
        take!(
            listen,
            cores,
            no_pin,
            data_dir,
            metrics,
            max_udp_payload,
            idle_timeout_ms,
            max_conns_per_core,
            max_streams_per_conn,
            handshakes_per_sec_per_core,
            auto_create,
            max_streams_per_tenant,
            max_group_positions_per_core,
            default_shards,
            segment_bytes,
            read_cache_bytes,
            retention_bytes,
            retention_ms,
            inflight_bytes_per_conn,
            inflight_bytes_per_core,
            slow_consumer_secs,
            allow_anonymous,
            repair,
            auth_keys,
            cluster_etcd,
            cluster_name,
            lease_ttl_s,
            min_insync,
            replica_resident_bytes,
            producer_expiry,
            max_producers_per_shard,
            leader_balance,
            peer_server_name
        );
        if f.peer_ca.is_some() && unset("peer_ca") {
            self.peer_ca = f.peer_ca;
        }
        if f.default_replicas.is_some() && unset("default_replicas") {
            self.default_replicas = f.default_replicas;
        }
        if f.node_id.is_some() && unset("node_id") {
            self.node_id = f.node_id;
        }
        if f.advertise.is_some() && unset("advertise") {
            self.advertise = f.advertise;
        }
        if f.cert.is_some() && unset("cert") {
            self.cert = f.cert;
        }
        if f.key.is_some() && unset("key") {
            self.key = f.key;
        }
        if let Some(v) = f.cpus {
            if unset("cpus") {
                self.cpus = match v {
                    TomlCpus::List(cpus) => CpuList(cpus),
                    TomlCpus::Text(t) => {
                        t.parse().map_err(|e| ConfigError::Invalid(format!("cpus: {e}")))?
                    }
                };
            }
        }
        if let Some(v) = f.min_free_bytes {
            if unset("min_free_bytes") {
                self.min_free_bytes = match v {
                    TomlMinFree::Bytes(b) => MinFreeBytes::Bytes(b),
                    TomlMinFree::Word(w) => w
                        .parse()
                        .map_err(|e| ConfigError::Invalid(format!("min_free_bytes: {e}")))?,
                };
            }
        }
        if let Some(s) = f.write_sync {
            if unset("write_sync") {
                self.write_sync =
                    s.parse().map_err(|e| ConfigError::Invalid(format!("write_sync: {e}")))?;
            }
        }
        if let Some(s) = f.preallocate {
            if unset("preallocate") {
                self.preallocate =
                    s.parse().map_err(|e| ConfigError::Invalid(format!("preallocate: {e}")))?;
            }
        }
        if let Some(s) = f.steering {
            if unset("steering") {
                self.steering =
                    s.parse().map_err(|e| ConfigError::Invalid(format!("steering: {e}")))?;
            }
        }
        Ok(())
    }

    /// With `--cluster-etcd`, a valid node id, an advertise address and a usable lease TTL.
    fn check_cluster(&self) -> Result<(), ConfigError> {
        if self.cluster_etcd.is_empty() {
            return Ok(());
        }
        let bad = |m: String| Err(ConfigError::Invalid(m));
        match &self.node_id {
            None => return bad("--cluster-etcd needs --node-id".into()),
            Some(id) => {
                if let Err(e) = felix_cluster::NodeId::new(id) {
                    return bad(format!("--node-id: {e}"));
                }
            }
        }
        match &self.advertise {
            None => return bad("--cluster-etcd needs --advertise HOST:PORT".into()),
            Some(a)
                if a.rsplit_once(':')
                    .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err()) =>
            {
                return bad(format!("--advertise {a:?} is not HOST:PORT"))
            }
            Some(_) => {}
        }
        if self.lease_ttl_s < felix_cluster::agent::LEASE_TTL_S_MIN {
            return bad(format!(
                "--lease-ttl-s must be at least {}",
                felix_cluster::agent::LEASE_TTL_S_MIN
            ));
        }
        if self.cluster_name.is_empty() || self.cluster_name.contains('/') {
            return bad("--cluster-name is non-empty, without '/'".into());
        }
        let max = felix_cluster::placement::REPLICAS_MAX;
        if self.default_replicas.is_some_and(|n| n == 0 || n > max) {
            return bad(format!("--default-replicas must be 1..={max}"));
        }
        if self.min_insync > usize::from(max) {
            return bad(format!("--min-insync must be 0..={max}"));
        }
        if self.producer_expiry.0 < 1_000 {
            return bad(format!("--producer-expiry {} is under a second", self.producer_expiry));
        }
        if self.max_producers_per_shard == 0 {
            return bad("--max-producers-per-shard must be at least 1".into());
        }
        Ok(())
    }

    /// The metrics address, or `None` when disabled.
    pub fn metrics_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        if self.metrics.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        self.metrics.parse().map(Some).map_err(|_| {
            ConfigError::Invalid(format!("--metrics {:?} is not an address or 'off'", self.metrics))
        })
    }

    /// The effective configuration, one `name = value` a line (TOML).
    pub fn render(&self) -> String {
        let opt = |p: &Option<PathBuf>| match p {
            Some(p) => format!("{:?}", p.display().to_string()),
            None => "\"\" # none: development certificate".to_owned(),
        };
        [
            format!("listen = \"{}\"", self.listen),
            format!("cores = {}", self.cores),
            format!("cpus = {:?}", self.cpus.0),
            format!("no_pin = {}", self.no_pin),
            format!("data_dir = {:?}", self.data_dir.display().to_string()),
            format!("cert = {}", opt(&self.cert)),
            format!("key = {}", opt(&self.key)),
            format!("metrics = {:?}", self.metrics),
            format!("steering = \"{}\"", self.steering),
            format!("max_udp_payload = {}", self.max_udp_payload),
            format!("idle_timeout_ms = {}", self.idle_timeout_ms),
            format!("max_conns_per_core = {}", self.max_conns_per_core),
            format!("max_streams_per_conn = {}", self.max_streams_per_conn),
            format!("handshakes_per_sec_per_core = {}", self.handshakes_per_sec_per_core),
            format!("auto_create = {}", self.auto_create),
            format!("max_streams_per_tenant = {}", self.max_streams_per_tenant),
            format!("max_group_positions_per_core = {}", self.max_group_positions_per_core),
            match self.min_free_bytes {
                MinFreeBytes::Auto => "min_free_bytes = \"auto\"".to_owned(),
                MinFreeBytes::Bytes(b) => format!("min_free_bytes = {b}"),
            },
            format!("default_shards = {}", self.default_shards),
            format!("segment_bytes = {}", self.segment_bytes),
            format!("read_cache_bytes = {}", self.read_cache_bytes),
            format!("write_sync = \"{}\"", self.write_sync),
            format!("preallocate = \"{}\"", self.preallocate),
            format!("retention_bytes = {}", self.retention_bytes),
            format!("retention_ms = {}", self.retention_ms),
            format!("inflight_bytes_per_conn = {}", self.inflight_bytes_per_conn),
            format!("inflight_bytes_per_core = {}", self.inflight_bytes_per_core),
            format!("slow_consumer_secs = {}", self.slow_consumer_secs),
            format!(
                "auth_keys = {:?}",
                self.auth_keys.iter().map(|p| p.display().to_string()).collect::<Vec<_>>()
            ),
            format!("allow_anonymous = {}", self.allow_anonymous),
            format!("repair = {}", self.repair),
            format!("cluster_etcd = {:?}", self.cluster_etcd),
            format!("node_id = {:?}", self.node_id.as_deref().unwrap_or("")),
            format!("advertise = {:?}", self.advertise.as_deref().unwrap_or("")),
            format!("cluster_name = {:?}", self.cluster_name),
            format!("lease_ttl_s = {}", self.lease_ttl_s),
            match self.default_replicas {
                Some(n) => format!("default_replicas = {n}"),
                None => "# default_replicas: 3, or the live brokers when fewer".to_owned(),
            },
            format!("min_insync = {}", self.min_insync),
            format!("replica_resident_bytes = {}", self.replica_resident_bytes),
            format!("producer_expiry = \"{}\"", self.producer_expiry),
            format!("max_producers_per_shard = {}", self.max_producers_per_shard),
            format!("leader_balance = {}", self.leader_balance),
            match &self.peer_ca {
                Some(p) => format!("peer_ca = {:?}", p.display().to_string()),
                None => "# peer_ca: this broker's own certificate".to_owned(),
            },
            format!("peer_server_name = {:?}", self.peer_server_name),
        ]
        .join("\n")
    }
}

/// Whether argument `id` was given neither on the command line nor in the environment.
fn is_default(m: &ArgMatches, id: &str) -> bool {
    matches!(m.value_source(id), Some(ValueSource::DefaultValue) | None)
}

/// Environment variables named `FELIX_*` that no flag reads, so a typo does not pass silently.
pub fn unknown_env_vars<C: CommandFactory>(
    vars: impl IntoIterator<Item = String>,
    also_known: &[&str],
) -> Vec<String> {
    let cmd = C::command();
    let mut known: Vec<String> = Vec::new();
    collect_env(&cmd, &mut known);
    vars.into_iter()
        .filter(|v| v.starts_with("FELIX_"))
        .filter(|v| !known.iter().any(|k| k == v) && !also_known.contains(&v.as_str()))
        .collect()
}

fn collect_env(cmd: &clap::Command, out: &mut Vec<String>) {
    for arg in cmd.get_arguments() {
        if let Some(env) = arg.get_env() {
            out.push(env.to_string_lossy().into_owned());
        }
    }
    for sub in cmd.get_subcommands() {
        collect_env(sub, out);
    }
}

/// Parses `ServeArgs` from an argument list (for tests and the binary).
pub fn parse_serve(args: &[&str]) -> Result<ServeArgs, String> {
    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        serve: ServeArgs,
    }
    let matches = Wrapper::command().try_get_matches_from(args).map_err(|e| e.to_string())?;
    let w = Wrapper::from_arg_matches(&matches).map_err(|e| e.to_string())?;
    w.serve.resolve(&matches).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_create_is_off_by_default_only_with_authentication() {
        assert!(parse_serve(&["felix"]).unwrap().auto_create);
        assert!(!parse_serve(&["felix", "--auth-keys", "/k.pem"]).unwrap().auto_create);
        let on = parse_serve(&["felix", "--auth-keys", "/k.pem", "--auto-create", "true"]);
        assert!(on.unwrap().auto_create);
        assert!(!parse_serve(&["felix", "--auto-create", "false"]).unwrap().auto_create);
    }

    #[test]
    fn sizes_and_durations_take_units_in_flags_and_the_file() {
        assert_eq!(parse_bytes("67108864"), Ok(64 << 20));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("64 mib"), Ok(64 << 20));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("500MB"), Ok(500_000_000));
        assert_eq!(parse_bytes("4kB"), Ok(4_000));
        assert!(parse_bytes("64 furlongs").unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("99999999TiB").unwrap_err().contains("too large"));
        let a = parse_serve(&[
            "felix",
            "--segment-bytes",
            "64MiB",
            "--retention-bytes",
            "10GiB",
            "--retention-ms",
            "7d",
            "--inflight-bytes-per-conn",
            "8MiB",
            "--min-free-bytes",
            "1GiB",
            "--idle-timeout-ms",
            "45s",
        ])
        .unwrap();
        assert_eq!(a.segment_bytes, 64 << 20);
        assert_eq!(a.retention_bytes, 10 << 30);
        assert_eq!(a.retention_ms, 7 * 24 * 3_600_000);
        assert_eq!(a.inflight_bytes_per_conn, 8 << 20);
        assert_eq!(a.min_free_bytes, MinFreeBytes::Bytes(1 << 30));
        assert_eq!(a.idle_timeout_ms, 45_000);
        assert!(parse_serve(&["felix", "--segment-bytes", "64 furlongs"]).is_err());

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("felix.toml");
        std::fs::write(
            &file,
            "segment_bytes = \"32MiB\"\nread_cache_bytes = 1048576\nretention_ms = \"12h\"\n\
             replica_resident_bytes = \"8 MiB\"\nmin_free_bytes = \"2GiB\"\n",
        )
        .unwrap();
        let a = parse_serve(&["felix", "--config", &file.display().to_string()]).unwrap();
        assert_eq!(a.segment_bytes, 32 << 20);
        assert_eq!(a.read_cache_bytes, 1 << 20);
        assert_eq!(a.retention_ms, 12 * 3_600_000);
        assert_eq!(a.replica_resident_bytes, 8 << 20);
        assert_eq!(a.min_free_bytes, MinFreeBytes::Bytes(2 << 30));
        std::fs::write(&file, "segment_bytes = \"lots\"\n").unwrap();
        assert!(parse_serve(&["felix", "--config", &file.display().to_string()]).is_err());
    }

    #[test]
    fn auto_create_in_the_file_counts_as_given() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("felix.toml");
        std::fs::write(&file, "auto_create = true\nmin_free_bytes = 12345\n").unwrap();
        let file = file.display().to_string();
        let a = parse_serve(&["felix", "--auth-keys", "/k.pem", "--config", &file]).unwrap();
        assert!(a.auto_create);
        assert_eq!(a.min_free_bytes, MinFreeBytes::Bytes(12345));
    }

    #[test]
    fn min_free_bytes_is_auto_a_number_or_refused() {
        assert_eq!(parse_serve(&["felix"]).unwrap().min_free_bytes, MinFreeBytes::Auto);
        let a = parse_serve(&["felix", "--min-free-bytes", "0"]).unwrap();
        assert_eq!(a.min_free_bytes, MinFreeBytes::Bytes(0));
        assert!(parse_serve(&["felix", "--min-free-bytes", "lots"]).is_err());
        // 5 % of the file system, capped.
        assert_eq!(MinFreeBytes::Auto.resolve(100 << 20), 5 << 20);
        assert_eq!(MinFreeBytes::Auto.resolve(10 << 40), MIN_FREE_AUTO_CAP_BYTES);
        assert_eq!(MinFreeBytes::Bytes(7).resolve(10 << 40), 7);
        let rendered = parse_serve(&["felix"]).unwrap().render();
        assert!(rendered.contains("min_free_bytes = \"auto\""), "{rendered}");
        assert!(rendered.contains("max_streams_per_tenant = 1000"), "{rendered}");
    }

    #[test]
    fn cpus_take_numbers_and_ranges_and_refuse_the_rest() {
        assert_eq!(parse_serve(&["felix"]).unwrap().cpus, CpuList(Vec::new()));
        let a = parse_serve(&["felix", "--cpus", "1-4"]).unwrap();
        assert_eq!(a.cpus.0, vec![1, 2, 3, 4]);
        let a = parse_serve(&["felix", "--cpus", "0, 2,5-6,3"]).unwrap();
        assert_eq!(a.cpus.0, vec![0, 2, 5, 6, 3], "in the order given");
        assert_eq!(parse_serve(&["felix", "--cpus", "7"]).unwrap().cpus.0, vec![7]);
        for bad in ["4-1", "a", "1-", "-3", "1-2-3", "0-100000"] {
            let err = parse_serve(&["felix", &format!("--cpus={bad}")]).unwrap_err();
            assert!(err.contains("--cpus"), "{bad}: {err}");
        }
        let rendered = parse_serve(&["felix", "--cpus", "2-3"]).unwrap().render();
        assert!(rendered.contains("cpus = [2, 3]"), "{rendered}");
    }

    #[test]
    fn cpus_in_the_file_are_a_list_or_a_string() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("felix.toml");
        for (text, want) in [("cpus = [3, 1]", vec![3, 1]), ("cpus = \"0,4-5\"", vec![0, 4, 5])] {
            std::fs::write(&file, text).unwrap();
            let a = parse_serve(&["felix", "--config", &file.display().to_string()]).unwrap();
            assert_eq!(a.cpus.0, want, "{text}");
            // A flag beats the file.
            let path = file.display().to_string();
            let a = parse_serve(&["felix", "--config", &path, "--cpus", "9"]).unwrap();
            assert_eq!(a.cpus.0, vec![9]);
        }
        std::fs::write(&file, "cpus = \"3-1\"").unwrap();
        let err = parse_serve(&["felix", "--config", &file.display().to_string()]).unwrap_err();
        assert!(err.contains("cpus"), "{err}");
    }

    #[test]
    fn a_zero_stream_quota_is_refused() {
        let err = parse_serve(&["felix", "--max-streams-per-tenant", "0"]).unwrap_err();
        assert!(err.contains("--max-streams-per-tenant"), "{err}");
    }
}
