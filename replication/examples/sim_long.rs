//! A long simulation run: many seeds over several threads, stopping at the first violation.
//!
//! ```sh
//! cargo run --release -p felix-replication --example sim_long -- [seeds] [first seed] [threads]
//! FELIX_SIM_BUG=skip_truncation cargo run --release -p felix-replication --example sim_long -- 1000
//! ```
//!
//! Prints one summary line (seeds covered, seeds per second, totals); with a violation, prints
//! it (with its replay command) and exits with status 1.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use felix_replication::sim::{self, SimOptions, SweepReport, Violation};
use felix_replication::InjectedBugs;

/// Each thread reports its progress every this many seeds (stderr).
const PROGRESS_EVERY_SEEDS: u64 = 10_000;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("arguments: [seeds] [first seed] [threads]"))
        .collect();
    let seeds = args.first().copied().unwrap_or(100_000);
    let first = args.get(1).copied().unwrap_or(0);
    let threads = args.get(2).copied().unwrap_or(2).max(1);
    let opts = SimOptions { bugs: bugs_from_env(), ..SimOptions::default() };
    let started = Instant::now();
    let stop = AtomicBool::new(false);
    let results: Vec<(SweepReport, Option<Violation>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (opts, stop) = (&opts, &stop);
                scope.spawn(move || run_share(first, seeds, t, threads, opts, stop))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a sweep thread panicked")).collect()
    });
    let mut total = SweepReport::default();
    let mut failed = None;
    for (r, violation) in results {
        total.seeds += r.seeds;
        total.events += r.events;
        total.acked_batches += r.acked_batches;
        total.epochs += r.epochs;
        total.crashes += r.crashes;
        total.sim_ms += r.sim_ms;
        total.unavailable += r.unavailable;
        failed = failed.or(violation);
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "seeds {}..{}: {} covered in {secs:.1} s ({:.0} seeds/s, {threads} threads): {} events, \
         {} durable acks, {} epochs, {} crashes, {:.1} h simulated, {} seeds ended with every \
         in-sync replica lost",
        first,
        first + seeds,
        total.seeds,
        total.seeds as f64 / secs,
        total.events,
        total.acked_batches,
        total.epochs,
        total.crashes,
        total.sim_ms as f64 / 3_600_000.0,
        total.unavailable
    );
    if let Some(violation) = failed {
        println!("{violation}");
        std::process::exit(1);
    }
}

/// Runs seeds `first + t, first + t + threads, ...` below `first + seeds`; returns what passed
/// and the violation that stopped it, if any.
fn run_share(
    first: u64,
    seeds: u64,
    t: u64,
    threads: u64,
    opts: &SimOptions,
    stop: &AtomicBool,
) -> (SweepReport, Option<Violation>) {
    let mut total = SweepReport::default();
    let mut seed = first + t;
    while seed < first + seeds && !stop.load(Ordering::Relaxed) {
        match sim::run_seed(seed, opts) {
            Ok(r) => {
                total.seeds += 1;
                total.events += r.events;
                total.acked_batches += r.acked_batches;
                total.epochs += r.epochs;
                total.crashes += u64::from(r.crashes);
                total.sim_ms += r.sim_ms;
                total.unavailable += u64::from(r.unavailable);
                if total.seeds % PROGRESS_EVERY_SEEDS == 0 {
                    eprintln!("thread {t}: {} seeds passed (last {seed})", total.seeds);
                }
            }
            Err(v) => {
                stop.store(true, Ordering::Relaxed);
                return (total, Some(v));
            }
        }
        seed += threads;
    }
    (total, None)
}

/// `FELIX_SIM_BUG`: a comma-separated list of bugs to inject (to watch the checker work).
fn bugs_from_env() -> InjectedBugs {
    let names = std::env::var("FELIX_SIM_BUG").unwrap_or_default();
    InjectedBugs::parse(&names).unwrap_or_else(|e| panic!("FELIX_SIM_BUG: {e}"))
}
