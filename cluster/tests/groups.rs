//! Replica groups against a real etcd (issue 12, "Leader epochs and fencing through etcd"):
//! every change of a shard's group record is a compare-and-swap on its mod revision, fenced by
//! the proposer's lease.
//!
//! The first three tests drive `felix_cluster::groups` with raw etcd clients and leases of
//! their own (no agents), so each race and each expiry is exactly the one described; the last
//! two run three agents with 2 s leases.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, PutOptions};
use felix_cluster::groups::{self, ShardGroup};
use felix_cluster::testing::Etcd;
use felix_cluster::{keys, Route};
use felix_cluster::{
    Agent, AgentConfig, AgentHandle, ClusterError, ClusterView, Member, NodeId, StreamDef,
};
use felix_replication::CasError;

const TTL_S: u32 = 2;
/// A lease the raw tests never let expire unless they mean to.
const LONG_TTL_S: i64 = 60;

fn n(s: &str) -> NodeId {
    NodeId::new(s).unwrap()
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

async fn connect(etcd: &Etcd) -> Client {
    Client::connect([etcd.client_url.as_str()], None).await.unwrap()
}

/// Registers `node` on a new lease of `ttl_s` seconds, as an agent would; returns the lease.
async fn register(client: &mut Client, cluster: &str, node: &str, ttl_s: i64) -> i64 {
    let lease = client.lease_grant(ttl_s, None).await.unwrap().id();
    let member = Member {
        node: n(node),
        advertise: format!("{node}.test:7400"),
        cores: 1,
        metrics: None,
        peers_verified: true,
    };
    let value = serde_json::to_vec(&member).unwrap();
    let opts = PutOptions::new().with_lease(lease);
    client.put(keys::member(cluster, node), value, Some(opts)).await.unwrap();
    lease
}

/// Creates the group of shard 0 of stream `s` on b1, b2, b3, led by b1 on `lease`.
async fn create_group(client: &mut Client, cluster: &str, lease: i64) -> ShardGroup {
    let g = ShardGroup::initial(vec![n("b1"), n("b2"), n("b3")], Some(lease));
    client.put(keys::group(cluster, "s", 0), g.to_json(), None).await.unwrap();
    groups::read(client, cluster, "s", 0).await.unwrap()
}

#[test]
fn stale_version_and_follower_isr_proposals_are_refused() {
    let Some(etcd) = Etcd::start() else { return };
    block_on(async {
        let c = &mut connect(&etcd).await;
        let l1 = register(c, "g1", "b1", LONG_TTL_S).await;
        let l2 = register(c, "g1", "b2", LONG_TTL_S).await;
        let g = create_group(c, "g1", l1).await;
        assert_eq!((g.epoch, g.leader.clone()), (1, Some(n("b1"))));

        // The leader shrinks its in-sync set: accepted, the version is the new mod revision.
        let shrunk =
            groups::propose_isr(c, "g1", "s", 0, &n("b1"), l1, g.version, 1, &[n("b1"), n("b2")])
                .await
                .unwrap();
        assert_eq!(shrunk.isr, vec![n("b1"), n("b2")]);
        assert!(shrunk.version > g.version);
        assert_eq!(groups::read(c, "g1", "s", 0).await.unwrap(), shrunk);

        // The same proposal again, on the old version: refused.
        let stale =
            groups::propose_isr(c, "g1", "s", 0, &n("b1"), l1, g.version, 1, &[n("b1")]).await;
        assert!(
            matches!(stale, Err(ClusterError::Cas(CasError::StaleVersion { .. }))),
            "{stale:?}"
        );

        // A follower, on the current version and epoch, with its own live lease: refused.
        let by_follower =
            groups::propose_isr(c, "g1", "s", 0, &n("b2"), l2, shrunk.version, 1, &[n("b2")]).await;
        assert!(
            matches!(by_follower, Err(ClusterError::Cas(CasError::NotLeader { .. }))),
            "{by_follower:?}"
        );
        // Nor can the follower borrow the leader's lease: its member key is not on it.
        let borrowed =
            groups::propose_isr(c, "g1", "s", 0, &n("b2"), l1, shrunk.version, 1, &[n("b2")]).await;
        assert!(borrowed.is_err(), "{borrowed:?}");
        assert_eq!(groups::read(c, "g1", "s", 0).await.unwrap(), shrunk, "nothing changed");
    });
}

#[test]
fn concurrent_elections_exactly_one_wins_and_the_epoch_goes_up_by_one() {
    let Some(etcd) = Etcd::start() else { return };
    block_on(async {
        let c = &mut connect(&etcd).await;
        let l1 = register(c, "g2", "b1", LONG_TTL_S).await;
        let l2 = register(c, "g2", "b2", LONG_TTL_S).await;
        let l3 = register(c, "g2", "b3", LONG_TTL_S).await;
        let g = create_group(c, "g2", l1).await;
        let live: BTreeSet<NodeId> = [n("b2"), n("b3")].into();

        // While the leader's lease holds, nobody can take over.
        let early = groups::elect(c, "g2", "s", 0, &g, &n("b2"), l2, &live).await;
        assert!(matches!(early, Err(ClusterError::LeaderAlive)), "{early:?}");

        c.lease_revoke(l1).await.unwrap();
        // Two candidates read the same version and race, each on its own connection.
        let (mut c2, mut c3) = (connect(&etcd).await, connect(&etcd).await);
        let (b2, b3) = (n("b2"), n("b3"));
        let (r2, r3) = tokio::join!(
            groups::elect(&mut c2, "g2", "s", 0, &g, &b2, l2, &live),
            groups::elect(&mut c3, "g2", "s", 0, &g, &b3, l3, &live),
        );
        let (won, lost, lease) = match (r2, r3) {
            (Ok(w), Err(e)) => (w, e, l2),
            (Err(e), Ok(w)) => (w, e, l3),
            other => panic!("exactly one election must win: {other:?}"),
        };
        assert!(matches!(lost, ClusterError::Cas(CasError::StaleVersion { .. })), "{lost:?}");
        let now = groups::read(c, "g2", "s", 0).await.unwrap();
        assert_eq!(now, won);
        assert_eq!(now.epoch, g.epoch + 1);
        assert_eq!(now.leader_lease, Some(lease));
        assert_eq!(now.isr, vec![n("b2"), n("b3")], "the dead leader left the in-sync set");
    });
}

#[test]
fn an_expired_leader_cannot_change_the_isr_and_a_restart_does_not_resume_its_epoch() {
    let Some(etcd) = Etcd::start() else { return };
    block_on(async {
        let c = &mut connect(&etcd).await;
        let l1 = register(c, "g3", "b1", i64::from(TTL_S)).await;
        register(c, "g3", "b2", LONG_TTL_S).await;
        let g = create_group(c, "g3", l1).await;
        // Nobody keeps l1 alive: wait for etcd to expire it.
        let deadline = Instant::now() + Duration::from_secs(u64::from(TTL_S) + 5);
        while !c.get(keys::member("g3", "b1"), None).await.unwrap().kvs().is_empty() {
            assert!(Instant::now() < deadline, "lease did not expire");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The record still names b1 on l1 at this version and epoch, so the replication rules
        // alone would accept it: only the transaction's lease compare refuses it.
        let late =
            groups::propose_isr(c, "g3", "s", 0, &n("b1"), l1, g.version, 1, &[n("b1")]).await;
        assert!(matches!(late, Err(ClusterError::Fenced)), "{late:?}");
        assert_eq!(groups::read(c, "g3", "s", 0).await.unwrap(), g, "nothing changed");

        // b1 restarts: a new lease. It cannot act for its old epoch...
        let l1b = register(c, "g3", "b1", LONG_TTL_S).await;
        let resumed =
            groups::propose_isr(c, "g3", "s", 0, &n("b1"), l1b, g.version, 1, &[n("b1")]).await;
        assert!(matches!(resumed, Err(ClusterError::Fenced)), "{resumed:?}");
        // ...but as a live in-sync replica it may be elected, for a new epoch, on its new lease.
        let live: BTreeSet<NodeId> = [n("b1"), n("b2")].into();
        let e = groups::elect(c, "g3", "s", 0, &g, &n("b1"), l1b, &live).await.unwrap();
        assert_eq!((e.epoch, e.leader_lease), (2, Some(l1b)));
        let ok = groups::propose_isr(c, "g3", "s", 0, &n("b1"), l1b, e.version, 2, &[n("b1")])
            .await
            .unwrap();
        assert_eq!(ok.isr, vec![n("b1")]);
    });
}

fn agent(etcd: &Etcd, cluster: &str, node: &str) -> AgentHandle {
    agent_verified(etcd, cluster, node, true)
}

fn agent_verified(etcd: &Etcd, cluster: &str, node: &str, peers_verified: bool) -> AgentHandle {
    Agent::start(AgentConfig {
        endpoints: vec![etcd.client_url.clone()],
        cluster: cluster.into(),
        member: Member {
            node: n(node),
            advertise: format!("{node}.test:7400"),
            cores: 1,
            metrics: None,
            peers_verified,
        },
        lease_ttl_s: TTL_S,
    })
    .expect("agent starts")
}

fn until(wait: Duration, agents: &[&AgentHandle], what: &str, ok: impl Fn(&ClusterView) -> bool) {
    let deadline = Instant::now() + wait;
    loop {
        let views: Vec<Arc<ClusterView>> = agents.iter().map(|a| a.view()).collect();
        if views.iter().all(|v| ok(v)) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not reached; views {views:#?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn def(shards: u32) -> StreamDef {
    StreamDef { shards, retention_bytes: 0, retention_ms: 0 }
}

const STREAM: &str = "acme/app/replicated";
/// Time for agents to see each other and the controller to place a stream.
const SETTLE: Duration = Duration::from_secs(TTL_S as u64 + 8);

/// Three agents and a 3-replica, 2-shard stream whose groups every view shows led at epoch 1.
fn replicated_cluster(etcd: &Etcd, cluster: &str) -> Vec<AgentHandle> {
    let all =
        vec![agent(etcd, cluster, "b1"), agent(etcd, cluster, "b2"), agent(etcd, cluster, "b3")];
    let refs: Vec<&AgentHandle> = all.iter().collect();
    until(SETTLE, &refs, "three members", |v| v.members.len() == 3 && v.controller.is_some());
    let (_, p) = block_on(all[1].create_replicated_stream(STREAM, def(2), 3)).unwrap();
    assert_eq!(p.replicas.len(), 2);
    until(SETTLE, &refs, "placed, groups led at epoch 1 everywhere", |v| {
        // Groups are written before the placement: wait for both.
        v.placements.contains_key(STREAM)
            && (0..2).all(|s| {
                v.group(STREAM, s).is_some_and(|g| {
                    g.epoch == 1
                        && g.leader.as_ref() == Some(&p.owners[s as usize])
                        && g.leader_alive(&v.member_leases)
                        && g.isr.len() == 3
                })
            })
    });
    let v = all[0].view();
    assert_eq!(v.replication.get(STREAM), Some(&3));
    assert_ne!(p.owners[0], p.owners[1], "leaders spread over brokers");
    for s in 0..2 {
        let g = v.group(STREAM, s).unwrap();
        assert_eq!(g.replicas.iter().collect::<BTreeSet<_>>().len(), 3, "distinct replicas");
        match v.route(STREAM, s) {
            Route::Owner(m) => assert_eq!(Some(&m.node), g.leader.as_ref()),
            other => panic!("shard {s}: {other:?}"),
        }
    }
    all
}

#[test]
fn agents_elect_a_live_isr_member_within_ttl_when_the_leader_dies_and_fence_the_restart() {
    let Some(etcd) = Etcd::start() else { return };
    let mut all = replicated_cluster(&etcd, "g4");
    let leader = all[0].view().group(STREAM, 0).unwrap().leader.clone().unwrap();
    let at = all.iter().position(|a| *a.node() == leader).unwrap();
    let dead = all.remove(at);
    let halted_at = Instant::now();
    dead.halt();
    let survivors: Vec<&AgentHandle> = all.iter().collect();
    until(SETTLE, &survivors, "a live in-sync member leads epoch 2", |v| {
        v.group(STREAM, 0).is_some_and(|g| {
            g.epoch == 2
                && g.leader.as_ref().is_some_and(|l| *l != leader && v.members.contains_key(l))
                && g.leader_alive(&v.member_leases)
        })
    });
    let took = halted_at.elapsed();
    eprintln!("leader {leader} halted; shard 0 re-elected after {took:?}");
    assert!(took <= Duration::from_secs(u64::from(TTL_S) + 1), "election took {took:?}");
    let v = survivors[0].view();
    let g = v.group(STREAM, 0).unwrap().clone();
    assert!(!g.isr.contains(&leader), "the dead leader left the in-sync set: {g:?}");
    // The other shard's leader lives on: its epoch did not move.
    assert_eq!(v.group(STREAM, 1).unwrap().epoch, 1);
    // `felix cluster status` reads the same from etcd.
    let endpoints = std::slice::from_ref(&etcd.client_url);
    let status = block_on(felix_cluster::cluster_status(endpoints, "g4")).unwrap();
    let st = status.streams.iter().find(|s| s.name == STREAM).unwrap();
    assert_eq!((st.replicas, st.groups.len()), (3, 2));
    let s0 = &st.groups[0];
    assert_eq!((s0.shard, &s0.leader, s0.epoch, &s0.isr), (0, &g.leader, 2, &g.isr));
    assert!(s0.leader_live);

    // Through the agents: a follower's proposal and a stale one are refused, the leader's
    // passes.
    let new_leader = g.leader.clone().unwrap();
    let (lead, follow) =
        if *all[0].node() == new_leader { (&all[0], &all[1]) } else { (&all[1], &all[0]) };
    let r =
        block_on(follow.propose_isr(STREAM, 0, g.version, g.epoch, vec![follow.node().clone()]));
    assert!(matches!(r, Err(ClusterError::Cas(CasError::NotLeader { .. }))), "{r:?}");
    let shrunk =
        block_on(lead.propose_isr(STREAM, 0, g.version, g.epoch, vec![new_leader.clone()]))
            .unwrap();
    assert_eq!(shrunk.isr, vec![new_leader.clone()]);
    let r = block_on(lead.propose_isr(STREAM, 0, g.version, g.epoch, g.isr.clone()));
    assert!(matches!(r, Err(ClusterError::Cas(CasError::StaleVersion { .. }))), "{r:?}");

    // The old leader restarts (a new lease): it sees epoch 2 and cannot act for epoch 1.
    let back = agent(&etcd, "g4", leader.as_str());
    until(SETTLE, &[&back], "the restarted broker sees epoch 2", |v| {
        v.members.contains_key(&leader) && v.group(STREAM, 0).is_some_and(|g| g.epoch == 2)
    });
    let r = block_on(back.propose_isr(STREAM, 0, shrunk.version, 1, vec![leader.clone()]));
    assert!(matches!(r, Err(ClusterError::Cas(CasError::NotLeader { .. }))), "{r:?}");
    let r = block_on(back.propose_isr(STREAM, 0, g.version - 1, 1, vec![leader.clone()]));
    assert!(r.is_err(), "{r:?}");
    let v = back.view();
    assert_eq!(v.group(STREAM, 0), Some(&shrunk), "the record did not move");
}

#[test]
fn a_leader_restarted_before_its_lease_expires_does_not_resume_its_epoch() {
    let Some(etcd) = Etcd::start() else { return };
    let mut all = replicated_cluster(&etcd, "g5");
    let v = all[0].view();
    let old = v.group(STREAM, 0).unwrap().clone();
    let leader = old.leader.clone().unwrap();
    let at = all.iter().position(|a| *a.node() == leader).unwrap();
    all.remove(at).halt();
    // Back at once, under the same node id, while etcd still holds its old lease.
    let back = agent(&etcd, "g5", leader.as_str());
    all.push(back);
    let refs: Vec<&AgentHandle> = all.iter().collect();
    until(SETTLE, &refs, "a new epoch on a live lease", |v| {
        v.members.len() == 3
            && v.group(STREAM, 0).is_some_and(|g| g.epoch == 2 && g.leader_alive(&v.member_leases))
    });
    let v = all[0].view();
    let g = v.group(STREAM, 0).unwrap();
    assert_ne!(g.leader_lease, old.leader_lease, "epoch 2 belongs to a live lease: {g:?}");
    assert_eq!(g.epoch, old.epoch + 1);
}

#[test]
fn a_replicated_stream_with_more_shards_than_one_etcd_transaction_holds_is_placed() {
    let Some(etcd) = Etcd::start() else { return };
    let all = [agent(&etcd, "g6", "b1"), agent(&etcd, "g6", "b2")];
    let refs: Vec<&AgentHandle> = all.iter().collect();
    until(SETTLE, &refs, "two members", |v| v.members.len() == 2 && v.controller.is_some());
    // etcd allows 128 operations per transaction (--max-txn-ops): one per group would not fit.
    let shards = 300;
    let (_, p) = block_on(all[0].create_replicated_stream(STREAM, def(shards), 2)).unwrap();
    assert_eq!(p.replicas.len(), shards as usize);
    until(SETTLE, &refs, "every group led at epoch 1", |v| {
        (0..shards).all(|s| v.group(STREAM, s).is_some_and(|g| g.epoch == 1 && g.isr.len() == 2))
    });
}

/// Issue 41, item 5: a replication factor above the live brokers is refused at once, with
/// nothing written (before, the definition stayed for ever, unplaceable, and the controller
/// warned every 500 ms); a factor the cluster can hold still works afterwards.
#[test]
fn more_replicas_than_live_brokers_is_refused_at_once_and_writes_nothing() {
    let Some(etcd) = Etcd::start() else { return };
    let all = [agent(&etcd, "g5", "b1"), agent(&etcd, "g5", "b2")];
    let refs: Vec<&AgentHandle> = all.iter().collect();
    until(SETTLE, &refs, "two members", |v| v.members.len() == 2 && v.controller.is_some());
    let started = Instant::now();
    let refused = block_on(all[0].create_replicated_stream("acme/app/five", def(2), 3));
    assert!(
        matches!(
            refused,
            Err(ClusterError::Placement(felix_cluster::placement::PlacementError::TooFewBrokers {
                replicas: 3,
                live: 2
            }))
        ),
        "{refused:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(felix_cluster::agent::PLACEMENT_WAIT_MS),
        "refused without waiting for a placement"
    );
    block_on(async {
        let mut c = connect(&etcd).await;
        let key = keys::stream("g5", "acme/app/five");
        let got = c.get(key.as_str(), None).await.unwrap();
        assert!(got.kvs().is_empty(), "nothing written for the refused stream");
    });
    let (_, p) = block_on(all[1].create_replicated_stream("acme/app/two", def(2), 2)).unwrap();
    assert_eq!(p.replicas.len(), 2);
}

/// Issue 41, item 5: a broker whose replication links are not verified (a certificate its
/// peers do not trust) gets no replicas; once it says they are, it does.
#[test]
fn replicas_go_only_to_brokers_whose_peer_links_are_verified() {
    let Some(etcd) = Etcd::start() else { return };
    let all = [
        agent(&etcd, "g6", "b1"),
        agent(&etcd, "g6", "b2"),
        agent_verified(&etcd, "g6", "b3", false),
    ];
    let refs: Vec<&AgentHandle> = all.iter().collect();
    until(SETTLE, &refs, "three members", |v| v.members.len() == 3 && v.controller.is_some());
    for round in 0..4 {
        let name = format!("acme/app/two{round}");
        let (_, p) = block_on(all[0].create_replicated_stream(&name, def(3), 2)).unwrap();
        for set in &p.replicas {
            assert!(!set.contains(&n("b3")), "an unverified broker got a replica: {p:?}");
        }
    }
    // Three replicas need b3: the create waits for a placement that cannot come.
    let three = block_on(all[0].create_replicated_stream("acme/app/three", def(1), 3));
    assert!(matches!(three, Err(ClusterError::TimedOut(_))), "{three:?}");
    block_on(all[2].mark_peers_verified()).unwrap();
    until(SETTLE, &refs, "b3 verified", |v| {
        v.members.get(&n("b3")).is_some_and(|m| m.peers_verified)
    });
    until(SETTLE, &refs, "the waiting stream placed on all three", |v| {
        v.placements.get("acme/app/three").is_some_and(|p| p.replicas[0].len() == 3)
    });
}
