//! Broker-to-broker connections: each core of broker A opens a connection to broker B naming
//! its own index (`CoreContext::connect`), and B's core with that index accepts it, whichever
//! core the kernel's group handed the Initial to. The 1-RTT traffic then flows core i to core
//! i: B forwards at most the handshake's datagrams between its cores, never the transfer.

#[path = "net_support.rs"]
mod support;

use std::sync::mpsc;
use std::time::Duration;

use felix_broker::net::steering::SteeringMode;
use felix_broker::net::tls::{quic_client_config, DEV_CERT_FILE};
use felix_broker::net::{CoreContext, Server};
use support::*;

const CORES: usize = 4;
const TRANSFER_BYTES: usize = 512 * 1024;

/// What core `core` of broker A saw: B's core that accepted its connection, and whether the
/// echo came back intact.
type Outcome = (u16, Result<u16, String>);

async fn connect_and_echo(
    ctx: &CoreContext,
    b_dir: &std::path::Path,
    b: std::net::SocketAddr,
) -> Result<u16, String> {
    let config = quic_client_config(&b_dir.join(DEV_CERT_FILE), None).map_err(|e| e.to_string())?;
    let conn = ctx.connect(config, b, "localhost", ctx.core()).map_err(|e| e.to_string())?;
    if conn.core() != ctx.core() {
        return Err(format!("the connection lives on {} of A", conn.core()));
    }
    // B's echo server names its accepting core first.
    let mut tag = conn.accept_uni().await.map_err(|e| format!("tag stream: {e}"))?;
    let accepted = tag.read_to_end(8).await.map_err(|e| format!("tag: {e}"))?;
    let [core] = accepted[..] else { return Err(format!("tag of {} bytes", accepted.len())) };
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| format!("open_bi: {e}"))?;
    let data = payload(usize::from(ctx.core().0), TRANSFER_BYTES);
    let writer = async {
        send.write_all(&data).await.map_err(|e| format!("write: {e}"))?;
        send.finish().map_err(|e| format!("finish: {e}"))
    };
    let reader =
        async { recv.read_to_end(TRANSFER_BYTES + 1).await.map_err(|e| format!("read: {e}")) };
    let (w, back) = futures_lite::future::zip(writer, reader).await;
    w?;
    if back? != data {
        return Err("the echo differs".into());
    }
    conn.close(0, b"done");
    Ok(u16::from(core))
}

fn run(mode: SteeringMode, steered: bool) {
    let b_dir = tempfile::tempdir().unwrap();
    let mut b_cfg = config(b_dir.path(), CORES);
    b_cfg.steering = mode;
    let (b, _seen) = start_echo(b_cfg);
    let b_addr = b.local_addr();
    let b_dir_path = b_dir.path().to_owned();

    let a_dir = tempfile::tempdir().unwrap();
    let (tx, rx) = mpsc::channel::<Outcome>();
    let a = Server::start(config(a_dir.path(), CORES), move |ctx: CoreContext| {
        let (tx, dir) = (tx.clone(), b_dir_path.clone());
        async move {
            let outcome = connect_and_echo(&ctx, &dir, b_addr).await;
            let _ = tx.send((ctx.core().0, outcome));
            // Keep the core's application alive until the server stops.
            while ctx.accept().await.is_some() {}
        }
    })
    .expect("broker A starts");

    let mut outcomes: Vec<Outcome> =
        (0..CORES).map(|_| rx.recv_timeout(STEP_TIMEOUT).expect("every core reports")).collect();
    outcomes.sort();
    for (core, outcome) in &outcomes {
        assert_eq!(outcome.as_ref(), Ok(core), "core {core} of A ({mode:?}): {outcome:?}");
    }
    let b_stats = b.stats();
    let forwarded: u64 = b_stats.iter().map(|s| s.forwarded_in).sum();
    let datagrams: u64 = b_stats.iter().map(|s| s.datagrams_in).sum();
    assert!(datagrams > 100 * CORES as u64, "the transfers ran ({datagrams} datagrams)");
    if steered {
        // Each connection's Initial (and the client's next handshake datagrams) may land on
        // another core of B and cross once; the transfers (hundreds of datagrams) never do.
        assert!(
            forwarded <= 4 * CORES as u64,
            "{forwarded} of {datagrams} datagrams crossed B's cores ({mode:?})"
        );
    }
    let connects: u64 = a.stats().iter().map(|s| s.connects).sum();
    assert_eq!(connects, CORES as u64);
    a.shutdown();
    b.shutdown();
    std::thread::sleep(Duration::from_millis(10));
}

#[test]
fn each_core_reaches_the_same_core_of_the_peer_with_ebpf_or_cbpf_steering() {
    run(SteeringMode::Auto, true);
}

#[test]
fn each_core_reaches_the_same_core_of_the_peer_with_steering_off() {
    // Without a program the kernel's hash picks B's core and the mesh carries the rest: the
    // pairing still holds, at the cost of the hops.
    run(SteeringMode::Off, false);
}
