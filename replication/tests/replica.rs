//! The replica state machine driven by hand: a small in-memory harness (quinn's `Pair` in
//! spirit) with instant messages, disks completed when the test says, and the controller's
//! compare-and-swap applied at once.

use std::collections::VecDeque;

use bytes::Bytes;
use felix_replication::{
    AckMode, AppendError, AppendId, AppendRequest, Batch, DiskOp, DiskOpId, Epoch, GroupState,
    LeaseId, Message, Offset, Output, ProducerId, ProducerLimits, ProducerSeq, Replica,
    ReplicaConfig, ReplicaLog, ReplicaNumber, RoleView, Seq, Time,
};

/// Lease validity the harness grants, ms.
const LEASE_MS: u64 = 10_000;

struct Harness {
    now: Time,
    nodes: Vec<Replica>,
    group: GroupState,
    /// Disk operations emitted and not completed, per node.
    disk: Vec<Vec<DiskOpId>>,
    /// Whether a node's disk completes at once.
    auto_disk: Vec<bool>,
    /// Whether a node is cut off (its messages are dropped).
    cut: Vec<bool>,
    /// Whether proposals to the controller are lost.
    drop_proposals: bool,
    /// Whether the controller applies proposals without telling anyone (its answers lost).
    silent_proposals: bool,
    messages: VecDeque<(ReplicaNumber, ReplicaNumber, Message)>,
    answers: Vec<Output>,
    /// Each node's stored log: its disk writes and truncations, applied when emitted (what
    /// an `Output::FetchFromLog` reads).
    stored: Vec<Vec<Batch>>,
}

impl Harness {
    /// `n` replicas with the default configuration, node 0 elected.
    fn new(n: u32) -> Harness {
        Harness::with_config(n, ReplicaConfig::for_replicas(n as usize))
    }

    /// `n` replicas, node 0 elected.
    fn with_config(n: u32, config: ReplicaConfig) -> Harness {
        let ids: Vec<ReplicaNumber> = (0..n).map(ReplicaNumber).collect();
        let mut h = Harness {
            now: Time(1),
            nodes: ids
                .iter()
                .map(|&id| Replica::new(id, config.clone(), ReplicaLog::default()))
                .collect(),
            group: GroupState::new(ids.clone()),
            disk: vec![Vec::new(); n as usize],
            auto_disk: vec![true; n as usize],
            cut: vec![false; n as usize],
            drop_proposals: false,
            silent_proposals: false,
            messages: VecDeque::new(),
            answers: Vec::new(),
            stored: vec![Vec::new(); n as usize],
        };
        for i in 0..n as usize {
            h.nodes[i].handle_lease(h.now, LeaseId(i as u64 + 1), h.now.plus_ms(LEASE_MS));
        }
        h.elect(ReplicaNumber(0));
        h
    }

    fn elect(&mut self, node: ReplicaNumber) {
        let live =
            (0..self.nodes.len() as u32).map(ReplicaNumber).filter(|n| !self.cut[n.0 as usize]);
        let live = live.collect();
        self.group.elect(node, LeaseId(u64::from(node.0) + 1), &live).expect("electable");
        self.publish_group();
    }

    fn publish_group(&mut self) {
        for i in 0..self.nodes.len() {
            if !self.cut[i] {
                self.nodes[i].handle_controller(self.now, self.group.clone());
            }
        }
        self.pump();
    }

    fn append(&mut self, node: u32, request: u64, tag: Option<(u64, u32)>, mode: AckMode) {
        self.append_records(node, request, tag, mode, 2);
    }

    fn append_records(
        &mut self,
        node: u32,
        request: u64,
        tag: Option<(u64, u32)>,
        mode: AckMode,
        records: u32,
    ) {
        self.append_with(node, request, tag, mode, records, false);
    }

    /// An append whose producer says nothing earlier of it is unresolved (`oldest_pending`).
    fn append_oldest(&mut self, node: u32, request: u64, tag: (u64, u32)) {
        self.append_with(node, request, Some(tag), AckMode::Durable, 2, true);
    }

