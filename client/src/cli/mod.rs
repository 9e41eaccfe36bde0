//! The `felix publish|subscribe|streams` commands: clap arguments and their implementation.
//!
//! Line-oriented like kcat and `nats pub/sub`: `publish` sends each stdin line as a record,
//! `subscribe` prints each record as a line. `--json` switches both to one JSON object per line
//! (see `docs/client.md` for the fields). The `felix` binary wires [`ClientCommand`] into its
//! own clap parser and calls [`run`] with [`ClientConfig::from_env`]; tests call [`run_with_io`]
//! with in-memory input and output.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use base64::Engine as _;
use bytes::Bytes;
use felix_proto::{AckMode, Offset, Retention, ShardId, StartAt};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use crate::config::{parse_ack_mode, ClientConfig, Trust};
use crate::{Client, PublishTicket, ReceivedRecord, Record, SubscribeOptions, SubscriptionState};

/// Tickets awaited by the output task before `publish` stops reading input.
const PUBLISH_PENDING_MAX: usize = 65_536;

/// The client commands of the `felix` binary.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ClientCommand {
    /// Publish stdin, one record per line.
    Publish(PublishArgs),
    /// Print a stream's records, one per line.
    Subscribe(SubscribeArgs),
    /// Create, list and describe streams.
    Streams(StreamsArgs),
}

/// Connection settings that override the `FELIX_*` environment. Global: they may follow a
/// subcommand (`felix streams list --addr …`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConnectArgs {
    /// Broker address host:port, or seed brokers of a cluster, comma-separated: the first one
    /// that answers is used and the others are learned from it (FELIX_ADDR).
    #[arg(long, global = true)]
    pub addr: Option<String>,
    /// Trust the CA or certificate in this PEM/DER file (FELIX_CA_FILE).
    #[arg(long, global = true, conflicts_with_all = ["fingerprint", "danger_accept_any_cert"])]
    pub ca_file: Option<PathBuf>,
    /// Trust exactly the certificate with this SHA-256 fingerprint, hex with or without colons
    /// (FELIX_CERT_FINGERPRINT).
    #[arg(long, global = true, conflicts_with = "danger_accept_any_cert")]
    pub fingerprint: Option<String>,
    /// Accept any certificate: anyone on the path can impersonate the broker
    /// (FELIX_DANGER_ACCEPT_ANY_CERT).
    #[arg(long, global = true)]
    pub danger_accept_any_cert: bool,
    /// The name the certificate must carry (FELIX_SERVER_NAME).
    #[arg(long, global = true)]
    pub server_name: Option<String>,
    /// Print the effective client configuration to stderr before running (the token hidden).
    #[arg(long, global = true)]
    pub show_config: bool,
}

