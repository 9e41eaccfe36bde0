//! Starting and stopping the per-core QUIC endpoints.
//!
//! [`Server::start`] loads TLS, binds one SO_REUSEPORT socket per core on the calling thread (in
//! core order, so the group index is the core index), attaches steering, builds the core mesh,
//! and spawns one glommio executor per core. Each core then runs its driver tasks
//! ([`super::driver`]) and the application's future, made by the factory with a
//! [`CoreContext`].

use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use felix_proto::CoreId;
use glommio::channels::shared_channel::{self, SharedReceiver, SharedSender};
use glommio::{LocalExecutorBuilder, Placement};
use quinn_proto::{EndpointConfig, IdleTimeout, MtuDiscoveryConfig, TransportConfig, VarInt};
use quinn_udp::UdpSocketState;

use super::cid::CoreCidGenerator;
use super::config::{self, NetConfig};
use super::conn::Connection;
use super::core::{ConnectError, CoreLimits, CoreState, Datagram};
use super::driver::{self, CoreRef, CoreShell, SocketIo};
use super::stats::{steering_code, CoreStats, CoreStatsSnapshot};
use super::steering::{self, AttachOptions, EffectiveSteering};
use super::tls::{ServerIdentity, TlsError};
use crate::sys::socket;

/// Registered I/O memory per executor: the network path does not use glommio's DMA buffers,
/// and the machine's memlock limit is small.
pub const IO_MEMORY_BYTES: usize = 256 << 10;
/// How often a core checks whether shutdown was requested.
pub const STOP_POLL_MS: u64 = 20;
/// How long shutdown waits for connections to close before the executors exit.
pub const SHUTDOWN_GRACE_MS: u64 = 2_000;
/// How often a core publishes its thread CPU time.
const CPU_SAMPLE_MS: u64 = 500;

/// Starts the per-core endpoints.
pub struct Server;

/// What the application's per-core future gets: its core's accepted connections.
#[derive(Clone)]
pub struct CoreContext {
    core: CoreRef,
    core_id: CoreId,
}

impl CoreContext {
    /// The next established connection on this core; `None` once the server shuts down.
    pub async fn accept(&self) -> Option<Connection> {
        poll_fn(|cx| self.core.state().poll_accept(cx)).await
    }

    /// This core's index.
    pub fn core(&self) -> CoreId {
        self.core_id
    }

    /// Opens a connection from this core to the broker at `remote`, handed there to its core
    /// `target` (see [`super::core::CoreState::connect`]): replication connects core i of one
    /// broker to core i of another. Returns at once; the handshake runs in the background, and
    /// the first stream opened waits for it (and fails with its error).
    pub fn connect(
        &self,
        config: quinn_proto::ClientConfig,
        remote: SocketAddr,
        server_name: &str,
        target: CoreId,
    ) -> Result<Connection, ConnectError> {
        self.core.connect(config, remote, server_name, target)
    }
}

