//! The etcd key layout. Everything Felix keeps in etcd lives under `/felix/<cluster>/`:
//!
//! | key | value | written by |
//! |---|---|---|
//! | `members/<node>` | [`crate::Member`] as JSON, attached to the node's lease | the node |
//! | `controller/<lease>` | the candidate's node id (etcd election API) | every node |
//! | `streams/<stream>` | [`crate::StreamDef`], `replicas`, as JSON | the broker that made it |
//! | `placement/<stream>` | [`crate::StreamPlacement`] as JSON | the controller |
//! | `groups/<stream>/<shard>` | [`crate::ShardGroup`] as JSON (replicated streams) | see below |
//! | `deleted/<stream>` | [`crate::Tombstone`] as JSON: the incarnation deleted | the deleting broker |
//!
//! A group key is created by the controller with the placement, then changed only by
//! elections and its leader's in-sync-set proposals, each a compare-and-swap on its mod
//! revision ([`crate::groups`]).
//!
//! Records never go to etcd, and nothing here is on the per-record path.

/// The key prefix of cluster `cluster`.
pub fn root(cluster: &str) -> String {
    format!("/felix/{cluster}/")
}

/// Prefix of the member keys.
pub fn members(cluster: &str) -> String {
    format!("{}members/", root(cluster))
}

/// The member key of `node`.
pub fn member(cluster: &str, node: &str) -> String {
    format!("{}{node}", members(cluster))
}

/// The election name of the controller.
pub fn controller(cluster: &str) -> String {
    format!("{}controller", root(cluster))
}

/// Prefix of the stream definitions.
pub fn streams(cluster: &str) -> String {
    format!("{}streams/", root(cluster))
}

/// The definition key of `stream`.
pub fn stream(cluster: &str, stream: &str) -> String {
    format!("{}{stream}", streams(cluster))
}

/// Prefix of the placements.
pub fn placements(cluster: &str) -> String {
    format!("{}placement/", root(cluster))
}

/// The placement key of `stream`.
pub fn placement(cluster: &str, stream: &str) -> String {
    format!("{}{stream}", placements(cluster))
}

/// Prefix of the replica-group records.
pub fn groups(cluster: &str) -> String {
    format!("{}groups/", root(cluster))
}

/// The group key of `shard` of `stream`.
pub fn group(cluster: &str, stream: &str, shard: u32) -> String {
    format!("{}{stream}/{shard}", groups(cluster))
}

/// Prefix of the tombstones of deleted streams.
pub fn tombstones(cluster: &str) -> String {
    format!("{}deleted/", root(cluster))
}

/// The tombstone key of `stream`.
pub fn tombstone(cluster: &str, stream: &str) -> String {
    format!("{}{stream}", tombstones(cluster))
}

/// Prefix of the group keys of `stream`.
pub fn groups_of(cluster: &str, stream: &str) -> String {
    format!("{}{stream}/", groups(cluster))
}

/// The stream and shard of a group key's name (what follows [`groups`]).
pub fn group_of(name: &str) -> Option<(&str, u32)> {
    let (stream, shard) = name.rsplit_once('/')?;
    let shard = shard.parse().ok()?;
    (!stream.is_empty()).then_some((stream, shard))
}

/// The name after `prefix` in `key`, if `key` is under it.
pub fn name_under<'a>(key: &'a str, prefix: &str) -> Option<&'a str> {
    key.strip_prefix(prefix).filter(|rest| !rest.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_nest_under_the_cluster_root() {
        assert_eq!(member("c", "b1"), "/felix/c/members/b1");
        assert_eq!(stream("c", "t/n/s"), "/felix/c/streams/t/n/s");
        assert_eq!(name_under(&placement("c", "t/n/s"), &placements("c")), Some("t/n/s"));
        assert_eq!(name_under("/felix/c/placement/", &placements("c")), None);
        assert_eq!(name_under("/felix/d/placement/x", &placements("c")), None);
        let g = group("c", "t/n/s", 7);
        assert_eq!(g, "/felix/c/groups/t/n/s/7");
        assert_eq!(name_under(&g, &groups("c")).and_then(group_of), Some(("t/n/s", 7)));
        assert_eq!(group_of("t/n/s/x"), None);
        assert_eq!(group_of("/3"), None);
    }
}