    fn append_with(
        &mut self,
        node: u32,
        request: u64,
        tag: Option<(u64, u32)>,
        mode: AckMode,
        records: u32,
        oldest_pending: bool,
    ) {
        let append = AppendRequest {
            request: AppendId(request),
            producer: tag.map(|(p, s)| ProducerSeq { producer: ProducerId(p), seq: Seq(s) }),
            records,
            oldest_pending,
            time_ms: self.now.0,
            payload: Bytes::from(format!("batch {request}")),
            mode,
        };
        self.nodes[node as usize].handle_append(self.now, append);
        self.pump();
    }

    /// Advances time by `ms` in ticks of 10 ms.
    fn advance(&mut self, ms: u64) {
        for _ in 0..ms / 10 {
            self.now = self.now.plus_ms(10);
            for i in 0..self.nodes.len() {
                if !self.cut[i] {
                    self.nodes[i].handle_tick(self.now);
                }
            }
            self.pump();
        }
    }

    fn complete_disk(&mut self, node: usize) {
        if let Some(&last) = self.disk[node].last() {
            self.disk[node].clear();
            self.nodes[node].handle_disk_done(self.now, last);
            self.pump();
        }
    }

    /// Runs until nothing moves.
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            for i in 0..self.nodes.len() {
                while let Some(output) = self.nodes[i].poll() {
                    moved = true;
                    self.route(i, output);
                }
                if self.auto_disk[i] && !self.disk[i].is_empty() {
                    let last = *self.disk[i].last().expect("not empty");
                    self.disk[i].clear();
                    self.nodes[i].handle_disk_done(self.now, last);
                    moved = true;
                }
            }
            while let Some((from, to, message)) = self.messages.pop_front() {
                moved = true;
                if !self.cut[from.0 as usize] && !self.cut[to.0 as usize] {
                    self.nodes[to.0 as usize].handle_message(self.now, from, message);
                }
            }
            if !moved {
                return;
            }
        }
    }

    fn route(&mut self, i: usize, output: Output) {
        match output {
            Output::Send { to, message } => {
                self.messages.push_back((ReplicaNumber(i as u32), to, message))
            }
            Output::Disk(op) => {
                match &op {
                    DiskOp::Write { batches, .. } => self.stored[i].extend(batches.iter().cloned()),
                    DiskOp::Truncate { to, .. } => self.stored[i].retain(|b| b.base < *to),
                    DiskOp::Sync { .. } => {}
                }
                self.disk[i].push(op_id(&op))
            }
            Output::FetchFromLog { to, epoch, from, upto, committed, log_start, bytes_max } => {
                let (mut batches, mut bytes) = (Vec::new(), 0);
                for b in self.stored[i].iter().filter(|b| b.base >= from && b.end() <= upto) {
                    bytes += b.size_bytes();
                    if !batches.is_empty() && bytes > bytes_max {
                        break;
                    }
                    batches.push(b.clone());
                }
                let message = Message::FetchReply { epoch, from, batches, committed, log_start };
                self.messages.push_back((ReplicaNumber(i as u32), to, message))
            }
            Output::Propose(proposal) => {
                if !self.cut[i]
                    && !self.drop_proposals
                    && self.group.apply_isr(&proposal).is_ok()
                    && !self.silent_proposals
                {
                    self.publish_group();
                }
            }
            answer => self.answers.push(answer),
        }
    }

    fn acked(&self, request: u64) -> Option<(Offset, u32)> {
        self.answers.iter().find_map(|a| match a {
            Output::Ack { request: r, base, records, .. } if *r == AppendId(request) => {
                Some((*base, *records))
            }
            _ => None,
        })
    }

    fn rejected(&self, request: u64) -> Option<AppendError> {
        self.answers.iter().find_map(|a| match a {
            Output::Reject { request: r, error } if *r == AppendId(request) => Some(error.clone()),
            _ => None,
        })
    }
}

fn op_id(op: &DiskOp) -> DiskOpId {
    op.id()
}

#[test]
fn durable_ack_waits_for_every_in_sync_follower_to_sync() {
    let mut h = Harness::new(3);
    h.auto_disk[2] = false;
    h.append(0, 1, None, AckMode::Durable);
    assert_eq!(h.acked(1), None, "node 2 has not synced");
    assert_eq!(h.nodes[0].committed(), Offset(0), "not visible before the quorum is durable");
    h.complete_disk(2);
    assert_eq!(h.acked(1), Some((Offset(0), 2)));
    assert_eq!(h.nodes[0].committed(), Offset(2));
    for node in &h.nodes {
        assert_eq!(node.log().end(), Offset(2));
    }
}

