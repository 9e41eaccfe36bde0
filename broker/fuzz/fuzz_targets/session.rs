//! Drives the broker's per-stream frame handling (`serve_stream`, `Session::dispatch`) with
//! arbitrary bytes over real QUIC streams, against in-process brokers whose data directories
//! lie on tmpfs (`/dev/shm`) where there is one.
//!
//! Once per process the target starts two 1-core brokers: `open` (no authentication, streams
//! auto-created) and `auth` (tokens required; the target signs one for tenant `a`). Each input
//! is one bidirectional stream:
//!
//! ```text
//! byte 0: mode   bit 0     0: the `open` broker, 1: the `auth` broker
//!                bit 1     0: the rest is written as it is
//!                          1: the rest is a list of frames, see `frames`
//!                bit 2     0: finish the stream after writing, 1: reset it
//!                bits 3-5  0..=5: the broker's shared connection (Hello already done)
//!                          6: a fresh connection, a valid Hello prepended on the stream
//!                          7: a fresh connection, nothing prepended (the input's Hello, if any)
//! bytes 1..: the stream's bytes
//! ```
//!
//! Only two of the eight connection values open a fresh connection: a handshake costs more
//! than a whole input on a shared connection.
//!
//! Every answer must decode as a frame a broker sends, an error must be neither `Internal` nor
//! show the data directory's path, a Hello prepended by the target must be answered by HelloOk first, the
//! broker must finish the stream within `STREAM_WAIT`, and afterwards it must answer a Ping on
//! the shared connection's control stream. Subscription streams the broker opens are read and
//! checked the same way. A connection the broker closes is replaced; a broker that crashes,
//! hangs or sends an undecodable frame fails the run.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use felix_broker::app::Broker;
use felix_broker::config;
use felix_proto::{Capabilities, ErrorCode, Frame, FrameDecoder, Hello, Limits, PROTOCOL_VERSION};
use libfuzzer_sys::fuzz_target;

/// How long the broker may take to finish a stream after the target finished its side.
const STREAM_WAIT: Duration = Duration::from_secs(5);
/// How long a handshake, a stream opening or a Ping round trip may take.
const WAIT: Duration = Duration::from_secs(10);
/// Inputs a shared connection serves before it is replaced (its subscriptions pile up).
const SHARED_CONN_INPUTS_MAX: u32 = 64;
/// Every this many inputs the data directory's size is checked...
const DIR_CHECK_INPUTS: u64 = 256;
/// ...and past this many bytes the broker is restarted on an empty directory.
const DIR_BYTES_MAX: u64 = 256 << 20;
/// Streams a tenant may have (each holds a 4 MiB block on tmpfs).
const STREAMS_PER_TENANT_MAX: &str = "32";
/// The broker's segment size: the smallest that holds a full frame.
const SEGMENT_BYTES: &str = "4198400";
/// Every this many inputs the harness's counts are printed.
const REPORT_INPUTS: u64 = 5_000;
/// Tenant of the `auth` broker's token; the proto vectors use stream `a/b/c`.
const TENANT: &str = "a";

/// Failures seen by background readers (subscription streams), reported by the next input.
static FAILURE: Mutex<Option<String>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    static HARNESS: OnceLock<Mutex<Harness>> = OnceLock::new();
    let harness = HARNESS.get_or_init(|| Mutex::new(Harness::new()));
    let mut h = harness.lock().unwrap_or_else(|p| p.into_inner());
    h.run(data);
});

/// Everything that lives for the whole process.
struct Harness {
    rt: tokio::runtime::Runtime,
    endpoint: quinn::Endpoint,
    targets: [Target; 2],
    inputs: u64,
    counts: Counts,
}

/// What happened, printed now and then.
#[derive(Default, Debug)]
struct Counts {
    fresh_connections: u64,
    closed_by_broker: u64,
    streams_reset_by_broker: u64,
    writes_stopped: u64,
    answers: u64,
    errors: u64,
    restarts: u64,
    /// Time spent in handshakes, on the inputs' streams, and in Ping round trips.
    connect_time: Duration,
    stream_time: Duration,
    ping_time: Duration,
}

