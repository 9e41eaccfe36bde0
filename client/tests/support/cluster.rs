//! The mock cluster: test brokers that advertise `CLUSTER` and share one placement table, as
//! the real brokers share etcd's. Each member answers `Metadata` from the table, stores only
//! the shards it owns, refuses the others with `NotOwner` (or, for a client that did not
//! advertise `CLUSTER`, an error with that code) and answers `ShardUnavailable` for shards
//! whose owner is marked down. An unacked publish to a shard it does not own is dropped and
//! counted, as the real broker does.

use super::*;
use felix_proto::{Metadata, MetadataOk, NotOwner, Publish, ShardOwner};

/// A broker's place in a mock cluster.
#[derive(Clone, Debug)]
pub struct ClusterRole {
    /// Its node id.
    pub node: String,
    /// The table every member reads.
    pub table: Arc<ClusterTable>,
}

/// Members and placements, shared by every member (what etcd holds for the real brokers).
#[derive(Debug, Default)]
pub struct ClusterTable {
    inner: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    /// node -> (address, live)
    nodes: BTreeMap<String, (String, bool)>,
    /// stream -> owner node of each shard (`None`: defined, not placed yet)
    streams: BTreeMap<String, Option<Vec<String>>>,
    /// (member, stream) -> the owners that member believes in, when its view lags the table
    /// (`ClusterTable::set_view`).
    views: BTreeMap<(String, String), Vec<String>>,
}

/// What the table says about a stream.
enum Lookup {
    Unknown,
    Unplaced,
    Placed(Vec<ShardOwner>),
}

impl ClusterTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.inner.lock().unwrap()
    }

    /// Adds (or moves) a member.
    pub fn add_node(&self, node: &str, address: String) {
        self.lock().nodes.insert(node.to_owned(), (address, true));
    }

    /// Marks a member up or down (its lease held or expired).
    pub fn set_live(&self, node: &str, live: bool) {
        self.lock().nodes.get_mut(node).expect("known node").1 = live;
    }

    /// Places `stream`: shard `s` on `owners[s]`.
    pub fn place(&self, stream: &str, owners: Vec<String>) {
        self.lock().streams.insert(stream.to_owned(), Some(owners));
    }

    /// Makes member `node` believe `stream`'s shards are on `owners` (a view lagging the
    /// table), or the table again (`None`).
    pub fn set_view(&self, node: &str, stream: &str, owners: Option<Vec<String>>) {
        let key = (node.to_owned(), stream.to_owned());
        match owners {
            Some(o) => self.lock().views.insert(key, o),
            None => self.lock().views.remove(&key),
        };
    }

    /// Defines `stream` without placing it.
    pub fn define(&self, stream: &str) {
        self.lock().streams.insert(stream.to_owned(), None);
    }

    /// What member `me` believes about `stream`: its own view if it lags, else the table.
    fn lookup_as(&self, me: &str, stream: &str) -> Lookup {
        let t = self.lock();
        let view = t.views.get(&(me.to_owned(), stream.to_owned())).cloned();
        match view.map(Some).or_else(|| t.streams.get(stream).cloned()) {
            None => Lookup::Unknown,
            Some(None) => Lookup::Unplaced,
            Some(Some(owners)) => Lookup::Placed(
                owners
                    .iter()
                    .map(|n| {
                        let (address, live) = t.nodes.get(n).cloned().expect("known node");
                        ShardOwner { node: n.clone(), address, live }
                    })
                    .collect(),
            ),
        }
    }
}

/// Three (or n) brokers on loopback sharing one certificate (one pin trusts them all) and one
/// placement table.
pub struct MockCluster {
    brokers: Vec<Option<TestBroker>>,
    pub table: Arc<ClusterTable>,
}

impl MockCluster {
    /// Starts `n` members, `b0` .. `b{n-1}`.
    pub async fn start(n: usize) -> Self {
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let key = Arc::new(cert.key_pair.serialize_der());
        let table = Arc::new(ClusterTable::default());
        let mut brokers = Vec::new();
        for i in 0..n {
            let options = BrokerOptions {
                capabilities: Capabilities::ALL,
                cluster: Some(ClusterRole { node: node(i), table: table.clone() }),
                ..BrokerOptions::default()
            };
            let b = TestBroker::start_with(
                "127.0.0.1:0".parse().unwrap(),
                cert.cert.der().clone(),
                cert.cert.pem(),
                key.clone(),
                Arc::default(),
                options,
            )
            .await;
            table.add_node(&node(i), b.addr.to_string());
            brokers.push(Some(b));
        }
        Self { brokers, table }
    }

