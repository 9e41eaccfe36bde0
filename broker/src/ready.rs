//! Readiness (`/ready`): whether this broker can take its share of the work now, as Redpanda's
//! `/v1/status/ready` and NATS's `/healthz` say it. `/health` stays liveness (the process
//! serves HTTP and is not stopping): a broker that lost etcd is alive but not ready.
//!
//! A broker is ready when every check holds:
//! - `serving`: started and not stopping;
//! - `cores`: every core reported its counters within [`CORE_REPORT_STALE_MS`] (a core
//!   publishes them once a second; one that stopped doing so is stuck or gone);
//! - `storage`: no core sees free space below `--min-free-bytes` (appends would get
//!   `StorageFull`);
//! - in a cluster, `lease`: this broker's membership lease is confirmed by etcd (without it
//!   the broker refuses writes: fencing);
//! - in a cluster, `peers`: every live broker its replication links lead to is reachable
//!   (`replication_peers_unreachable` is 0 on every core).
//!
//! Reads only what the cores already publish (their counters) and the agent's view: nothing
//! here touches a core.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use felix_cluster::ClusterView;
use tokio::sync::watch;

use crate::app::stats::AppStats;

/// A core whose last report is older than this is taken as stuck.
pub const CORE_REPORT_STALE_MS: u64 = 5_000;

/// What `/ready` is answered from.
#[derive(Clone)]
pub struct Readiness {
    serving: Arc<AtomicBool>,
    cores: Option<Arc<Vec<Arc<AppStats>>>>,
    cluster: Option<watch::Receiver<Arc<ClusterView>>>,
    /// The cluster's name, for the `/cluster` page.
    cluster_name: String,
    created: Instant,
}

/// One check's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// The check's name (`serving`, `cores`, `storage`, `lease`, `peers`).
    pub name: &'static str,
    /// Whether it holds.
    pub ok: bool,
    /// What was seen.
    pub detail: String,
}

impl From<Arc<AtomicBool>> for Readiness {
    /// Readiness from the serving flag alone (no core or cluster checks).
    fn from(serving: Arc<AtomicBool>) -> Readiness {
        Readiness {
            serving,
            cores: None,
            cluster: None,
            cluster_name: String::new(),
            created: Instant::now(),
        }
    }
}

impl Readiness {
    /// Every check: the serving flag, the cores' reports, and with `cluster` the lease and
    /// the peers.
    pub fn new(
        serving: Arc<AtomicBool>,
        cores: Arc<Vec<Arc<AppStats>>>,
        cluster: Option<watch::Receiver<Arc<ClusterView>>>,
    ) -> Readiness {
        Readiness {
            serving,
            cores: Some(cores),
            cluster,
            cluster_name: String::new(),
            created: Instant::now(),
        }
    }

    /// The cluster's name, for the `/cluster` page.
    pub fn named(mut self, cluster_name: &str) -> Readiness {
        self.cluster_name = cluster_name.to_owned();
        self
    }

    /// The cluster as this broker's agent sees it (the `/cluster` page, JSON), or `None` for
    /// a broker outside a cluster. Leases' time left is not known here (-1).
    pub fn cluster_status(&self) -> Option<felix_cluster::ClusterStatus> {
        let view = self.cluster.as_ref()?.borrow().clone();
        Some(felix_cluster::status_of_view(&self.cluster_name, &view, |_| -1))
    }

    /// Whether the broker is started and not stopping (liveness, `/health`).
    pub fn serving(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }

    /// Runs every check.
    pub fn checks(&self) -> Vec<Check> {
        let mut out = Vec::new();
        let serving = self.serving.load(Ordering::Relaxed);
        out.push(Check {
            name: "serving",
            ok: serving,
            detail: if serving { "serving" } else { "stopping" }.to_owned(),
        });
        if let Some(cores) = &self.cores {
            out.push(self.cores_check(cores));
            out.push(storage_check(cores));
            if self.cluster.is_some() {
                out.push(peers_check(cores));
            }
        }
        if let Some(views) = &self.cluster {
            let view = views.borrow().clone();
            let now = Instant::now();
            let ok = view.lease_holds(now);
            let detail = match view.lease_valid_until {
                Some(until) if ok => {
                    format!("membership lease confirmed for {} ms more", (until - now).as_millis())
                }
                _ => "membership lease not confirmed by etcd: writes are refused".to_owned(),
            };
            out.push(Check { name: "lease", ok, detail });
        }
        out
    }