impl Server {
    /// Starts `config.cores` cores. `app` is called once on each core with its
    /// [`CoreContext`]; the future it returns runs on that core until it completes or the
    /// server shuts down.
    pub fn start<F, Fut>(config: NetConfig, app: F) -> Result<ServerHandle, StartError>
    where
        F: Fn(CoreContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        config.validate()?;
        super::cid::check_core_count(config.cores).map_err(|e| StartError::Cid(e.to_string()))?;
        eprintln!("felix-net: config {config}");
        let identity = ServerIdentity::load(&config.tls)?;
        eprintln!(
            "felix-net: certificate sha256 {}{}",
            identity.fingerprint,
            if identity.generated { " (development certificate generated)" } else { "" }
        );
        let server_config = Arc::new(quic_server_config(&config, &identity)?);
        let sockets =
            socket::bind_reuseport_group(config.listen, config.cores).map_err(StartError::Bind)?;
        let local_addr = sockets[0]
            .local_addr()
            .map_err(StartError::Bind)?
            .as_socket()
            .ok_or_else(|| StartError::Bind(std::io::Error::other("no inet address")))?;
        let fds: Vec<_> = sockets.iter().map(|s| s.as_fd()).collect();
        let options = AttachOptions { refuse_ebpf: config.steering_refuse_ebpf };
        let steering = steering::attach_with(&fds, config.steering, &options)
            .map_err(|e| StartError::Steering(e.to_string()))?;
        drop(fds);
        let effective = steering.effective();
        eprintln!(
            "felix-net: {} cores on {local_addr}, steering requested {:?}, effective {effective:?}{}",
            config.cores,
            config.steering,
            steering
                .ebpf_error()
                .map(|e| format!(" (eBPF unavailable: {e})"))
                .unwrap_or_default()
        );

        let n = config.cores;
        // mesh[from][to]: a bounded queue of misrouted datagrams.
        let mut senders: Vec<Vec<Option<SharedSender<Datagram>>>> =
            (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
        let mut receivers: Vec<Vec<SharedReceiver<Datagram>>> =
            (0..n).map(|_| Vec::new()).collect();
        for (from, row) in senders.iter_mut().enumerate() {
            for (to, slot) in row.iter_mut().enumerate() {
                if from != to {
                    let (tx, rx) = shared_channel::new_bounded(config::MESH_DATAGRAMS_QUEUED_MAX);
                    *slot = Some(tx);
                    receivers[to].push(rx);
                }
            }
        }

        let stats: Vec<Arc<CoreStats>> = (0..n).map(|_| Arc::new(CoreStats::default())).collect();
        for s in &stats {
            CoreStats::set(&s.steering_mode, steering_code(effective));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let app = Arc::new(app);
        let limits = CoreLimits::new(&config);
        let base_endpoint = base_endpoint_config(&config)?;
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), std::io::Error>>();
        let mut threads = Vec::with_capacity(n);
        for ((i, socket), (tx_row, rx_col)) in
            sockets.into_iter().enumerate().zip(senders.into_iter().zip(receivers))
        {
            let placement = match config.cpus.is_empty() {
                true => Placement::Unbound,
                false => Placement::Fixed(config.cpus[i % config.cpus.len()]),
            };
            let core_id = CoreId(i as u16);
            let mut endpoint_config = base_endpoint.clone();
            endpoint_config.cid_generator(move || {
                // Cannot fail: check_core_count above bounded the core index.
                Box::new(CoreCidGenerator::new(core_id).unwrap_or_else(|_| unreachable_core()))
            });
            let ctx = CoreStart {
                core_id,
                cores: n,
                socket,
                endpoint_config: Arc::new(endpoint_config),
                server_config: server_config.clone(),
                stats: stats[i].clone(),
                limits,
                mesh_tx: tx_row,
                mesh_rx: rx_col,
                stop: stop.clone(),
                ready: ready_tx.clone(),
            };
            let app = app.clone();
            let handle = LocalExecutorBuilder::new(placement)
                .name(&format!("felix-core-{i}"))
                .io_memory(IO_MEMORY_BYTES)
                .spawn(move || async move { run_core(ctx, move |c| app(c)).await })
                .map_err(|e| StartError::Executor(e.to_string()))?;
            threads.push(handle);
        }
        drop(ready_tx);
        let mut handle = ServerHandle {
            local_addr,
            stats,
            stop,
            threads,
            steering: effective,
            _steering: Box::new(steering),
        };
        for _ in 0..n {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    handle.stop_and_join();
                    return Err(StartError::CoreSocket(e));
                }
                Err(_) => {
                    handle.stop_and_join();
                    return Err(StartError::CoreExited);
                }
            }
        }
        Ok(handle)
    }
}

fn unreachable_core() -> CoreCidGenerator {
    // Only reached if check_core_count and the core loop disagree; core 0 keeps CIDs valid.
    CoreCidGenerator::new(CoreId(0)).unwrap_or_else(|_| std::process::abort())
}

/// The endpoint configuration every core starts from: one reset key for all cores (cloned), so
/// any core's stateless reset is valid for any connection, and `max_udp_payload`.
pub(crate) fn base_endpoint_config(config: &NetConfig) -> Result<EndpointConfig, StartError> {
    let mut c = EndpointConfig::default();
    c.max_udp_payload_size(config.max_udp_payload).map_err(|e| StartError::Quic(e.to_string()))?;
    Ok(c)
}

