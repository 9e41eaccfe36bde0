//! Disk space end to end, real QUIC on loopback with 2 cores: creating streams allocates
//! little; below the free-space floor (`--min-free-bytes`) new streams and appends get
//! StorageFull while reads and commits go on; a full disk (ENOSPC) answers StorageFull on
//! every path without naming the data directory; the per-tenant stream quota; auto-create is
//! off by default when authentication is on.
//!
//! The floor and full-disk tests run the broker on a small file system: ext4 on a loop device
//! (as root, with mkfs.ext4), else a tmpfs; they print SKIPPED when neither can be mounted.

mod e2e_support;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e_support::{TestBroker, WAIT};
use felix_client::{
    AckMode, Client, ClientError, PublishSettings, Publisher, Record, StartAt, SubscribeOptions,
};
use felix_proto::ErrorCode;
use jsonwebtoken::{Algorithm, EncodingKey, Header};

/// The broker's code of a refused request.
fn code(e: &ClientError) -> Option<ErrorCode> {
    match e {
        ClientError::Broker { code, .. } => Some(*code),
        _ => None,
    }
}

/// `e` is StorageFull, and its message names neither `dir` nor an OS error.
fn assert_storage_full(e: &ClientError, dir: &Path, what: &str) {
    assert_eq!(code(e), Some(ErrorCode::StorageFull), "{what}: {e}");
    let text = e.to_string();
    assert!(!text.contains(&dir.display().to_string()), "{what} names the data directory: {text}");
    assert!(!text.contains("os error"), "{what} carries an OS error: {text}");
}

/// Bytes allocated on disk (st_blocks) by every file under `dir`.
fn allocated_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() { allocated_bytes(&entry.path()) } else { meta.blocks() * 512 };
    }
    total
}

async fn durable_publisher(client: &Client, stream: &str) -> Result<Publisher, ClientError> {
    let settings = PublishSettings {
        ack_mode: AckMode::Durable,
        linger_us: 100,
        ..PublishSettings::default()
    };
    client.publisher_with(stream, settings).await
}

/// Publishes one record and waits for its ack.
async fn publish_one(client: &Client, stream: &str, value: Vec<u8>) -> Result<(), ClientError> {
    let p = durable_publisher(client, stream).await?;
    tokio::time::timeout(WAIT, p.publish(Record::unkeyed(value))).await.expect("ack in time")?;
    Ok(())
}