#[test]
fn written_and_none_acks_do_not_wait_for_followers() {
    let mut h = Harness::new(3);
    h.auto_disk = vec![false; 3];
    h.append(0, 1, None, AckMode::None);
    assert_eq!(h.acked(1), Some((Offset(0), 2)));
    h.append(0, 2, None, AckMode::Written);
    assert_eq!(h.acked(2), None, "not written yet");
    h.complete_disk(0);
    assert_eq!(h.acked(2), Some((Offset(2), 2)));
    assert_eq!(h.nodes[0].committed(), Offset(0), "followers have not synced");
}

#[test]
fn an_expired_lease_stops_acks_at_once() {
    let mut h = Harness::new(3);
    h.auto_disk[1] = false;
    h.append(0, 1, None, AckMode::Durable);
    h.now = h.now.plus_ms(LEASE_MS);
    h.complete_disk(1);
    assert_eq!(h.nodes[0].committed(), Offset(2), "committed, and visible");
    assert_eq!(h.acked(1), None, "but not acked without a lease");
    h.append(0, 2, None, AckMode::Durable);
    assert_eq!(h.rejected(2), Some(AppendError::LeaseExpired));
    h.nodes[0].handle_lease(h.now, LeaseId(1), h.now.plus_ms(LEASE_MS));
    h.pump();
    assert_eq!(h.acked(1), Some((Offset(0), 2)), "acked once the lease is confirmed again");
}

#[test]
fn a_retry_gets_the_original_offsets_even_after_failover() {
    let mut h = Harness::new(3);
    h.append(0, 1, Some((9, 0)), AckMode::Durable);
    h.append(0, 2, Some((9, 0)), AckMode::Durable);
    assert_eq!(h.acked(2), Some((Offset(0), 2)));
    assert_eq!(h.nodes[0].log().end(), Offset(2), "stored once");
    h.cut[0] = true;
    h.elect(ReplicaNumber(1));
    assert_eq!(h.nodes[1].role(), RoleView::Leader { epoch: Epoch(2) });
    h.append(1, 3, Some((9, 0)), AckMode::Durable);
    assert_eq!(h.acked(3), Some((Offset(0), 2)), "the new leader knows the producer's batch");
    h.append(1, 4, Some((9, 1)), AckMode::Durable);
    assert_eq!(h.acked(4), Some((Offset(2), 2)));
    h.append(1, 5, Some((9, 3)), AckMode::Durable);
    assert_eq!(h.rejected(5), Some(AppendError::OutOfOrderSequence));
}

#[test]
fn an_idle_producer_expires_on_every_replica_and_starts_again_where_it_says() {
    let limits = ProducerLimits { expiry_ms: 1_000, max: 16 };
    let mut h = Harness::with_config(3, ReplicaConfig { producers: limits, ..Default::default() });
    h.append(0, 1, Some((9, 0)), AckMode::Durable);
    h.append(0, 2, Some((9, 1)), AckMode::Durable);
    assert_eq!(h.acked(2), Some((Offset(2), 2)));
    // Another producer appends 1.5 s later: producer 9 has been idle more than the expiry by
    // the log clock, on every replica alike.
    h.advance(1_500);
    h.append(0, 3, Some((5, 0)), AckMode::Durable);
    assert_eq!(h.acked(3), Some((Offset(4), 2)));
    for node in &h.nodes {
        assert_eq!(node.log().producer_ids(), vec![5], "{:?}", node.role());
        assert_eq!(node.log().producers_forgotten(), (1, 0));
    }
    // Its next batch: refused while it may have earlier ones on the way, taken when it says it
    // has none.
    h.append(0, 4, Some((9, 2)), AckMode::Durable);
    assert_eq!(h.rejected(4), Some(AppendError::OutOfOrderSequence));
    h.append_oldest(0, 5, (9, 2));
    assert_eq!(h.acked(5), Some((Offset(6), 2)));
    h.append(0, 6, Some((9, 3)), AckMode::Durable);
    assert_eq!(h.acked(6), Some((Offset(8), 2)), "known again: the next sequence follows");
    // The limit of exactly-once: a batch retried after its producer expired is stored again.
    h.advance(1_500);
    h.append(0, 7, Some((5, 1)), AckMode::Durable);
    h.append_oldest(0, 8, (9, 3));
    assert_eq!(h.acked(8), Some((Offset(12), 2)), "stored twice, as documented");
}

