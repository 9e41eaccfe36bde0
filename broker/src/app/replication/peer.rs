//! Links to other brokers for replication: this core's one outbound QUIC connection to each
//! peer broker's core with the same index, carrying `Replicate` frames.
//!
//! Each broker sends on its own connections and receives on the ones its peers opened, so a
//! link has a single writer: the link task, draining a bounded queue. Replica messages may be
//! lost (the protocol resends what matters), so a full queue or a broken connection drops
//! frames instead of waiting: the link reconnects after [`RECONNECT_MS`].

use std::cell::Cell;
use std::net::{SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use felix_proto::{Capabilities, Frame, FrameDecoder, Hello, PROTOCOL_VERSION};
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};

use super::ReplicationShell;

/// Frames waiting to be sent on one link; more are dropped.
pub const LINK_QUEUE_FRAMES: usize = 1024;
/// Wait before connecting again after a link failed.
pub const RECONNECT_MS: u64 = 200;
/// How long a peer has to answer the link's Hello.
pub const HELLO_TIMEOUT_MS: u64 = 3_000;

/// A link whose peer has been silent this long is closed (and opened again): a peer broker
/// that died or restarted is noticed within it, not after the clients' idle timeout.
pub const PEER_IDLE_TIMEOUT_MS: u64 = 1_500;
/// Keep-alives on an idle link, well within [`PEER_IDLE_TIMEOUT_MS`].
pub const PEER_KEEP_ALIVE_MS: u64 = 300;

/// The transport settings of links: a short idle timeout, kept alive while the peer answers.
pub fn transport() -> quinn_proto::TransportConfig {
    let mut t = quinn_proto::TransportConfig::default();
    let idle = quinn_proto::VarInt::from_u32(PEER_IDLE_TIMEOUT_MS as u32);
    t.max_idle_timeout(Some(quinn_proto::IdleTimeout::from(idle)));
    t.keep_alive_interval(Some(Duration::from_millis(PEER_KEEP_ALIVE_MS)));
    // Peers exchange streams only; no DATAGRAM frames are read, so none are accepted.
    t.datagram_receive_buffer_size(None);
    t
}

/// Where a link stands, for the readiness check and `replication_peers_unreachable`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// Not connected yet.
    Connecting,
    /// Connected; Hello answered with `REPLICATION`.
    Up,
    /// The last attempt to connect failed.
    Down,
}

/// One outbound link: its queue and its state.
pub struct PeerLink {
    tx: LocalSender<Bytes>,
    state: Rc<Cell<LinkState>>,
}

impl PeerLink {
    /// A link to `node`, run by a task on this core until the host is dropped.
    pub fn open(host: &Rc<ReplicationShell>, node: felix_cluster::NodeId) -> Rc<PeerLink> {
        let (tx, rx) = local_channel::new_bounded(LINK_QUEUE_FRAMES);
        let state = Rc::new(Cell::new(LinkState::Connecting));
        glommio::spawn_local(run(Rc::downgrade(host), node, rx, state.clone())).detach();
        Rc::new(PeerLink { tx, state })
    }

    /// Queues an encoded frame; false when the queue is full (the frame is dropped).
    pub fn send(&self, frame: Bytes) -> bool {
        self.tx.try_send(frame).is_ok()
    }

    /// Where the link stands.
    pub fn state(&self) -> LinkState {
        self.state.get()
    }
}