    /// Member `i` (panics if it was stopped).
    pub fn broker(&self, i: usize) -> &TestBroker {
        self.brokers[i].as_ref().expect("broker running")
    }

    /// Stops member `i` and marks it down in the table.
    pub async fn stop(&mut self, i: usize) {
        self.table.set_live(&node(i), false);
        self.kill(i).await;
    }

    /// Stops member `i` while the table still shows it live (its lease not expired yet).
    pub async fn kill(&mut self, i: usize) {
        let b = self.brokers[i].take().expect("broker running");
        b.stop().await;
    }

    /// Creates `stream` with one shard per entry of `owners` on every member (definitions are
    /// cluster-wide) and places shard `s` on member `owners[s]`.
    pub fn create_stream(&self, stream: &str, owners: &[usize]) {
        for b in self.brokers.iter().flatten() {
            b.create_stream(stream, owners.len() as u32);
        }
        self.table.place(stream, owners.iter().map(|i| node(*i)).collect());
    }

    /// A client configuration with the members `seeds` as seed addresses, in order.
    pub fn client_config(&self, seeds: &[usize]) -> ClientConfig {
        let mut c = self.broker(seeds[0]).client_config();
        c.addr =
            seeds.iter().map(|i| self.broker(*i).addr.to_string()).collect::<Vec<_>>().join(",");
        c
    }

    /// The records member `i` stores for each shard of `stream`.
    pub fn stored(&self, i: usize, stream: &str) -> Vec<Vec<Stored>> {
        self.broker(i)
            .state
            .lock()
            .streams
            .get(stream)
            .map(|s| s.shards.clone())
            .unwrap_or_default()
    }
}

/// The node id of member `i`.
pub fn node(i: usize) -> String {
    format!("b{i}")
}

fn in_cluster(ctx: &ConnCtx) -> bool {
    ctx.options.capabilities.contains(Capabilities::CLUSTER)
}

/// This member's node id.
fn me(ctx: &ConnCtx) -> String {
    ctx.options.cluster.as_ref().map_or_else(|| "self".to_owned(), |r| r.node.clone())
}

fn lookup(ctx: &ConnCtx, stream: &str) -> Lookup {
    match &ctx.options.cluster {
        Some(role) => role.table.lookup_as(&role.node, stream),
        // A cluster of one: this broker owns every shard of the streams it has.
        None => match ctx.state.lock().streams.get(stream) {
            None => Lookup::Unknown,
            Some(s) => {
                let me = ShardOwner { node: me(ctx), address: ctx.addr.to_string(), live: true };
                Lookup::Placed(vec![me; s.shards.len()])
            }
        },
    }
}

/// Answers Metadata.
pub(super) fn metadata(ctx: &ConnCtx, m: Metadata) -> Vec<Frame> {
    if !in_cluster(ctx) {
        ctx.state.lock().violations.push("Metadata sent to a single-node broker".into());
        return vec![error(m.request_id, ErrorCode::InvalidArgument, "not in a cluster")];
    }
    ctx.state.lock().metadata_requests += 1;
    match lookup(ctx, &m.stream) {
        Lookup::Unknown => vec![error(m.request_id, ErrorCode::StreamNotFound, "no such stream")],
        Lookup::Unplaced => vec![error(m.request_id, ErrorCode::ShardUnavailable, "not placed")],
        Lookup::Placed(owners) => {
            vec![Frame::MetadataOk(MetadataOk {
                request_id: m.request_id,
                stream: m.stream,
                owners,
            })]
        }
    }
}

/// The answer refusing a request for `shard`, whose owner is `owner` (down, or another
/// broker). `publish`: answered as a publish is (PublishError; nothing when unacked).
fn refuse(
    ctx: &ConnCtx,
    request_id: RequestId,
    stream: &str,
    shard: ShardId,
    owner: ShardOwner,
    publish: bool,
) -> Vec<Frame> {
    let mut o = ctx.state.lock();
    let body = |code, message: &str| ErrorBody { request_id, code, message: message.to_owned() };
    let wrap = |b: ErrorBody| {
        if publish && b.request_id.0 != 0 {
            Frame::PublishError(b)
        } else {
            Frame::Error(b)
        }
    };
    if !owner.live {
        o.unavailable_sent += 1;
        return vec![wrap(body(ErrorCode::ShardUnavailable, "owner down"))];
    }
    if request_id.0 == 0 {
        o.dropped_not_owner += 1;
        return vec![];
    }
    if !ctx.client_caps.lock().unwrap().contains(Capabilities::CLUSTER) {
        return vec![wrap(body(ErrorCode::NotOwner, &format!("owned by {}", owner.address)))];
    }
    o.not_owner_sent += 1;
    vec![Frame::NotOwner(NotOwner { request_id, stream: stream.to_owned(), shard, owner })]
}

