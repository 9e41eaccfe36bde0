//! `felix cluster status`: members (with what is left of their lease), the controller, each
//! stream's placement (each shard's current leader), and each member's per-core load from its
//! metrics endpoint; a table, or JSON with `--json`. Read from etcd (`--etcd`) or through any
//! broker's admin endpoint (`--addr`, its `/cluster` page).

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use felix_cluster::{ClusterStatus, StreamPlacement};
use serde::Serialize;

/// How long one metrics scrape may take.
const SCRAPE_TIMEOUT_MS: u64 = 1_000;
/// The largest metrics page read.
const SCRAPE_BYTES_MAX: u64 = 4 << 20;

/// `felix cluster ...`
#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Show members, controller, placement and per-core load.
    Status(StatusArgs),
}

/// `felix cluster status` flags.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// etcd endpoints (comma-separated), as given to `felix serve --cluster-etcd`.
    #[arg(
        long,
        env = "FELIX_CLUSTER_ETCD",
        value_delimiter = ',',
        required_unless_present = "addr",
        conflicts_with = "addr"
    )]
    pub etcd: Vec<String>,
    /// Instead of etcd: any broker's admin (metrics) address, `host:port` (`felix serve
    /// --metrics`); the status is that broker's view of the cluster.
    #[arg(long)]
    pub addr: Option<String>,
    /// The cluster's name.
    #[arg(long, env = "FELIX_CLUSTER_NAME", default_value = felix_broker::config::DEFAULT_CLUSTER_NAME)]
    pub cluster_name: String,
    /// Print JSON instead of tables.
    #[arg(long, default_value_t = false)]
    pub json: bool,
}

/// One member's load, from its `/metrics`.
#[derive(Debug, Default, Serialize)]
struct CoreLoad {
    core: u16,
    stored_bytes: u64,
    publishes: u64,
    connections_open: u64,
}

/// One follower's lag behind a replicated shard's leader, from the leader's `/metrics`.
#[derive(Debug, Default, Clone, Serialize)]
struct FollowerLag {
    stream: String,
    shard: u32,
    follower: String,
    records: u64,
    bytes: u64,
}

/// What one member's metrics page says.
#[derive(Debug, Default)]
struct Scraped {
    cores: Vec<CoreLoad>,
    lag: Vec<FollowerLag>,
}

#[derive(Serialize)]
struct Output<'a> {
    #[serde(flatten)]
    status: &'a ClusterStatus,
    /// Per member: per-core load, or why it could not be read.
    load: Vec<(String, Result<Vec<CoreLoad>, String>)>,
    /// Each follower's lag behind its shard's leader (from the leaders' metrics).
    lag: Vec<FollowerLag>,
}