#[test]
fn the_producer_table_keeps_the_most_recent_producers_within_its_bound() {
    let limits = ProducerLimits { expiry_ms: u64::MAX, max: 2 };
    let mut h = Harness::with_config(3, ReplicaConfig { producers: limits, ..Default::default() });
    for (request, producer) in [(1, 1), (2, 2), (3, 1), (4, 3)] {
        h.append(
            0,
            request,
            Some((producer, u32::from(request > 2 && producer == 1))),
            AckMode::Durable,
        );
        assert!(h.acked(request).is_some());
    }
    for node in &h.nodes {
        assert_eq!(node.log().producer_ids(), vec![1, 3], "producer 2 was the oldest idle");
        assert_eq!(node.log().producers_forgotten(), (0, 1));
    }
    // A producer the bound forgot is unknown again.
    h.append(0, 5, Some((2, 1)), AckMode::Durable);
    assert_eq!(h.rejected(5), Some(AppendError::OutOfOrderSequence));
}

#[test]
fn a_retry_with_another_record_count_is_refused_not_acked() {
    let mut h = Harness::new(3);
    h.append(0, 1, Some((9, 0)), AckMode::Durable);
    assert_eq!(h.acked(1), Some((Offset(0), 2)));
    h.append(0, 2, Some((9, 1)), AckMode::Durable);
    // Same producer and sequence as the first batch, but 3 records: acking it at offset 0
    // would cover offset 2, which holds the second batch.
    h.append_records(0, 3, Some((9, 0)), AckMode::Durable, 3);
    assert_eq!(h.acked(3), None);
    assert_eq!(h.rejected(3), Some(AppendError::SequenceMismatch { stored: 2, retry: 3 }));
    assert_eq!(h.nodes[0].log().end(), Offset(4), "nothing stored for it");
    // The faithful retry still gets the original offsets.
    h.append(0, 4, Some((9, 0)), AckMode::Durable);
    assert_eq!(h.acked(4), Some((Offset(0), 2)));
}

/// Node 0 leads and holds an uncommitted batch at offset 2 (its followers were cut off); then,
/// with node 0 away, node 1 leads epoch 2 and commits another batch at 2. Node 0 stays cut off.
fn old_leader_with_a_suffix_the_new_leader_overwrote() -> Harness {
    let mut h = Harness::new(3);
    h.append(0, 1, None, AckMode::Durable);
    h.cut[1] = true;
    h.cut[2] = true;
    h.append(0, 2, None, AckMode::Durable);
    assert_eq!(h.nodes[0].log().end(), Offset(4), "an uncommitted suffix on the old leader");
    h.cut = vec![true, false, false];
    h.elect(ReplicaNumber(1));
    h.append(1, 3, None, AckMode::Durable);
    assert_eq!(h.acked(3), Some((Offset(2), 2)));
    h
}

#[test]
fn a_follower_truncates_what_the_new_leader_does_not_have() {
    let mut h = old_leader_with_a_suffix_the_new_leader_overwrote();
    // Node 0 comes back as a follower of epoch 2 and must drop its epoch-1 batch at 2.
    h.cut[0] = false;
    h.nodes[0].handle_controller(h.now, h.group.clone());
    h.pump();
    h.advance(1_000);
    assert_eq!(h.nodes[0].stats().batches_truncated, 1);
    assert_eq!(h.nodes[0].log().batches(), h.nodes[1].log().batches());
}

#[test]
fn readers_of_a_follower_stop_at_a_truncation_storage_has_not_applied() {
    let mut h = old_leader_with_a_suffix_the_new_leader_overwrote();
    // Node 0 comes back with its disk stalled: it truncates to 2 in memory and refetches, but
    // storage still holds its own epoch-1 batch at 2 until the truncation completes.
    h.auto_disk[0] = false;
    h.cut[0] = false;
    h.nodes[0].handle_controller(h.now, h.group.clone());
    h.pump();
    h.advance(200);
    assert_eq!(h.nodes[0].log().batches(), h.nodes[1].log().batches());
    assert_eq!(h.nodes[0].committed(), Offset(4), "the leader's commit point, learned in memory");
    assert_eq!(h.nodes[0].visible_end(), Offset(2), "readers stop where storage is the log's");
    h.complete_disk(0);
    assert_eq!(h.nodes[0].visible_end(), Offset(4));
}