/// One broker and the target's shared connection to it.
struct Target {
    name: &'static str,
    extra: Vec<String>,
    token: Option<Bytes>,
    root: PathBuf,
    dir: PathBuf,
    generation: u32,
    broker: Option<Broker>,
    addr: std::net::SocketAddr,
    client: quinn::ClientConfig,
    shared: Option<Shared>,
}

/// A connection that said Hello, with its control stream.
struct Shared {
    conn: quinn::Connection,
    send: quinn::SendStream,
    recv: quinn::RecvStream,
    decoder: FrameDecoder,
    inputs: u32,
    next_ping: u64,
}

impl Harness {
    fn new() -> Harness {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let endpoint = {
            let _guard = rt.enter();
            quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).expect("client endpoint")
        };
        let base = scratch_base();
        remove_stale_dirs(&base);
        let root = base.join(format!("felix-fuzz-session-{}", std::process::id()));
        std::fs::create_dir_all(&root).expect("scratch directory");
        register_cleanup(&root);
        let keys = root.join("keys");
        std::fs::create_dir_all(&keys).expect("keys directory");
        let (token, public) = make_token(&keys);
        let open = Target::new("open", &root, vec![], None);
        let auth = Target::new(
            "auth",
            &root,
            vec!["--auth-keys".into(), public.display().to_string()],
            Some(token),
        );
        eprintln!(
            "session fuzz: brokers on {} (open {}, auth {})",
            root.display(),
            open.addr,
            auth.addr
        );
        Harness { rt, endpoint, targets: [open, auth], inputs: 0, counts: Counts::default() }
    }

    fn run(&mut self, data: &[u8]) {
        let Some((&mode, rest)) = data.split_first() else { return };
        self.inputs += 1;
        let which = usize::from(mode & 1 != 0);
        let payload = if mode & 2 != 0 { frames(rest) } else { Bytes::copy_from_slice(rest) };
        let reset = mode & 4 != 0;
        let conn_mode = (mode >> 3) & 7;
        let endpoint = self.endpoint.clone();
        let counts = &mut self.counts;
        let target = &mut self.targets[which];
        let rt = &self.rt;
        rt.block_on(async {
            target.ensure_shared(&endpoint).await;
            let fresh = conn_mode >= 6;
            let started = std::time::Instant::now();
            let conn = if fresh {
                counts.fresh_connections += 1;
                let conn = target.connect(&endpoint).await;
                counts.connect_time += started.elapsed();
                conn
            } else {
                target.shared.as_ref().expect("shared connection").conn.clone()
            };
            let hello_first = conn_mode == 6;
            let mut bytes = BytesMut::new();
            if hello_first {
                bytes.extend_from_slice(&target.hello().to_bytes());
            }
            bytes.extend_from_slice(&payload);
            let started = std::time::Instant::now();
            exchange(&conn, bytes.freeze(), reset, hello_first, target, counts).await;
            counts.stream_time += started.elapsed();
            if fresh {
                conn.close(0u32.into(), b"done");
            }
            let started = std::time::Instant::now();
            target.check_alive(&endpoint, counts).await;
            counts.ping_time += started.elapsed();
        });
        if let Some(failure) = FAILURE.lock().unwrap_or_else(|p| p.into_inner()).take() {
            panic!("{failure}");
        }
        let target = &mut self.targets[which];
        if let Some(s) = &mut target.shared {
            s.inputs += 1;
            if s.inputs >= SHARED_CONN_INPUTS_MAX {
                s.conn.close(0u32.into(), b"recycled");
                target.shared = None;
            }
        }
        if self.inputs % DIR_CHECK_INPUTS == 0 {
            for t in &mut self.targets {
                if dir_bytes(&t.dir) > DIR_BYTES_MAX {
                    self.counts.restarts += 1;
                    t.restart();
                }
            }
        }
        if self.inputs % REPORT_INPUTS == 0 {
            eprintln!("session fuzz: {} inputs: {:?}", self.inputs, self.counts);
        }
    }
}

