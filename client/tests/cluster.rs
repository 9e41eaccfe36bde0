//! The client in a cluster, against mock brokers sharing one placement table
//! (`support/cluster.rs`): seeds, routing each keyed batch to its shard's owner, NotOwner
//! corrected with no lost or duplicated record, subscriptions and commits at every owner, and
//! the typed error for an unavailable shard within the deadline.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use felix_client::cluster::SHARD_UNAVAILABLE_DEADLINE_MS;
use felix_client::{
    AckMode, Client, ClientError, Offset, PublishSettings, Receipt, Record, ShardId, StartAt,
    SubscribeOptions,
};
use felix_proto::shard_for_key;
use support::cluster::{node, MockCluster};

const STREAM: &str = "acme/app/orders";
/// Bound on every wait (not a timing assertion: a hang fails instead of blocking).
const WAIT: Duration = Duration::from_secs(20);

/// A key of `stream` (with `shards` shards) that maps to `shard`, the n-th such key.
fn key_for(shard: u32, shards: u32, n: usize) -> String {
    (0..)
        .map(|i| format!("key-{i}"))
        .filter(|k| shard_for_key(k.as_bytes(), shards).0 == shard)
        .nth(n)
        .unwrap()
}

/// Publishes `per_key` records for each key, all acked; returns the receipts by value.
async fn publish_all(
    client: &Client,
    keys: &[String],
    per_key: usize,
) -> BTreeMap<String, Receipt> {
    let publisher = client.publisher(STREAM).await.unwrap();
    let mut tickets = Vec::new();
    for i in 0..per_key {
        for k in keys {
            let value = format!("{k}/{i}");
            tickets.push((
                value.clone(),
                publisher.send(Record::keyed(k.clone(), value)).await.unwrap(),
            ));
        }
    }
    let mut receipts = BTreeMap::new();
    for (value, t) in tickets {
        let r = tokio::time::timeout(WAIT, t).await.expect("ack stalled");
        let receipt = r.unwrap_or_else(|e| panic!("{value}: {e}")).expect("acked");
        assert!(receipts.insert(value, receipt).is_none());
    }
    publisher.close().await.unwrap();
    receipts
}

/// Every stored value of `stream` on every running member: (member, shard, value) in log order.
fn stored_values(cluster: &MockCluster, members: &[usize]) -> Vec<(usize, u32, String)> {
    let mut out = Vec::new();
    for &m in members {
        for (s, log) in cluster.stored(m, STREAM).iter().enumerate() {
            for r in log {
                out.push((m, s as u32, String::from_utf8(r.value.to_vec()).unwrap()));
            }
        }
    }
    out
}