/// The quinn-proto server configuration: TLS, transport limits and windows, migration allowed.
pub(crate) fn quic_server_config(
    config: &NetConfig,
    identity: &ServerIdentity,
) -> Result<quinn_proto::ServerConfig, StartError> {
    if let Some(roots) = &config.peer_client_roots {
        super::tls::check_peer_identity(identity, roots)?;
    }
    let mut server = identity.quic_server_config(config.peer_client_roots.as_deref())?;
    let mut transport = TransportConfig::default();
    let idle =
        IdleTimeout::try_from(config.idle_timeout).map_err(|e| StartError::Quic(e.to_string()))?;
    transport
        .max_idle_timeout(Some(idle))
        .max_concurrent_bidi_streams(VarInt::from_u32(config.max_streams_per_conn))
        .max_concurrent_uni_streams(match config.peer_uni_streams {
            true => VarInt::from_u32(config.max_streams_per_conn),
            false => VarInt::from_u32(0),
        })
        // No QUIC DATAGRAM support is advertised: nothing here reads datagrams, and quinn-proto
        // would otherwise queue up to its default 1.25 MB of them per connection, each a
        // slice of a receive slab. A peer that sends one anyway is closed (PROTOCOL_VIOLATION).
        .datagram_receive_buffer_size(None)
        .stream_receive_window(VarInt::from_u32(config::STREAM_RECEIVE_WINDOW_BYTES))
        .receive_window(VarInt::from_u32(config::CONN_RECEIVE_WINDOW_BYTES))
        .send_window(config::CONN_SEND_WINDOW_BYTES);
    let mut mtud = MtuDiscoveryConfig::default();
    mtud.upper_bound(config.max_udp_payload);
    transport.mtu_discovery_config(Some(mtud));
    server.transport_config(Arc::new(transport));
    server.migration(true);
    Ok(server)
}

struct CoreStart {
    core_id: CoreId,
    cores: usize,
    socket: socket2::Socket,
    endpoint_config: Arc<EndpointConfig>,
    server_config: Arc<quinn_proto::ServerConfig>,
    stats: Arc<CoreStats>,
    limits: CoreLimits,
    mesh_tx: Vec<Option<SharedSender<Datagram>>>,
    mesh_rx: Vec<SharedReceiver<Datagram>>,
    stop: Arc<AtomicBool>,
    ready: mpsc::Sender<Result<(), std::io::Error>>,
}

async fn run_core<Fut: Future<Output = ()> + 'static>(
    s: CoreStart,
    app: impl FnOnce(CoreContext) -> Fut,
) {
    let ready = s.ready.clone();
    match setup_core(s, app).await {
        Ok(()) => {}
        Err(e) => {
            let _ = ready.send(Err(e));
        }
    }
}

