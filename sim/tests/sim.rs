//! The deterministic simulation of replication: many seeds, one replayable seed, and proof that
//! the checker catches deliberately broken protocols.

use felix_replication::InjectedBugs;
use felix_sim::{self as sim, SimOptions};

/// Seeds the CI sweep runs (at least 10,000, in well under two minutes).
const CI_SEEDS: u64 = 10_000;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name} must be a number")))
}

/// Threads the CI sweep uses: the machine's, at most 4 (the totals do not depend on it).
fn sweep_threads() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4) as u64)
}

#[test]
fn sim_sweep() {
    let count = env_u64("FELIX_SIM_SEEDS").unwrap_or(CI_SEEDS);
    let first = env_u64("FELIX_SIM_FIRST_SEED").unwrap_or(0);
    let threads = env_u64("FELIX_SIM_THREADS").unwrap_or_else(sweep_threads);
    let (report, violation) = sim::sweep(first, count, threads, &SimOptions::default());
    eprintln!("{report} ({threads} threads)");
    if let Some(violation) = violation {
        panic!("{violation}");
    }
    assert_eq!(report.seeds, count);
}

#[test]
fn sim_replay() {
    let Some(seed) = env_u64("FELIX_SIM_SEED") else {
        // Without a seed, replay seed 0 twice and require the same run.
        let a = sim::run_seed(0, &SimOptions::default()).expect("seed 0 passes");
        let b = sim::run_seed(0, &SimOptions::default()).expect("seed 0 passes");
        assert_eq!((a.events, a.sim_ms, a.acked_batches), (b.events, b.sim_ms, b.acked_batches));
        return;
    };
    let bug_names = std::env::var("FELIX_SIM_BUG").unwrap_or_default();
    let opts = SimOptions {
        trace: std::env::var_os("FELIX_SIM_TRACE").is_some(),
        bugs: InjectedBugs::parse(&bug_names).expect("FELIX_SIM_BUG"),
        ..SimOptions::default()
    };
    match sim::run_seed(seed, &opts) {
        Ok(report) => eprintln!("{report:?}"),
        Err(violation) => panic!("{violation}"),
    }
}

/// Runs seeds with `bugs` until one breaks a safety invariant (a liveness failure, "producers
/// not done", does not count); returns the violation.
fn find_violation(bugs: InjectedBugs, seeds: u64) -> sim::Violation {
    let opts = SimOptions { bugs, ..SimOptions::default() };
    for seed in 0..seeds {
        if let Err(violation) = sim::run_seed(seed, &opts) {
            if !violation.what.starts_with("liveness") {
                eprintln!("{violation}");
                return violation;
            }
        }
    }
    panic!("no seed out of {seeds} caught {bugs:?}");
}

#[test]
fn checker_catches_commit_without_quorum() {
    let v = find_violation(
        InjectedBugs { commit_without_quorum: true, ..InjectedBugs::default() },
        2_000,
    );
    // Replays exactly.
    let again = sim::run_seed(
        v.seed,
        &SimOptions {
            bugs: InjectedBugs { commit_without_quorum: true, ..InjectedBugs::default() },
            ..SimOptions::default()
        },
    )
    .expect_err("the same seed fails again");
    assert_eq!((again.events, again.what), (v.events, v.what));
}

#[test]
fn checker_catches_skipped_truncation() {
    find_violation(InjectedBugs { skip_truncation: true, ..InjectedBugs::default() }, 2_000);
}

#[test]
fn checker_catches_skipped_dedup() {
    find_violation(InjectedBugs { skip_dedup: true, ..InjectedBugs::default() }, 2_000);
}

#[test]
fn checker_catches_acks_without_a_lease() {
    find_violation(InjectedBugs { ignore_lease: true, ..InjectedBugs::default() }, 2_000);
}

#[test]
fn checker_catches_reads_past_a_truncation_not_yet_stored() {
    find_violation(InjectedBugs { visible_past_written: true, ..InjectedBugs::default() }, 2_000);
}

// The driver's bugs of the last round, put back one at a time (docs/replication.md, "What the
// simulator found"): each is caught by an invariant within a few seeds.

#[test]
fn checker_catches_a_tail_fed_past_what_storage_holds() {
    // 10f4ad2, in the driver: readers and the tail up to the commit point while a truncation
    // is still queued for storage.
    find_violation(InjectedBugs { tail_past_written: true, ..InjectedBugs::default() }, 2_000);
}

#[test]
fn checker_catches_proposals_piling_up() {
    // 741370b: every resend of an unanswered proposal handed to the agent.
    let v =
        find_violation(InjectedBugs { propose_unbounded: true, ..InjectedBugs::default() }, 2_000);
    assert!(v.what.contains("proposals"), "{v}");
}

#[test]
fn checker_catches_a_leadership_handed_to_a_replica_out_of_sync() {
    // Leader balance without its in-sync condition: the new leader lacks committed batches.
    find_violation(InjectedBugs { transfer_out_of_sync: true, ..InjectedBugs::default() }, 2_000);
}

#[test]
fn checker_catches_retention_past_a_followers_log() {
    // Retention on replicated streams: a leader that starts its log past what a follower
    // holds would delete what that follower still has to fetch.
    find_violation(
        InjectedBugs { retention_past_followers: true, ..InjectedBugs::default() },
        2_000,
    );
}

#[test]
fn checker_catches_replicas_opened_before_the_placement() {
    // fa9b380: replicas started from a deposed controller's record and kept when the placed
    // record names other replicas.
    find_violation(InjectedBugs { open_unplaced: true, ..InjectedBugs::default() }, 2_000);
}

#[test]
fn an_answer_to_a_keepalive_of_the_replaced_connection_credits_nothing() {
    // Seed 20,664,296 (the long run of 2026-12-07): an answer to a keep-alive sent before the
    // session started was credited to the session's first send, stretching the lease 50 ms past
    // etcd's expiry, and the leader acked after another was elected (the simulator's model of
    // the agent, not the agent: its new keep-alive stream never reads the old one's answers).
    sim::run_seed(20_664_296, &SimOptions::default()).expect("the seed passes");
}

#[test]
fn a_fetch_reply_counts_released_payloads_as_they_were() {
    // Seed 15 (2026-12-08): a leader's fetch reply counted a released payload (empty in memory,
    // read back from storage before sending) as nothing, and sent more than `fetch_bytes_max`.
    // On brokers a follower far behind got replies of up to 12 MB, over the 4 MiB frame limit:
    // its peer refused every one and it never caught up.
    sim::run_seed(15, &SimOptions::default()).expect("the seed passes");
}

#[test]
fn an_ack_is_checked_against_the_role_its_input_began_with() {
    // Seeds 30,669,092 and 31,196,710 (the long runs of 2026-12-08): one input let a leader
    // commit and ack, then stepped it down (a record naming it under the lease its agent had
    // just left, then that lease; a lease confirmation, then the record of the transfer it had
    // proposed). The acks were fenced in time (etcd still named it, or it had handed the epoch
    // on); the check of its role, made after the input, took them for acks of a non-leader.
    for seed in [30_669_092, 31_196_710] {
        sim::run_seed(seed, &SimOptions::default()).expect("the seed passes");
    }
}