#[test]
fn a_lagging_follower_is_shrunk_out_then_rejoins() {
    let mut h = Harness::new(3);
    h.cut[2] = true;
    h.append(0, 1, None, AckMode::Durable);
    assert_eq!(h.acked(1), None, "node 2 is in sync and has not synced");
    h.advance(ReplicaConfig::default().isr_lag_max_ms + 100);
    assert!(!h.group.isr.contains(&ReplicaNumber(2)), "shrunk out by compare-and-swap");
    assert_eq!(h.acked(1), Some((Offset(0), 2)), "committed by the smaller in-sync set");
    h.cut[2] = false;
    h.nodes[2].handle_controller(h.now, h.group.clone());
    h.advance(600);
    assert!(h.group.isr.contains(&ReplicaNumber(2)), "caught up and back in sync");
    assert_eq!(h.nodes[2].log().end(), Offset(2));
}

#[test]
fn a_silent_follower_leaves_the_isr_long_before_the_lag_limit() {
    let config = ReplicaConfig::for_replicas(3);
    let (silence_ms, lag_max_ms) = (config.follower_silence_ms, config.isr_lag_max_ms);
    let mut h = Harness::with_config(3, config);
    h.append(0, 1, None, AckMode::Durable);
    assert_eq!(h.acked(1), Some((Offset(0), 2)), "all three in sync");
    h.advance(100);
    // Node 2 crashes: its parked fetch is answered by the next append and nothing comes back.
    h.cut[2] = true;
    let struck = h.now;
    h.append(0, 2, None, AckMode::Durable);
    assert_eq!(h.acked(2), None, "node 2 is in sync and has not synced");
    h.advance(silence_ms - 10);
    assert!(h.group.isr.contains(&ReplicaNumber(2)), "not before the silence limit");
    assert_eq!(h.acked(2), None);
    h.advance(30);
    assert!(!h.group.isr.contains(&ReplicaNumber(2)), "shrunk out after the silence limit");
    assert_eq!(h.acked(2), Some((Offset(2), 2)), "committed by the two left");
    assert!(h.now.since_ms(struck) <= silence_ms + 20 && silence_ms + 20 < lag_max_ms);
}

#[test]
fn a_follower_with_a_slow_disk_is_not_silent_only_slow() {
    let config = ReplicaConfig::for_replicas(3);
    let (silence_ms, lag_max_ms) = (config.follower_silence_ms, config.isr_lag_max_ms);
    let mut h = Harness::with_config(3, config);
    h.auto_disk[2] = false;
    h.append(0, 1, None, AckMode::Durable);
    // Node 2 keeps fetching (it is alive) but its disk never completes: it is not silent, so
    // only the lag limit removes it.
    h.advance(10 * silence_ms);
    assert!(h.group.isr.contains(&ReplicaNumber(2)), "a live follower is kept for the lag limit");
    assert_eq!(h.acked(1), None);
    h.advance(lag_max_ms);
    assert!(!h.group.isr.contains(&ReplicaNumber(2)), "then shrunk out as slow");
    assert_eq!(h.acked(1), Some((Offset(0), 2)));
}

#[test]
fn too_few_in_sync_replicas_refuse_durable_appends() {
    let mut h = Harness::new(3);
    h.cut[1] = true;
    h.cut[2] = true;
    h.advance(ReplicaConfig::default().isr_lag_max_ms + 100);
    assert_eq!(h.group.isr.len(), 1);
    h.append(0, 1, None, AckMode::Durable);
    assert_eq!(h.rejected(1), Some(AppendError::NotEnoughReplicas { insync: 1, min_insync: 2 }));
    h.append(0, 2, None, AckMode::Written);
    assert_eq!(h.acked(2), Some((Offset(0), 2)), "written appends still go");
}

#[test]
fn a_restarted_leader_does_not_resume_its_old_epoch() {
    let mut h = Harness::new(3);
    h.append(0, 1, None, AckMode::Durable);
    // The process restarts: same node id, a new lease; the group still names the old lease.
    let log = ReplicaLog::from_batches(h.nodes[0].log().batches().to_vec()).unwrap();
    h.nodes[0] = Replica::new(ReplicaNumber(0), ReplicaConfig::for_replicas(3), log);
    h.nodes[0].handle_lease(h.now, LeaseId(100), h.now.plus_ms(LEASE_MS));
    h.nodes[0].handle_controller(h.now, h.group.clone());
    assert_eq!(h.nodes[0].role(), RoleView::Idle);
    h.append(0, 2, None, AckMode::Durable);
    assert!(matches!(h.rejected(2), Some(AppendError::NotLeader { .. })));
}

