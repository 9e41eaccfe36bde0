//! Configuration of the per-core QUIC endpoints: every knob is a field here, printed at start
//! (`NetConfig`'s `Display`), and read by the driver.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::steering::SteeringMode;

/// Default bound on connections owned by one core.
pub const DEFAULT_MAX_CONNS_PER_CORE: usize = 10_000;
/// Default bound on concurrently open streams (per direction) a peer may open on one connection.
pub const DEFAULT_MAX_STREAMS_PER_CONN: u32 = 256;
/// Default idle timeout: a connection silent for this long is closed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default bound on handshakes a core accepts per second before answering with stateless retry.
pub const DEFAULT_HANDSHAKES_PER_SEC_PER_CORE: u32 = 2_000;
/// Default ceiling for path MTU discovery (UDP payload bytes): a 1500-byte Ethernet path.
pub const DEFAULT_MAX_UDP_PAYLOAD: u16 = 1452;
/// QUIC's minimum UDP payload; `max_udp_payload` may not be smaller.
pub const MIN_UDP_PAYLOAD: u16 = 1200;
/// Largest `max_udp_payload` accepted (a 64 KiB loopback datagram less IP/UDP headers).
pub const MAX_UDP_PAYLOAD: u16 = 65_527;
/// Most cores one server runs (the CID carries the core index in one byte).
pub const MAX_CORES: usize = 256;
/// Datagrams queued on each directed core-mesh queue carrying misrouted datagrams to their
/// owner core (the net layer's mesh; the application's is `app::mesh::MESH_MESSAGES_QUEUED_MAX`).
pub const MESH_DATAGRAMS_QUEUED_MAX: usize = 1024;
/// Depth of the per-core queue of established connections waiting for the application.
pub const ACCEPT_QUEUE_DEPTH: usize = 1024;
/// Per-stream receive window (bytes): the most a peer may send ahead of the application's reads.
pub const STREAM_RECEIVE_WINDOW_BYTES: u32 = 1 << 20;
/// Per-connection receive window (bytes), over all its streams.
pub const CONN_RECEIVE_WINDOW_BYTES: u32 = 8 << 20;
/// Per-connection send window (bytes): the most unacknowledged data a connection buffers.
pub const CONN_SEND_WINDOW_BYTES: u64 = 8 << 20;
/// Most UDP payload bytes one GSO send may carry: the kernel refuses a larger one with
/// `EMSGSIZE` (a UDP datagram's length field is 16 bits), and quinn-udp drops such a send after
/// logging it, so every segment of it is lost.
pub const GSO_BYTES_MAX: usize = 65_507;

/// How many segments of `segment_bytes` one GSO send may carry: the socket's own limit
/// (`kernel_segments_max`, 64 on Linux) bounded by [`GSO_BYTES_MAX`]; at least one.
pub fn gso_segments_max(kernel_segments_max: usize, segment_bytes: u16) -> usize {
    kernel_segments_max.min(GSO_BYTES_MAX / usize::from(segment_bytes.max(1))).max(1)
}

/// Where the TLS certificate comes from.
#[derive(Clone, Debug)]
pub enum TlsSource {
    /// A certificate chain and private key, PEM files.
    Pem {
        /// Certificate chain, leaf first.
        cert: PathBuf,
        /// PKCS#8, PKCS#1 or SEC1 private key.
        key: PathBuf,
    },
    /// A self-signed development certificate for `localhost`, `127.0.0.1` and `::1`, generated
    /// once into `data_dir` (`dev-cert.pem`, `dev-key.pem`) and reused afterwards.
    Dev {
        /// Directory holding the generated files.
        data_dir: PathBuf,
    },
}