/// Writes `payload` on a new stream of `conn`, reads and checks every answer.
async fn exchange(
    conn: &quinn::Connection,
    payload: Bytes,
    reset: bool,
    hello_first: bool,
    target: &Target,
    counts: &mut Counts,
) {
    let (mut send, mut recv) = match tokio::time::timeout(WAIT, conn.open_bi()).await {
        Ok(Ok(s)) => s,
        Ok(Err(_)) => {
            counts.closed_by_broker += 1;
            return;
        }
        Err(_) => panic!("{}: no stream could be opened within {WAIT:?}", target.name),
    };
    match send.write_all(&payload).await {
        Ok(()) => {}
        Err(quinn::WriteError::Stopped(_)) => counts.writes_stopped += 1,
        Err(quinn::WriteError::ConnectionLost(_)) => {
            counts.closed_by_broker += 1;
            return;
        }
        Err(e) => panic!("{}: write failed: {e}", target.name),
    }
    if reset {
        let _ = send.reset(0u32.into());
    } else {
        let _ = send.finish();
    }
    let mut decoder = answer_decoder();
    let mut answers = 0usize;
    let deadline = tokio::time::Instant::now() + STREAM_WAIT;
    loop {
        let chunk = match tokio::time::timeout_at(deadline, recv.read_chunk(64 << 10, true)).await {
            Ok(Ok(Some(chunk))) => chunk,
            Ok(Ok(None)) => {
                if let Some(e) = decoder.handle_end() {
                    panic!("{}: the broker finished a stream inside a frame: {e}", target.name);
                }
                break;
            }
            Ok(Err(quinn::ReadError::Reset(_))) => {
                counts.streams_reset_by_broker += 1;
                break;
            }
            Ok(Err(_)) => {
                counts.closed_by_broker += 1;
                break;
            }
            Err(_) => panic!(
                "{}: the broker did not finish the stream within {STREAM_WAIT:?} ({answers} answers)",
                target.name
            ),
        };
        decoder.handle_chunk(chunk.bytes);
        while let Some(result) = decoder.poll_frame() {
            let frame = result.unwrap_or_else(|e| {
                panic!("{}: the broker sent an undecodable frame: {e}", target.name)
            });
            if hello_first && answers == 0 && !matches!(frame, Frame::HelloOk(_)) {
                panic!("{}: a valid Hello was answered with {frame:?}", target.name);
            }
            check_answer(&frame, target);
            answers += 1;
            counts.answers += 1;
            if matches!(frame, Frame::Error(_) | Frame::PublishError(_)) {
                counts.errors += 1;
            }
        }
    }
}

/// Panics unless `frame` is one the broker may send on a request stream.
fn check_answer(frame: &Frame, target: &Target) {
    match frame {
        Frame::HelloOk(_)
        | Frame::StreamInfo(_)
        | Frame::StreamList(_)
        | Frame::PublishAck(_)
        | Frame::SubscribeOk(_)
        | Frame::CommitOk(_)
        | Frame::Pong(_) => {}
        Frame::Error(e) | Frame::PublishError(e) => check_error(e, &target.root, target.name),
        other => panic!("{}: the broker answered a request with {other:?}", target.name),
    }
}

fn check_error(e: &felix_proto::ErrorBody, root: &Path, name: &str) {
    let root = root.display().to_string();
    assert!(!e.message.contains(&root), "{name}: an error shows the data directory: {e:?}");
    assert!(e.code != ErrorCode::Internal, "{name}: the broker answered Internal: {e:?}");
}

/// A decoder for what the broker sends.
fn answer_decoder() -> FrameDecoder {
    FrameDecoder::new(Limits::default(), Capabilities::ALL)
}

/// Turns `input` into frames with a valid header: each is `type u8, flags u8, length u8`
/// (255: a u16 length follows), then that many body bytes (fewer at the end of the input).
fn frames(mut input: &[u8]) -> Bytes {
    let mut out = BytesMut::new();
    while let [ty, flags, len, rest @ ..] = input {
        let (len, rest) = match (*len, rest) {
            (255, [hi, lo, rest @ ..]) => (usize::from(u16::from_be_bytes([*hi, *lo])), rest),
            (255, rest) => (rest.len(), &[][..]),
            (n, rest) => (usize::from(n), rest),
        };
        let (body, rest) = rest.split_at(len.min(rest.len()));
        out.extend_from_slice(b"FX\x01");
        out.extend_from_slice(&[*ty, 0, *flags]);
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(body);
        input = rest;
    }
    out.freeze()
}