/// Runs a `felix cluster` command.
pub fn main(cmd: ClusterCommand) -> ExitCode {
    let ClusterCommand::Status(args) = cmd;
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("felix: {e}");
            return ExitCode::FAILURE;
        }
    };
    let status = match &args.addr {
        Some(addr) => match fetch_status(addr) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("felix: cluster status from {addr}: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => match rt.block_on(felix_cluster::cluster_status(&args.etcd, &args.cluster_name)) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("felix: cluster {}: {e}", args.cluster_name);
                return ExitCode::FAILURE;
            }
        },
    };
    let mut lag = Vec::new();
    let load = status
        .members
        .iter()
        .map(|m| {
            let node = m.member.node.to_string();
            match &m.member.metrics {
                Some(addr) => match scrape(addr) {
                    Ok(page) => {
                        lag.extend(page.lag);
                        (node, Ok(page.cores))
                    }
                    Err(e) => (node, Err(e)),
                },
                None => (node, Err("no metrics endpoint".into())),
            }
        })
        .collect();
    let out = Output { status: &status, load, lag };
    if args.json {
        match serde_json::to_string_pretty(&out) {
            Ok(j) => println!("{j}"),
            Err(e) => {
                eprintln!("felix: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", render(&out));
    }
    ExitCode::SUCCESS
}

fn render(out: &Output<'_>) -> String {
    let s = out.status;
    let mut t = format!(
        "cluster {} at etcd revision {}, controller {}\n\n",
        s.cluster,
        s.revision,
        s.controller.as_ref().map_or("none".to_owned(), ToString::to_string)
    );
    t.push_str(&format!(
        "{:<16} {:<24} {:>9} {:>5} {:>6} {:<10}\n",
        "MEMBER", "ADDRESS", "LEASE_S", "CORES", "SHARDS", "PEERS"
    ));
    for m in &s.members {
        // Unverified: its replication links to the others are not verified (a certificate
        // they do not trust?): it gets no replicas until they are.
        let peers = if m.member.peers_verified { "verified" } else { "UNVERIFIED" };
        t.push_str(&format!(
            "{:<16} {:<24} {:>9} {:>5} {:>6} {:<10}\n",
            m.member.node, m.member.advertise, m.lease_ttl_left_s, m.member.cores, m.shards, peers
        ));
    }
    t.push_str(&format!(
        "\n{:<16} {:>5} {:>14} {:>10} {:>11}\n",
        "MEMBER", "CORE", "STORED_BYTES", "PUBLISHES", "CONNECTIONS"
    ));
    for (node, load) in &out.load {
        match load {
            Ok(cores) => {
                for c in cores {
                    t.push_str(&format!(
                        "{:<16} {:>5} {:>14} {:>10} {:>11}\n",
                        node, c.core, c.stored_bytes, c.publishes, c.connections_open
                    ));
                }
            }
            Err(e) => t.push_str(&format!("{node:<16} metrics unavailable: {e}\n")),
        }
    }
    t.push_str(&format!("\n{:<40} {:>6}  PLACEMENT\n", "STREAM", "SHARDS"));
    for st in &s.streams {
        let placement =
            st.placement.as_ref().map_or("not placed yet".to_owned(), |p| owners(p, st));
        let down = if st.down.is_empty() {
            String::new()
        } else {
            let names: Vec<String> = st.down.iter().map(ToString::to_string).collect();
            format!("  (down: {})", names.join(", "))
        };
        t.push_str(&format!("{:<40} {:>6}  {placement}{down}\n", st.name, st.def.shards));
    }
    render_groups(s, &out.lag, &mut t);
    t
}

/// Each replicated shard's group: leader (`?` while its lease is gone and an election is due),
/// epoch, in-sync replicas, replicas, and the largest lag of a follower, in records and payload
/// bytes, as the leader's metrics say (`n/a` when they could not be read).
fn render_groups(s: &ClusterStatus, lag: &[FollowerLag], t: &mut String) {
    if s.streams.iter().all(|st| st.groups.is_empty()) {
        return;
    }
    t.push_str(&format!(
        "\n{:<40} {:>5} {:<16} {:>6} {:<24} {:<24} LAG\n",
        "STREAM", "SHARD", "LEADER", "EPOCH", "IN_SYNC", "REPLICAS"
    ));
    let names = |ns: &[felix_cluster::NodeId]| {
        ns.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
    };
    for st in &s.streams {
        for g in &st.groups {
            let leader = match (&g.leader, g.leader_live) {
                (Some(l), true) => l.to_string(),
                (Some(l), false) => format!("{l}?"),
                (None, _) => "none".to_owned(),
            };
            let of_shard: Vec<&FollowerLag> =
                lag.iter().filter(|l| l.stream == st.name && l.shard == g.shard).collect();
            let behind = match of_shard.iter().max_by_key(|l| (l.records, l.bytes)) {
                Some(l) => format!("{} records, {} bytes", l.records, l.bytes),
                None => "n/a".to_owned(),
            };
            t.push_str(&format!(
                "{:<40} {:>5} {:<16} {:>6} {:<24} {:<24} {behind}\n",
                st.name,
                g.shard,
                leader,
                g.epoch,
                names(&g.isr),
                names(&g.replicas)
            ));
        }
    }
}

/// `b1:0,3 b2:1,4` — each owner and its shards: for a replicated stream each shard's current
/// leader (`?` after it: its lease is gone, an election is due; `none`: not elected), not the
/// owner at creation.
fn owners(p: &StreamPlacement, st: &felix_cluster::StreamStatus) -> String {
    let mut by: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (shard, node) in p.owners.iter().enumerate() {
        let now = match st.groups.iter().find(|g| g.shard as usize == shard) {
            Some(g) => match (&g.leader, g.leader_live) {
                (Some(l), true) => l.to_string(),
                (Some(l), false) => format!("{l}?"),
                (None, _) => "none".to_owned(),
            },
            None => node.to_string(),
        };
        by.entry(now).or_default().push(shard.to_string());
    }
    by.into_iter().map(|(n, s)| format!("{n}:{}", s.join(","))).collect::<Vec<_>>().join(" ")
}

/// The cluster as the broker whose admin endpoint is `addr` sees it (`http://addr/cluster`).
fn fetch_status(addr: &str) -> Result<ClusterStatus, String> {
    let text = get_page(addr, "/cluster")?;
    serde_json::from_str(&text).map_err(|e| format!("not a cluster status: {e}"))
}

/// `http://addr<path>` from a broker's admin endpoint, within [`SCRAPE_TIMEOUT_MS`] and
/// [`SCRAPE_BYTES_MAX`].
fn get_page(addr: &str, path: &str) -> Result<String, String> {
    let agent = ureq::AgentBuilder::new().timeout(Duration::from_millis(SCRAPE_TIMEOUT_MS)).build();
    let resp = agent.get(&format!("http://{addr}{path}")).call().map_err(|e| e.to_string())?;
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(resp.into_reader(), SCRAPE_BYTES_MAX),
        &mut text,
    )
    .map_err(|e| e.to_string())?;
    Ok(text)
}

