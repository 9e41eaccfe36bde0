//! The agent against an etcd that misbehaves (a real etcd, as in `agent.rs`): a connection
//! that freezes without failing, keys that do not parse, and a new lease whose view cannot be
//! loaded. 2 s leases; each test ends within a few TTLs.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, DeleteOptions};
use felix_cluster::agent::{HTTP2_PING_INTERVAL_MS, HTTP2_PING_TIMEOUT_MS};
use felix_cluster::testing::Etcd;
use felix_cluster::{keys, Agent, AgentConfig, AgentHandle, ClusterView, Member, NodeId};
use felix_cluster::{Route, StreamDef};

const TTL_S: u32 = 2;
const TTL: Duration = Duration::from_secs(TTL_S as u64);
/// How long a change may take to reach an agent: a lease expiry plus a margin.
const SETTLE: Duration = Duration::from_secs(TTL_S as u64 + 3);

fn agent(endpoint: &str, cluster: &str, node: &str) -> AgentHandle {
    Agent::start(AgentConfig {
        endpoints: vec![endpoint.to_owned()],
        cluster: cluster.into(),
        member: Member {
            node: NodeId::new(node).unwrap(),
            advertise: format!("{node}.test:7400"),
            cores: 1,
            metrics: None,
            peers_verified: true,
        },
        lease_ttl_s: TTL_S,
    })
    .expect("agent starts")
}

/// Waits up to `wait` until `ok` holds for `agent`'s view.
fn until(wait: Duration, agent: &AgentHandle, what: &str, ok: impl Fn(&ClusterView) -> bool) {
    let deadline = Instant::now() + wait;
    loop {
        let view = agent.view();
        if ok(&view) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not reached; view {view:#?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

async fn connect(etcd: &Etcd) -> Client {
    Client::connect([etcd.client_url.as_str()], None).await.unwrap()
}

fn def(shards: u32) -> StreamDef {
    StreamDef { shards, retention_bytes: 0, retention_ms: 0 }
}

/// A TCP proxy in front of etcd whose connections can be frozen: what a frozen connection
/// receives is read and dropped, never forwarded, and nothing fails (a hung etcd member, or
/// packets dropped on the way). Connections opened after a freeze are forwarded. Closes every
/// connection and its listener on drop.
struct Proxy {
    url: String,
    addr: std::net::SocketAddr,
    /// Connections accepted so far, numbered from 1 in the order they were accepted.
    accepted: Arc<AtomicU64>,
    frozen: Arc<Mutex<BTreeSet<u64>>>,
    sockets: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    fn start(etcd: &Etcd) -> Proxy {
        let target = etcd.client_url.trim_start_matches("http://").to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().unwrap();
        let proxy = Proxy {
            url: format!("http://{addr}"),
            addr,
            accepted: Arc::default(),
            frozen: Arc::default(),
            sockets: Arc::default(),
            stop: Arc::default(),
        };
        let (accepted, frozen) = (proxy.accepted.clone(), proxy.frozen.clone());
        let (sockets, stop) = (proxy.sockets.clone(), proxy.stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let (Ok(client), Ok(server)) = (client, TcpStream::connect(&target)) else {
                    continue;
                };
                let number = accepted.fetch_add(1, Ordering::SeqCst) + 1;
                let mut held = sockets.lock().unwrap();
                held.extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                let ends =
                    [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)];
                for (from, to) in ends {
                    let frozen = frozen.clone();
                    std::thread::spawn(move || forward(from, to, number, &frozen));
                }
            }
        });
        proxy
    }

    /// Freezes every connection open now.
    fn freeze(&self) {
        let open = self.accepted.load(Ordering::SeqCst);
        self.frozen.lock().unwrap().extend(1..=open);
    }

    /// Freezes connection `number` (1: the first accepted).
    fn freeze_one(&self, number: u64) {
        self.frozen.lock().unwrap().insert(number);
    }
}