#[test]
fn fetch_replies_are_bounded() {
    let config = ReplicaConfig { fetch_bytes_max: 300, ..ReplicaConfig::for_replicas(2) };
    let mut h = Harness::with_config(2, config);
    h.cut[1] = true;
    for r in 10..30 {
        h.append(0, r, None, AckMode::Written);
    }
    let fetch = Message::Fetch { epoch: Epoch(1), from: Offset(0), durable_end: Offset(0) };
    h.nodes[0].handle_message(h.now, ReplicaNumber(1), fetch);
    let mut sent = Vec::new();
    while let Some(output) = h.nodes[0].poll() {
        if let Output::Send { message: Message::FetchReply { batches, .. }, .. } = output {
            sent.push(batches.len());
        }
    }
    // Each batch costs 48 + 8 payload bytes: five fit in 300.
    assert_eq!(sent, vec![5]);
}

#[test]
fn a_follower_behind_the_archive_catches_up_from_storage() {
    let config = ReplicaConfig {
        fetch_bytes_max: 300,
        archive_min_batches: 4,
        ..ReplicaConfig::for_replicas(3)
    };
    let mut h = Harness::with_config(3, config);
    h.cut[2] = true;
    h.advance(ReplicaConfig::default().isr_lag_max_ms + 100);
    for r in 10..40 {
        h.append(0, r, Some((9, (r - 10) as u32)), AckMode::Durable);
        assert!(h.acked(r).is_some(), "committed by nodes 0 and 1");
    }
    assert_eq!(h.nodes[0].archive(Offset(56)), 28, "only the committed prefix, 56 records");
    assert_eq!(h.nodes[0].log().batches().len(), 2, "and it leaves memory");
    assert_eq!(h.nodes[0].archive(Offset(60)), 0, "fewer than archive_min_batches");
    // Node 2 comes back with nothing: its first replies are read from storage.
    h.cut[2] = false;
    h.nodes[2].handle_controller(h.now, h.group.clone());
    h.advance(1_000);
    assert_eq!(h.nodes[2].log().batches(), &h.stored[0][..], "the whole log, in order");
    assert!(h.group.isr.contains(&ReplicaNumber(2)), "back in sync");
    let stats = h.nodes[0].stats();
    assert_eq!(stats.batches_archived, 28);
    // Five 56-byte batches fit a 300-byte reply: at least six replies for the 28 archived (a
    // fetch that reports a new durable end is answered again from the same offset).
    assert!(stats.fetches_from_log >= 6, "{stats:?}");
    // A retry of an archived batch is still answered with its offsets, and the next is new.
    h.append(0, 99, Some((9, 25)), AckMode::Durable);
    assert_eq!(h.acked(99), Some((Offset(50), 2)), "seq 25, archived, at 50");
    h.append(0, 100, Some((9, 30)), AckMode::Durable);
    assert_eq!(h.acked(100), Some((Offset(60), 2)));
}

#[test]
fn a_single_replica_commits_on_its_own_sync() {
    let mut h = Harness::new(1);
    h.auto_disk[0] = false;
    h.append(0, 1, Some((1, 0)), AckMode::Durable);
    assert_eq!(h.acked(1), None, "not synced yet");
    h.complete_disk(0);
    assert_eq!(h.acked(1), Some((Offset(0), 2)));
    assert_eq!(h.nodes[0].committed(), Offset(2));
}

#[test]
fn a_follower_only_names_another_node_as_leader() {
    let mut h = Harness::new(3);
    h.append(1, 1, None, AckMode::Durable);
    assert_eq!(h.rejected(1), Some(AppendError::NotLeader { leader: Some(ReplicaNumber(0)) }));
    // A restarted leader (new lease) does not send clients to itself.
    h.nodes[0] =
        Replica::new(ReplicaNumber(0), ReplicaConfig::for_replicas(3), ReplicaLog::default());
    h.nodes[0].handle_lease(h.now, LeaseId(100), h.now.plus_ms(LEASE_MS));
    h.nodes[0].handle_controller(h.now, h.group.clone());
    h.append(0, 2, None, AckMode::Durable);
    assert_eq!(h.rejected(2), Some(AppendError::NotLeader { leader: None }));
}

