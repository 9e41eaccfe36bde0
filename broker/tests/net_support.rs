//! Shared helpers for the `net_*` tests: an echo application for the server and a quinn (tokio)
//! client that trusts the server's development certificate. Included by the other `net_*`
//! tests with `#[path]`; on its own it has one smoke test of the helpers.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use felix_broker::net::tls::{ALPN, DEV_CERT_FILE};
use felix_broker::net::{CoreContext, NetConfig, Server, ServerHandle, TlsSource};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// Bound on every network wait in the tests.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(20);

/// What the echo server saw, for assertions.
#[derive(Debug, Default)]
pub struct Seen {
    /// (core index, peer) per accepted connection.
    pub accepted: Vec<(u16, SocketAddr)>,
    /// The close reason of each connection, as the server saw it.
    pub closed: Vec<String>,
    /// (first peer, peer when closed) per connection: differs after a migration.
    pub peers: Vec<(SocketAddr, SocketAddr)>,
    /// Streams echoed to the end.
    pub streams_done: usize,
}

/// A config on 127.0.0.1:0 with a dev certificate in `dir`.
pub fn config(dir: &Path, cores: usize) -> NetConfig {
    let mut c = NetConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        cores,
        TlsSource::Dev { data_dir: dir.to_owned() },
    );
    c.idle_timeout = Duration::from_secs(10);
    // These tests drive the network layer with client-opened unidirectional streams.
    c.peer_uni_streams = true;
    c
}

/// Starts an echo server: every accepted connection first gets a unidirectional stream holding
/// its core index (one byte), then every bidirectional stream is echoed until its end.
pub fn start_echo(config: NetConfig) -> (ServerHandle, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = seen.clone();
    let handle = Server::start(config, move |ctx: CoreContext| {
        let seen = s.clone();
        async move {
            while let Some(conn) = ctx.accept().await {
                seen.lock().unwrap().accepted.push((conn.core().0, conn.peer()));
                let seen = seen.clone();
                glommio::spawn_local(async move {
                    if let Ok(mut tag) = conn.open_uni().await {
                        let _ = tag.write_all(&[conn.core().0 as u8]).await;
                        let _ = tag.finish();
                    }
                    let closer = conn.clone();
                    let seen2 = seen.clone();
                    let first_peer = conn.peer();
                    glommio::spawn_local(async move {
                        let why = closer.closed().await;
                        let mut seen = seen2.lock().unwrap();
                        seen.closed.push(why.to_string());
                        seen.peers.push((first_peer, closer.peer()));
                    })
                    .detach();
                    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                        let seen = seen.clone();
                        glommio::spawn_local(async move {
                            let mut buf = vec![0u8; 32 * 1024];
                            loop {
                                match recv.read(&mut buf).await {
                                    Ok(Some(n)) => {
                                        if send.write_all(&buf[..n]).await.is_err() {
                                            return;
                                        }
                                    }
                                    Ok(None) => break,
                                    Err(_) => return,
                                }
                            }
                            if send.finish().is_ok() {
                                seen.lock().unwrap().streams_done += 1;
                            }
                        })
                        .detach();
                    }
                })
                .detach();
            }
        }
    })
    .expect("server starts");
    (handle, seen)
}

/// A quinn client endpoint on 127.0.0.1:0 trusting the dev certificate in `dir`.
pub fn client(dir: &Path) -> quinn::Endpoint {
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(client_config(dir));
    ep
}

/// A quinn client config trusting the dev certificate in `dir` (quinn's defaults otherwise:
/// 20-byte random Initial DCIDs).
pub fn client_config(dir: &Path) -> quinn::ClientConfig {
    let cert = CertificateDer::from_pem_file(dir.join(DEV_CERT_FILE)).expect("dev cert");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut cc = quinn::ClientConfig::new(Arc::new(quic));
    let mut transport = quinn::TransportConfig::default();
    transport.max_idle_timeout(Some(Duration::from_secs(10).try_into().unwrap()));
    cc.transport_config(Arc::new(transport));
    cc
}

/// Connects and reads the server's core tag.
pub async fn connect(ep: &quinn::Endpoint, addr: SocketAddr) -> (quinn::Connection, u16) {
    let conn = tokio::time::timeout(STEP_TIMEOUT, ep.connect(addr, "localhost").unwrap())
        .await
        .expect("handshake in time")
        .expect("handshake");
    let mut tag = tokio::time::timeout(STEP_TIMEOUT, conn.accept_uni())
        .await
        .expect("tag in time")
        .expect("tag stream");
    let core = tag.read_to_end(8).await.expect("tag");
    assert_eq!(core.len(), 1);
    (conn, u16::from(core[0]))
}

/// Deterministic payload for stream `i` of length `len`.
pub fn payload(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| ((i * 131 + j * 7) % 251) as u8).collect()
}

/// Sends `data` on a new bidirectional stream and checks the echo.
pub async fn echo_once(conn: &quinn::Connection, data: &[u8]) {
    let (mut send, mut recv) = conn.open_bi().await.expect("open_bi");
    let writer = async {
        send.write_all(data).await.expect("write");
        send.finish().expect("finish");
    };
    let reader = async { recv.read_to_end(data.len() + 1).await.expect("read echo") };
    let ((), back) = tokio::join!(writer, reader);
    assert_eq!(back.len(), data.len());
    assert!(back == data, "echo differs");
}

/// Polls `f` every 20 ms until it holds, for at most `STEP_TIMEOUT`.
pub async fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < STEP_TIMEOUT {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

#[test]
fn payload_is_deterministic() {
    assert_eq!(payload(3, 10), payload(3, 10));
    assert_ne!(payload(3, 10), payload(4, 10));
}