/// `felix publish`.
#[derive(Debug, Clone, clap::Args)]
pub struct PublishArgs {
    /// Stream, tenant/namespace/stream.
    #[arg(long, short = 's')]
    pub stream: String,
    /// Key for every record (all go to the key's shard, in order).
    #[arg(long, short = 'k', conflicts_with = "key_separator")]
    pub key: Option<String>,
    /// Split each line at the first SEP into key and value (kcat's -K); lines without SEP are
    /// unkeyed.
    #[arg(long, short = 'K')]
    pub key_separator: Option<String>,
    /// Ack mode: none, written or durable (default: FELIX_ACK_MODE, else durable).
    #[arg(long, value_parser = parse_ack_mode)]
    pub ack: Option<AckMode>,
    /// Linger time in microseconds (default: FELIX_LINGER_US).
    #[arg(long)]
    pub linger_us: Option<u64>,
    /// Print one JSON object per published record (stream, shard, offset, key).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// `felix subscribe`.
#[derive(Debug, Clone, clap::Args)]
pub struct SubscribeArgs {
    /// Stream, tenant/namespace/stream.
    #[arg(long, short = 's')]
    pub stream: String,
    /// Where to start: earliest, latest, an offset, or @UNIX_MS for a time.
    #[arg(long, short = 'o', default_value = "latest", value_parser = parse_start)]
    pub from: StartAt,
    /// Consumer group: resume from its commits and commit what was printed.
    #[arg(long, short = 'g')]
    pub group: Option<String>,
    /// Read only this shard (repeatable).
    #[arg(long = "shard")]
    pub shards: Vec<u32>,
    /// Exit after this many records.
    #[arg(long, short = 'c')]
    pub count: Option<u64>,
    /// With a group: commit the printed positions at least this often, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub commit_interval_ms: u64,
    /// Print `key SEP value` instead of the value alone.
    #[arg(long, short = 'K')]
    pub key_separator: Option<String>,
    /// Print one JSON object per record (stream, shard, offset, timestamp_ms, key, value).
    #[arg(long)]
    pub json: bool,
    /// Exit with an error when the broker stays unreachable this long, in milliseconds
    /// (default: keep following, resuming once it is back).
    #[arg(long)]
    pub resume_timeout_ms: Option<u64>,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// `felix streams`.
#[derive(Debug, Clone, clap::Args)]
pub struct StreamsArgs {
    #[command(subcommand)]
    pub command: StreamsCommand,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// `felix streams create|list|describe`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum StreamsCommand {
    /// Create a stream.
    Create {
        /// Stream, tenant/namespace/stream.
        #[arg(long, short = 's')]
        stream: String,
        /// Shard count.
        #[arg(long, default_value_t = 1)]
        shards: u32,
        /// Retention in bytes per shard (0: unlimited).
        #[arg(long, default_value_t = 0)]
        retention_bytes: u64,
        /// Retention in milliseconds (0: unlimited).
        #[arg(long, default_value_t = 0)]
        retention_ms: u64,
        /// Replication factor, 1..=5 (a cluster only; default: the broker's
        /// `--default-replicas`): each shard kept on this many brokers.
        #[arg(long)]
        replicas: Option<u8>,
    },
    /// List streams.
    List {
        /// Only names starting with this prefix.
        #[arg(long, default_value = "")]
        prefix: String,
    },
    /// Describe a stream.
    Describe {
        /// Stream, tenant/namespace/stream.
        #[arg(long, short = 's')]
        stream: String,
    },
}

/// Parses `earliest`, `latest`, an offset, or `@UNIX_MS`.
pub fn parse_start(s: &str) -> Result<StartAt, String> {
    match s {
        "earliest" | "beginning" => Ok(StartAt::Earliest),
        "latest" | "end" => Ok(StartAt::Latest),
        _ => match s.strip_prefix('@') {
            Some(ms) => ms.parse().map(StartAt::Timestamp).map_err(|e| format!("{s}: {e}")),
            None => s
                .parse()
                .map(|o| StartAt::Offset(Offset(o)))
                .map_err(|_| format!("{s}: expected earliest, latest, an offset or @UNIX_MS")),
        },
    }
}

/// The whole client side of the `felix` binary: reads the `FELIX_*` environment, trusts the
/// development certificate of a local broker when nothing else supplies trust (see
/// [`dev_cert_default`]), runs `cmd` on a tokio runtime, prints an error to stderr. Exit status
/// 0 on success, 1 on failure, 2 on a configuration error. The flags are applied, and the
/// result validated, in [`run`]: trust may come from a flag alone.
pub fn main(cmd: ClientCommand) -> std::process::ExitCode {
    let config = match ClientConfig::parse_env() {
        Ok(c) => dev_cert_default(c, std::env::var_os("FELIX_DATA_DIR").map(PathBuf::from)),
        Err(e) => {
            eprintln!("felix: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("felix: cannot start the tokio runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cmd, config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("felix: {e:#}");
            let config_error = e.downcast_ref::<crate::ConfigError>().is_some();
            std::process::ExitCode::from(if config_error { 2 } else { 1 })
        }
    }
}

/// `config`, trusting `<data_dir>/dev-cert.pem` (default `./felix-data`, the broker's default
/// data directory) when the environment configured no trust and that file exists: a broker
/// started with the defaults on this host is reached with no setting at all. A trust flag
/// still overrides it.
pub fn dev_cert_default(mut config: ClientConfig, data_dir: Option<PathBuf>) -> ClientConfig {
    if config.trust.is_none() {
        let dev = data_dir.unwrap_or_else(|| PathBuf::from("felix-data")).join("dev-cert.pem");
        if dev.exists() {
            config.trust = Some(Trust::CaFile(dev));
        }
    }
    config
}

/// Runs `cmd` on stdin and stdout. `config` need not be valid yet (trust may come from the
/// command's flags): it is validated after the flags are applied.
pub async fn run(cmd: ClientCommand, config: ClientConfig) -> anyhow::Result<()> {
    let stdin = tokio::io::BufReader::new(tokio::io::stdin());
    run_with_io(cmd, config, stdin, tokio::io::stdout()).await
}

/// Runs `cmd` reading `input` (publish) and writing `output`.
pub async fn run_with_io<R, W>(
    cmd: ClientCommand,
    config: ClientConfig,
    input: R,
    mut output: W,
) -> anyhow::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    match cmd {
        ClientCommand::Publish(args) => {
            let mut config = config;
            if let Some(a) = args.ack {
                config.publish.ack_mode = a;
            }
            if let Some(l) = args.linger_us {
                config.publish.linger_us = l;
            }
            let config = args.connect.apply(config)?;
            publish(args, config, input, output).await
        }
        ClientCommand::Subscribe(args) => {
            let config = args.connect.apply(config)?;
            subscribe(args, config, &mut output).await
        }
        ClientCommand::Streams(args) => {
            let config = args.connect.apply(config)?;
            streams(args, config, &mut output).await
        }
    }
}

impl ConnectArgs {
    /// `config` with these overrides, validated. `--show-config` prints the result first (even
    /// when it does not validate); `FELIX_LOG=info` logs it.
    pub fn apply(&self, mut config: ClientConfig) -> anyhow::Result<ClientConfig> {
        if let Some(a) = &self.addr {
            config.addr = a.clone();
        }
        if let Some(n) = &self.server_name {
            config.server_name = n.clone();
        }
        if let Some(p) = &self.ca_file {
            config.trust = Some(Trust::CaFile(p.clone()));
        }
        if let Some(f) = &self.fingerprint {
            config.trust = Some(Trust::Fingerprint(f.parse()?));
        }
        if self.danger_accept_any_cert {
            config.trust = Some(Trust::DangerAcceptAnyCertificate);
        }
        if self.show_config {
            eprintln!("felix client configuration:\n{config}");
        }
        config.validate()?;
        tracing::info!(config = %config, "client configuration");
        Ok(config)
    }
}

async fn publish<R, W>(
    args: PublishArgs,
    config: ClientConfig,
    mut input: R,
    output: W,
) -> anyhow::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let settings = config.publish.clone();
    let client = Client::connect(config).await.context("connecting")?;
    let publisher = client.publisher_with(&args.stream, settings).await?;
    let (tx, rx) = tokio::sync::mpsc::channel(PUBLISH_PENDING_MAX);
    let printer = tokio::spawn(print_receipts(rx, args.stream.clone(), args.json, output));
    let mut line = Vec::new();
    let mut sent = 0u64;
    loop {
        line.clear();
        if input.read_until(b'\n', &mut line).await? == 0 {
            break;
        }
        let text = trim_newline(&line);
        if text.is_empty() {
            continue;
        }
        let record = match (&args.key, &args.key_separator) {
            (Some(k), _) => Record::keyed(k.clone().into_bytes(), text.to_vec()),
            (None, Some(sep)) => split_key(text, sep.as_bytes()),
            (None, None) => Record::unkeyed(text.to_vec()),
        };
        let key = record.key.clone();
        let ticket = publisher.send(record).await?;
        sent += 1;
        if tx.send((key, ticket)).await.is_err() {
            break;
        }
    }
    drop(tx);
    publisher.flush().await?;
    let (acked, failed) = printer.await??;
    tracing::info!(sent, acked, failed, stream = %args.stream, "published");
    client.close();
    anyhow::ensure!(failed == 0, "{failed} of {sent} records failed");
    Ok(())
}

async fn print_receipts<W: AsyncWrite + Unpin>(
    mut rx: tokio::sync::mpsc::Receiver<(Option<Bytes>, PublishTicket)>,
    stream: String,
    json: bool,
    mut output: W,
) -> anyhow::Result<(u64, u64)> {
    let (mut acked, mut failed) = (0u64, 0u64);
    while let Some((key, ticket)) = rx.recv().await {
        match ticket.await {
            Ok(receipt) => {
                acked += u64::from(receipt.is_some());
                if json {
                    let mut obj = serde_json::Map::new();
                    obj.insert("stream".into(), stream.clone().into());
                    if let Some(r) = receipt {
                        obj.insert("shard".into(), r.shard.0.into());
                        obj.insert("offset".into(), r.offset.0.into());
                    }
                    put_bytes(&mut obj, "key", key.as_deref());
                    output
                        .write_all(format!("{}\n", serde_json::Value::Object(obj)).as_bytes())
                        .await?;
                }
            }
            Err(e) => {
                failed += 1;
                eprintln!("publish failed: {e}");
            }
        }
    }
    output.flush().await?;
    Ok((acked, failed))
}

async fn subscribe<W: AsyncWrite + Unpin>(
    args: SubscribeArgs,
    config: ClientConfig,
    output: &mut W,
) -> anyhow::Result<()> {
    let client = Client::connect(config).await.context("connecting")?;
    let mut options = SubscribeOptions::new(&args.stream)
        .start(args.from)
        .resume_timeout_ms(args.resume_timeout_ms);
    if let Some(g) = &args.group {
        options = options.group(g.clone());
    }
    if !args.shards.is_empty() {
        options = options.shards(args.shards.iter().map(|s| ShardId(*s)).collect());
    }
    let mut sub = client.subscribe(options).await?;
    let reporter = tokio::spawn(report_resumes(sub.state()));
    let interval = Duration::from_millis(args.commit_interval_ms);
    let mut last_commit = Instant::now();
    let mut printed = 0u64;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    while args.count.is_none_or(|c| printed < c) {
        let record = tokio::select! {
            r = sub.next() => r?,
            _ = &mut ctrl_c => break,
        };
        let Some(record) = record else { break };
        output.write_all(&format_record(&args, &record)).await?;
        printed += 1;
        if args.group.is_some() && last_commit.elapsed() >= interval {
            output.flush().await?;
            sub.commit_consumed().await?;
            last_commit = Instant::now();
        }
    }
    output.flush().await?;
    if args.group.is_some() {
        sub.commit_consumed().await?;
    }
    reporter.abort();
    client.close();
    Ok(())
}

/// Tells stderr, once each, when the subscription lost its broker and when it is back, as
/// `nats sub` does: `felix: connection lost: timed out; resuming the subscription`, then
/// `felix: subscription resumed after 2.4 s`. Each failed attempt in between is logged at
/// `FELIX_LOG=warn`; a resume that gives up is the command's error.
async fn report_resumes(mut state: tokio::sync::watch::Receiver<SubscriptionState>) {
    // Since when the broker is away, and the resumes before.
    let mut away: Option<(Instant, u64)> = None;
    let mut resumes = 0;
    while state.changed().await.is_ok() {
        let now = state.borrow_and_update().clone();
        match (now, away) {
            (SubscriptionState::Resuming { since, error, .. }, None) => {
                eprintln!("felix: {error}; resuming the subscription");
                away = Some((since, resumes));
            }
            (SubscriptionState::Reading { resumes: after }, Some((since, before))) => {
                if after > before {
                    let secs = since.elapsed().as_secs_f64();
                    eprintln!("felix: subscription resumed after {secs:.1} s");
                }
                (away, resumes) = (None, after);
            }
            (SubscriptionState::Reading { resumes: after }, None) => resumes = after,
            (SubscriptionState::Resuming { .. }, Some(_)) => {}
        }
    }
}

fn format_record(args: &SubscribeArgs, r: &ReceivedRecord) -> Vec<u8> {
    if args.json {
        let mut obj = serde_json::Map::new();
        obj.insert("stream".into(), args.stream.clone().into());
        obj.insert("shard".into(), r.shard.0.into());
        obj.insert("offset".into(), r.offset.0.into());
        obj.insert("timestamp_ms".into(), r.timestamp_ms.into());
        put_bytes(&mut obj, "key", r.key.as_deref());
        put_bytes(&mut obj, "value", Some(&r.value));
        return format!("{}\n", serde_json::Value::Object(obj)).into_bytes();
    }
    let mut line = Vec::with_capacity(r.value.len() + 1);
    if let Some(sep) = &args.key_separator {
        line.extend_from_slice(String::from_utf8_lossy(r.key.as_deref().unwrap_or(b"")).as_bytes());
        line.extend_from_slice(sep.as_bytes());
    }
    line.extend_from_slice(String::from_utf8_lossy(&r.value).as_bytes());
    line.push(b'\n');
    line
}

async fn streams<W: AsyncWrite + Unpin>(
    args: StreamsArgs,
    config: ClientConfig,
    output: &mut W,
) -> anyhow::Result<()> {
    let client = Client::connect(config).await.context("connecting")?;
    let text = match args.command {
        StreamsCommand::Create { stream, shards, retention_bytes, retention_ms, replicas } => {
            let retention = Retention {
                bytes_max: (retention_bytes != 0).then_some(retention_bytes),
                age_max_ms: (retention_ms != 0).then_some(retention_ms),
            };
            let created = client.create_stream_with(&stream, shards, retention, replicas).await?;
            describe_text(&created, args.json)
        }
        StreamsCommand::Describe { stream } => {
            describe_text(&client.describe_stream(&stream).await?, args.json)
        }
        StreamsCommand::List { prefix } => {
            let names = client.list_streams(&prefix).await?;
            if args.json {
                names.iter().map(|n| format!("{}\n", serde_json::json!({ "stream": n }))).collect()
            } else {
                names.iter().map(|n| format!("{n}\n")).collect()
            }
        }
    };
    output.write_all(text.as_bytes()).await?;
    output.flush().await?;
    client.close();
    Ok(())
}

fn describe_text(d: &crate::StreamDescription, json: bool) -> String {
    let bytes = d.retention.bytes_max.unwrap_or(0);
    let ms = d.retention.age_max_ms.unwrap_or(0);
    if json {
        let v = serde_json::json!({
            "stream": d.name, "shards": d.shards, "retention_bytes": bytes, "retention_ms": ms,
        });
        format!("{v}\n")
    } else {
        format!("{} shards={} retention_bytes={bytes} retention_ms={ms}\n", d.name, d.shards)
    }
}

/// Inserts `name` as a UTF-8 string, or `name_b64` as base64 when the bytes are not UTF-8;
/// `null` when absent.
fn put_bytes(obj: &mut serde_json::Map<String, serde_json::Value>, name: &str, v: Option<&[u8]>) {
    match v {
        None => {
            obj.insert(name.into(), serde_json::Value::Null);
        }
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => {
                obj.insert(name.into(), s.into());
            }
            Err(_) => {
                let b64 = base64::engine::general_purpose::STANDARD.encode(b);
                obj.insert(format!("{name}_b64"), b64.into());
            }
        },
    }
}

