//! The deterministic simulator (TigerBeetle's VOPR, in small): 3-5 [`Replica`]s, a model of
//! etcd and idempotent producers, driven by one event queue and one seeded PRNG (ChaCha8, so a
//! seed replays the same on every machine).
//!
//! Each seed draws a replication factor, producer count and fault rates, then runs
//! `fault_phase_ms` of simulated time with message drops, duplicates, delays (reordering),
//! partitions (between nodes and from etcd, so leases expire), pauses (SIGSTOP past the
//! lease), crashes that lose what was not fdatasync'd and restarts; then heals everything and
//! requires every producer to finish within `heal_deadline_ms` (liveness). After every event
//! it checks the invariants in [`check`]. A failure is a [`Violation`] that names its seed and
//! how to replay it.
//!
//! [`Replica`]: felix_replication::Replica

pub mod check;
mod disk;
mod etcd;
mod net;
mod producer;
mod world;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use felix_replication::config::InjectedBugs;
use felix_replication::ReplicaStats;

pub use world::{LEASE_TTL_MS, NODE_TICK_MS};

/// How seeds are run.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Deliberate bugs to inject into every replica (the checker's own tests).
    pub bugs: InjectedBugs,
    /// Simulated time with faults, ms.
    pub fault_phase_ms: u64,
    /// After healing, every producer must finish within this, ms.
    pub heal_deadline_ms: u64,
    /// Batches per producer at most (at least 5).
    pub batches_per_producer_max: u32,
    /// Print every event to stderr.
    pub trace: bool,
    /// In a sweep, each thread reports to stderr every this many seeds (0: never).
    pub progress_every_seeds: u64,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            bugs: InjectedBugs::default(),
            fault_phase_ms: 2_000,
            heal_deadline_ms: 20_000,
            batches_per_producer_max: 25,
            trace: false,
            progress_every_seeds: 0,
        }
    }
}

/// What one seed did.
#[derive(Clone, Debug, Default)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// Its replication factor.
    pub replicas: usize,
    /// Events processed (each followed by a check).
    pub events: u64,
    /// Simulated time at the end, ms.
    pub sim_ms: u64,
    /// Distinct batches acknowledged as durable.
    pub acked_batches: u64,
    /// Batches in the committed history at the end.
    pub committed_batches: u64,
    /// The last leader epoch (elections).
    pub epochs: u64,
    /// Crashes injected.
    pub crashes: u32,
    /// The replicas' counters, summed (crashed incarnations included).
    pub stats: ReplicaStats,
    /// Every in-sync replica was lost for good, so the producers could not finish (allowed:
    /// there is no unclean election).
    pub unavailable: bool,
    /// Producers expired from the producer table (the most any live replica counted).
    pub producers_expired: u64,
    /// Restarts that started from the node's checkpoint.
    pub checkpoint_restarts: u64,
    /// Sessions the nodes' cluster agents gave up (a silent etcd connection).
    pub agent_giveups: u64,
    /// Leaderships handed to the preferred replica (leader balance).
    pub transfers: u64,
    /// The furthest any node's storage deleted to (retention), an offset.
    pub log_start_max: u64,
    /// Replicas opened from storage retention had cut (their log's origin past 0).
    pub recovered_past_deletion: u64,
}

/// A seed that broke an invariant (or did not finish after healing).
#[derive(Clone, Debug)]
pub struct Violation {
    /// The seed.
    pub seed: u64,
    /// Events processed before the failing check.
    pub events: u64,
    /// What broke.
    pub what: String,
    /// The injected bugs, as `FELIX_SIM_BUG=...` for the replay command (empty if none).
    pub bugs: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} failed after {} events: {}\nreplay: FELIX_SIM_SEED={}{} cargo test -p felix-sim --test sim sim_replay -- --nocapture (FELIX_SIM_TRACE=1 prints every event)",
            self.seed, self.events, self.what, self.seed, self.bugs
        )
    }
}