async fn setup_core<Fut: Future<Output = ()> + 'static>(
    s: CoreStart,
    app: impl FnOnce(CoreContext) -> Fut,
) -> Result<(), std::io::Error> {
    let state = UdpSocketState::new((&s.socket).into())?;
    let ready_sock = socket::glommio_readiness_socket(&s.socket)?;
    let allow_mtud = !state.may_fragment();
    let max_gso_segments = state.max_gso_segments();
    let io = SocketIo { socket: s.socket, state };
    let endpoint =
        quinn_proto::Endpoint::new(s.endpoint_config, Some(s.server_config), allow_mtud, None);
    // Connecting a shared channel waits for its other end: connect every end concurrently,
    // or two cores would wait on each other.
    let tx_tasks: Vec<_> =
        s.mesh_tx.into_iter().map(|tx| tx.map(|tx| glommio::spawn_local(tx.connect()))).collect();
    let rx_tasks: Vec<_> =
        s.mesh_rx.into_iter().map(|rx| glommio::spawn_local(rx.connect())).collect();
    let mut mesh = Vec::with_capacity(s.cores);
    for t in tx_tasks {
        mesh.push(match t {
            Some(t) => Some(t.await),
            None => None,
        });
    }
    let mut mesh_rx = Vec::with_capacity(rx_tasks.len());
    for t in rx_tasks {
        mesh_rx.push(t.await);
    }
    let state = CoreState::new(
        s.core_id,
        s.cores,
        endpoint,
        s.stats.clone(),
        s.limits,
        max_gso_segments,
        Instant::now(),
    );
    let core = CoreShell::new(state, io, mesh);
    // Kept to be cancelled at shutdown: each holds this core (its socket) and waits on a
    // channel whose sender another core's shell holds, so neither would ever end.
    let mesh_tasks: Vec<_> = mesh_rx
        .into_iter()
        .map(|rx| glommio::spawn_local(driver::mesh_loop(core.clone(), rx)).detach())
        .collect();
    let recv = glommio::spawn_local(driver::recv_loop(core.clone(), ready_sock)).detach();
    let app_task =
        glommio::spawn_local(app(CoreContext { core: core.clone(), core_id: s.core_id })).detach();
    let _ = s.ready.send(Ok(()));

    let mut since_sample_ms = 0;
    while !s.stop.load(Ordering::Relaxed) {
        glommio::timer::sleep(Duration::from_millis(STOP_POLL_MS)).await;
        since_sample_ms += STOP_POLL_MS;
        if since_sample_ms >= CPU_SAMPLE_MS {
            since_sample_ms = 0;
            CoreStats::set(&s.stats.cpu_time_us, socket::thread_cpu_time_us());
            core.state().sample_paths();
        }
    }
    driver::shutdown(&core, Duration::from_millis(SHUTDOWN_GRACE_MS)).await;
    app_task.cancel();
    recv.cancel();
    for t in &mesh_tasks {
        t.cancel();
    }
    // One more turn of the reactor: the cancelled receive task's in-flight io_uring recvmsg
    // holds the socket, and is cancelled here rather than by the ring's teardown after the
    // thread exits (which leaves the port bound for up to ~50 ms after join).
    glommio::timer::sleep(Duration::from_millis(1)).await;
    CoreStats::set(&s.stats.cpu_time_us, socket::thread_cpu_time_us());
    core.state().sample_paths();
    Ok(())
}

/// A running server: its address, per-core counters, and shutdown.
pub struct ServerHandle {
    local_addr: SocketAddr,
    stats: Vec<Arc<CoreStats>>,
    stop: Arc<AtomicBool>,
    threads: Vec<glommio::ExecutorJoinHandle<()>>,
    steering: EffectiveSteering,
    _steering: Box<steering::Steering>,
}

impl ServerHandle {
    /// The address all cores listen on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Number of cores.
    pub fn cores(&self) -> usize {
        self.stats.len()
    }

    /// The steering mode in effect.
    pub fn steering(&self) -> EffectiveSteering {
        self.steering
    }

    /// A snapshot of every core's counters, in core order.
    pub fn stats(&self) -> Vec<CoreStatsSnapshot> {
        self.stats.iter().map(|s| s.snapshot()).collect()
    }

    /// Closes every connection, stops the cores and waits for their threads.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// The server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A configuration field is out of bounds.
    #[error("config: {0}")]
    Config(#[from] config::ConfigError),
    /// The core count cannot be encoded in connection IDs.
    #[error("connection ids: {0}")]
    Cid(String),
    /// Loading or generating the certificate failed.
    #[error("tls: {0}")]
    Tls(#[from] TlsError),
    /// quinn-proto refused a transport setting.
    #[error("quic config: {0}")]
    Quic(String),
    /// Creating or binding the sockets failed.
    #[error("bind: {0}")]
    Bind(std::io::Error),
    /// The requested steering mode could not be attached.
    #[error("steering: {0}")]
    Steering(String),
    /// An executor could not be created.
    #[error("executor: {0}")]
    Executor(String),
    /// A core could not set up its socket for quinn-udp or for glommio's readiness.
    #[error("executor: {0}")]
    CoreSocket(#[source] std::io::Error),
    /// A core's executor exited before it reported that it started.
    #[error("executor: a core exited during start")]
    CoreExited,
}