fn trim_newline(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn split_key(line: &[u8], sep: &[u8]) -> Record {
    if !sep.is_empty() {
        if let Some(at) = line.windows(sep.len()).position(|w| w == sep) {
            return Record::keyed(line[..at].to_vec(), line[at + sep.len()..].to_vec());
        }
    }
    Record::unkeyed(line.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct Felix {
        #[command(subcommand)]
        cmd: ClientCommand,
    }

    /// How the `felix` binary embeds the commands next to its own.
    #[derive(Debug, clap::Parser)]
    struct FelixWithServe {
        #[command(subcommand)]
        cmd: Embedded,
    }

    #[derive(Debug, clap::Subcommand)]
    #[allow(clippy::large_enum_variant)] // a test parser; the binary's Serve variant is large too
    enum Embedded {
        Serve,
        #[command(flatten)]
        Client(ClientCommand),
    }

    #[test]
    fn the_commands_flatten_into_the_binarys_parser() {
        let p = FelixWithServe::parse_from(["felix", "subscribe", "-s", "a/b/c", "-o", "earliest"]);
        assert!(matches!(p.cmd, Embedded::Client(ClientCommand::Subscribe(_))));
        assert!(matches!(FelixWithServe::parse_from(["felix", "serve"]).cmd, Embedded::Serve));
    }

    #[test]
    fn flags_supply_the_trust_the_environment_lacks() {
        let env = ClientConfig::parse_env_map([("FELIX_ADDR", "127.0.0.1:1")]).unwrap();
        assert_eq!(env.validate(), Err(crate::ConfigError::NoTrust));
        let pin = "ab".repeat(32);
        let args = ConnectArgs { fingerprint: Some(pin.clone()), ..Default::default() };
        let c = args.apply(env).unwrap();
        assert_eq!(c.trust, Some(Trust::Fingerprint(pin.parse().unwrap())));
        assert_eq!(c.addr, "127.0.0.1:1");
    }

    #[test]
    fn connection_flags_may_follow_a_subcommand() {
        let p = Felix::parse_from([
            "felix",
            "streams",
            "list",
            "--addr",
            "10.0.0.1:7400",
            "--ca-file",
            "/ca.pem",
            "--show-config",
        ]);
        let ClientCommand::Streams(a) = p.cmd else { panic!("not streams") };
        assert_eq!(a.connect.addr.as_deref(), Some("10.0.0.1:7400"));
        let seeds = ["felix", "publish", "-s", "a/b/c", "--addr", "10.0.0.1:7400,10.0.0.2:7400"];
        let ClientCommand::Publish(p) = Felix::parse_from(seeds).cmd else { panic!("not publish") };
        let env = ClientConfig::new("127.0.0.1:1", Trust::DangerAcceptAnyCertificate);
        let c = p.connect.apply(env).unwrap();
        assert_eq!(c.seeds(), ["10.0.0.1:7400", "10.0.0.2:7400"]);
        assert_eq!(a.connect.ca_file, Some(PathBuf::from("/ca.pem")));
        assert!(a.connect.show_config);
        let both = ["felix", "streams", "list", "--ca-file", "/ca.pem", "--fingerprint", "ab"];
        assert!(Felix::try_parse_from(both).is_err(), "two trust flags conflict");
    }

    #[test]
    fn the_dev_certificate_is_trusted_only_without_other_trust() {
        let dir = tempfile::tempdir().unwrap();
        let none = ClientConfig::default();
        let data = Some(dir.path().to_owned());
        assert_eq!(dev_cert_default(none.clone(), data.clone()).trust, None, "no file yet");
        std::fs::write(dir.path().join("dev-cert.pem"), "x").unwrap();
        let dev = Trust::CaFile(dir.path().join("dev-cert.pem"));
        assert_eq!(dev_cert_default(none, data.clone()).trust, Some(dev));
        let pinned = ClientConfig::new("a:1", Trust::DangerAcceptAnyCertificate);
        assert_eq!(dev_cert_default(pinned.clone(), data).trust, pinned.trust);
    }

    #[tokio::test]
    async fn publish_flags_are_validated_with_the_rest() {
        let p = Felix::parse_from(["felix", "publish", "-s", "a/b/c", "--linger-us", "2000000"]);
        let config = ClientConfig::new("127.0.0.1:1", Trust::DangerAcceptAnyCertificate);
        let input = tokio::io::BufReader::new(&b""[..]);
        let e = run_with_io(p.cmd, config, input, tokio::io::sink()).await.unwrap_err();
        assert!(e.downcast_ref::<crate::ConfigError>().is_some(), "{e}");
        assert!(e.to_string().contains("linger_us"), "{e}");
    }

    #[test]
    fn start_positions_parse() {
        assert_eq!(parse_start("earliest"), Ok(StartAt::Earliest));
        assert_eq!(parse_start("latest"), Ok(StartAt::Latest));
        assert_eq!(parse_start("42"), Ok(StartAt::Offset(Offset(42))));
        assert_eq!(parse_start("@1700000000000"), Ok(StartAt::Timestamp(1_700_000_000_000)));
        assert!(parse_start("soon").is_err());
    }

    #[test]
    fn the_documented_command_lines_parse() {
        let p = Felix::parse_from([
            "felix", "publish", "--stream", "a/b/c", "--key", "K", "--ack", "durable",
        ]);
        let ClientCommand::Publish(a) = p.cmd else { panic!("not publish") };
        assert_eq!((a.key.as_deref(), a.ack), (Some("K"), Some(AckMode::Durable)));
        let s = Felix::parse_from([
            "felix",
            "subscribe",
            "--stream",
            "a/b/c",
            "--from",
            "7",
            "--group",
            "G",
        ]);
        let ClientCommand::Subscribe(a) = s.cmd else { panic!("not subscribe") };
        assert_eq!((a.from, a.group.as_deref()), (StartAt::Offset(Offset(7)), Some("G")));
        for args in [
            vec!["felix", "streams", "create", "--stream", "a/b/c", "--shards", "4"],
            vec!["felix", "streams", "list", "--json"],
            vec!["felix", "streams", "describe", "--stream", "a/b/c"],
        ] {
            assert!(matches!(Felix::parse_from(args).cmd, ClientCommand::Streams(_)));
        }
        assert!(Felix::try_parse_from(["felix", "publish", "--stream", "a/b/c", "--ack", "maybe"])
            .is_err());
        let c = Felix::parse_from(["felix", "streams", "create", "-s", "a/b/c", "--replicas", "3"]);
        let ClientCommand::Streams(a) = c.cmd else { panic!("not streams") };
        assert!(matches!(a.command, StreamsCommand::Create { replicas: Some(3), .. }));
    }

    #[test]
    fn keys_split_at_the_first_separator_and_json_keeps_binary_as_base64() {
        let r = split_key(b"k1:v:1", b":");
        assert_eq!((r.key.as_deref(), &r.value.to_bytes()[..]), (Some(&b"k1"[..]), &b"v:1"[..]));
        assert_eq!(split_key(b"novalue", b":").key, None);
        let mut obj = serde_json::Map::new();
        put_bytes(&mut obj, "value", Some(&[0xff, 0x00]));
        put_bytes(&mut obj, "key", None);
        assert_eq!(
            serde_json::Value::Object(obj).to_string(),
            r#"{"key":null,"value_b64":"/wA="}"#
        );
        assert_eq!(trim_newline(b"x\r\n"), b"x");
    }
}
