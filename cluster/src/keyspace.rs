//! What the cluster's etcd keys say: one key's put or delete applied to a [`ClusterView`] and
//! the controller candidates. Shared by the agent (its load and its watch) and by
//! `felix cluster status`. A key that does not parse is an error of [`apply`]; the callers
//! skip it ([`apply_or_skip`]) so that one bad key never stops a broker from loading the rest.

use std::collections::BTreeMap;

use etcd_client::KeyValue;

use crate::error::ClusterError;
use crate::groups::ShardGroup;
use crate::keys;
use crate::placement::StreamPlacement;
use crate::view::{ClusterView, Member, StreamRecord, Tombstone};
use crate::NodeId;

/// Controller candidates: election key -> (create revision, node; `None` for a value that is
/// not a node id). The oldest key leads.
pub(crate) type Candidates = BTreeMap<String, (i64, Option<NodeId>)>;

/// [`apply`], or for a key that does not parse: a warning naming it, one more
/// [`ClusterView::keys_skipped`], and the view as it was. One bad key (written by hand, by a
/// newer version, or damaged) must not stop every agent from loading the others.
pub(crate) fn apply_or_skip(
    cluster: &str,
    view: &mut ClusterView,
    candidates: &mut Candidates,
    kv: &KeyValue,
    deleted: bool,
) {
    if let Err(e) = apply(cluster, view, candidates, kv, deleted) {
        let key = String::from_utf8_lossy(kv.key());
        tracing::warn!(%key, deleted, error = %e, "cluster agent: skipping a malformed key");
        view.keys_skipped += 1;
    }
}

/// Applies one key's put or delete to the view. On an error the view is unchanged, except for
/// a controller candidate that is not a node id: it is kept (as a candidate of no broker).
pub(crate) fn apply(
    cluster: &str,
    view: &mut ClusterView,
    candidates: &mut Candidates,
    kv: &KeyValue,
    deleted: bool,
) -> Result<(), ClusterError> {
    let key = kv.key_str().map_err(ClusterError::from)?.to_owned();
    let corrupt = |why: String| ClusterError::Corrupt { key: key.clone(), why };
    let controller_prefix = format!("{}/", keys::controller(cluster));
    if let Some(name) = keys::name_under(&key, &keys::members(cluster)) {
        let node = NodeId::new(name).map_err(|e| corrupt(e.to_string()))?;
        if deleted {
            view.members.remove(&node);
            view.member_leases.remove(&node);
        } else {
            let m: Member =
                serde_json::from_slice(kv.value()).map_err(|e| corrupt(e.to_string()))?;
            view.member_leases.insert(node.clone(), kv.lease());
            view.members.insert(node, m);
        }
    } else if let Some(name) = keys::name_under(&key, &keys::streams(cluster)) {
        if deleted {
            view.streams.remove(name);
            view.replication.remove(name);
            view.incarnations.remove(name);
        } else {
            let r: StreamRecord =
                serde_json::from_slice(kv.value()).map_err(|e| corrupt(e.to_string()))?;
            view.streams.insert(name.to_owned(), r.def);
            view.incarnations.insert(name.to_owned(), kv.create_revision());
            view.replication.remove(name);
            if r.replicas > 1 {
                view.replication.insert(name.to_owned(), r.replicas);
            }
        }
    } else if let Some(name) = keys::name_under(&key, &keys::groups(cluster)) {
        let (stream, shard) =
            keys::group_of(name).ok_or_else(|| corrupt("not groups/<stream>/<shard>".into()))?;
        let at = (stream.to_owned(), shard);
        if deleted {
            view.groups.remove(&at);
        } else {
            view.groups.insert(at, ShardGroup::from_kv(kv)?);
        }
    } else if let Some(name) = keys::name_under(&key, &keys::tombstones(cluster)) {
        if deleted {
            view.deleted.remove(name);
        } else {
            let t: Tombstone =
                serde_json::from_slice(kv.value()).map_err(|e| corrupt(e.to_string()))?;
            view.deleted.insert(name.to_owned(), t);
        }
    } else if let Some(name) = keys::name_under(&key, &keys::placements(cluster)) {
        if deleted {
            view.placements.remove(name);
        } else {
            let p: StreamPlacement =
                serde_json::from_slice(kv.value()).map_err(|e| corrupt(e.to_string()))?;
            view.placements.insert(name.to_owned(), p);
        }
    } else if key.starts_with(&controller_prefix) {
        let mut node = None;
        if deleted {
            candidates.remove(&key);
        } else {
            node = std::str::from_utf8(kv.value()).ok().and_then(|s| NodeId::new(s).ok());
            // Kept even when it is not a node id: etcd's election counts every key under the
            // name, so while it is the oldest, no broker is the controller.
            candidates.insert(key.clone(), (kv.create_revision(), node.clone()));
        }
        // The election's leader is the candidate with the oldest key.
        let oldest = candidates.values().min_by_key(|(rev, _)| *rev);
        view.controller = oldest.and_then(|(_, n)| n.clone());
        if !deleted && node.is_none() {
            return Err(corrupt("not a node id".into()));
        }
    }
    Ok(())
}
