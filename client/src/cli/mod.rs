//! The `felix publish|subscribe|streams` commands: clap arguments and their implementation.
//!
//! Line-oriented like kcat and `nats pub/sub`: `publish` sends each stdin line as a record,
//! `subscribe` prints each record as a line. `--json` switches both to one JSON object per line
//! (see `docs/client.md` for the fields). The `felix` binary wires [`ClientCommand`] into its
//! own clap parser and calls [`main`]; tests call [`run_with_io`] with in-memory input and
//! output. Modules: `publish`, `subscribe`, `output` (stdout, buffered), `errors` (messages
//! and exit statuses).

mod errors;
mod output;
mod publish;
mod subscribe;

use std::path::PathBuf;

use felix_proto::{AckMode, Offset, Retention, StartAt};
use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt};

pub use errors::{
    exit_code, ConnectFailed, Interrupted, PublishFailed, EXIT_CONFIG, EXIT_FAILURE,
    EXIT_INTERRUPTED,
};
pub use output::{LineOutput, OUTPUT_BUFFER_BYTES, OUTPUT_IDLE_FLUSH_MS};
pub use publish::{PUBLISH_FAILURES_NAMED_MAX, PUBLISH_INTERRUPT_WAIT_MS};

use crate::config::{parse_ack_mode, read_token_file, ClientConfig, Trust};
use crate::Client;

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
    /// Bearer token (a JWT) for a broker that requires one (FELIX_TOKEN). Other users of the
    /// host can read it in the process list: prefer --token-file.
    #[arg(long, global = true, conflicts_with = "token_file")]
    pub token: Option<String>,
    /// Read the token from this file, surrounding whitespace removed (FELIX_TOKEN_FILE).
    #[arg(long, global = true)]
    pub token_file: Option<PathBuf>,
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
    /// Print no summary line (`N sent, M acked, K failed`) on stderr after a successful run.
    #[arg(long, short = 'q')]
    pub quiet: bool,
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
    /// Exit once every shard is read up to its end as of the start, like kcat's -e (default:
    /// keep following).
    #[arg(long, short = 'e')]
    pub exit_at_end: bool,
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

