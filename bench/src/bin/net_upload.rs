//! Upload generator for the network benchmark.
//!
//! `net_upload quic <addr> <secs> <conns>`: a quinn (tokio, current-thread) client opening
//! `conns` connections, each writing one unidirectional stream as fast as flow and congestion
//! control allow, in 1200-byte datagrams (MTU discovery off).
//! `net_upload udp <addr> <secs>`: raw 1200-byte datagrams with GSO, as fast as the socket takes
//! them.
//! At the end prints one JSON line with its own CPU time, so the script can tell whether the
//! generator was the bottleneck.

use std::sync::Arc;
use std::time::{Duration, Instant};

const DATAGRAM_BYTES: usize = 1200;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() >= 4, "usage: net_upload quic|udp <addr> <secs> [conns]");
    let addr: std::net::SocketAddr = args[2].parse()?;
    let secs = Duration::from_secs_f64(args[3].parse()?);
    let c0 = felix_bench::process_cpu_us();
    let t0 = Instant::now();
    let samples = sample_busy_per_second();
    let sent = match args[1].as_str() {
        "quic" => {
            let conns: usize = args.get(4).map(|c| c.parse()).transpose()?.unwrap_or(4);
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(quic(addr, secs, conns))?
        }
        "udp" => udp(addr, secs)?,
        other => anyhow::bail!("unknown mode {other}"),
    };
    let wall = t0.elapsed().as_secs_f64();
    let cpu_us = felix_bench::process_cpu_us() - c0;
    // Busy share per second while uploading: drop the first second (handshakes, warm-up) and
    // the last (the sink may already have stopped), and report the median of the rest.
    let mut per_second = samples.lock().map(|s| s.clone()).unwrap_or_default();
    if per_second.len() > 2 {
        per_second.remove(0);
        per_second.pop();
    }
    let mut sorted = per_second.clone();
    sorted.sort_by(f64::total_cmp);
    let busy = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    println!(
        "{}",
        serde_json::json!({
            "generator": args[1],
            "wall_s": wall,
            "sent": sent,
            "cpu_us": cpu_us,
            "generator_busy": busy,
            "generator_busy_per_second": per_second,
        })
    );
    Ok(())
}

async fn quic(addr: std::net::SocketAddr, secs: Duration, conns: usize) -> anyhow::Result<u64> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_no_client_auth();
    tls.alpn_protocols = vec![felix_proto::ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
    let mut cc = quinn::ClientConfig::new(Arc::new(quic));
    let mut transport = quinn::TransportConfig::default();
    transport.initial_mtu(DATAGRAM_BYTES as u16).mtu_discovery_config(None);
    cc.transport_config(Arc::new(transport));
    let mut ep = quinn::Endpoint::client("0.0.0.0:0".parse()?)?;
    ep.set_default_client_config(cc);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..conns {
        let conn = ep.connect(addr, "localhost")?.await?;
        tasks.spawn(async move {
            let mut send = conn.open_uni().await?;
            let chunk = bytes::Bytes::from(vec![0x5a_u8; 64 * 1024]);
            let deadline = Instant::now() + secs;
            let mut sent = 0u64;
            let deadline = tokio::time::Instant::from_std(deadline);
            // Ends at the deadline even when blocked on flow control, or earlier when the sink
            // closes the connection at the end of its measurement.
            while let Ok(Ok(())) =
                tokio::time::timeout_at(deadline, send.write_chunk(chunk.clone())).await
            {
                sent += chunk.len() as u64;
            }
            let _ = send.finish();
            conn.close(0u32.into(), b"done");
            anyhow::Ok(sent)
        });
    }
    let mut total = 0;
    while let Some(r) = tasks.join_next().await {
        total += r??;
    }
    // Give the close frames a moment; the sink may already be gone.
    let _ = tokio::time::timeout(Duration::from_millis(200), ep.wait_idle()).await;
    Ok(total)
}

fn udp(addr: std::net::SocketAddr, secs: Duration) -> anyhow::Result<u64> {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let state = quinn_udp::UdpSocketState::new((&socket).into())?;
    let segments = state.max_gso_segments().clamp(1, 64 * 1024 / DATAGRAM_BYTES);
    let payload = vec![0x40_u8; DATAGRAM_BYTES * segments];
    let deadline = Instant::now() + secs;
    let mut sent = 0u64;
    while Instant::now() < deadline {
        let t = quinn_udp::Transmit {
            destination: addr,
            ecn: None,
            contents: &payload,
            segment_size: (segments > 1).then_some(DATAGRAM_BYTES),
            src_ip: None,
        };
        if state.send((&socket).into(), &t).is_ok() {
            sent += segments as u64;
        }
    }
    Ok(sent)
}

/// Accepts any server certificate: benchmark traffic on loopback only.
#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Samples this process's CPU share once per second on a helper thread.
fn sample_busy_per_second() -> Arc<std::sync::Mutex<Vec<f64>>> {
    let samples = Arc::new(std::sync::Mutex::new(Vec::new()));
    let out = samples.clone();
    std::thread::spawn(move || {
        let mut last = felix_bench::process_cpu_us();
        let mut at = Instant::now();
        loop {
            std::thread::sleep(Duration::from_secs(1));
            let now = felix_bench::process_cpu_us();
            let busy = (now - last) as f64 / 1e6 / at.elapsed().as_secs_f64();
            (last, at) = (now, Instant::now());
            if let Ok(mut s) = out.lock() {
                s.push(busy);
            }
        }
    });
    samples
}