#[tokio::test]
async fn keyed_publishes_through_one_seed_reach_each_shards_owner() {
    let cluster = MockCluster::start(3).await;
    let owners = [0, 1, 2, 0, 1, 2];
    cluster.create_stream(STREAM, &owners);
    let client = Client::connect(cluster.client_config(&[0])).await.unwrap();
    assert!(client.is_cluster());
    let keys: Vec<String> = (0..12).map(|i| format!("customer-{i}")).collect();
    let per_key = 20;
    let receipts = publish_all(&client, &keys, per_key).await;

    // Every record acked once, at its key's shard, with its own offset.
    assert_eq!(receipts.len(), keys.len() * per_key);
    let distinct: BTreeSet<(ShardId, Offset)> =
        receipts.values().map(|r| (r.shard, r.offset)).collect();
    assert_eq!(distinct.len(), receipts.len(), "two records share an offset");
    for (value, r) in &receipts {
        let key = value.split('/').next().unwrap();
        assert_eq!(r.shard, shard_for_key(key.as_bytes(), 6), "{value}");
    }
    // Stored once, at the owner only, in per-key order; the seed never had to redirect.
    let stored = stored_values(&cluster, &[0, 1, 2]);
    assert_eq!(stored.len(), receipts.len());
    for (member, shard, value) in &stored {
        assert_eq!(*member, owners[*shard as usize], "{value} stored on b{member}");
    }
    for k in &keys {
        let order: Vec<usize> = stored
            .iter()
            .filter(|(_, _, v)| v.split('/').next() == Some(k.as_str()))
            .map(|(_, _, v)| v.rsplit('/').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(order, (0..per_key).collect::<Vec<_>>(), "order of {k}");
    }
    for m in 0..3 {
        let o = cluster.broker(m).state.lock();
        assert_eq!(o.not_owner_sent, 0, "b{m} refused a batch");
        assert!(o.publishes > 0, "b{m} got nothing");
        assert!(o.violations.is_empty(), "{:?}", o.violations);
    }
    assert_eq!(client.brokers().len(), 3, "one pool per broker: {:?}", client.brokers());
}

#[tokio::test]
async fn unkeyed_publishes_spread_over_the_owners_and_are_stored_once() {
    let cluster = MockCluster::start(3).await;
    cluster.create_stream(STREAM, &[0, 1, 2]);
    let client = Client::connect(cluster.client_config(&[1])).await.unwrap();
    let settings = PublishSettings { batch_records_max: 4, ..PublishSettings::default() };
    let publisher = client.publisher_with(STREAM, settings).await.unwrap();
    let mut tickets = Vec::new();
    for i in 0..60 {
        tickets.push(publisher.send(Record::unkeyed(format!("u{i}"))).await.unwrap());
    }
    for t in tickets {
        tokio::time::timeout(WAIT, t).await.unwrap().unwrap().expect("acked");
    }
    let stored = stored_values(&cluster, &[0, 1, 2]);
    let values: BTreeSet<&str> = stored.iter().map(|(_, _, v)| v.as_str()).collect();
    assert_eq!((stored.len(), values.len()), (60, 60), "lost or duplicated");
    for m in 0..3 {
        assert!(stored.iter().any(|(s, _, _)| *s == m), "nothing stored on b{m}");
        assert_eq!(cluster.broker(m).state.lock().not_owner_sent, 0);
    }
}

/// While a leadership is handed on, two brokers may each name the other as the owner (one view
/// has the new record, the other not yet). A publish follows the redirects, pauses once they
/// ping-pong, and is stored once the views agree; before, it failed with `NotOwner` after four
/// redirects (bench/failover.sh's isolate trials lost a record so, 2026-12-08).
#[tokio::test]
async fn owners_naming_each_other_during_a_hand_over_cost_a_pause_not_the_record() {
    let cluster = MockCluster::start(2).await;
    cluster.create_stream(STREAM, &[0]);
    cluster.table.set_view(&node(0), STREAM, Some(vec![node(1)]));
    cluster.table.set_view(&node(1), STREAM, Some(vec![node(0)]));
    let client = Client::connect(cluster.client_config(&[0])).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    let ticket = publisher.send(Record::unkeyed("handed over")).await.unwrap();
    // Long enough for several rounds of redirects.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = (0..2).map(|i| cluster.broker(i).state.lock().not_owner_sent).sum::<usize>();
    assert!(refused > 4, "the brokers redirected {refused} times");
    // b0's view catches up: it owns the shard.
    cluster.table.set_view(&node(0), STREAM, None);
    cluster.table.set_view(&node(1), STREAM, None);
    let receipt =
        tokio::time::timeout(WAIT, ticket).await.unwrap().expect("stored").expect("acked");
    assert_eq!(receipt.shard, ShardId(0));
    assert_eq!(cluster.stored(0, STREAM)[0].len(), 1, "stored once, at the owner");
}

#[tokio::test]
async fn a_stale_placement_is_corrected_by_not_owner_without_loss_or_duplicates() {
    let cluster = MockCluster::start(3).await;
    cluster.create_stream(STREAM, &[0, 1, 2]);
    let client = Client::connect(cluster.client_config(&[0])).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    // Warm the client's pool to b1 with one record of shard 1.
    let k1 = key_for(1, 3, 0);
    publisher.publish(Record::keyed(k1.clone(), "warm")).await.unwrap();
    assert_eq!(cluster.stored(1, STREAM)[1].len(), 1);

    // Shard 1 moves to b2; the client still routes it to b1.
    cluster.table.place(STREAM, vec![node(0), node(2), node(2)]);
    let keys = [k1, key_for(1, 3, 1), key_for(1, 3, 2)];
    let mut tickets = Vec::new();
    for i in 0..30 {
        let k = &keys[i % keys.len()];
        let value = format!("{k}/{i}");
        tickets
            .push((value.clone(), publisher.send(Record::keyed(k.clone(), value)).await.unwrap()));
    }
    let mut offsets = BTreeSet::new();
    for (value, t) in tickets {
        let r = tokio::time::timeout(WAIT, t).await.unwrap();
        let receipt = r.unwrap_or_else(|e| panic!("{value}: {e}")).expect("acked");
        assert_eq!(receipt.shard, ShardId(1));
        assert!(offsets.insert(receipt.offset), "offset {:?} twice", receipt.offset);
    }
    assert!(cluster.broker(1).state.lock().not_owner_sent >= 1, "b1 never refused");
    // Nothing more on b1; exactly the 30 records on b2.
    assert_eq!(cluster.stored(1, STREAM)[1].len(), 1, "stored at the old owner");
    let at_b2: Vec<String> = cluster.stored(2, STREAM)[1]
        .iter()
        .map(|r| String::from_utf8(r.value.to_vec()).unwrap())
        .collect();
    let distinct: BTreeSet<&String> = at_b2.iter().collect();
    assert_eq!((at_b2.len(), distinct.len()), (30, 30), "lost or duplicated: {at_b2:?}");

    // The placement was corrected: later batches go straight to b2.
    let refused = cluster.broker(1).state.lock().not_owner_sent;
    publisher.publish(Record::keyed(keys[0].clone(), "after")).await.unwrap();
    assert_eq!(cluster.broker(1).state.lock().not_owner_sent, refused);
    assert_eq!(cluster.stored(2, STREAM)[1].len(), 31);
    assert_eq!(client.placement(STREAM).await.unwrap()[1].node, node(2));
}

#[tokio::test]
async fn a_subscription_over_all_shards_reads_from_every_owner() {
    // Each mock broker has 2 cores and the client's pools reach both (core_sequence 0, 1):
    // split by core (the default), each owner is asked once per core for that core's shards;
    // without the split, once for all its shards.
    for per_core in [true, false] {
        let cluster = MockCluster::start(3).await;
        let owners = [0, 1, 2, 0, 1, 2];
        cluster.create_stream(STREAM, &owners);
        let mut config = cluster.client_config(&[2]);
        config.subscribe_per_core = per_core;
        let client = Client::connect(config).await.unwrap();
        let keys: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
        let receipts = publish_all(&client, &keys, 5).await;

        let options = SubscribeOptions::new(STREAM).start(StartAt::Earliest);
        let mut sub = client.subscribe(options).await.unwrap();
        assert_eq!(sub.parts(), if per_core { 6 } else { 3 });
        assert_eq!(sub.shards(), (0..6).map(ShardId).collect::<Vec<_>>());
        let mut seen = BTreeMap::new();
        while seen.len() < receipts.len() {
            let r =
                tokio::time::timeout(WAIT, sub.next()).await.expect("stalled").unwrap().unwrap();
            let value = String::from_utf8(r.value.to_vec()).unwrap();
            let receipt = Receipt { shard: r.shard, offset: r.offset };
            assert!(seen.insert(value.clone(), receipt).is_none());
        }
        assert_eq!(seen, receipts);
        // Each owner was asked for exactly its own shards (per core: one Subscribe each).
        for m in 0..3 {
            let o = cluster.broker(m).state.lock();
            let mine: Vec<ShardId> =
                (0..6).filter(|s| owners[*s as usize] == m).map(ShardId).collect();
            let mut asked = o.subscribes.clone();
            asked.sort();
            let want = match per_core {
                true => mine.iter().map(|s| Some(vec![*s])).collect(),
                false => vec![Some(mine)],
            };
            assert_eq!(asked, want, "b{m}, per_core {per_core}");
            assert!(o.violations.is_empty(), "{:?}", o.violations);
        }
    }
}

#[tokio::test]
async fn a_subscription_with_a_stale_placement_resubscribes_at_the_owner() {
    let cluster = MockCluster::start(3).await;
    cluster.create_stream(STREAM, &[0, 1, 2]);
    let client = Client::connect(cluster.client_config(&[0])).await.unwrap();
    assert_eq!(client.placement(STREAM).await.unwrap()[2].node, node(2));
    // Shard 2 moves to b1 after the client cached the placement.
    cluster.table.place(STREAM, vec![node(0), node(1), node(1)]);
    let k2 = key_for(2, 3, 0);
    cluster.broker(1).state.lock().streams.get_mut(STREAM).unwrap().shards[2].push(
        support::Stored { timestamp_ms: 0, key: Some(k2.clone().into()), value: "moved".into() },
    );
    let mut sub =
        client.subscribe(SubscribeOptions::new(STREAM).start(StartAt::Earliest)).await.unwrap();
    assert!(cluster.broker(2).state.lock().not_owner_sent >= 1, "b2 never refused");
    assert_eq!(sub.shards(), [ShardId(0), ShardId(1), ShardId(2)]);
    let r = tokio::time::timeout(WAIT, sub.next()).await.unwrap().unwrap().unwrap();
    assert_eq!((r.shard, &r.value[..]), (ShardId(2), &b"moved"[..]));
    assert!(cluster.broker(2).state.lock().subscribes.is_empty());
}

#[tokio::test]
async fn group_commits_go_to_the_shards_owner() {
    let cluster = MockCluster::start(3).await;
    let owners = [0, 1, 2, 1];
    cluster.create_stream(STREAM, &owners);
    let client = Client::connect(cluster.client_config(&[0])).await.unwrap();
    let keys: Vec<String> = (0..4).map(|s| key_for(s, 4, 0)).collect();
    publish_all(&client, &keys, 3).await;
    let options = SubscribeOptions::new(STREAM).start(StartAt::Earliest).group("billing");
    let mut sub = client.subscribe(options).await.unwrap();
    for _ in 0..12 {
        tokio::time::timeout(WAIT, sub.next()).await.unwrap().unwrap().unwrap();
    }
    sub.commit_consumed().await.unwrap();
    for m in 0..3 {
        let o = cluster.broker(m).state.lock();
        let committed: BTreeSet<u32> = o.commits.keys().map(|(_, _, s)| *s).collect();
        let mine: BTreeSet<u32> = (0..4).filter(|s| owners[*s as usize] == m).collect();
        assert_eq!(committed, mine, "commits at b{m}");
        assert!(o.commits.values().all(|next| *next == 3));
    }
    // A commit after the shard moved follows NotOwner to the new owner.
    cluster.table.place(STREAM, vec![node(0), node(1), node(0), node(1)]);
    sub.commit(ShardId(2), Offset(2)).await.unwrap();
    let key = (STREAM.to_owned(), "billing".to_owned(), 2);
    assert_eq!(cluster.broker(0).state.lock().commits.get(&key), Some(&2));
    assert_eq!(cluster.broker(2).state.lock().commits.get(&key), Some(&3), "old owner untouched");
    assert!(cluster.broker(2).state.lock().not_owner_sent >= 1);
}

#[tokio::test]
async fn an_unavailable_shard_fails_with_the_typed_error_within_the_deadline() {
    let cluster = MockCluster::start(3).await;
    cluster.create_stream(STREAM, &[0, 1, 2]);
    let mut config = cluster.client_config(&[0]);
    // An idempotent batch waits for the shard as long as it is retried (a failover takes a
    // lease TTL): here as long as an untagged one.
    config.publish.retry_timeout_ms = SHARD_UNAVAILABLE_DEADLINE_MS;
    let client = Client::connect(config).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    let k1 = key_for(1, 3, 0);
    publisher.publish(Record::keyed(k1.clone(), "before")).await.unwrap();
    // b1 loses its lease: every member answers ShardUnavailable for shard 1.
    cluster.table.set_live(&node(1), false);
    let started = Instant::now();
    let err = tokio::time::timeout(WAIT, publisher.publish(Record::keyed(k1.clone(), "lost")))
        .await
        .expect("hung")
        .unwrap_err();
    let waited = started.elapsed();
    assert!(
        matches!(&err, ClientError::ShardUnavailable { shard: Some(ShardId(1)), stream, .. } if stream == STREAM),
        "{err:?}"
    );
    let deadline = Duration::from_millis(SHARD_UNAVAILABLE_DEADLINE_MS);
    assert!(waited >= deadline && waited < deadline + Duration::from_secs(5), "{waited:?}");
    assert!(cluster.broker(1).state.lock().unavailable_sent >= 1);
    assert_eq!(cluster.stored(1, STREAM)[1].len(), 1, "nothing stored while unavailable");
    // Every other shard keeps working.
    for s in [0, 2] {
        let r = publisher.publish(Record::keyed(key_for(s, 3, 0), "ok")).await.unwrap().unwrap();
        assert_eq!(r.shard, ShardId(s));
    }
    // An unacked record for the shard fails at once instead of being dropped unseen.
    let none = PublishSettings { ack_mode: AckMode::None, ..PublishSettings::default() };
    let unacked = client.publisher_with(STREAM, none).await.unwrap();
    assert!(matches!(
        unacked.send(Record::keyed(k1.clone(), "x")).await,
        Err(ClientError::ShardUnavailable { shard: Some(ShardId(1)), .. })
    ));
    // A subscription needing the shard, and a commit of it, fail the same way.
    let err = client
        .subscribe(SubscribeOptions::new(STREAM).start(StartAt::Earliest))
        .await
        .err()
        .unwrap();
    assert!(matches!(err, ClientError::ShardUnavailable { .. }), "{err:?}");
    let other = client
        .subscribe(
            SubscribeOptions::new(STREAM)
                .shards(vec![ShardId(0)])
                .group("g")
                .start(StartAt::Earliest),
        )
        .await
        .unwrap();
    let err = other.commit(ShardId(1), Offset(1)).await.unwrap_err();
    assert!(
        matches!(err, ClientError::ShardUnavailable { shard: Some(ShardId(1)), .. }),
        "{err:?}"
    );
    // Back up: the shard works again.
    cluster.table.set_live(&node(1), true);
    let r = publisher.publish(Record::keyed(k1, "after")).await.unwrap().unwrap();
    assert_eq!(r.shard, ShardId(1));
}

#[tokio::test]
async fn seeds_are_tried_in_order_and_a_lost_broker_is_refreshed_from_another() {
    let mut cluster = MockCluster::start(3).await;
    cluster.create_stream(STREAM, &[0, 1, 2]);
    // The first seed never answers.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut config = cluster.client_config(&[0, 1]);
    config.addr = format!("{},{}", silent.local_addr().unwrap(), config.addr);
    config.connect_timeout_ms = 500;
    config.reconnect_attempts_max = 1;
    let client = Client::connect(config).await.unwrap();
    assert_eq!(client.brokers(), [cluster.broker(0).addr.to_string()]);
    let publisher = client.publisher(STREAM).await.unwrap();
    for s in 0..3 {
        publisher.publish(Record::keyed(key_for(s, 3, 0), "a")).await.unwrap();
    }

    // The home broker goes away, then shard 1 moves from b1 to b2.
    cluster.stop(0).await;
    cluster.table.place(STREAM, vec![node(0), node(2), node(2)]);
    let r = tokio::time::timeout(WAIT, publisher.publish(Record::keyed(key_for(1, 3, 0), "b")))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(r.shard, ShardId(1));
    assert_eq!(cluster.stored(2, STREAM)[1].len(), 1, "resent to the new owner");
    // Placement and stream requests are answered by another broker.
    let placement = tokio::time::timeout(WAIT, client.placement(STREAM)).await.unwrap().unwrap();
    assert_eq!(
        placement.iter().map(|o| (o.node.as_str(), o.live)).collect::<Vec<_>>(),
        [("b0", false), ("b2", true), ("b2", true)]
    );
    assert_eq!(client.describe_stream(STREAM).await.unwrap().shards, 3);
    // Shard 0's owner is down: its records fail with the typed error.
    let err = publisher.publish(Record::keyed(key_for(0, 3, 0), "c")).await.unwrap_err();
    assert!(
        matches!(err, ClientError::ShardUnavailable { shard: Some(ShardId(0)), .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_single_node_broker_gets_no_cluster_frames() {
    // Split by core (the default) the subscription names each core's shards; without the
    // split the shard list is left to the broker, as before.
    for per_core in [true, false] {
        let broker = support::TestBroker::start(support::BrokerOptions::default()).await;
        broker.create_stream(STREAM, 2);
        let mut config = broker.client_config();
        config.subscribe_per_core = per_core;
        let client = Client::connect(config).await.unwrap();
        assert!(!client.is_cluster());
        let placement = client.placement(STREAM).await;
        assert_eq!(placement, Err(ClientError::Unsupported("cluster metadata")));
        publish_all(&client, &["a".to_owned(), "b".to_owned()], 3).await;
        let options = SubscribeOptions::new(STREAM).start(StartAt::Earliest).group("g");
        let mut sub = client.subscribe(options).await.unwrap();
        assert_eq!(sub.parts(), if per_core { 2 } else { 1 });
        for _ in 0..6 {
            tokio::time::timeout(WAIT, sub.next()).await.unwrap().unwrap().unwrap();
        }
        sub.commit_consumed().await.unwrap();
        let o = broker.state.lock();
        assert_eq!(o.metadata_requests, 0);
        let mut asked = o.subscribes.clone();
        asked.sort();
        let want = match per_core {
            true => vec![Some(vec![ShardId(0)]), Some(vec![ShardId(1)])],
            false => vec![None],
        };
        assert_eq!(asked, want, "per_core {per_core}");
        drop(o);
        broker.assert_no_unadvertised_bits();
    }
}

#[tokio::test]
async fn an_owner_that_cannot_be_reached_fails_with_the_typed_error() {
    let mut cluster = MockCluster::start(2).await;
    cluster.create_stream(STREAM, &[0, 1]);
    let mut config = cluster.client_config(&[0]);
    config.connect_timeout_ms = 300;
    config.reconnect_attempts_max = 1;
    config.publish.retry_timeout_ms = SHARD_UNAVAILABLE_DEADLINE_MS;
    let client = Client::connect(config).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    let k1 = key_for(1, 2, 0);
    publisher.publish(Record::keyed(k1.clone(), "before")).await.unwrap();
    // b1 dies; its lease has not expired, so the placement still names it live.
    cluster.kill(1).await;
    let started = Instant::now();
    let err = tokio::time::timeout(WAIT, publisher.publish(Record::keyed(k1, "lost")))
        .await
        .expect("hung")
        .unwrap_err();
    assert!(
        matches!(err, ClientError::ShardUnavailable { shard: Some(ShardId(1)), .. }),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(SHARD_UNAVAILABLE_DEADLINE_MS) * 4);
    let r = publisher.publish(Record::keyed(key_for(0, 2, 0), "ok")).await.unwrap().unwrap();
    assert_eq!(r.shard, ShardId(0));
}

#[tokio::test]
async fn a_client_whose_only_seed_died_finds_the_cluster_through_the_brokers_it_learned() {
    let mut cluster = MockCluster::start(3).await;
    cluster.create_stream(STREAM, &[0, 1, 2]);
    // One seed, and only its pool opened: the other brokers are known from the placement alone.
    let mut config = cluster.client_config(&[0]);
    config.connect_timeout_ms = 300;
    config.reconnect_attempts_max = 1;
    let client = Client::connect(config).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    publisher.publish(Record::keyed(key_for(0, 3, 0), "a")).await.unwrap();
    assert_eq!(client.brokers(), [cluster.broker(0).addr.to_string()]);

    // The seed dies and its shard moves to b1.
    cluster.stop(0).await;
    cluster.table.set_live(&node(0), false);
    cluster.table.place(STREAM, vec![node(1), node(1), node(2)]);
    for (s, owner) in [(0, 1), (1, 1), (2, 2)] {
        let r = tokio::time::timeout(WAIT, publisher.publish(Record::keyed(key_for(s, 3, 0), "b")))
            .await
            .expect("hung: the client asked only its dead seed where the shard went")
            .unwrap()
            .unwrap();
        assert_eq!(r.shard, ShardId(s));
        let stored = cluster.stored(owner, STREAM)[s as usize].clone();
        assert_eq!(stored.last().map(|r| r.value.to_vec()), Some(b"b".to_vec()), "shard {s}");
    }
}

#[tokio::test]
async fn a_dead_first_seed_costs_a_moment_not_the_connect_timeout() {
    let cluster = MockCluster::start(2).await;
    cluster.create_stream(STREAM, &[0, 1]);
    // The first seed never answers; the connect timeout is the default's 5 s.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut config = cluster.client_config(&[0, 1]);
    config.addr = format!("{},{}", silent.local_addr().unwrap(), config.addr);
    let connect_timeout = Duration::from_millis(config.connect_timeout_ms);
    let started = Instant::now();
    let client = Client::connect(config).await.unwrap();
    let took = started.elapsed();
    // Not a timing: the dead seed must not have been waited for (it was, for 5 s, before).
    assert!(took < connect_timeout / 2, "connect took {took:?}");
    assert_eq!(client.brokers(), [cluster.broker(0).addr.to_string()], "the first live seed");
}

#[tokio::test]
async fn shutting_down_is_retried_for_idempotent_batches_only() {
    let cluster = MockCluster::start(3).await;
    cluster.create_stream(STREAM, &[0, 1, 2]);
    let client = Client::connect(cluster.client_config(&[0])).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    let plain_settings = PublishSettings { idempotent: false, ..PublishSettings::default() };
    let plain = client.publisher_with(STREAM, plain_settings).await.unwrap();
    let k1 = key_for(1, 3, 0);
    publisher.publish(Record::keyed(k1.clone(), "before")).await.unwrap();

    // b1 is stopping: it refuses every publish with ShuttingDown.
    cluster.broker(1).state.stopping.store(true, std::sync::atomic::Ordering::Relaxed);
    // A plain batch is not sent again: the broker may have stored it.
    let err = tokio::time::timeout(WAIT, plain.publish(Record::keyed(k1.clone(), "plain")))
        .await
        .expect("hung")
        .unwrap_err();
    assert!(
        matches!(err, ClientError::Broker { code: felix_proto::ErrorCode::ShuttingDown, .. }),
        "{err:?}"
    );
    // An idempotent one is retried until the shard has its next owner, and stored there once.
    let ticket = publisher.send(Record::keyed(k1.clone(), "during")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.table.set_live(&node(1), false);
    cluster.table.place(STREAM, vec![node(0), node(2), node(2)]);
    let r = tokio::time::timeout(WAIT, ticket).await.expect("hung").unwrap().expect("acked");
    assert_eq!(r.shard, ShardId(1));
    let at_b2: Vec<Vec<u8>> =
        cluster.stored(2, STREAM)[1].iter().map(|r| r.value.to_vec()).collect();
    assert_eq!(at_b2, [b"during".to_vec()]);
    assert_eq!(cluster.stored(1, STREAM)[1].len(), 1, "nothing more at the stopping broker");
}

#[tokio::test]
async fn a_broker_that_stops_answering_is_left_for_the_shards_next_owner() {
    let cluster = MockCluster::start(3).await;
    cluster.create_stream(STREAM, &[0, 1, 2]);
    // The home broker is the one that will hang; acks and requests wait 30 s (the default).
    let mut config = cluster.client_config(&[1]);
    config.ack_timeout_ms = 30_000;
    let client = Client::connect(config).await.unwrap();
    let publisher = client.publisher(STREAM).await.unwrap();
    let k1 = key_for(1, 3, 0);
    publisher.publish(Record::keyed(k1.clone(), "before")).await.unwrap();

    // b1 answers nothing more, its connections alive (as a leader cut off from its cluster,
    // or paused); a batch waits for its ack there.
    cluster.broker(1).state.frozen.store(true, std::sync::atomic::Ordering::Relaxed);
    let waiting = publisher.send(Record::keyed(k1.clone(), "waiting")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Its lease runs out and shard 1 gets its next owner.
    cluster.table.set_live(&node(1), false);
    cluster.table.place(STREAM, vec![node(0), node(2), node(2)]);
    let r = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("the batch waited on the hung broker")
        .unwrap()
        .expect("acked");
    assert_eq!(r.shard, ShardId(1));
    let r = tokio::time::timeout(WAIT, publisher.publish(Record::keyed(k1, "after")))
        .await
        .expect("hung")
        .unwrap()
        .expect("acked");
    assert_eq!(r.shard, ShardId(1));
    let at_b2: Vec<Vec<u8>> =
        cluster.stored(2, STREAM)[1].iter().map(|r| r.value.to_vec()).collect();
    assert_eq!(at_b2, [b"waiting".to_vec(), b"after".to_vec()]);
    // Requests any broker can answer do not wait for the hung one either.
    let described = tokio::time::timeout(WAIT, client.describe_stream(STREAM)).await;
    assert_eq!(described.expect("waited on the hung broker").unwrap().shards, 3);
}