/// Found by the simulator (seed 7084181): a leader whose expansion the controller applied
/// without the answer reaching it, and whose lease changed and came back (it stepped down and
/// led the same epoch again), committed on the old in-sync set alone, while the controller's
/// set held a follower without the batch: that follower could be elected and lose it.
#[test]
fn a_proposal_stays_pending_across_a_leadership_of_the_same_epoch() {
    let mut h = Harness::new(3);
    h.cut[1] = true;
    h.cut[2] = true;
    h.advance(ReplicaConfig::default().isr_lag_max_ms + 100);
    assert_eq!(h.group.isr.len(), 1, "shrunk to the leader");
    // Node 1 comes back and catches up; the controller applies the expansion, silently.
    h.cut[1] = false;
    h.silent_proposals = true;
    h.nodes[1].handle_controller(h.now, h.group.clone());
    h.advance(600);
    assert!(h.group.isr.contains(&ReplicaNumber(1)), "the controller applied the expansion");
    assert!(
        !h.nodes[0].group().unwrap().isr.contains(&ReplicaNumber(1)),
        "the leader was not told"
    );
    // The leader's lease changes and comes back: it steps down, then leads epoch 1 again.
    let epoch = h.group.epoch;
    h.nodes[0].handle_lease(h.now, LeaseId(50), h.now.plus_ms(LEASE_MS));
    assert_eq!(h.nodes[0].role(), RoleView::Idle);
    h.nodes[0].handle_lease(h.now, LeaseId(1), h.now.plus_ms(LEASE_MS));
    assert_eq!(h.nodes[0].role(), RoleView::Leader { epoch });
    // Node 1, in the controller's in-sync set, gets nothing more.
    h.cut[1] = true;
    h.append(0, 1, None, AckMode::Written);
    assert_eq!(h.acked(1), Some((Offset(0), 2)), "written locally");
    assert_eq!(h.nodes[0].durable_end(), Offset(2));
    assert_eq!(h.nodes[0].committed(), Offset(0), "committed without node 1, in sync");
}

#[test]
fn a_lost_shrink_proposal_is_sent_again() {
    let mut h = Harness::new(3);
    h.cut[2] = true;
    h.drop_proposals = true;
    h.append(0, 1, None, AckMode::Durable);
    h.advance(ReplicaConfig::default().isr_lag_max_ms + 100);
    assert!(h.group.isr.contains(&ReplicaNumber(2)), "the proposal was lost");
    h.drop_proposals = false;
    h.advance(ReplicaConfig::default().propose_retry_ms + 100);
    assert!(!h.group.isr.contains(&ReplicaNumber(2)), "resent while the laggard is still behind");
    assert_eq!(h.acked(1), Some((Offset(0), 2)));
}

/// Issue 41, item 7: an append the leader already took into its log, refused because the
/// leader stepped down before it committed, says its outcome is unknown (the new leader holds
/// it here and may commit it), never "not the leader", which claims nothing was stored and
/// made plain producers store such batches twice. An append refused before it was taken still
/// says nothing was stored.
#[test]
fn a_waiting_append_refused_at_a_step_down_has_an_unknown_outcome() {
    let mut h = Harness::new(3);
    h.auto_disk[1] = false;
    h.auto_disk[2] = false;
    h.append(0, 1, None, AckMode::Durable);
    assert_eq!(h.nodes[0].log().end(), Offset(2), "taken into the leader's log");
    assert_eq!(h.acked(1), None, "not committed: the followers have not synced");
    h.elect(ReplicaNumber(1));
    let refused = h.rejected(1);
    assert_eq!(refused, Some(AppendError::OutcomeUnknown { leader: Some(ReplicaNumber(1)) }));
    assert!(refused.is_some_and(|e| e.outcome_unknown()));
    assert_eq!(h.nodes[1].log().end(), Offset(2), "the new leader holds the batch");
    h.append(0, 2, None, AckMode::Durable);
    let before = h.rejected(2);
    assert_eq!(before, Some(AppendError::NotLeader { leader: Some(ReplicaNumber(1)) }));
    assert!(before.is_some_and(|e| !e.outcome_unknown()), "refused before it was taken");
}