/// A small file system mounted for one test; unmounted (lazily) when dropped.
struct SmallFs {
    mnt: PathBuf,
    _work: tempfile::TempDir,
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

fn sh(cmd: &str, args: &[&str]) -> bool {
    std::process::Command::new(cmd)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// An ext4 of `mib` MiB on a loop device, or else a tmpfs of that size.
fn small_fs(mib: u64) -> Option<SmallFs> {
    let work = tempfile::tempdir().ok()?;
    let mnt = work.path().join("mnt");
    std::fs::create_dir_all(&mnt).ok()?;
    let img = work.path().join("fs.img");
    let (img_s, mnt_s) = (img.to_str()?, mnt.to_str()?);
    if std::fs::File::create(&img).and_then(|f| f.set_len(mib << 20)).is_ok()
        && sh("mkfs.ext4", &["-q", "-F", img_s])
        && sh("mount", &["-o", "loop", img_s, mnt_s])
    {
        println!("small file system: ext4 on a loop device, {mib} MiB");
    } else if sh("mount", &["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs", mnt_s]) {
        println!("small file system: tmpfs, {mib} MiB");
    } else {
        println!(
            "SKIPPED: cannot mount a small file system (needs root, mkfs.ext4 + loop, or tmpfs)"
        );
        return None;
    }
    let fs = SmallFs { mnt: mnt.clone(), _work: work };
    // The broker's data directory, below the mount point (which root owns).
    std::fs::create_dir_all(mnt.join("data")).ok()?;
    Some(fs)
}

/// Writes zeros to `path` until `bytes` are written or the file system is full (ENOSPC);
/// returns the bytes written.
fn ballast(path: &Path, bytes: u64) -> u64 {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    let mut written = 0;
    for chunk in [1 << 20, 4096] {
        let zeros = vec![0u8; chunk];
        while written + chunk as u64 <= bytes {
            if f.write_all(&zeros).is_err() {
                break;
            }
            written += chunk as u64;
        }
    }
    let _ = f.sync_all();
    written
}

/// Retries `attempt` every 20 ms until it returns `Some`, for at most `WAIT`.
async fn eventually<T, F, Fut>(what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(t) = attempt().await {
            return t;
        }
        assert!(Instant::now() < deadline, "{what} did not happen within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_streams_allocates_blocks_not_segments() {
    let dir = tempfile::tempdir().unwrap();
    // The default segment size (256 MiB), which every new log used to reserve on every core.
    let broker = TestBroker::start(dir.path(), 2, &[]);
    let client = broker.client().await;
    let before = allocated_bytes(dir.path());
    for i in 0..20 {
        client.create_stream(&format!("acme/app/s{i}"), 2, Default::default()).await.unwrap();
    }
    let created = allocated_bytes(dir.path()) - before;
    println!("20 streams x 2 cores created: {created} bytes allocated");
    // One header block per log, a definition file per stream, directories: well under 4 MiB
    // (before: 20 x 2 x 256 MiB reserved).
    assert!(created < 4 << 20, "{created} bytes allocated by creating 20 streams");
    // One record in each: the written log reserves a small step past it, not a segment.
    for i in 0..20 {
        publish_one(&client, &format!("acme/app/s{i}"), vec![b'x'; 100]).await.unwrap();
    }
    let used = allocated_bytes(dir.path()) - before;
    println!("after one record per stream: {used} bytes allocated");
    let bound = created + 20 * (4096 + felix_storage::SEGMENT_GROW_MIN_BYTES + (64 << 10));
    assert!(used <= bound, "{used} bytes allocated for 20 records (bound {bound})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_free_space_floor_new_streams_and_appends_are_refused_reads_go_on() {
    let Some(fs) = small_fs(64) else { return };
    let data = fs.mnt.join("data");
    let floor: u64 = 24 << 20;
    let floor_s = floor.to_string();
    let broker = TestBroker::start(&data, 2, &["--min-free-bytes", &floor_s]);
    let client = broker.client().await;
    client.create_stream("acme/app/old", 2, Default::default()).await.unwrap();
    let mut stored = 0;
    for i in 0..20 {
        publish_one(&client, "acme/app/old", format!("old-{i}").into_bytes()).await.unwrap();
        stored += 1;
    }
    // Leave 8 MiB free: below the floor.
    let free = felix_storage::fs_space(&fs.mnt).unwrap().available_bytes;
    assert!(free > floor + (8 << 20), "{free} bytes free on a fresh file system");
    ballast(&fs.mnt.join("ballast"), free - (8 << 20));
    // The cores notice within their check interval; publishes until then are stored.
    let deadline = Instant::now() + WAIT;
    let refused = loop {
        match publish_one(&client, "acme/app/old", format!("old-{stored}").into_bytes()).await {
            Ok(()) => stored += 1,
            Err(e) => break e,
        }
        assert!(Instant::now() < deadline, "no refusal below the floor within {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_storage_full(&refused, &data, "publish below the floor");
    // Both shards, whichever core owns them, refuse appends.
    for i in 0..4 {
        let e = publish_one(&client, "acme/app/old", format!("late-{i}").into_bytes()).await;
        assert_storage_full(&e.unwrap_err(), &data, "publish below the floor");
    }
    let e = client.create_stream("acme/app/new", 2, Default::default()).await.unwrap_err();
    assert_storage_full(&e, &data, "create below the floor");
    let e = publish_one(&client, "acme/app/auto", b"x".to_vec()).await.unwrap_err();
    assert_storage_full(&e, &data, "auto-create below the floor");
    // Reads of what was written, and commits of the group's position, go on.
    let mut sub = client
        .subscribe(SubscribeOptions::new("acme/app/old").start(StartAt::Earliest).group("g"))
        .await
        .unwrap();
    let mut got = Vec::new();
    while got.len() < stored {
        let r = tokio::time::timeout(WAIT, sub.next()).await.unwrap().unwrap().unwrap();
        got.push(String::from_utf8(r.value.to_vec()).unwrap());
    }
    got.sort_by_key(|v| v[4..].parse::<u32>().unwrap());
    assert_eq!(got, (0..stored).map(|i| format!("old-{i}")).collect::<Vec<_>>());
    sub.commit_consumed().await.unwrap();
    // Freeing space lifts the refusal.
    std::fs::remove_file(fs.mnt.join("ballast")).unwrap();
    eventually("appends after space was freed", || async {
        publish_one(&client, "acme/app/old", b"again".to_vec()).await.ok()
    })
    .await;
    client.create_stream("acme/app/new", 2, Default::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_storage_full_on_every_path_without_naming_the_data_directory() {
    let Some(fs) = small_fs(32) else { return };
    let data = fs.mnt.join("data");
    // No floor: the disk really fills up.
    let broker = TestBroker::start(&data, 2, &["--min-free-bytes", "0"]);
    let client = broker.client().await;
    client.create_stream("acme/app/s", 2, Default::default()).await.unwrap();
    for i in 0..6 {
        publish_one(&client, "acme/app/s", format!("r{i}").into_bytes()).await.unwrap();
    }
    let mut sub = client
        .subscribe(SubscribeOptions::new("acme/app/s").start(StartAt::Earliest).group("g"))
        .await
        .unwrap();
    for _ in 0..6 {
        tokio::time::timeout(WAIT, sub.next()).await.unwrap().unwrap().unwrap();
    }
    let filled = ballast(&fs.mnt.join("ballast"), u64::MAX);
    println!("ballast: {filled} bytes until ENOSPC");
    // Appends: the active segments' reserved blocks take a few more, then ENOSPC.
    let publisher = durable_publisher(&client, "acme/app/s").await.unwrap();
    let mut failed = None;
    for _ in 0..1000 {
        match tokio::time::timeout(WAIT, publisher.publish(Record::unkeyed(vec![7u8; 64 << 10])))
            .await
            .unwrap()
        {
            Ok(_) => {}
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    assert_storage_full(&failed.expect("a publish failed"), &data, "publish on a full disk");
    // Creating a stream (its definition and logs), auto-creating one, and committing a
    // consumer position (the offsets log) all hear StorageFull. (A failed write truncates its
    // segment, which frees the blocks reserved past it: top the ballast up each time.)
    ballast(&fs.mnt.join("ballast"), u64::MAX);
    let e = client.create_stream("acme/app/t", 2, Default::default()).await.unwrap_err();
    assert_storage_full(&e, &data, "create on a full disk");
    ballast(&fs.mnt.join("ballast"), u64::MAX);
    let e = publish_one(&client, "acme/app/auto", b"x".to_vec()).await.unwrap_err();
    assert_storage_full(&e, &data, "auto-create on a full disk");
    ballast(&fs.mnt.join("ballast"), u64::MAX);
    let e = sub.commit_consumed().await.unwrap_err();
    assert_storage_full(&e, &data, "commit on a full disk");
    // Reads go on; after space is freed, everything works again.
    let mut again = client
        .subscribe(SubscribeOptions::new("acme/app/s").start(StartAt::Earliest))
        .await
        .unwrap();
    let first = tokio::time::timeout(WAIT, again.next()).await.unwrap().unwrap().unwrap();
    assert!(first.value.starts_with(b"r"));
    std::fs::remove_file(fs.mnt.join("ballast")).unwrap();
    eventually("appends after space was freed", || async {
        publish_one(&client, "acme/app/s", b"again".to_vec()).await.ok()
    })
    .await;
    sub.commit_consumed().await.unwrap();
    client.create_stream("acme/app/t", 2, Default::default()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_tenant_stream_quota_refuses_creates_with_limit_reached() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--max-streams-per-tenant", "3"];
    let mut broker = TestBroker::start(dir.path(), 2, &args);
    let client = broker.client().await;
    for i in 0..3 {
        client.create_stream(&format!("acme/app/s{i}"), 2, Default::default()).await.unwrap();
    }
    let e = client.create_stream("acme/app/s3", 2, Default::default()).await.unwrap_err();
    assert_eq!(code(&e), Some(ErrorCode::LimitReached), "{e}");
    assert!(e.to_string().contains("acme"), "{e}");
    // Auto-create counts against the same quota; a subscribe creates nothing.
    let e = publish_one(&client, "acme/other/auto", b"x".to_vec()).await.unwrap_err();
    assert_eq!(code(&e), Some(ErrorCode::LimitReached), "{e}");
    let e = client.subscribe(SubscribeOptions::new("acme/other/sub")).await.err().unwrap();
    assert_eq!(code(&e), Some(ErrorCode::StreamNotFound), "{e}");
    // A deleted stream gives its slot back.
    client.delete_stream("acme/app/s2").await.unwrap();
    client.create_stream("acme/app/s2", 2, Default::default()).await.unwrap();
    // Existing streams still work and may be created again alike; other tenants have theirs.
    client.create_stream("acme/app/s0", 2, Default::default()).await.unwrap();
    publish_one(&client, "acme/app/s1", b"y".to_vec()).await.unwrap();
    publish_one(&client, "globex/app/auto", b"z".to_vec()).await.unwrap();
    assert!(!client.list_streams("acme/").await.unwrap().contains(&"acme/app/s3".to_owned()));
    // The count survives a restart (it is taken from the stream definitions on disk).
    drop(client);
    broker.stop();
    let broker = TestBroker::start(dir.path(), 2, &args);
    let client = broker.client().await;
    let e = client.create_stream("acme/app/s3", 2, Default::default()).await.unwrap_err();
    assert_eq!(code(&e), Some(ErrorCode::LimitReached), "{e}");
}

fn now_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_authentication_auto_create_is_off_unless_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let keys = tempfile::tempdir().unwrap();
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let public = keys.path().join("ed.pub.pem");
    std::fs::write(&public, kp.public_key_pem()).unwrap();
    let key = EncodingKey::from_ed_pem(kp.serialize_pem().as_bytes()).unwrap();
    let claims = serde_json::json!({
        "tenant": "acme",
        "exp": now_s() + 600,
        "permissions": [{ "actions": ["publish", "subscribe"], "namespace": "app", "stream": "*" }],
    });
    let token = jsonwebtoken::encode(&Header::new(Algorithm::EdDSA), &claims, &key).unwrap();
    let public_s = public.display().to_string();
    let connect = |broker: &TestBroker| {
        let mut c = broker.client_config();
        c.token = Some(token.clone());
        Client::connect(c)
    };

    let mut broker = TestBroker::start(dir.path(), 2, &["--auth-keys", &public_s]);
    let client = connect(&broker).await.unwrap();
    // A token that may publish cannot create streams by naming them...
    let e = publish_one(&client, "acme/app/new", b"x".to_vec()).await.unwrap_err();
    assert_eq!(code(&e), Some(ErrorCode::StreamNotFound), "{e}");
    let e = client.subscribe(SubscribeOptions::new("acme/app/new2")).await.err().unwrap();
    assert_eq!(code(&e), Some(ErrorCode::StreamNotFound), "{e}");
    assert!(client.list_streams("").await.unwrap().is_empty());
    // ...only with CreateStream.
    client.create_stream("acme/app/new", 2, Default::default()).await.unwrap();
    publish_one(&client, "acme/app/new", b"x".to_vec()).await.unwrap();
    drop(client);
    broker.stop();

    // The operator may turn it on explicitly.
    let args = ["--auth-keys", &public_s, "--auto-create", "true"];
    let broker = TestBroker::start(dir.path(), 2, &args);
    let client = connect(&broker).await.unwrap();
    publish_one(&client, "acme/app/auto", b"x".to_vec()).await.unwrap();
}
