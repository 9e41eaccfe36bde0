//! Standard QUIC clients pick their Initial's destination CID at random: 8 bytes (aioquic,
//! Chromium) or 20 (quinn). Whatever the bytes, the handshake completes: a DCID that happens to
//! look like a CID in Felix's layout never gets its Initial dropped (docs/connection-ids.md,
//! "Standard clients"). Before the check value, one random 8-byte DCID in 8 had the config
//! bits, and its core byte named a core the broker does not have: the Initial and every
//! retransmit of it were dropped, and the handshake timed out.
//!
//! Each test starts an echo broker with 2 or 4 cores under one steering mode and runs 1,000
//! handshakes with seeded random 8-byte Initial DCIDs and 1,000 with 20-byte ones, 64 at a
//! time from 16 client sockets (so the kernel's hash spreads the Initials over the cores),
//! then handshakes whose DCID names a core on purpose (in the layout, with its check value):
//! each existing core (the named core accepts) and cores the broker does not have (the core
//! the Initial reached accepts). The eBPF tests need CAP_BPF (root), as `--steering ebpf` does.

#[path = "net_support.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use felix_broker::net::steering::{EffectiveSteering, SteeringMode};
use felix_proto::cid::{cid_for_core, core_of, CID_LEN, CONFIG_ID, CONFIG_ID_SHIFT};
use felix_proto::CoreId;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use support::*;

/// Handshakes per DCID length and configuration.
const HANDSHAKES: usize = 1000;
/// Handshakes in flight at once.
const IN_FLIGHT: usize = 64;
/// Client sockets (source ports) the handshakes are spread over.
const CLIENT_SOCKETS: usize = 16;
/// A handshake (and the server's core tag) that takes longer has failed: an Initial the
/// broker drops is retransmitted for this long in vain.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(8);
/// Handshakes per core named on purpose.
const HINTED_PER_CORE: usize = 4;

/// How one handshake ended: the core that accepted it, or why it failed.
type Outcome = Result<u16, String>;

/// Connects from `ep` with Initial DCID `dcid` and reads the accepting core's tag.
async fn handshake(
    ep: quinn::Endpoint,
    config: quinn::ClientConfig,
    addr: SocketAddr,
    dcid: Vec<u8>,
) -> Outcome {
    let mut config = config;
    let cid = quinn::ConnectionId::new(&dcid);
    config.initial_dst_cid_provider(Arc::new(move || cid));
    let attempt = async {
        let conn = ep
            .connect_with(config, addr, "localhost")
            .map_err(|e| format!("connect: {e}"))?
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let mut tag = conn.accept_uni().await.map_err(|e| format!("tag stream: {e}"))?;
        let core = tag.read_to_end(8).await.map_err(|e| format!("tag: {e}"))?;
        conn.close(0u32.into(), b"done");
        match core[..] {
            [c] => Ok(u16::from(c)),
            _ => Err(format!("tag of {} bytes", core.len())),
        }
    };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, attempt).await {
        Ok(outcome) => outcome,
        Err(_) => Err(format!("no handshake within {HANDSHAKE_TIMEOUT:?}")),
    }
}

/// Runs one handshake per DCID, `IN_FLIGHT` at a time, spread over the client sockets.
async fn handshakes(
    eps: &[quinn::Endpoint],
    config: &quinn::ClientConfig,
    addr: SocketAddr,
    dcids: &[Vec<u8>],
) -> Vec<Outcome> {
    let permits = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, dcid) in dcids.iter().enumerate() {
        let permit = permits.clone().acquire_owned().await.expect("semaphore open");
        let (ep, config, dcid) = (eps[i % eps.len()].clone(), config.clone(), dcid.clone());
        tasks.spawn(async move {
            let outcome = handshake(ep, config, addr, dcid).await;
            drop(permit);
            (i, outcome)
        });
    }
    let mut outcomes = vec![Err("not run".to_string()); dcids.len()];
    while let Some(joined) = tasks.join_next().await {
        let (i, outcome) = joined.expect("handshake task");
        outcomes[i] = outcome;
    }
    outcomes
}

