//! The epoch handshake finds exactly the longest common prefix of a follower's and a leader's
//! logs, for any pair of logs a history of leaders can produce (property test), also when both
//! have archived part of that prefix (as replicas archive committed batches).

use bytes::Bytes;
use felix_replication::{Batch, Epoch, Offset, ReplicaLog};
use proptest::prelude::*;

/// A history: for each epoch 1.., (the earlier log it starts from, how many of that log's batches
/// the new leader kept, how many batches it appended).
type History = Vec<(usize, usize, usize)>;

/// Builds the logs of every leader of the history (index e - 1 for epoch e). Each epoch's
/// batches are written once, so the logs obey log matching, as the protocol's do.
fn leader_logs(history: &History) -> Vec<Vec<Batch>> {
    let mut logs: Vec<Vec<Batch>> = Vec::new();
    for (i, &(from, keep, add)) in history.iter().enumerate() {
        let epoch = Epoch(i as u64 + 1);
        let mut log: Vec<Batch> =
            if logs.is_empty() { Vec::new() } else { logs[from % logs.len()].clone() };
        log.truncate(keep.min(log.len()));
        for _ in 0..add {
            let base = log.last().map_or(Offset(0), Batch::end);
            let payload = Bytes::from(format!("e{}@{}", epoch.0, base.0));
            log.push(Batch {
                epoch,
                base,
                records: 1 + (base.0 % 3) as u32,
                producer: None,
                time_ms: 0,
                payload,
            });
        }
        logs.push(log);
    }
    logs
}

/// Runs the handshake (at most as many rounds as epochs) and returns the follower's log.
fn handshake(mut follower: ReplicaLog, leader: &ReplicaLog, current: Epoch) -> ReplicaLog {
    for _ in 0..=current.0 {
        if follower.end() == Offset(0) {
            break;
        }
        let (answer, end) = leader.epoch_answer(follower.last_epoch(), current);
        let to = follower.truncation_point(answer, end);
        follower.truncate(to).expect("the handshake never cuts into the common prefix");
        if follower.end() == Offset(0) || Some(follower.last_epoch()) == answer {
            return follower;
        }
    }
    assert_eq!(follower.end(), Offset(0), "the handshake did not converge");
    follower
}

fn history() -> impl Strategy<Value = History> {
    prop::collection::vec((0usize..8, 0usize..12, 0usize..6), 1..8)
}

proptest! {
    #[test]
    fn truncation_keeps_exactly_the_common_prefix(
        history in history(),
        pick in (0usize..8, 0usize..40, 0usize..8),
        archive in (0usize..40, 0usize..40),
    ) {
        let logs = leader_logs(&history);
        let (f, f_len, l) = pick;
        let leader_index = l % logs.len();
        // The follower holds a prefix of some leader's log from an epoch up to the leader's.
        let follower_index = f % (leader_index + 1);
        let follower_log = &logs[follower_index][..f_len.min(logs[follower_index].len())];
        let mut leader = ReplicaLog::from_batches(logs[leader_index].clone()).unwrap();
        let mut follower = ReplicaLog::from_batches(follower_log.to_vec()).unwrap();
        let current = Epoch(leader_index as u64 + 1);
        let common = follower_log
            .iter()
            .zip(leader.batches())
            .take_while(|(a, b)| a == b)
            .count();
        // Each side archives some of the common prefix (what both can know committed).
        let cut = |n: usize| n.min(common).checked_sub(1).map_or(Offset(0), |i| follower_log[i].end());
        let (archived_leader, archived_follower) = (cut(archive.0), cut(archive.1));
        leader.archive(archived_leader);
        follower.archive(archived_follower);
        let done = handshake(follower, &leader, current);
        let want = &logs[leader_index][..common];
        let kept = done.archived_batches() as usize;
        prop_assert_eq!(done.end(), want.last().map_or(Offset(0), Batch::end));
        prop_assert_eq!(done.batches(), &want[kept..]);
        prop_assert!(done.archived_end() <= archived_follower);
    }
}