async fn run(
    host: std::rc::Weak<ReplicationShell>,
    node: felix_cluster::NodeId,
    rx: LocalReceiver<Bytes>,
    state: Rc<Cell<LinkState>>,
) {
    let mut warned: Option<Instant> = None;
    loop {
        let Some(h) = host.upgrade() else { return };
        let addr = h.address_of(&node).and_then(|a| resolve(&a));
        let conn = match addr {
            Some(addr) => connect(&h, addr).await.map_err(|e| (e, Some(addr))),
            None => Err((format!("{node} has no known address"), None)),
        };
        drop(h);
        match conn {
            Ok((conn, mut send)) => {
                tracing::debug!(%node, "replication link up");
                if warned.take().is_some() {
                    tracing::info!(%node, "replication link up again");
                }
                state.set(LinkState::Up);
                while let Some(frame) = rx.recv().await {
                    if let Err(e) = send.write_all(&frame).await {
                        tracing::debug!(%node, error = %e, "replication link broke");
                        break;
                    }
                }
                state.set(LinkState::Down);
                conn.close(0, b"link closed");
            }
            Err((e, addr)) => {
                state.set(LinkState::Down);
                tracing::debug!(%node, error = %e, "replication link: cannot connect");
                // Said once at `warn` per run of failures (each is at `debug`); "up again"
                // when the link comes back.
                if warned.is_none() {
                    warned = Some(Instant::now());
                    let addr = addr.map_or_else(|| "no address".to_owned(), |a| a.to_string());
                    match tls_hint(&e) {
                        Some(hint) => tracing::warn!(
                            %node, %addr, error = %e, "replication link: TLS handshake failed: {hint}"
                        ),
                        None => tracing::warn!(
                            %node, %addr, error = %e, "replication link: cannot connect"
                        ),
                    }
                }
                // Whatever waited is stale by the time a link is up: drop it.
                while let Some(Some(_)) = futures_lite::future::poll_once(rx.recv()).await {}
            }
        }
        glommio::timer::sleep(Duration::from_millis(RECONNECT_MS)).await;
    }
}

/// How often the check of [`verify_peers`] runs while it fails, at most (it starts at
/// [`RECONNECT_MS`] and doubles).
pub const VERIFY_RETRY_MAX_MS: u64 = 5_000;
/// How often [`verify_peers`] looks for brokers that joined since its last round.
pub const VERIFY_POLL_MS: u64 = 1_000;

/// Connects, as a replication peer, to core 0 of every other live broker (mutual TLS verified
/// both ways, Hello with `REPLICATION` answered). Once enough answered ([`trusted_enough`]),
/// says so in this broker's member key (`Member::peers_verified`): until then the controller
/// gives this broker no replicas. Afterwards it checks each broker that joins (or restarts, on a new lease) the
/// same way, so a newcomer whose certificate this broker does not trust is logged here too,
/// not only on the newcomer. A failure is logged at `warn` once per broker and error (until
/// that broker is reached) with what fixes it. Runs on core 0 for the broker's life.
pub async fn verify_peers(host: Rc<ReplicationShell>) {
    let mut wait = Duration::from_millis(RECONNECT_MS);
    // The (broker, error) pairs already said at `warn`, until that broker is reached.
    let mut warned: std::collections::HashSet<(felix_cluster::NodeId, String)> =
        std::collections::HashSet::new();
    let mut marked = false;
    // The brokers this one reached, with the lease they were on.
    let mut reached: std::collections::HashMap<felix_cluster::NodeId, Option<i64>> =
        std::collections::HashMap::new();
    loop {
        let view = host.link.view();
        reached.retain(|node, lease| view.member_leases.get(node).copied() == *lease);
        let due: Vec<(felix_cluster::NodeId, String)> = view
            .members
            .values()
            .filter(|m| m.node != host.me && !reached.contains_key(&m.node))
            .map(|m| (m.node.clone(), m.advertise.clone()))
            .collect();
        let mut failed = Vec::new();
        for (node, advertise) in due {
            let Some(addr) = resolve(&advertise) else {
                failed.push((node, advertise, "the address does not resolve".to_owned()));
                continue;
            };
            match connect(&host, addr).await {
                Ok((conn, _)) => {
                    conn.close(0, b"verified");
                    warned.retain(|(n, _)| *n != node);
                    reached.insert(node.clone(), view.member_leases.get(&node).copied());
                }
                Err(e) => failed.push((node, advertise, e)),
            }
        }
        if !marked && trusted_enough(&view, &host.me, &reached) {
            match host.agent.mark_peers_verified().await {
                Ok(()) => {
                    marked = true;
                    tracing::info!("replication links verified");
                }
                Err(e) => tracing::debug!(error = %e, "cannot record the verified links yet"),
            }
        }
        if failed.is_empty() {
            wait = Duration::from_millis(VERIFY_POLL_MS);
        } else {
            {
                let consequence = if marked {
                    "replicas shared with it cannot be followed"
                } else {
                    "this broker gets no replicas until it reaches the verified brokers"
                };
                for (node, addr, e) in &failed {
                    if !warned.insert((node.clone(), e.clone())) {
                        tracing::debug!(%node, %addr, error = %e, "replication link not verified");
                        continue;
                    }
                    // A verified broker says nothing of a peer that is merely down (a crash
                    // being failed over): its lease tells. A certificate problem it names.
                    let hint = match (tls_hint(e), marked) {
                        (Some(hint), _) => hint,
                        (None, false) => "is it running, and reachable from here?",
                        (None, true) => {
                            tracing::debug!(%node, %addr, error = %e, "peer not reached");
                            continue;
                        }
                    };
                    tracing::warn!(
                        %node, %addr, error = %e,
                        "replication link not verified: {consequence}; {hint}"
                    );
                }
            }
            wait = (wait * 2).min(Duration::from_millis(VERIFY_RETRY_MAX_MS));
        }
        glommio::timer::sleep(wait).await;
    }
}