/// Totals of a sweep over many seeds.
#[derive(Clone, Debug, Default)]
pub struct SweepReport {
    /// Seeds run.
    pub seeds: u64,
    /// Events over all seeds.
    pub events: u64,
    /// Durable acks over all seeds.
    pub acked_batches: u64,
    /// Leader epochs over all seeds.
    pub epochs: u64,
    /// Crashes over all seeds.
    pub crashes: u64,
    /// Simulated time over all seeds, ms.
    pub sim_ms: u64,
    /// The replicas' counters over all seeds.
    pub stats: ReplicaStats,
    /// Seeds that ended unavailable because every in-sync replica was lost.
    pub unavailable: u64,
    /// Producers expired (see [`SeedReport::producers_expired`]), and seeds with any.
    pub producers_expired: u64,
    /// Seeds in which some producer expired.
    pub seeds_with_expiry: u64,
    /// Restarts from a checkpoint.
    pub checkpoint_restarts: u64,
    /// Sessions the nodes' cluster agents gave up (a silent etcd connection).
    pub agent_giveups: u64,
    /// Leaderships handed to the preferred replica (leader balance).
    pub transfers: u64,
    /// Seeds in which retention deleted something.
    pub seeds_with_deletion: u64,
    /// Replicas opened from storage retention had cut.
    pub recovered_past_deletion: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// Runs one seed.
pub fn run_seed(seed: u64, opts: &SimOptions) -> Result<SeedReport, Violation> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let replicas = rng.gen_range(3..=5u32) as usize;
    let producers = rng.gen_range(1..=3u32) as usize;
    let world = world::World::new(seed, rng, opts.clone(), replicas, producers);
    world.run().map_err(|(events, what)| Violation { seed, events, what, bugs: bug_env(opts.bugs) })
}

/// Runs seeds `first..first + count` on `threads` threads (seed `first + i` on thread
/// `i % threads`); all stop at the first violation. Returns the totals of the seeds that passed
/// and the violation, if any. Every seed is deterministic, so the totals of a passing sweep do
/// not depend on `threads`.
pub fn sweep(
    first: u64,
    count: u64,
    threads: u64,
    opts: &SimOptions,
) -> (SweepReport, Option<Violation>) {
    let started = Instant::now();
    let threads = threads.max(1);
    let stop = AtomicBool::new(false);
    let shares: Vec<(SweepReport, Option<Violation>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let seeds = (first + t..first + count).step_by(threads as usize);
                let stop = &stop;
                scope.spawn(move || sweep_share(seeds, opts, stop))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a sweep thread panicked")).collect()
    });
    let mut total = SweepReport::default();
    let mut failed: Option<Violation> = None;
    for (share, violation) in shares {
        total.add(&share);
        failed = match (failed, violation) {
            (Some(a), Some(b)) => Some(if b.seed < a.seed { b } else { a }),
            (a, b) => a.or(b),
        };
    }
    total.elapsed = started.elapsed();
    (total, failed)
}

/// One thread's seeds.
fn sweep_share(
    seeds: impl Iterator<Item = u64>,
    opts: &SimOptions,
    stop: &AtomicBool,
) -> (SweepReport, Option<Violation>) {
    let mut total = SweepReport::default();
    for seed in seeds {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        match run_seed(seed, opts) {
            Ok(report) => total.add_seed(&report),
            Err(violation) => {
                stop.store(true, Ordering::Relaxed);
                return (total, Some(violation));
            }
        }
        if opts.progress_every_seeds > 0 && total.seeds % opts.progress_every_seeds == 0 {
            eprintln!("{} seeds passed on this thread (last {seed})", total.seeds);
        }
    }
    (total, None)
}

