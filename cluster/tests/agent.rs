//! The cluster agent against a real etcd (Debian's `etcd-server`, started by the test on
//! loopback ports with a data directory it removes): membership, one controller, placement
//! spread by load, a join, a crash (lease expiry), a restart, and etcd going away and coming
//! back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use felix_cluster::testing::Etcd;
use felix_cluster::Route;
use felix_cluster::{Agent, AgentConfig, AgentHandle, ClusterView, Member, NodeId, StreamDef};

const TTL_S: u32 = 2;
/// How long a change may take to reach every agent: a lease expiry plus a margin.
const SETTLE: Duration = Duration::from_secs(TTL_S as u64 + 3);

fn agent(etcd: &Etcd, cluster: &str, node: &str) -> AgentHandle {
    Agent::start(AgentConfig {
        endpoints: vec![etcd.client_url.clone()],
        cluster: cluster.into(),
        member: Member {
            node: NodeId::new(node).unwrap(),
            advertise: format!("{node}.test:7400"),
            cores: 2,
            metrics: None,
            peers_verified: true,
        },
        lease_ttl_s: TTL_S,
    })
    .expect("agent starts")
}

/// Waits until `ok` holds for the view of every agent in `agents`.
fn until(agents: &[&AgentHandle], what: &str, ok: impl Fn(&ClusterView) -> bool) {
    until_within(SETTLE, agents, what, ok)
}

fn until_within(
    wait: Duration,
    agents: &[&AgentHandle],
    what: &str,
    ok: impl Fn(&ClusterView) -> bool,
) {
    let deadline = Instant::now() + wait;
    loop {
        let views: Vec<Arc<ClusterView>> = agents.iter().map(|a| a.view()).collect();
        if views.iter().all(|v| ok(v)) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not reached; views {views:#?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn def(shards: u32) -> StreamDef {
    StreamDef { shards, retention_bytes: 0, retention_ms: 0 }
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

fn owners_per_node(v: &ClusterView, stream: &str) -> Vec<(String, usize)> {
    let mut counts = std::collections::BTreeMap::new();
    for o in &v.placements[stream].owners {
        *counts.entry(o.to_string()).or_insert(0) += 1;
    }
    counts.into_iter().collect()
}

#[test]
fn membership_controller_placement_join_crash_and_restart() {
    let Some(etcd) = Etcd::start() else { return };
    let (b1, b2, b3) =
        (agent(&etcd, "c1", "b1"), agent(&etcd, "c1", "b2"), agent(&etcd, "c1", "b3"));
    until(&[&b1, &b2, &b3], "three members and one controller", |v| {
        v.members.len() == 3 && v.controller.is_some() && v.lease_holds(Instant::now())
    });
    let controller = b1.view().controller.clone().unwrap();
    until(&[&b2, &b3], "the same controller everywhere", |v| {
        v.controller.as_ref() == Some(&controller)
    });

    // A 12-shard stream, created through a broker that need not be the controller.
    let (d, p) = block_on(b2.create_stream("acme/app/orders", def(12))).unwrap();
    assert_eq!((d, p.shards()), (def(12), 12));
    until(&[&b1, &b2, &b3], "placement everywhere", |v| {
        v.placements.contains_key("acme/app/orders")
    });
    assert_eq!(
        owners_per_node(&b3.view(), "acme/app/orders"),
        vec![("b1".into(), 4), ("b2".into(), 4), ("b3".into(), 4)]
    );
    // Creating it again keeps the first definition.
    let (d, p2) = block_on(b3.create_stream("acme/app/orders", def(3))).unwrap();
    assert_eq!((d, p2), (def(12), p));

    // Join: a fourth broker gets the new stream's shards first.
    let b4 = agent(&etcd, "c1", "b4");
    until(&[&b1, &b4], "four members", |v| v.members.len() == 4);
    let (_, p) = block_on(b1.create_stream("acme/app/new", def(4))).unwrap();
    assert!(p.owners.iter().all(|o| o.as_str() == "b4"), "{p:?}");

    // Crash of the controller: its lease expires, its shards are unavailable, a new
    // controller is elected, and the other shards still route to their owners.
    let mut all = vec![b1, b2, b3, b4];
    let dead_at = all.iter().position(|a| *a.node() == controller).expect("controller is ours");
    let dead = all.remove(dead_at);
    let dead_node = dead.node().clone();
    let halted_at = Instant::now();
    dead.halt();
    let survivors: Vec<&AgentHandle> = all.iter().collect();
    until(&survivors, "the dead broker leaves and a new controller is elected", |v| {
        !v.members.contains_key(&dead_node)
            && v.controller.as_ref().is_some_and(|c| *c != dead_node)
    });
    let took = halted_at.elapsed();
    eprintln!("controller {dead_node} halted; gone and replaced after {took:?}");
    assert!(took <= Duration::from_secs(u64::from(TTL_S) + 2), "{took:?}");
    let v = survivors[0].view();
    let mut unavailable = 0;
    for shard in 0..12 {
        match v.route("acme/app/orders", shard) {
            Route::Unavailable(n) => {
                assert_eq!(*n, dead_node);
                unavailable += 1;
            }
            Route::Owner(m) => assert_ne!(m.node, dead_node),
            other => panic!("shard {shard}: {other:?}"),
        }
    }
    assert!(unavailable == 4 || dead_node.as_str() == "b4", "{unavailable} unavailable");
    assert_eq!(v.route("acme/app/nope", 0), Route::Unknown);

    // Restart under the same node id: it serves its shards again.
    let back = agent(&etcd, "c1", dead_node.as_str());
    until(&[survivors[0], &back], "the broker is back", |v| v.members.contains_key(&dead_node));
    let v = back.view();
    assert!((0..12).all(|s| matches!(v.route("acme/app/orders", s), Route::Owner(_))));
}

#[test]
fn etcd_down_fences_writes_and_the_agent_recovers_when_it_returns() {
    let Some(mut etcd) = Etcd::start() else { return };
    let b1 = agent(&etcd, "c2", "b1");
    until(&[&b1], "lease held", |v| v.lease_holds(Instant::now()) && v.members.len() == 1);
    let (_, p) = block_on(b1.create_stream("acme/app/s", def(2))).unwrap();
    etcd.kill();
    let killed_at = Instant::now();
    // Within one TTL of the last keep-alive the lease stops holding: writes are fenced.
    let deadline = killed_at + Duration::from_secs(u64::from(TTL_S) + 1);
    while b1.view().lease_holds(Instant::now()) {
        assert!(Instant::now() < deadline, "lease still holds with etcd gone");
        std::thread::sleep(Duration::from_millis(50));
    }
    // What the broker knew is still there to serve reads and route.
    assert_eq!(b1.view().placements.get("acme/app/s"), Some(&p));
    etcd.spawn();
    // etcd's own start-up plus the agent's reconnect.
    until_within(SETTLE * 3, &[&b1], "lease held again", |v| {
        v.lease_holds(Instant::now()) && v.members.len() == 1
    });
    assert_eq!(b1.view().placements.get("acme/app/s"), Some(&p));
}