/// Whether the brokers this one `reached` are enough to call its links verified: every other
/// verified member; or, while no other member is verified yet (a cluster starting), a majority
/// of the live members counting itself. So one broker whose certificate nobody trusts neither
/// gets verified itself nor keeps the others from it.
fn trusted_enough(
    view: &felix_cluster::ClusterView,
    me: &felix_cluster::NodeId,
    reached: &std::collections::HashMap<felix_cluster::NodeId, Option<i64>>,
) -> bool {
    let verified: Vec<&felix_cluster::NodeId> = view
        .members
        .values()
        .filter(|m| m.peers_verified && m.node != *me)
        .map(|m| &m.node)
        .collect();
    if !verified.is_empty() {
        return verified.iter().all(|n| reached.contains_key(*n));
    }
    let live = view.members.len().max(1);
    let reached_live = view.members.keys().filter(|n| reached.contains_key(*n)).count();
    (reached_live + 1) * 2 > live
}

/// What to do about a link error that is a certificate problem, or `None` for any other.
pub fn tls_hint(error: &str) -> Option<&'static str> {
    const TLS_WORDS: [&str; 5] =
        ["certificate", "Certificate", "handshake failed", "UnknownIssuer", "crypto"];
    if let Some(hint) = crate::net::tls::certificate_hint(error) {
        return Some(hint);
    }
    TLS_WORDS.iter().any(|w| error.contains(w)).then_some(
        "the brokers of a cluster must trust each other's certificates: give every broker \
         --peer-ca with the CA that signed every broker's --cert, and --peer-server-name with \
         the name those certificates carry (docs/operations.md, \"A cluster's certificates\")",
    )
}

fn resolve(advertise: &str) -> Option<SocketAddr> {
    advertise.parse().ok().or_else(|| advertise.to_socket_addrs().ok()?.next())
}

/// Connects to core `host.core` of the broker at `addr` and exchanges Hello (capability
/// `REPLICATION`); returns the connection and its stream for frames.
async fn connect(
    host: &ReplicationShell,
    addr: SocketAddr,
) -> Result<(crate::net::Connection, crate::net::SendStream), String> {
    let conn = host
        .ctx
        .connect(host.tls.clone(), addr, &host.server_name, host.core)
        .map_err(|e| e.to_string())?;
    let hello = async {
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
        let hello = Hello {
            version: PROTOCOL_VERSION,
            capabilities: Capabilities::REPLICATION,
            token: None,
        };
        let mut buf = BytesMut::new();
        Frame::Hello(hello).encode(&mut buf);
        send.write_all(&buf).await.map_err(|e| e.to_string())?;
        let mut decoder = FrameDecoder::new(felix_proto::Limits::default(), Capabilities::ALL);
        loop {
            let chunk = recv.read_chunk(4096).await.map_err(|e| e.to_string())?;
            let Some(chunk) = chunk else { return Err("the peer closed the stream".into()) };
            decoder.handle_chunk(chunk);
            match decoder.poll_frame() {
                None => continue,
                Some(Ok(Frame::HelloOk(ok)))
                    if ok.capabilities.contains(Capabilities::REPLICATION) =>
                {
                    return Ok(send)
                }
                Some(Ok(other)) => return Err(format!("the peer answered Hello with {other:?}")),
                Some(Err(e)) => return Err(e.to_string()),
            }
        }
    };
    let timeout = Duration::from_millis(HELLO_TIMEOUT_MS);
    match glommio::timer::timeout(timeout, async { Ok(hello.await) }).await {
        Ok(Ok(send)) => Ok((conn, send)),
        Ok(Err(e)) => {
            conn.close(0, b"hello failed");
            Err(e)
        }
        Err(_) => {
            conn.close(0, b"hello timed out");
            Err("the peer did not answer Hello".into())
        }
    }
}