impl SweepReport {
    fn add_seed(&mut self, report: &SeedReport) {
        self.seeds += 1;
        self.events += report.events;
        self.acked_batches += report.acked_batches;
        self.epochs += report.epochs;
        self.crashes += u64::from(report.crashes);
        self.sim_ms += report.sim_ms;
        self.stats = self.stats + report.stats;
        self.unavailable += u64::from(report.unavailable);
        self.producers_expired += report.producers_expired;
        self.seeds_with_expiry += u64::from(report.producers_expired > 0);
        self.checkpoint_restarts += report.checkpoint_restarts;
        self.agent_giveups += report.agent_giveups;
        self.transfers += report.transfers;
        self.seeds_with_deletion += u64::from(report.log_start_max > 0);
        self.recovered_past_deletion += report.recovered_past_deletion;
    }

    fn add(&mut self, other: &SweepReport) {
        self.seeds += other.seeds;
        self.events += other.events;
        self.acked_batches += other.acked_batches;
        self.epochs += other.epochs;
        self.crashes += other.crashes;
        self.sim_ms += other.sim_ms;
        self.stats = self.stats + other.stats;
        self.unavailable += other.unavailable;
        self.producers_expired += other.producers_expired;
        self.seeds_with_expiry += other.seeds_with_expiry;
        self.checkpoint_restarts += other.checkpoint_restarts;
        self.agent_giveups += other.agent_giveups;
        self.transfers += other.transfers;
        self.seeds_with_deletion += other.seeds_with_deletion;
        self.recovered_past_deletion += other.recovered_past_deletion;
    }
}

impl fmt::Display for SweepReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.elapsed.as_secs_f64();
        write!(
            f,
            "{} seeds in {secs:.1} s ({:.0} seeds/s): {} events, {} durable acks, {} epochs, {} \
             crashes, {:.1} h simulated, {} ended unavailable (every in-sync replica lost), {} \
             producers expired in {} seeds, {} restarts from a checkpoint, {} agent sessions given up, \
             {} leaderships handed to the preferred replica, retention deleted in {} seeds and {} \
             replicas recovered from where it deleted to; {:?}",
            self.seeds,
            self.seeds as f64 / secs.max(1e-9),
            self.events,
            self.acked_batches,
            self.epochs,
            self.crashes,
            self.sim_ms as f64 / 3_600_000.0,
            self.unavailable,
            self.producers_expired,
            self.seeds_with_expiry,
            self.checkpoint_restarts,
            self.agent_giveups,
            self.transfers,
            self.seeds_with_deletion,
            self.recovered_past_deletion,
            self.stats
        )
    }
}

/// ` FELIX_SIM_BUG=a,b` for the injected bugs, or "".
fn bug_env(bugs: InjectedBugs) -> String {
    let flags = [
        (bugs.commit_without_quorum, "commit_without_quorum"),
        (bugs.skip_truncation, "skip_truncation"),
        (bugs.skip_dedup, "skip_dedup"),
        (bugs.ignore_lease, "ignore_lease"),
        (bugs.visible_past_written, "visible_past_written"),
        (bugs.tail_past_written, "tail_past_written"),
        (bugs.truncate_below_fed, "truncate_below_fed"),
        (bugs.propose_unbounded, "propose_unbounded"),
        (bugs.open_unplaced, "open_unplaced"),
        (bugs.transfer_out_of_sync, "transfer_out_of_sync"),
        (bugs.retention_past_followers, "retention_past_followers"),
    ];
    let names: Vec<&str> = flags.iter().filter(|(on, _)| *on).map(|(_, n)| *n).collect();
    if names.is_empty() {
        String::new()
    } else {
        format!(" FELIX_SIM_BUG={}", names.join(","))
    }
}

/// A uniformly chosen element (portable: draws a `u32`, never a `usize`).
pub(crate) fn pick<T: Copy>(rng: &mut ChaCha8Rng, items: &[T]) -> Option<T> {
    if items.is_empty() {
        return None;
    }
    Some(items[rng.gen_range(0..items.len() as u32) as usize])
}