/// The placed owners of `stream`, or the refusal of a request for it.
fn owners(
    ctx: &ConnCtx,
    request_id: RequestId,
    stream: &str,
) -> Result<Vec<ShardOwner>, Vec<Frame>> {
    match lookup(ctx, stream) {
        Lookup::Placed(owners) => Ok(owners),
        Lookup::Unplaced => Err(vec![error(request_id, ErrorCode::ShardUnavailable, "not placed")]),
        Lookup::Unknown => {
            Err(vec![error(request_id, ErrorCode::StreamNotFound, "no such stream")])
        }
    }
}

/// The shard a publish of a stream with `n` shards is stored on, arriving on `core`, or the
/// answer refusing it.
pub(super) fn check_publish(
    ctx: &ConnCtx,
    p: &Publish,
    n: u32,
    core: u16,
) -> Result<ShardId, Vec<Frame>> {
    let core_count = u32::from(ctx.options.core_count.max(1));
    let core_rule = |shards: &[u32]| {
        shards
            .iter()
            .copied()
            .find(|s| s % core_count == u32::from(core))
            .or(shards.first().copied())
    };
    let request_id = p.ack.map(|a| a.request_id).unwrap_or_default();
    if !in_cluster(ctx) {
        return Ok(match &p.key {
            Some(k) => shard_for_key(k, n),
            None => ShardId(core_rule(&(0..n).collect::<Vec<_>>()).unwrap_or(0)),
        });
    }
    let owners = owners(ctx, request_id, &p.stream)?;
    let me = me(ctx);
    let shard = match (&p.key, p.producer) {
        (Some(k), _) => shard_for_key(k, n),
        // An idempotent producer's unkeyed batches go to its shard, as the real broker's do.
        (None, Some(tag)) => ShardId((tag.producer.0 % u64::from(n.max(1))) as u32),
        (None, None) => {
            let mine: Vec<u32> = (0..n)
                .filter(|s| owners[*s as usize].node == me && owners[*s as usize].live)
                .collect();
            match core_rule(&mine) {
                Some(s) => return Ok(ShardId(s)),
                // Owns none: refuse, naming some (live) owner.
                None => ShardId(owners.iter().position(|o| o.live).unwrap_or(0) as u32),
            }
        }
    };
    let owner = owners[shard.0 as usize].clone();
    if owner.node == me && owner.live {
        return Ok(shard);
    }
    Err(refuse(ctx, request_id, &p.stream, shard, owner, true))
}

/// Refuses a Subscribe naming a shard this member does not own (or whose owner is down).
pub(super) fn check_subscribe(ctx: &ConnCtx, s: &felix_proto::Subscribe) -> Result<(), Vec<Frame>> {
    if !in_cluster(ctx) {
        return Ok(());
    }
    if s.shards.is_none() {
        ctx.state.lock().violations.push("Subscribe without a shard list in a cluster".into());
    }
    let owners = owners(ctx, s.request_id, &s.stream)?;
    let all: Vec<ShardId> = (0..owners.len() as u32).map(ShardId).collect();
    let me = me(ctx);
    for shard in s.shards.as_ref().unwrap_or(&all) {
        let Some(owner) = owners.get(shard.0 as usize) else { continue };
        if owner.node != me || !owner.live {
            return Err(refuse(ctx, s.request_id, &s.stream, *shard, owner.clone(), false));
        }
    }
    Ok(())
}

/// Refuses a CommitOffset for a shard this member does not own (or whose owner is down).
pub(super) fn check_commit(ctx: &ConnCtx, c: &felix_proto::CommitOffset) -> Result<(), Vec<Frame>> {
    if !in_cluster(ctx) {
        return Ok(());
    }
    let owners = owners(ctx, c.request_id, &c.stream)?;
    match owners.get(c.shard.0 as usize) {
        Some(owner) if owner.node != me(ctx) || !owner.live => {
            Err(refuse(ctx, c.request_id, &c.stream, c.shard, owner.clone(), false))
        }
        _ => Ok(()),
    }
}