/// `felix streams create|list|describe|delete|alter`.
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
    /// Delete a stream and its records (on every broker of a cluster).
    Delete {
        /// Stream, tenant/namespace/stream.
        #[arg(long, short = 's')]
        stream: String,
    },
    /// Change a stream's settings; what is not given stays as it is.
    Alter {
        /// Stream, tenant/namespace/stream.
        #[arg(long, short = 's')]
        stream: String,
        /// Retention in bytes per shard (0: unlimited).
        #[arg(long)]
        retention_bytes: Option<u64>,
        /// Retention in milliseconds (0: unlimited).
        #[arg(long)]
        retention_ms: Option<u64>,
        /// Replication factor (changing it is not supported yet; the stream's own is accepted).
        #[arg(long)]
        replicas: Option<u8>,
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

/// Ctrl-C as a command sees it. The first asks the command to stop on its own terms
/// (`publish` stops reading and waits a bounded time for its acks, `subscribe` writes what it
/// holds and commits); [`main`] exits at once with [`EXIT_INTERRUPTED`] at the second.
#[derive(Clone)]
pub struct Interrupt(tokio::sync::watch::Receiver<bool>);

impl Interrupt {
    /// An interrupt that never comes (tests, and where no signal handler could be installed).
    pub fn never() -> Self {
        Interrupt(tokio::sync::watch::channel(false).1)
    }

    /// An interrupt raised by sending `true`.
    pub fn channel() -> (tokio::sync::watch::Sender<bool>, Self) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        (tx, Interrupt(rx))
    }

    /// Whether it came.
    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once it came (never for [`Interrupt::never`]).
    pub async fn wait(&mut self) {
        if self.0.wait_for(|set| *set).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// `fut`'s output, or [`Interrupted`] when the interrupt comes first.
    pub async fn guard<F: std::future::Future>(
        &mut self,
        fut: F,
    ) -> Result<F::Output, Interrupted> {
        tokio::select! {
            out = fut => Ok(out),
            () = self.wait() => Err(Interrupted),
        }
    }
}

/// The whole client side of the `felix` binary: reads the `FELIX_*` environment, trusts the
/// development certificate of a local broker when nothing else supplies trust (see
/// [`dev_cert_default`]), runs `cmd` on a tokio runtime with Ctrl-C handled (see
/// [`Interrupt`]), prints an error to stderr once. The exit statuses are in `errors`: 0 on
/// success, 1 on failure, 2 on a configuration error, 130 when interrupted. The flags are
/// applied, and the result validated, in [`run`]: trust may come from a flag alone.
pub fn main(cmd: ClientCommand) -> std::process::ExitCode {
    let config = match ClientConfig::parse_env() {
        Ok(c) => dev_cert_default(c, std::env::var_os("FELIX_DATA_DIR").map(PathBuf::from)),
        Err(e) => {
            eprintln!("felix: {e}");
            return std::process::ExitCode::from(EXIT_CONFIG);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("felix: cannot start the tokio runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    // A task, not `block_on`'s own future: the command then runs on a worker thread beside the
    // connections' tasks, and waking them (or being woken by them) is not a thread switch.
    let result = runtime.block_on(async {
        match tokio::spawn(run(cmd, config)).await {
            Ok(r) => r,
            Err(e) => Err(anyhow::anyhow!("the command's task failed: {e}")),
        }
    });
    // Not waiting for the blocking pool: its stdin read stays blocked until input comes, and
    // an interrupted `publish` has stopped reading.
    runtime.shutdown_background();
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("felix: {e:#}");
            std::process::ExitCode::from(exit_code(&e))
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

/// Runs `cmd` on stdin and stdout, with Ctrl-C as its [`Interrupt`] (a second Ctrl-C exits
/// the process with [`EXIT_INTERRUPTED`]). `config` need not be valid yet (trust may come
/// from the command's flags): it is validated after the flags are applied.
pub async fn run(cmd: ClientCommand, config: ClientConfig) -> anyhow::Result<()> {
    let interrupt = match ctrl_c() {
        Ok(i) => i,
        Err(e) => {
            tracing::warn!(error = %e, "cannot handle Ctrl-C: it ends the process at once");
            Interrupt::never()
        }
    };
    let stdin = tokio::io::BufReader::with_capacity(OUTPUT_BUFFER_BYTES, tokio::io::stdin());
    run_with(cmd, config, stdin, tokio::io::stdout(), interrupt).await
}

/// Runs `cmd` reading `input` (publish) and writing `output`, never interrupted.
pub async fn run_with_io<R, W>(
    cmd: ClientCommand,
    config: ClientConfig,
    input: R,
    output: W,
) -> anyhow::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    run_with(cmd, config, input, output, Interrupt::never()).await
}

/// Runs `cmd` reading `input` (publish) and writing `output`, stopped by `interrupt`.
pub async fn run_with<R, W>(
    cmd: ClientCommand,
    config: ClientConfig,
    input: R,
    mut output: W,
    mut interrupt: Interrupt,
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
            publish::publish(args, config, input, output, interrupt).await
        }
        ClientCommand::Subscribe(args) => {
            let config = args.connect.apply(config)?;
            subscribe::subscribe(args, config, output, interrupt).await
        }
        ClientCommand::Streams(args) => {
            let config = args.connect.apply(config)?;
            interrupt.guard(streams(args, config, &mut output)).await?
        }
    }
}

/// The first SIGINT raises the returned interrupt; the second exits the process at once.
#[cfg(unix)]
fn ctrl_c() -> std::io::Result<Interrupt> {
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let (tx, interrupt) = Interrupt::channel();
    tokio::spawn(async move {
        if sigint.recv().await.is_none() {
            return;
        }
        let _ = tx.send(true);
        if sigint.recv().await.is_some() {
            eprintln!("felix: interrupted twice: exiting at once");
            std::process::exit(i32::from(EXIT_INTERRUPTED));
        }
    });
    Ok(interrupt)
}

#[cfg(not(unix))]
fn ctrl_c() -> std::io::Result<Interrupt> {
    Ok(Interrupt::never())
}

/// Connects, or says why not: the addresses tried and what to check ([`ConnectFailed`]).
async fn connect(config: ClientConfig) -> anyhow::Result<Client> {
    let seeds = config.seeds();
    match Client::connect(config).await {
        Ok(c) => Ok(c),
        Err(e) => match ConnectFailed::new(e, &seeds) {
            Ok(failed) => Err(failed.into()),
            Err(config_error) => Err(config_error.into()),
        },
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
        if let Some(t) = &self.token {
            config.token = Some(t.clone());
        }
        if let Some(p) = &self.token_file {
            config.token = Some(read_token_file(p)?);
        }
        if self.show_config {
            eprintln!("felix client configuration:\n{config}");
        }
        config.validate()?;
        tracing::info!(config = %config, "client configuration");
        Ok(config)
    }
}

async fn streams<W: AsyncWrite + Unpin>(
    args: StreamsArgs,
    config: ClientConfig,
    output: &mut W,
) -> anyhow::Result<()> {
    let client = connect(config).await?;
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
        StreamsCommand::Delete { stream } => {
            describe_text(&client.delete_stream(&stream).await?, args.json)
        }
        StreamsCommand::Alter { stream, retention_bytes, retention_ms, replicas } => {
            let changes = felix_proto::StreamChanges { retention_bytes, retention_ms, replicas };
            if changes.is_empty() {
                anyhow::bail!(
                    "nothing to alter: give --retention-bytes, --retention-ms or --replicas"
                );
            }
            describe_text(&client.alter_stream(&stream, changes).await?, args.json)
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
    fn a_token_comes_from_a_flag_or_a_file_and_the_flags_exclude_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "  from-file\n").unwrap();
        let env = ClientConfig::parse_env_map([("FELIX_TOKEN", "from-env")]).unwrap();
        let env = ClientConfig { trust: Some(Trust::DangerAcceptAnyCertificate), ..env };
        let flag = ConnectArgs { token: Some("from-flag".into()), ..Default::default() };
        assert_eq!(flag.apply(env.clone()).unwrap().token.as_deref(), Some("from-flag"));
        let from_file = ConnectArgs { token_file: Some(file.clone()), ..Default::default() };
        assert_eq!(from_file.apply(env.clone()).unwrap().token.as_deref(), Some("from-file"));
        let missing = ConnectArgs { token_file: Some(dir.path().join("no")), ..Default::default() };
        let e = missing.apply(env).unwrap_err();
        assert_eq!(exit_code(&e), EXIT_CONFIG, "{e}");
        let file_s = file.display().to_string();
        let both = ["felix", "streams", "list", "--token", "t", "--token-file", &file_s];
        assert!(Felix::try_parse_from(both).is_err(), "--token and --token-file conflict");
    }
}
