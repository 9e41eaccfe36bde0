//! The `felix` binary: `felix serve` runs a broker; `felix publish|subscribe|streams` are the
//! client commands of `felix_client::cli`; `felix cluster status` reads a cluster from etcd;
//! `felix completions SHELL` and `felix man` print a completion script and the man page, both
//! generated from these clap definitions.

mod cluster_cmd;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use felix_broker::app::Broker;
use felix_broker::config::{self, ServeArgs};

/// The binary's allocator (feature `mimalloc`, on by default): see broker/Cargo.toml.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Felix: a durable publish/subscribe log broker over QUIC.
#[derive(Parser)]
#[command(name = "felix", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines are written to stderr: `text` (one line each, with a timestamp; coloured
    /// only on a terminal) or `json` (one JSON object per line, for a log collector).
    #[arg(long, global = true, value_enum, env = "FELIX_LOG_FORMAT", default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// The log line format (`--log-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run a broker (defaults: 127.0.0.1:7400, one core per CPU, ./felix-data, dev certificate).
    Serve(Box<ServeArgs>),
    #[command(flatten)]
    Client(Box<felix_client::cli::ClientCommand>),
    /// Look at a cluster of brokers (members, controller, placement, load).
    #[command(subcommand)]
    Cluster(cluster_cmd::ClusterCommand),
    /// Print a shell completion script, e.g. `felix completions bash >
    /// /etc/bash_completion.d/felix`, or `source <(felix completions zsh)`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), e.g. `felix man | man -l -`.
    Man,
}

/// The log filter when `FELIX_LOG` is unset: the broker logs its start-up and notable events;
/// the client commands only errors, as kcat and `nats` keep quiet (`--show-config` or
/// `FELIX_LOG=info` shows more).
const SERVE_LOG_DEFAULT: &str = "info";
/// See [`SERVE_LOG_DEFAULT`].
const CLIENT_LOG_DEFAULT: &str = "error";

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let log_default = match cli.command {
        Command::Serve(_) => SERVE_LOG_DEFAULT,
        Command::Client(_) | Command::Cluster(_) | Command::Completions { .. } | Command::Man => {
            CLIENT_LOG_DEFAULT
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("FELIX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(log_default));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match cli.log_format {
        // Colour codes only for a person at a terminal, never into a file or a journal.
        LogFormat::Text => {
            logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).try_init()
        }
        LogFormat::Json => logs.json().try_init(),
    };
    let mut also_known = vec!["FELIX_LOG"];
    also_known.extend(felix_client::config::ENV_KEYS);
    for name in config::unknown_env_vars::<Cli>(std::env::vars().map(|(k, _)| k), &also_known) {
        eprintln!("felix: warning: environment variable {name} is not a Felix setting (typo?)");
    }
    match cli.command {
        Command::Serve(args) => {
            let sub = matches.subcommand_matches("serve").cloned().unwrap_or_default();
            serve(*args, &sub)
        }
        // Reads the environment without validating it: trust may come from a flag alone.
        Command::Client(cmd) => felix_client::cli::main(*cmd),
        Command::Cluster(cmd) => cluster_cmd::main(cmd),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "felix", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Man => {
            match clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("felix: cannot write the man page: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn serve(args: ServeArgs, matches: &clap::ArgMatches) -> ExitCode {
    let args = match args.resolve(matches) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("felix: {e}");
            return ExitCode::from(2);
        }
    };
    println!("# felix serve: effective configuration\n{}", args.render());
    if args.print_config {
        return ExitCode::SUCCESS;
    }
    let metrics = match args.metrics_addr() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("felix: {e}");
            return ExitCode::from(2);
        }
    };
    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        // A second signal while shutting down exits at once (the logs recover on restart).
        let registered = signal_hook::flag::register_conditional_shutdown(sig, 130, term.clone())
            .and_then(|_| signal_hook::flag::register(sig, term.clone()));
        if let Err(e) = registered {
            eprintln!("felix: cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    }
    let broker = match Broker::start(&args) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("felix: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(addr) = metrics {
        match felix_broker::admin::start(
            addr,
            broker.stats.clone(),
            broker.net.clone(),
            broker.readiness(),
        ) {
            Ok(local) => eprintln!("felix: metrics on http://{local}/metrics"),
            Err(e) => {
                eprintln!("felix: metrics address {addr}: {e}");
                broker.shutdown();
                return ExitCode::FAILURE;
            }
        }
    }
    eprintln!(
        "felix: serving on {} with {} cores, steering {:?}",
        broker.local_addr(),
        args.cores,
        broker.steering()
    );
    while !term.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(200));
        broker.refresh();
    }
    eprintln!("felix: shutting down (a second signal exits at once)");
    if broker.shutdown() {
        eprintln!("felix: stopped");
        ExitCode::SUCCESS
    } else {
        eprintln!("felix: stopped without draining every core (the logs recover on restart)");
        ExitCode::FAILURE
    }
}