    /// Whether every check holds, and the answer's body: `ready` or `not ready`, then one line
    /// per check.
    pub fn answer(&self) -> (bool, String) {
        let checks = self.checks();
        let ready = checks.iter().all(|c| c.ok);
        let mut body = if ready { "ready\n" } else { "not ready\n" }.to_owned();
        for c in &checks {
            let verdict = if c.ok { "ok" } else { "FAIL" };
            body.push_str(&format!("{}: {verdict}: {}\n", c.name, c.detail));
        }
        (ready, body)
    }

    fn cores_check(&self, cores: &[Arc<AppStats>]) -> Check {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let young = self.created.elapsed() < Duration::from_millis(CORE_REPORT_STALE_MS);
        let stale: Vec<usize> = cores
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                let at = s.histograms_published_unix_ms.load(Ordering::Acquire);
                // Before its first report a core counts as up for a while (it reports once a
                // second from its start).
                if at == 0 {
                    return !young;
                }
                now_ms.saturating_sub(at) > CORE_REPORT_STALE_MS
            })
            .map(|(i, _)| i)
            .collect();
        let detail = if stale.is_empty() {
            format!("{} of {} cores reporting", cores.len(), cores.len())
        } else {
            format!("cores {stale:?} silent for over {CORE_REPORT_STALE_MS} ms")
        };
        Check { name: "cores", ok: stale.is_empty(), detail }
    }
}

fn storage_check(cores: &[Arc<AppStats>]) -> Check {
    let low = cores.iter().any(|s| s.counters.storage_below_floor.load(Ordering::Relaxed) != 0);
    let detail = if low {
        "free space below --min-free-bytes: appends get StorageFull"
    } else {
        "free space above --min-free-bytes"
    };
    Check { name: "storage", ok: !low, detail: detail.to_owned() }
}

fn peers_check(cores: &[Arc<AppStats>]) -> Check {
    let worst = cores
        .iter()
        .map(|s| s.counters.replication_peers_unreachable.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0);
    let detail = if worst == 0 {
        "every live peer reachable".to_owned()
    } else {
        format!("{worst} live peer(s) unreachable from a core (see the log for why)")
    };
    Check { name: "peers", ok: worst == 0, detail }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cores(n: usize) -> Arc<Vec<Arc<AppStats>>> {
        Arc::new((0..n).map(|_| Arc::new(AppStats::default())).collect())
    }

    fn now_ms() -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
    }

    #[test]
    fn each_check_fails_on_its_own_condition() {
        let serving = Arc::new(AtomicBool::new(true));
        let stats = cores(2);
        for s in stats.iter() {
            s.histograms_published_unix_ms.store(now_ms(), Ordering::Release);
        }
        let view = ClusterView {
            lease_valid_until: Some(Instant::now() + Duration::from_secs(60)),
            ..ClusterView::default()
        };
        let (tx, rx) = watch::channel(Arc::new(view));
        let r = Readiness::new(serving.clone(), stats.clone(), Some(rx));
        let (ready, body) = r.answer();
        assert!(ready, "{body}");
        assert!(body.starts_with("ready\n"), "{body}");

        stats[1].counters.storage_below_floor.store(1, Ordering::Relaxed);
        let (ready, body) = r.answer();
        assert!(!ready);
        assert!(body.contains("storage: FAIL"), "{body}");
        stats[1].counters.storage_below_floor.store(0, Ordering::Relaxed);

        stats[0].counters.replication_peers_unreachable.store(1, Ordering::Relaxed);
        assert!(r.answer().1.contains("peers: FAIL"));
        stats[0].counters.replication_peers_unreachable.store(0, Ordering::Relaxed);

        stats[0].histograms_published_unix_ms.store(now_ms() - 60_000, Ordering::Release);
        assert!(r.answer().1.contains("cores: FAIL: cores [0]"));
        stats[0].histograms_published_unix_ms.store(now_ms(), Ordering::Release);

        tx.send(Arc::new(ClusterView {
            lease_valid_until: Some(Instant::now() - Duration::from_millis(1)),
            ..ClusterView::default()
        }))
        .unwrap();
        let (ready, body) = r.answer();
        assert!(!ready);
        assert!(body.contains("lease: FAIL"), "{body}");
        tx.send(Arc::new(ClusterView::default())).unwrap();
        assert!(r.answer().1.contains("lease: FAIL"), "no lease yet");

        let alone = Readiness::from(serving.clone());
        assert!(alone.answer().0);
        serving.store(false, Ordering::Relaxed);
        assert!(alone.answer().1.contains("serving: FAIL: stopping"));
    }
}
