//! A producer: one batch in flight, retried (to the leader it was told of, else a random
//! replica) until acknowledged. Most are idempotent and durable, the ones the checker follows;
//! some send untagged `Written` batches, whose retries may be stored twice, to mix the load.

use bytes::Bytes;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use felix_replication::error::AppendError;
use felix_replication::types::{
    AckMode, AppendId, ProducerId, ProducerSeq, ReplicaNumber, Seq, Time,
};
use felix_replication::AppendRequest;

/// A request unanswered this long is sent again, ms.
pub const PRODUCER_RETRY_MS: u64 = 150;
/// After a refusal, wait this long before retrying, ms.
pub const PRODUCER_BACKOFF_MS: u64 = 20;
/// Records per batch at most.
pub const PRODUCER_RECORDS_MAX: u32 = 4;

/// One simulated producer.
pub struct Producer {
    /// Its id (its index + 1).
    pub id: ProducerId,
    /// Idempotent and durable: its acks are checked. Otherwise untagged `Written` batches.
    pub checked: bool,
    next_seq: u32,
    total: u32,
    target: ReplicaNumber,
    in_flight: Option<InFlight>,
}

struct InFlight {
    seq: Seq,
    records: u32,
    payload: Bytes,
    resend_at: Time,
}

impl Producer {
    /// A producer that will send `total` batches, first to `target`.
    pub fn new(id: ProducerId, checked: bool, total: u32, target: ReplicaNumber) -> Producer {
        Producer { id, checked, next_seq: 0, total, target, in_flight: None }
    }

    /// Whether all its batches were acknowledged.
    pub fn done(&self) -> bool {
        self.in_flight.is_none() && self.next_seq >= self.total
    }

    /// Batches acknowledged so far.
    pub fn acked(&self) -> u32 {
        self.next_seq
    }

    /// The append to send now, if any (a new batch, or a retry that is due).
    pub fn tick(
        &mut self,
        now: Time,
        request: AppendId,
        rng: &mut ChaCha8Rng,
    ) -> Option<(ReplicaNumber, AppendRequest)> {
        if self.in_flight.is_none() && self.next_seq < self.total {
            let seq = Seq(self.next_seq);
            let payload = Bytes::from(format!("p{}-s{}", self.id.0, seq.0));
            let records = rng.gen_range(1..=PRODUCER_RECORDS_MAX);
            self.in_flight = Some(InFlight { seq, records, payload, resend_at: now });
        }
        let flight = self.in_flight.as_mut()?;
        if now < flight.resend_at {
            return None;
        }
        flight.resend_at = now.plus_ms(PRODUCER_RETRY_MS);
        let append = AppendRequest {
            request,
            producer: Some(ProducerSeq { producer: self.id, seq: flight.seq })
                .filter(|_| self.checked),
            records: flight.records,
            // True: one batch in flight, so none earlier is unresolved; sometimes left out
            // (also true), so both rules for an unknown producer run.
            oldest_pending: rng.gen_bool(0.5),
            // The leader's clock sets it (the world, on delivery).
            time_ms: 0,
            payload: flight.payload.clone(),
            mode: if self.checked { AckMode::Durable } else { AckMode::Written },
        };
        Some((self.target, append))
    }

    /// An acknowledgement of sequence `seq` arrived: the next batch may go.
    pub fn on_ack(&mut self, seq: Seq) {
        if self.in_flight.as_ref().is_some_and(|f| f.seq == seq) {
            self.in_flight = None;
            self.next_seq += 1;
        }
    }

    /// A refusal of sequence `seq`: retry soon, at the named leader or a random replica.
    pub fn on_reject(
        &mut self,
        now: Time,
        seq: Seq,
        error: &AppendError,
        replicas: &[ReplicaNumber],
        rng: &mut ChaCha8Rng,
    ) {
        let Some(flight) = self.in_flight.as_mut().filter(|f| f.seq == seq) else { return };
        self.target = match error {
            AppendError::NotLeader { leader: Some(leader) }
            | AppendError::OutcomeUnknown { leader: Some(leader) } => *leader,
            _ => super::pick(rng, replicas).unwrap_or(self.target),
        };
        flight.resend_at = now.plus_ms(PRODUCER_BACKOFF_MS);
    }

    /// A request timed out without an answer: also try another replica next time.
    pub fn retarget(&mut self, replicas: &[ReplicaNumber], rng: &mut ChaCha8Rng) {
        if let Some(node) = super::pick(rng, replicas) {
            self.target = node;
        }
    }

    /// Whether a retry is due (the last send went unanswered).
    pub fn retry_due(&self, now: Time) -> bool {
        self.in_flight.as_ref().is_some_and(|f| now >= f.resend_at)
    }

    /// The sequence in flight, if any.
    pub fn in_flight_seq(&self) -> Option<Seq> {
        self.in_flight.as_ref().map(|f| f.seq)
    }
}