impl Target {
    fn new(name: &'static str, root: &Path, extra: Vec<String>, token: Option<Bytes>) -> Target {
        let mut t = Target {
            name,
            extra,
            token,
            root: root.to_owned(),
            dir: PathBuf::new(),
            generation: 0,
            broker: None,
            addr: "127.0.0.1:0".parse().unwrap(),
            client: quinn::ClientConfig::new(Arc::new(
                quinn::crypto::rustls::QuicClientConfig::try_from(tls_config(None))
                    .expect("quic tls"),
            )),
            shared: None,
        };
        t.start();
        t
    }

    fn start(&mut self) {
        self.generation += 1;
        self.dir = self.root.join(format!("{}-{}", self.name, self.generation));
        let dir = self.dir.display().to_string();
        let mut args: Vec<&str> = vec![
            "felix",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &dir,
            "--cores",
            "1",
            "--metrics",
            "off",
            "--no-pin",
            "--segment-bytes",
            SEGMENT_BYTES,
            "--min-free-bytes",
            "0",
            "--max-streams-per-tenant",
            STREAMS_PER_TENANT_MAX,
        ];
        args.extend(self.extra.iter().map(String::as_str));
        let serve = config::parse_serve(&args).expect("broker flags");
        let broker = Broker::start(&serve).expect("broker start");
        self.addr = broker.local_addr();
        self.broker = Some(broker);
        let tls = tls_config(Some(&self.dir.join("dev-cert.pem")));
        let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).expect("quic tls");
        self.client = quinn::ClientConfig::new(Arc::new(quic));
    }

    fn restart(&mut self) {
        if let Some(s) = self.shared.take() {
            s.conn.close(0u32.into(), b"restart");
        }
        if let Some(b) = self.broker.take() {
            b.shutdown();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        self.start();
    }

    fn hello(&self) -> Frame {
        Frame::Hello(Hello {
            version: PROTOCOL_VERSION,
            capabilities: Capabilities::ALL,
            token: self.token.clone(),
        })
    }

    /// A new connection; its subscription streams are read and checked in the background.
    async fn connect(&self, endpoint: &quinn::Endpoint) -> quinn::Connection {
        let connecting =
            endpoint.connect_with(self.client.clone(), self.addr, "localhost").expect("connect");
        let conn = match tokio::time::timeout(WAIT, connecting).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => panic!("{}: handshake failed: {e}", self.name),
            Err(_) => panic!("{}: no handshake within {WAIT:?}", self.name),
        };
        tokio::spawn(read_subscriptions(conn.clone(), self.name, self.root.clone()));
        conn
    }

    /// Connects and says Hello unless the shared connection is still open.
    async fn ensure_shared(&mut self, endpoint: &quinn::Endpoint) {
        if self.shared.as_ref().is_some_and(|s| s.conn.close_reason().is_none()) {
            return;
        }
        let conn = self.connect(endpoint).await;
        let (mut send, recv) = tokio::time::timeout(WAIT, conn.open_bi())
            .await
            .expect("control stream in time")
            .expect("control stream");
        send.write_all(&self.hello().to_bytes()).await.expect("Hello written");
        let mut shared =
            Shared { conn, send, recv, decoder: answer_decoder(), inputs: 0, next_ping: 1 };
        match shared.next_frame(self.name).await {
            Frame::HelloOk(_) => {}
            other => panic!("{}: Hello answered with {other:?}", self.name),
        }
        self.shared = Some(shared);
    }

    /// Panics unless the broker answers a Ping (on a new connection if it closed the old one).
    async fn check_alive(&mut self, endpoint: &quinn::Endpoint, counts: &mut Counts) {
        if self.shared.as_ref().is_some_and(|s| s.conn.close_reason().is_some()) {
            counts.closed_by_broker += 1;
        }
        self.ensure_shared(endpoint).await;
        let name = self.name;
        let shared = self.shared.as_mut().expect("shared connection");
        let n = shared.next_ping;
        shared.next_ping += 1;
        shared.send.write_all(&Frame::Ping(n).to_bytes()).await.expect("Ping written");
        match shared.next_frame(name).await {
            Frame::Pong(m) if m == n => {}
            other => panic!("{name}: Ping({n}) answered with {other:?}"),
        }
    }
}

