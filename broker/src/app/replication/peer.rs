//! Links to other brokers for replication: this core's one outbound QUIC connection to each
//! peer broker's core with the same index, carrying `Replicate` frames.
//!
//! Each broker sends on its own connections and receives on the ones its peers opened, so a
//! link has a single writer: the link task, draining a bounded queue. Replica messages may be
//! lost (the protocol resends what matters), so a full queue or a broken connection drops
//! frames instead of waiting: the link reconnects after [`RECONNECT_MS`].

use std::net::{SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use felix_proto::{Capabilities, Frame, FrameDecoder, Hello, PROTOCOL_VERSION};
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};

use super::Host;

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

/// One outbound link: its queue.
pub struct PeerLink {
    tx: LocalSender<Bytes>,
}

impl PeerLink {
    /// A link to `node`, run by a task on this core until the host is dropped.
    pub fn open(host: &Rc<Host>, node: felix_cluster::NodeId) -> Rc<PeerLink> {
        let (tx, rx) = local_channel::new_bounded(LINK_QUEUE_FRAMES);
        glommio::spawn_local(run(Rc::downgrade(host), node, rx)).detach();
        Rc::new(PeerLink { tx })
    }

    /// Queues an encoded frame; false when the queue is full (the frame is dropped).
    pub fn send(&self, frame: Bytes) -> bool {
        self.tx.try_send(frame).is_ok()
    }
}

async fn run(host: std::rc::Weak<Host>, node: felix_cluster::NodeId, rx: LocalReceiver<Bytes>) {
    loop {
        let Some(h) = host.upgrade() else { return };
        let addr = h.address_of(&node).and_then(|a| resolve(&a));
        let conn = match addr {
            Some(addr) => connect(&h, addr).await,
            None => Err(format!("{node} has no known address")),
        };
        drop(h);
        match conn {
            Ok((conn, mut send)) => {
                tracing::debug!(%node, "replication link up");
                while let Some(frame) = rx.recv().await {
                    if let Err(e) = send.write_all(&frame).await {
                        tracing::debug!(%node, error = %e, "replication link broke");
                        break;
                    }
                }
                conn.close(0, b"link closed");
            }
            Err(e) => {
                tracing::debug!(%node, error = %e, "replication link: cannot connect");
                // Whatever waited is stale by the time a link is up: drop it.
                while let Some(Some(_)) = futures_lite::future::poll_once(rx.recv()).await {}
            }
        }
        glommio::timer::sleep(Duration::from_millis(RECONNECT_MS)).await;
    }
}

fn resolve(advertise: &str) -> Option<SocketAddr> {
    advertise.parse().ok().or_else(|| advertise.to_socket_addrs().ok()?.next())
}

/// Connects to core `host.core` of the broker at `addr` and exchanges Hello (capability
/// `REPLICATION`); returns the connection and its stream for frames.
async fn connect(
    host: &Host,
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
