//! A long simulation run: many seeds over several threads, stopping at the first violation.
//!
//! ```sh
//! cargo run --release -p felix-sim --example sim_long -- [seeds] [first seed] [threads]
//! FELIX_SIM_BUG=skip_truncation cargo run --release -p felix-sim --example sim_long -- 1000
//! ```
//!
//! Prints one summary line (seeds covered, seeds per second, totals); with a violation, prints
//! it (with its replay command) and exits with status 1.

use felix_replication::InjectedBugs;
use felix_sim::{self as sim, SimOptions};

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
    let bug_names = std::env::var("FELIX_SIM_BUG").unwrap_or_default();
    let bugs = InjectedBugs::parse(&bug_names).unwrap_or_else(|e| panic!("FELIX_SIM_BUG: {e}"));
    let opts =
        SimOptions { bugs, progress_every_seeds: PROGRESS_EVERY_SEEDS, ..SimOptions::default() };
    let (report, violation) = sim::sweep(first, seeds, threads, &opts);
    println!("seeds {first}..{}, {threads} threads: {report}", first + seeds);
    if let Some(violation) = violation {
        println!("{violation}");
        std::process::exit(1);
    }
}
