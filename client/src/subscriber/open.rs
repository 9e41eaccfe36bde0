//! Opening a subscription's parts: on the home broker, one per core that owns some of its
//! shards (or one), or in a cluster one per owner (and core), each a `Subscribe` on its
//! connection; and where each part's shards start ([`Start`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use felix_proto::{
    Capabilities, ErrorCode, Frame, FrameType, Offset, ShardId, StartAt, Subscribe, SubscribeOk,
};

use super::{Part, SubscribeOptions};
use crate::client::Client;
use crate::cluster::{is_unreachable, Cluster, Patience, NOT_OWNER_REDIRECTS_MAX};
use crate::conn::{unexpected, Conn};
use crate::error::ClientError;

/// What [`open_part`] fails with where a resume needs positions that the broker does not
/// speak (no `SUBSCRIBE_POSITIONS`) and the subscription has no other way to resume exactly.
pub(super) const NO_POSITIONS: ClientError = ClientError::Unsupported("subscription positions");

/// Where the shards of a `Subscribe` start.
#[derive(Clone, Copy, Debug)]
pub(super) enum Start<'a> {
    /// At the options' start (with a group: at its commits where it has them).
    At(StartAt),
    /// A resume: each shard at its next offset (`Subscribe` flag `POSITIONS`: the group's
    /// commits are not consulted). A broker without `SUBSCRIBE_POSITIONS`, or a shard without
    /// a known position, gets `fallback` instead, where the subscription has one, else the
    /// part fails with [`NO_POSITIONS`].
    Positions { next: &'a BTreeMap<ShardId, Offset>, fallback: Option<StartAt> },
}

/// Opens a subscription to `shards` (`None`: all) on the home broker: one part per group of
/// [`per_core_groups`], each on its core's connection, or one part on the next connection.
pub(super) async fn open_at_home(
    client: &Client,
    options: &SubscribeOptions,
    shards: Option<Vec<ShardId>>,
    start: Start<'_>,
) -> Result<Vec<Part>, ClientError> {
    let shared = &client.shared;
    let Some(groups) = per_core_groups(client, options, shards.as_deref()).await else {
        let conn = shared.conn(shared.home.next_slot()).await?;
        return Ok(vec![open_part(conn, options, shards, start).await?]);
    };
    let mut parts = Vec::with_capacity(groups.len());
    for (slot, group) in groups {
        let conn = shared.conn(slot).await?;
        parts.push(open_part(conn, options, Some(group), start).await?);
    }
    Ok(parts)
}

/// The home pool's slots and the shards each should read, when the subscription is split by
/// core (`subscribe_per_core`): each shard goes to the slot whose connection the shard's core
/// owns ([`crate::pool::Pool::slot_for_shard`]). `None` (one part, on the next connection, as
/// asked) when the option is off, or for every shard (`shards` is `None`) when the pool reaches
/// one core, the stream cannot be described (the broker then answers the Subscribe itself:
/// created, not found, not allowed), or the shards would make one group anyway.
async fn per_core_groups(
    client: &Client,
    options: &SubscribeOptions,
    shards: Option<&[ShardId]>,
) -> Option<BTreeMap<usize, Vec<ShardId>>> {
    let home = &client.shared.home;
    if !client.shared.config.subscribe_per_core {
        return None;
    }
    let all: Vec<ShardId> = match shards {
        Some(list) => list.to_vec(),
        None => {
            let cores: BTreeSet<u16> = (0..home.len()).filter_map(|i| home.slot_core(i)).collect();
            if cores.len() < 2 {
                return None;
            }
            match client.describe_stream(&options.stream).await {
                Ok(d) if (d.shards as usize) <= felix_proto::limits::MAX_SUBSCRIBE_SHARDS => {
                    (0..d.shards).map(ShardId).collect()
                }
                Ok(_) => return None,
                Err(e) => {
                    tracing::debug!(stream = %options.stream, error = %e, "not split by core");
                    return None;
                }
            }
        }
    };
    let mut groups: BTreeMap<usize, Vec<ShardId>> = BTreeMap::new();
    for s in all {
        groups.entry(home.slot_for_shard(s)).or_default().push(s);
    }
    (shards.is_some() || groups.len() > 1).then_some(groups)
}

/// Sends Subscribe for `shards` (`None`: all) on `conn` and takes the subscription's stream.
async fn open_part(
    conn: Arc<Conn>,
    options: &SubscribeOptions,
    shards: Option<Vec<ShardId>>,
    start: Start<'_>,
) -> Result<Part, ClientError> {
    let (start, positions) = match start {
        Start::At(at) => (at, None),
        Start::Positions { next, fallback } => {
            let listed: Option<Vec<Offset>> = shards
                .as_ref()
                .and_then(|list| list.iter().map(|s| next.get(s).copied()).collect());
            let speaks = conn.capabilities().contains(Capabilities::SUBSCRIBE_POSITIONS);
            match (listed, fallback) {
                // `start` is ignored by the broker where positions are given.
                (Some(positions), _) if speaks => (StartAt::Latest, Some(positions)),
                (_, Some(at)) => (at, None),
                (_, None) => return Err(NO_POSITIONS),
            }
        }
    };
    let id = conn.next_request_id();
    let frame = Frame::Subscribe(Subscribe {
        request_id: id,
        stream: options.stream.clone(),
        shards,
        start,
        group: options.group.clone(),
        positions,
    });
    let ok: SubscribeOk = match conn.request(id, &frame).await? {
        Frame::SubscribeOk(ok) => ok,
        other => return Err(unexpected(&other, FrameType::SubscribeOk)),
    };
    let stream = conn.take_subscription_stream(ok.subscription_id).await?;
    // Where each shard starts, from a broker that says so (one position per shard).
    let starts = match ok.positions {
        Some(p) if p.len() == ok.shards.len() => ok.shards.iter().copied().zip(p).collect(),
        Some(p) => {
            return Err(ClientError::Protocol(format!(
                "SubscribeOk with {} positions for {} shards",
                p.len(),
                ok.shards.len()
            )))
        }
        None => Vec::new(),
    };
    Ok(Part {
        conn,
        id: ok.subscription_id,
        shards: ok.shards,
        starts,
        stream,
        ended: false,
        stopping: false,
    })
}