/// Configuration of the network layer.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// Address every core's socket binds to (port 0 picks one).
    pub listen: SocketAddr,
    /// Number of cores (executors, sockets, endpoints).
    pub cores: usize,
    /// CPUs to pin core `i` to: `cpus[i % cpus.len()]`; empty means unpinned.
    pub cpus: Vec<usize>,
    /// How datagrams are steered to the core owning their connection ID.
    pub steering: SteeringMode,
    /// Act as if the kernel refused the eBPF program (tests of the fallback path).
    pub steering_refuse_ebpf: bool,
    /// Ceiling for path MTU discovery, in UDP payload bytes.
    pub max_udp_payload: u16,
    /// A connection silent for this long is closed.
    pub idle_timeout: Duration,
    /// Connections one core owns at most; more are refused.
    pub max_conns_per_core: usize,
    /// Concurrent streams per direction a peer may open on one connection.
    pub max_streams_per_conn: u32,
    /// Whether a peer may open unidirectional streams at all. The broker's application opens
    /// its own (subscriptions) but accepts none, and a stream nobody accepts would hold its
    /// data (and the receive buffers it points into) for the connection's life: off by default.
    pub peer_uni_streams: bool,
    /// New handshakes per second one core accepts from unvalidated addresses; past it, the core
    /// answers with a stateless retry.
    pub handshakes_per_sec_per_core: u32,
    /// Certificate source.
    pub tls: TlsSource,
    /// In a cluster: the certificates (PEM) a connecting broker's client certificate is
    /// verified against (`--peer-ca`). Connections may then present one (optional: clients do
    /// not); `None` asks for none.
    pub peer_client_roots: Option<PathBuf>,
}

impl NetConfig {
    /// A configuration with the defaults above, listening on `listen` with `cores` cores.
    pub fn new(listen: SocketAddr, cores: usize, tls: TlsSource) -> Self {
        Self {
            listen,
            cores,
            cpus: Vec::new(),
            steering: SteeringMode::Auto,
            steering_refuse_ebpf: false,
            max_udp_payload: DEFAULT_MAX_UDP_PAYLOAD,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_conns_per_core: DEFAULT_MAX_CONNS_PER_CORE,
            max_streams_per_conn: DEFAULT_MAX_STREAMS_PER_CONN,
            peer_uni_streams: false,
            handshakes_per_sec_per_core: DEFAULT_HANDSHAKES_PER_SEC_PER_CORE,
            tls,
            peer_client_roots: None,
        }
    }

    /// Checks every field against its bounds.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.cores == 0 || self.cores > MAX_CORES {
            return Err(ConfigError::Cores(self.cores));
        }
        if !(MIN_UDP_PAYLOAD..=MAX_UDP_PAYLOAD).contains(&self.max_udp_payload) {
            return Err(ConfigError::MaxUdpPayload(self.max_udp_payload));
        }
        if self.max_conns_per_core == 0 {
            return Err(ConfigError::Zero("max_conns_per_core"));
        }
        if self.handshakes_per_sec_per_core == 0 {
            return Err(ConfigError::Zero("handshakes_per_sec_per_core"));
        }
        if self.idle_timeout.is_zero() {
            return Err(ConfigError::Zero("idle_timeout"));
        }
        Ok(())
    }
}

impl fmt::Display for NetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "listen={} cores={} cpus={:?} steering={:?} max_udp_payload={} idle_timeout_ms={} \
             max_conns_per_core={} max_streams_per_conn={} handshakes_per_sec_per_core={} tls={}",
            self.listen,
            self.cores,
            self.cpus,
            self.steering,
            self.max_udp_payload,
            self.idle_timeout.as_millis(),
            self.max_conns_per_core,
            self.max_streams_per_conn,
            self.handshakes_per_sec_per_core,
            match &self.tls {
                TlsSource::Pem { cert, .. } => format!("pem:{}", cert.display()),
                TlsSource::Dev { data_dir } => format!("dev:{}", data_dir.display()),
            }
        )
    }
}

/// A configuration field out of bounds.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `cores` must be in 1..=MAX_CORES.
    #[error("cores must be in 1..={MAX_CORES}, got {0}")]
    Cores(usize),
    /// `max_udp_payload` must be in MIN_UDP_PAYLOAD..=MAX_UDP_PAYLOAD.
    #[error("max_udp_payload must be in {MIN_UDP_PAYLOAD}..={MAX_UDP_PAYLOAD}, got {0}")]
    MaxUdpPayload(u16),
    /// A field that must be positive is zero.
    #[error("{0} must be positive")]
    Zero(&'static str),
}