/// Copies `from` to `to` until either closes; while connection `number` is frozen, drops
/// what it reads.
fn forward(mut from: TcpStream, mut to: TcpStream, number: u64, frozen: &Mutex<BTreeSet<u64>>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if frozen.lock().unwrap().contains(&number) {
            continue;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which sees `stop`.
        let _ = TcpStream::connect(self.addr);
        for s in self.sockets.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Review finding 1: keep-alives and the watch were the only calls that noticed a dead etcd,
/// and a frozen connection fails neither; the agent stayed on it, fenced for good.
#[test]
fn a_frozen_etcd_connection_is_given_up_for_a_new_one() {
    let Some(etcd) = Etcd::start() else { return };
    let proxy = Proxy::start(&etcd);
    let b1 = agent(&proxy.url, "f1", "b1");
    until(SETTLE, &b1, "b1 holds its lease", |v| {
        v.lease_holds(Instant::now()) && v.controller.is_some()
    });
    proxy.freeze();
    let frozen_at = Instant::now();
    // Only a keep-alive sent after the freeze, answered through a new connection, can make the
    // lease hold past this.
    let renewed = frozen_at + TTL;
    until(SETTLE, &b1, "the lease renewed through a new connection", |v| {
        v.lease_valid_until.is_some_and(|t| t > renewed) && v.lease_holds(Instant::now())
    });
    eprintln!("renewed through a new connection {:?} after the freeze", frozen_at.elapsed());
    until(SETTLE, &b1, "b1 a member and controller again", |v| {
        v.members.contains_key(b1.node()) && v.controller.as_ref() == Some(b1.node())
    });
    b1.halt();
}

/// Review finding 1, the campaign: it waits for etcd's answer with no timeout (it may wait
/// for good), on a connection of its own. Frozen, only its HTTP/2 pings can fail it; without
/// them the broker never acts as the controller.
#[test]
fn a_campaign_on_a_frozen_connection_is_given_up() {
    let Some(etcd) = Etcd::start() else { return };
    let b1 = agent(&etcd.client_url, "f4", "b1");
    until(SETTLE, &b1, "b1 the controller", |v| v.controller.as_ref() == Some(b1.node()));
    let proxy = Proxy::start(&etcd);
    let b2 = agent(&proxy.url, "f4", "b2");
    until(SETTLE, &b2, "b2 a member", |v| v.lease_holds(Instant::now()) && v.members.len() == 2);
    // The session's connection is the first (the lease), the campaign's the second.
    let deadline = Instant::now() + SETTLE;
    while proxy.accepted.load(Ordering::SeqCst) < 2 {
        assert!(Instant::now() < deadline, "the campaign never connected");
        std::thread::sleep(Duration::from_millis(20));
    }
    proxy.freeze_one(2);
    let frozen_at = Instant::now();
    b1.halt();
    // b1's election key goes with its lease; etcd's answer to b2's campaign is swallowed.
    // Defining a stream needs no controller; placing it does.
    let _ = block_on(b2.create_stream("t/n/s", def(1)));
    let wait = Duration::from_millis(HTTP2_PING_INTERVAL_MS + HTTP2_PING_TIMEOUT_MS) + SETTLE;
    until(wait, &b2, "b2 elected on a new connection places the stream", |v| {
        v.placements.contains_key("t/n/s")
    });
    eprintln!("placed by b2 {:?} after its campaign's connection froze", frozen_at.elapsed());
    b2.halt();
}

/// Review finding 2: a value that did not parse ended the session, at every load again, and a
/// bad `groups/` key (sorted before `members/`) left every agent without members.
#[test]
fn keys_that_do_not_parse_are_skipped() {
    let Some(etcd) = Etcd::start() else { return };
    let bad = [
        (keys::group("f2", "t/n/s", 0), "not json"),
        (format!("{}no-shard", keys::groups("f2")), "{}"),
        (format!("{}/x", keys::controller("f2")), "not a node id!"),
        (keys::member("f2", "bad!id"), "{}"),
        (keys::member("f2", "b9"), "not json"),
        (keys::stream("f2", "t/n/zz"), "not json"),
        (keys::placement("f2", "t/n/zz"), "not json"),
    ];
    block_on(async {
        let mut c = connect(&etcd).await;
        for (key, value) in &bad {
            c.put(key.as_str(), *value, None).await.unwrap();
        }
    });
    let b1 = agent(&etcd.client_url, "f2", "b1");
    until(SETTLE, &b1, "b1 loads around the bad keys", |v| {
        v.lease_holds(Instant::now())
            && v.members.keys().map(NodeId::as_str).eq(["b1"])
            && v.keys_skipped == bad.len() as u64
    });
    // etcd's election counts the bad candidate, the oldest: no one leads until it goes.
    assert_eq!(b1.view().controller, None);
    block_on(async { connect(&etcd).await.delete(bad[2].0.as_str(), None).await.unwrap() });
    until(SETTLE, &b1, "b1 elected", |v| v.controller.as_ref() == Some(b1.node()));
    let (_, p) = block_on(b1.create_stream("t/n/ok", def(2))).expect("placed");
    assert!(p.owners.iter().all(|o| o == b1.node()), "{p:?}");

    // The same through the watch: a delete under an invalid node id and two bad puts.
    block_on(async {
        let mut c = connect(&etcd).await;
        c.delete(keys::member("f2", "bad!id"), None).await.unwrap();
        c.put(keys::member("f2", "b8"), "not json", None).await.unwrap();
        c.put(keys::stream("f2", "t/n/zz"), "still not json", None).await.unwrap();
    });
    until(SETTLE, &b1, "three more skipped", |v| v.keys_skipped == bad.len() as u64 + 3);
    let b2 = agent(&etcd.client_url, "f2", "b2");
    until(SETTLE, &b1, "b1 sees b2 join", |v| v.members.len() == 2);
    until(SETTLE, &b2, "b2 loads around the bad keys", |v| {
        v.lease_holds(Instant::now())
            && v.members.len() == 2
            && matches!(v.route("t/n/ok", 0), Route::Owner(_))
    });
    b2.halt();
    b1.halt();
}

/// Review finding 3b: after its lease was lost, a session that granted a new lease and then
/// failed before loading published the old view (naming this broker leader of epochs elected
/// on the lost lease) with the new lease's validity.
#[test]
fn a_new_lease_is_not_published_with_a_view_loaded_for_the_old_one() {
    let Some(etcd) = Etcd::start() else { return };
    let b1 = agent(&etcd.client_url, "f3", "b1");
    until(SETTLE, &b1, "b1 holds its lease", |v| {
        v.lease_holds(Instant::now()) && v.members.len() == 1
    });
    let lease = b1.view().member_leases[b1.node()];
    let junk = |i: usize| format!("{}junk/{i}", keys::root("f3"));
    block_on(async {
        let mut c = connect(&etcd).await;
        // More than the 4 MiB a gRPC client decodes in one message: every load fails (after
        // the lease and the member key), nothing else does.
        for i in 0..6 {
            c.put(junk(i), vec![b'j'; 1 << 20], None).await.unwrap();
        }
        c.lease_revoke(lease).await.unwrap();
    });
    let revoked_at = Instant::now();
    // Any validity past this is a lease granted after the revoke, with the old view.
    let old_lease_end = revoked_at + TTL;
    let watch_until = revoked_at + TTL + Duration::from_secs(1);
    while Instant::now() < watch_until {
        let v = b1.view();
        assert!(
            v.lease_valid_until.is_none_or(|t| t <= old_lease_end),
            "a new lease's validity published with a view not loaded for it: {v:#?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    block_on(async {
        let mut c = connect(&etcd).await;
        let prefix = Some(DeleteOptions::new().with_prefix());
        c.delete(format!("{}junk/", keys::root("f3")), prefix).await.unwrap();
    });
    until(SETTLE, &b1, "b1 loaded with a new lease", |v| {
        v.lease_holds(Instant::now())
            && v.lease_valid_until.is_some_and(|t| t > old_lease_end)
            && v.member_leases.get(b1.node()).is_some_and(|l| *l != lease)
    });
    b1.halt();
}