/// `group`, the shards owned by the broker at `address`, split by the slot of that broker's
/// pool that each shard's core owns (with `per_core`; whole without it, or when the pool
/// cannot be opened now: the connection attempt then reports why).
async fn split_by_core(
    cluster: &Cluster,
    address: String,
    group: Vec<ShardId>,
    per_core: bool,
) -> Vec<(String, Vec<ShardId>)> {
    let pool = match per_core {
        true => cluster.pool_for(&address).await.ok(),
        false => None,
    };
    let Some(pool) = pool else { return vec![(address, group)] };
    let mut by_slot: BTreeMap<usize, Vec<ShardId>> = BTreeMap::new();
    for s in group {
        by_slot.entry(pool.slot_for_shard(s)).or_default().push(s);
    }
    by_slot.into_values().map(|g| (address.clone(), g)).collect()
}

/// Opens the parts of a subscription to `shards` (`None`: every shard of the placement) in a
/// cluster: one Subscribe per owner (with `per_core`, per owner and core), naming its shards.
/// A part refused with `NotOwner` is grouped again after a fresh placement (at most
/// [`NOT_OWNER_REDIRECTS_MAX`] times); shards whose owner is down are retried until the
/// deadline, then `ShardUnavailable`.
pub(super) async fn open_in_cluster(
    cluster: &Cluster,
    options: &SubscribeOptions,
    shards: Option<Vec<ShardId>>,
    start: Start<'_>,
    per_core: bool,
) -> Result<Vec<Part>, ClientError> {
    let stream = &options.stream;
    let mut parts = Vec::new();
    let mut todo = shards;
    let mut redirects = 0u32;
    let mut patience = Patience::default();
    let mut after: Option<Instant> = None;
    loop {
        let placement = match after {
            None => cluster.placement(stream).await,
            Some(t) => cluster.refresh(stream, t).await,
        };
        let placement = match placement {
            Ok(p) => p,
            Err(e) if e.is_shard_unavailable() || is_unreachable(&e) => {
                patience.wait(stream, None).await?;
                after = Some(Instant::now());
                continue;
            }
            Err(ClientError::Broker { code: ErrorCode::StreamNotFound, .. })
                if parts.is_empty() =>
            {
                // A stream the cluster does not know: the home broker answers the Subscribe
                // as a single broker would (an error, or the stream created).
                let home = cluster.home();
                let conn = home.conn(home.next_slot()).await?;
                return Ok(vec![open_part(conn, options, todo, start).await?]);
            }
            Err(e) => return Err(e),
        };
        let want = todo.take().unwrap_or_else(|| (0..placement.shards()).map(ShardId).collect());
        // Owner address (None: not live) -> its shards. A shard the placement lacks goes to
        // the home broker, whose answer (InvalidShard) is the caller's.
        let mut groups: BTreeMap<Option<String>, Vec<ShardId>> = BTreeMap::new();
        for s in want {
            let owner = match placement.owner(s) {
                Some(o) => o.live.then(|| o.address.clone()),
                None => Some(cluster.home().name().to_owned()),
            };
            groups.entry(owner).or_default().push(s);
        }
        let mut retry = Vec::new();
        let mut waiting = false;
        let mut by_core = Vec::new();
        for (owner, group) in groups {
            let Some(address) = owner else {
                retry.extend(group);
                waiting = true;
                continue;
            };
            by_core.extend(split_by_core(cluster, address, group, per_core).await);
        }
        for (address, group) in by_core {
            let slot_of = per_core.then(|| group[0]);
            let opened = match cluster.conn_at(&address, slot_of).await {
                Ok(conn) => open_part(conn, options, Some(group.clone()), start).await,
                Err(e) => Err(e),
            };
            match opened {
                Ok(part) => parts.push(part),
                Err(ClientError::NotOwner { stream: s, shard, owner }) => {
                    cluster.learn(&s, shard, &owner);
                    redirects += 1;
                    if redirects > NOT_OWNER_REDIRECTS_MAX {
                        return Err(ClientError::NotOwner { stream: s, shard, owner });
                    }
                    retry.extend(group);
                }
                Err(e) if e.is_shard_unavailable() || is_unreachable(&e) => {
                    retry.extend(group);
                    waiting = true;
                }
                Err(e) => return Err(e),
            }
        }
        if retry.is_empty() {
            return Ok(parts);
        }
        if waiting {
            patience.wait(stream, retry.first().copied()).await?;
        }
        todo = Some(retry);
        after = Some(Instant::now());
    }
}