/// Reads the per-core counters and the replication lag the status shows from
/// `http://addr/metrics`.
fn scrape(addr: &str) -> Result<Scraped, String> {
    let text = get_page(addr, "/metrics")?;
    let mut cores: std::collections::BTreeMap<u16, CoreLoad> = Default::default();
    let mut lag: std::collections::BTreeMap<(String, u32, String), FollowerLag> =
        Default::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name_labels, value)) = line.rsplit_once(' ') else { continue };
        let Some((name, labels)) = name_labels.split_once('{') else { continue };
        if let Some(which) = name.strip_prefix("felix_replica_lag_") {
            let (Some(stream), Some(shard), Some(follower)) =
                (label(labels, "stream"), label(labels, "shard"), label(labels, "follower"))
            else {
                continue;
            };
            let Ok(shard) = shard.parse::<u32>() else { continue };
            let key = (stream.to_owned(), shard, follower.to_owned());
            let entry = lag.entry(key).or_insert_with(|| FollowerLag {
                stream: stream.to_owned(),
                shard,
                follower: follower.to_owned(),
                ..FollowerLag::default()
            });
            let v: u64 = value.parse::<f64>().map_or(0, |f| f as u64);
            match which {
                "records" => entry.records = v,
                "bytes" => entry.bytes = v,
                _ => {}
            }
            continue;
        }
        let Some(core) = labels
            .strip_prefix("core=\"")
            .and_then(|r| r.split('"').next())
            .and_then(|c| c.parse::<u16>().ok())
        else {
            continue;
        };
        if labels.contains("quantile") {
            continue;
        }
        let v: u64 = value.parse::<f64>().map_or(0, |f| f as u64);
        let entry = cores.entry(core).or_insert_with(|| CoreLoad { core, ..CoreLoad::default() });
        match name {
            "felix_storage_append_bytes_total" => entry.stored_bytes = v,
            "felix_broker_publishes_total" => entry.publishes = v,
            "felix_broker_connections_open" => entry.connections_open = v,
            _ => {}
        }
    }
    Ok(Scraped { cores: cores.into_values().collect(), lag: lag.into_values().collect() })
}

/// The value of label `name` in an OpenMetrics label list (`a="x",b="y"}`).
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
    labels[start..].split('"').next()
}
