//! End to end: deleting and altering streams on a single broker (2 cores), and a Subscribe
//! that never creates one.

mod e2e_support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e_support::{TestBroker, WAIT};
use felix_client::{
    AckMode, Client, ClientError, Offset, PublishSettings, Record, StartAt, SubscribeOptions,
};
use felix_proto::{ErrorCode, Retention, StreamChanges};

/// The smallest segment the broker takes: a few rolls in a few tens of MiB.
const SEGMENT_BYTES: &str = "4198400";

async fn publish(client: &Client, stream: &str, from: usize, n: usize, size: usize) {
    let settings =
        PublishSettings { ack_mode: AckMode::Durable, linger_us: 50, ..PublishSettings::default() };
    let p = client.publisher_with(stream, settings).await.unwrap();
    for i in from..from + n {
        let mut value = format!("v{i}:").into_bytes();
        value.resize(size.max(value.len()), b'.');
        p.publish(Record::unkeyed(value)).await.unwrap();
    }
    p.flush().await.unwrap();
}

fn value_index(value: &[u8]) -> usize {
    let text = String::from_utf8_lossy(value);
    let (head, _) = text.split_once(':').expect("v<i>:");
    head[1..].parse().expect("an index")
}

/// Reads `n` records, or panics.
async fn read(sub: &mut felix_client::Subscriber, n: usize) -> Vec<felix_client::ReceivedRecord> {
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(WAIT, sub.next()).await {
            Ok(Ok(Some(r))) => out.push(r),
            other => panic!("after {} of {n}: {other:?}", out.len()),
        }
    }
    out
}

fn broker_code(e: &ClientError) -> Option<ErrorCode> {
    match e {
        ClientError::Broker { code, .. } | ClientError::Refused { code, .. } => Some(*code),
        _ => None,
    }
}

/// Every file and directory under `dir` whose name contains `part`.
fn paths_named(dir: &Path, part: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.file_name().is_some_and(|n| n.to_string_lossy().contains(part)) {
                found.push(p.clone());
            }
            if p.is_dir() {
                dirs.push(p);
            }
        }
    }
    found
}