impl Shared {
    /// The next frame on the control stream.
    async fn next_frame(&mut self, name: &str) -> Frame {
        loop {
            if let Some(result) = self.decoder.poll_frame() {
                return result.unwrap_or_else(|e| panic!("{name}: undecodable control frame: {e}"));
            }
            match tokio::time::timeout(WAIT, self.recv.read_chunk(64 << 10, true)).await {
                Ok(Ok(Some(chunk))) => self.decoder.handle_chunk(chunk.bytes),
                Ok(other) => panic!("{name}: the control stream ended: {other:?}"),
                Err(_) => panic!("{name}: no answer on the control stream within {WAIT:?}"),
            }
        }
    }
}

/// Reads every unidirectional stream the broker opens on `conn` and checks its frames.
async fn read_subscriptions(conn: quinn::Connection, name: &'static str, root: PathBuf) {
    while let Ok(mut recv) = conn.accept_uni().await {
        let root = root.clone();
        tokio::spawn(async move {
            let mut decoder = answer_decoder();
            let mut first = true;
            while let Ok(Some(chunk)) = recv.read_chunk(64 << 10, true).await {
                decoder.handle_chunk(chunk.bytes);
                while let Some(result) = decoder.poll_frame() {
                    let problem = match result {
                        Err(e) => Some(format!("undecodable subscription frame: {e}")),
                        Ok(Frame::SubscriptionStart(_)) if first => None,
                        Ok(Frame::EventBatch(_)) if !first => None,
                        Ok(Frame::Error(e)) if !first => {
                            let r = root.display().to_string();
                            (e.message.contains(&r) || e.code == ErrorCode::Internal)
                                .then(|| format!("subscription error: {e:?}"))
                        }
                        Ok(other) => Some(format!("unexpected subscription frame {other:?}")),
                    };
                    first = false;
                    if let Some(p) = problem {
                        let mut f = FAILURE.lock().unwrap_or_else(|p| p.into_inner());
                        f.get_or_insert(format!("{name}: {p}"));
                        return;
                    }
                }
            }
        });
    }
}

/// TLS for the broker's development certificate (`None`: a placeholder never used).
fn tls_config(ca: Option<&Path>) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = ca {
        for c in felix_client::tls::read_ca_file(ca).expect("dev cert") {
            roots.add(c).expect("root");
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("tls13")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![felix_proto::ALPN.to_vec()];
    tls
}

/// An Ed25519 key pair (public key written to `dir`) and a token for tenant `a`: publish and
/// subscribe on namespaces `b*`, any stream, valid for a day.
fn make_token(dir: &Path) -> (Bytes, PathBuf) {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("key pair");
    let public = dir.join("fuzz.pub.pem");
    std::fs::write(&public, kp.public_key_pem()).expect("public key");
    let key = jsonwebtoken::EncodingKey::from_ed_pem(kp.serialize_pem().as_bytes()).expect("key");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    let claims = serde_json::json!({
        "tenant": TENANT,
        "exp": now + 86_400,
        "iat": now,
        "permissions": [{ "actions": ["publish", "subscribe"], "namespace": "b*", "stream": "*" }],
    });
    let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
    let token = jsonwebtoken::encode(&header, &claims, &key).expect("token");
    (Bytes::from(token), public)
}

/// Where the brokers' data goes: tmpfs when there is one, so no disk is written.
fn scratch_base() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() && tempfile::tempdir_in(shm).is_ok() {
        shm.to_owned()
    } else {
        std::env::temp_dir()
    }
}

/// Removes the directories of earlier runs whose process is gone (a crash leaves them).
fn remove_stale_dirs(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix("felix-fuzz-session-") {
            if !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// Bytes held by the files under `dir` (allocated blocks, preallocation included).
fn dir_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

static CLEANUP: OnceLock<PathBuf> = OnceLock::new();

/// Removes the scratch directory when libFuzzer exits (it calls `exit`, so nothing is dropped).
fn register_cleanup(root: &Path) {
    extern "C" fn remove_root() {
        if let Some(root) = CLEANUP.get() {
            let _ = std::fs::remove_dir_all(root);
        }
    }
    let _ = CLEANUP.set(root.to_owned());
    // SAFETY: `remove_root` is an `extern "C" fn()` that never unwinds (it ignores every
    // error), as atexit requires; registering it has no other precondition.
    unsafe {
        libc::atexit(remove_root);
    }
}