/// Asserts that every handshake completed, naming the seed and the failed DCIDs otherwise.
fn assert_all_connected(what: &str, seed: u64, dcids: &[Vec<u8>], outcomes: &[Outcome]) {
    let failed: Vec<String> = dcids
        .iter()
        .zip(outcomes)
        .filter_map(|(d, o)| o.as_ref().err().map(|e| format!("{}: {e}", hex(d))))
        .collect();
    assert!(
        failed.is_empty(),
        "{what} (seed {seed:#x}): {} of {} handshakes failed, e.g. {:#?}",
        failed.len(),
        dcids.len(),
        &failed[..failed.len().min(8)]
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn random_dcids(rng: &mut StdRng, len: usize) -> Vec<Vec<u8>> {
    (0..HANDSHAKES)
        .map(|_| {
            let mut d = vec![0u8; len];
            rng.fill_bytes(&mut d);
            d
        })
        .collect()
}

async fn run(mode: SteeringMode, cores: usize, expect: EffectiveSteering) {
    let started = Instant::now();
    let seed = 0xdc1d_0000 + cores as u64 * 16 + mode as u64;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), cores);
    cfg.steering = mode;
    // No stateless retries: a retry's Initial carries a DCID the broker chose.
    cfg.handshakes_per_sec_per_core = 1_000_000;
    let (server, _seen) = start_echo(cfg);
    assert_eq!(server.steering(), expect);
    let addr = server.local_addr();
    let eps: Vec<quinn::Endpoint> = (0..CLIENT_SOCKETS).map(|_| client(dir.path())).collect();
    let config = client_config(dir.path());
    let mut rng = StdRng::seed_from_u64(seed);

    // 8 random bytes. The sample holds DCIDs that the layout without a check value took for
    // a core this broker does not have (about 1 in 8): these handshakes used to fail.
    let eight = random_dcids(&mut rng, CID_LEN);
    let misread = eight
        .iter()
        .filter(|d| d[0] >> CONFIG_ID_SHIFT == CONFIG_ID && usize::from(d[1]) >= cores)
        .count();
    assert!(
        misread > HANDSHAKES / 16,
        "the sample has {misread} DCIDs naming no core by the old rule"
    );
    let t = Instant::now();
    let outcomes = handshakes(&eps, &config, addr, &eight).await;
    let eight_took = t.elapsed();
    assert_all_connected("8-byte DCIDs", seed, &eight, &outcomes);
    // A random DCID that decodes to one of our cores (about 1 in 2,000) is handed to it.
    for (d, o) in eight.iter().zip(&outcomes) {
        if let Some(core) = core_of(d).filter(|c| usize::from(c.0) < cores) {
            assert_eq!(o.as_ref(), Ok(&core.0), "DCID {} names core {}", hex(d), core.0);
        }
    }

    // 20 random bytes (quinn's default): never read as a core.
    let twenty = random_dcids(&mut rng, 20);
    let t = Instant::now();
    let outcomes = handshakes(&eps, &config, addr, &twenty).await;
    let twenty_took = t.elapsed();
    assert_all_connected("20-byte DCIDs", seed, &twenty, &outcomes);

    // DCIDs that name a core on purpose (as the Felix client and broker-to-broker connects do):
    // every existing core accepts its own; a core the broker does not have (a client that
    // believes in more cores, a DCID meant for another broker) is served where it landed.
    let named: Vec<u16> = (0..cores as u16 + 2).chain([100, 254]).collect();
    let mut hinted = Vec::new();
    for &core in &named {
        for _ in 0..HINTED_PER_CORE {
            let mut random = [0u8; CID_LEN];
            rng.fill_bytes(&mut random);
            let cid = cid_for_core(CoreId(core), random).expect("core can be named");
            assert_eq!(core_of(&cid), Some(CoreId(core)));
            hinted.push((core, cid.to_vec()));
        }
    }
    let dcids: Vec<Vec<u8>> = hinted.iter().map(|(_, d)| d.clone()).collect();
    let outcomes = handshakes(&eps, &config, addr, &dcids).await;
    assert_all_connected("DCIDs naming a core", seed, &dcids, &outcomes);
    let mut landed_elsewhere = vec![0usize; cores];
    for ((core, d), o) in hinted.iter().zip(&outcomes) {
        let accepted = *o.as_ref().expect("connected");
        if usize::from(*core) < cores {
            assert_eq!(accepted, *core, "DCID {} names core {core}", hex(d));
        } else {
            landed_elsewhere[usize::from(accepted)] += 1;
        }
    }

    let stats = server.stats();
    let dropped: u64 = stats.iter().map(|s| s.dropped_bad_core).sum();
    let kept: u64 = stats.iter().map(|s| s.kept_bad_core).sum();
    let handshakes_done: u64 = stats.iter().map(|s| s.handshakes).sum();
    let nowhere = (named.len() - cores) * HINTED_PER_CORE;
    let misrouted: u64 = stats.iter().map(|s| s.misrouted).sum();
    eprintln!(
        "{mode:?}, {cores} cores, seed {seed:#x}: {handshakes_done} handshakes in {:?} \
         (1,000 with 8-byte DCIDs in {eight_took:?}, of which {misread} named no core by the \
         old rule; 1,000 with 20-byte DCIDs in {twenty_took:?}); {nowhere} naming no core \
         accepted by cores {landed_elsewhere:?}; kept_bad_core {kept}, misrouted {misrouted}",
        started.elapsed()
    );
    assert_eq!(handshakes_done, (2 * HANDSHAKES + hinted.len()) as u64);
    assert_eq!(dropped, 0, "no datagram was dropped for its CID: {stats:#?}");
    // Every Initial naming no core was counted where it landed (retransmits counted again).
    assert!(kept >= nowhere as u64, "kept_bad_core {kept} < {nowhere}");
    server.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_initial_dcids_ebpf_2_cores() {
    run(SteeringMode::Ebpf, 2, EffectiveSteering::Ebpf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_initial_dcids_ebpf_4_cores() {
    run(SteeringMode::Ebpf, 4, EffectiveSteering::Ebpf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_initial_dcids_cbpf_2_cores() {
    run(SteeringMode::Cbpf, 2, EffectiveSteering::Cbpf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_initial_dcids_cbpf_4_cores() {
    run(SteeringMode::Cbpf, 4, EffectiveSteering::Cbpf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_initial_dcids_steering_off_2_cores() {
    run(SteeringMode::Off, 2, EffectiveSteering::Off).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_initial_dcids_steering_off_4_cores() {
    run(SteeringMode::Off, 4, EffectiveSteering::Off).await;
}