/// The directory names storage gives `stream` (its logs, one per core) and its definition.
fn storage_name(stream: &str) -> String {
    felix_storage::stream_dir_name(stream).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_stream_is_gone_from_every_core_and_its_subscriptions_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = TestBroker::start(dir.path(), 2, &[]);
    let client = broker.client().await;
    let stream = "acme/app/doomed";
    client.create_stream(stream, 4, Retention::default()).await.unwrap();
    publish(&client, stream, 0, 200, 100).await;
    // A live subscriber reads everything, then waits at the tail.
    let mut sub =
        client.subscribe(SubscribeOptions::new(stream).start(StartAt::Earliest)).await.unwrap();
    assert_eq!(read(&mut sub, 200).await.len(), 200);
    let name = storage_name(stream);
    let on_disk = paths_named(dir.path(), &name);
    assert!(on_disk.len() >= 3, "a definition and a log per core: {on_disk:?}");

    let gone = client.delete_stream(stream).await.unwrap();
    assert_eq!(gone.shards, 4, "the answer names what was deleted");
    // The subscription ends with a typed error, not silence.
    match tokio::time::timeout(WAIT, sub.next()).await {
        Ok(Err(e)) => assert_eq!(broker_code(&e), Some(ErrorCode::StreamNotFound), "{e}"),
        other => panic!("the subscription of a deleted stream goes on: {other:?}"),
    }
    // Nothing of it is left: no definition, no log on either core, not listed, not described.
    assert_eq!(paths_named(dir.path(), &name), Vec::<PathBuf>::new());
    assert!(!client.list_streams("").await.unwrap().contains(&stream.to_owned()));
    let e = client.describe_stream(stream).await.expect_err("deleted");
    assert_eq!(broker_code(&e), Some(ErrorCode::StreamNotFound), "{e}");
    let e = client.delete_stream(stream).await.expect_err("deleted twice");
    assert_eq!(broker_code(&e), Some(ErrorCode::StreamNotFound), "{e}");
    // The name can be used again, for a new, empty stream (auto-create is on here).
    publish(&client, stream, 1000, 10, 100).await;
    let mut fresh =
        client.subscribe(SubscribeOptions::new(stream).start(StartAt::Earliest)).await.unwrap();
    let mut got: Vec<usize> =
        read(&mut fresh, 10).await.iter().map(|r| value_index(&r.value)).collect();
    got.sort_unstable();
    assert_eq!(got, (1000..1010).collect::<Vec<_>>(), "only the new stream's records");
    // A deletion survives a restart.
    client.delete_stream(stream).await.unwrap();
    client.close();
    broker.stop();
    let broker = TestBroker::start(dir.path(), 2, &[]);
    let client = broker.client().await;
    let e = client.describe_stream(stream).await.expect_err("deleted before the restart");
    assert_eq!(broker_code(&e), Some(ErrorCode::StreamNotFound), "{e}");
    assert_eq!(paths_named(dir.path(), &name), Vec::<PathBuf>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_never_creates_a_stream() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(dir.path(), 1, &["--auto-create", "true"]);
    let client = broker.client().await;
    let Err(e) =
        client.subscribe(SubscribeOptions::new("acme/app/typo").start(StartAt::Earliest)).await
    else {
        panic!("a subscription to a missing stream");
    };
    assert_eq!(broker_code(&e), Some(ErrorCode::StreamNotFound), "{e}");
    assert_eq!(client.list_streams("").await.unwrap(), Vec::<String>::new());
    assert_eq!(paths_named(dir.path(), &storage_name("acme/app/typo")), Vec::<PathBuf>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_altered_retention_deletes_old_segments_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--segment-bytes", SEGMENT_BYTES];
    let mut broker = TestBroker::start(dir.path(), 1, &flags);
    let client = broker.client().await;
    let stream = "acme/app/kept";
    client.create_stream(stream, 1, Retention::default()).await.unwrap();
    // ~16 MiB: four segments of a 4 MiB log.
    publish(&client, stream, 0, 256, 64 << 10).await;
    let changes = StreamChanges { retention_bytes: Some(5 << 20), ..Default::default() };
    let altered = client.alter_stream(stream, changes).await.unwrap();
    assert_eq!(altered.retention.bytes_max, Some(5 << 20));
    assert_eq!(client.describe_stream(stream).await.unwrap().retention.bytes_max, Some(5 << 20));
    // The next retention pass (every 10 s) deletes the oldest segments: a reader from the
    // earliest offset starts past 0 and reads densely to the end.
    let deadline = std::time::Instant::now() + WAIT + Duration::from_secs(10);
    let first = loop {
        let mut sub =
            client.subscribe(SubscribeOptions::new(stream).start(StartAt::Earliest)).await.unwrap();
        let first = read(&mut sub, 1).await[0].offset;
        if first > Offset(0) || std::time::Instant::now() > deadline {
            let rest = read(&mut sub, (255 - first.0) as usize).await;
            for (i, r) in rest.iter().enumerate() {
                assert_eq!(r.offset, Offset(first.0 + 1 + i as u64), "dense after the start");
            }
            break first;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(first > Offset(0), "retention deleted nothing");
    // Changing the replication factor is refused on a single broker; so is a missing stream.
    let e = client
        .alter_stream(stream, StreamChanges { replicas: Some(3), ..Default::default() })
        .await
        .expect_err("no replica moves");
    assert_eq!(broker_code(&e), Some(ErrorCode::InvalidArgument), "{e}");
    let e = client.alter_stream("acme/app/none", changes).await.expect_err("missing");
    assert_eq!(broker_code(&e), Some(ErrorCode::StreamNotFound), "{e}");
    // The retention is kept across a restart; unlimited again with 0.
    client.close();
    broker.stop();
    let broker = TestBroker::start(dir.path(), 1, &flags);
    let client = broker.client().await;
    assert_eq!(client.describe_stream(stream).await.unwrap().retention.bytes_max, Some(5 << 20));
    let unlimited = StreamChanges { retention_bytes: Some(0), ..Default::default() };
    let altered = client.alter_stream(stream, unlimited).await.unwrap();
    assert_eq!(altered.retention, Retention::default());
}

/// A delete a stop interrupted (its definition set aside as `.deleting`, its logs still there)
/// is finished at the next start: the logs go, and a new stream of that name starts empty
/// instead of opening them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_interrupted_by_a_stop_is_finished_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = TestBroker::start(dir.path(), 2, &[]);
    let client = broker.client().await;
    let stream = "acme/app/halfway";
    client.create_stream(stream, 2, Retention::default()).await.unwrap();
    publish(&client, stream, 0, 20, 100).await;
    client.close();
    broker.stop();
    // What a crash between the two steps of a delete leaves.
    let name = storage_name(stream);
    let definition = dir.path().join("streams").join(format!("{name}.meta"));
    assert!(definition.exists(), "{definition:?}");
    let deleting = dir.path().join("streams").join(format!("{name}.meta.deleting"));
    std::fs::rename(&definition, &deleting).unwrap();
    let left = paths_named(dir.path(), &name);
    assert!(left.len() >= 2, "logs are left: {left:?}");
    let broker = TestBroker::start(dir.path(), 2, &[]);
    assert_eq!(paths_named(dir.path(), &name), Vec::<PathBuf>::new(), "the delete was finished");
    let client = broker.client().await;
    publish(&client, stream, 500, 3, 100).await;
    let mut sub =
        client.subscribe(SubscribeOptions::new(stream).start(StartAt::Earliest)).await.unwrap();
    let mut got: Vec<usize> =
        read(&mut sub, 3).await.iter().map(|r| value_index(&r.value)).collect();
    got.sort_unstable();
    assert_eq!(got, vec![500, 501, 502], "only the new stream's records");
}
