//! Resuming a subscription's part after its connection was lost or its broker stopped: where
//! each shard starts again, which failures another attempt may fix, the backoff between
//! attempts, and the [`SubscriptionState`] a caller can watch.
//!
//! A part resumes each of its shards at its next offset (`Subscriber::next_offsets`: after the
//! last record returned, else where the broker said the shard started), with `Subscribe` flag
//! `POSITIONS`. That holds whatever the subscription's start and group, on one broker and
//! after a failover (offsets are the same on every replica). Only a broker without
//! `SUBSCRIBE_POSITIONS` gets the older rules of [`Subscriber::fallback_start`].

use std::time::{Duration, Instant};

use felix_proto::{ErrorCode, ShardId, StartAt};

use super::open::{open_at_home, open_in_cluster, Start, NO_POSITIONS};
use super::{Part, Subscriber};
use crate::error::ClientError;

/// What a subscription is doing about its connections (see [`Subscriber::state`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubscriptionState {
    /// Every part is open (or has ended), after this many resumes ([`Subscriber::resumes`]):
    /// a resume that failed leaves the count as it was.
    Reading {
        /// The resumes so far.
        resumes: u64,
    },
    /// Parts lost their connection (or their broker is stopping) and are being opened again.
    Resuming {
        /// When the first of them was found lost.
        since: Instant,
        /// The attempts that failed since.
        failures: u32,
        /// Why: the loss, then the last failed attempt.
        error: String,
    },
}

impl Subscriber {
    /// Resumes part `i` after `lost` (see [`Subscriber::next`]), then every other part whose
    /// connection is closed or whose broker is stopping (a broker that went away takes all of
    /// the parts it served), so that one outage is one `Resuming` in [`Subscriber::state`].
    /// Returns the error that ended a part that cannot resume.
    pub(super) async fn resume_after(
        &mut self,
        i: usize,
        lost: ClientError,
    ) -> Result<(), ClientError> {
        if !self.options.resume {
            self.parts[i].ended = true;
            return Err(lost);
        }
        // A resume that was cancelled (`next` dropped) and is taken up again keeps its start.
        let since = match &*self.state.borrow() {
            SubscriptionState::Resuming { since, .. } => *since,
            SubscriptionState::Reading { .. } => Instant::now(),
        };
        tracing::warn!(stream = %self.options.stream, error = %lost, "subscription lost its connection; resuming");
        self.state.send_replace(SubscriptionState::Resuming {
            since,
            failures: 0,
            error: lost.to_string(),
        });
        let mut failures = 0u32;
        let mut next = Some(i);
        let outcome = loop {
            let Some(i) = next else { break Ok(()) };
            if let Err(e) = self.resume_part(i, since, &lost, &mut failures).await {
                break Err(e);
            }
            next = self.parts.iter().position(|p| !p.ended && (p.stopping || p.conn.is_closed()));
        };
        self.state.send_replace(SubscriptionState::Reading { resumes: self.resumes });
        outcome
    }

    /// Opens part `i` again, retrying with backoff while the failures are transient and the
    /// subscription's resume timeout allows; ends the part and returns the error otherwise.
    async fn resume_part(
        &mut self,
        i: usize,
        since: Instant,
        lost: &ClientError,
        failures: &mut u32,
    ) -> Result<(), ClientError> {
        if self.parts[i].stopping {
            // The broker closes the connection once it has drained (at most the ack timeout).
            let conn = self.parts[i].conn.clone();
            conn.closed_within(conn.ack_timeout()).await;
        }
        let shards = self.parts[i].shards.clone();
        // Whatever was decoded but not returned from this part is read again.
        self.buffered.retain(|r| !shards.contains(&r.shard));
        let mut fallback = self.fallback_start(&shards);
        let config = &self.client.shared.config;
        let mut backoff =
            Backoff::new(config.reconnect_backoff_min_ms, config.reconnect_backoff_max_ms);
        loop {
            let error = match self.open_again(&shards, fallback).await {
                Ok(fresh) => {
                    self.parts.splice(i..=i, fresh);
                    self.update_shards();
                    self.resumes += 1;
                    let after_ms = since.elapsed().as_millis() as u64;
                    tracing::info!(stream = %self.options.stream, after_ms, "subscription resumed");
                    return Ok(());
                }
                Err(e) => e,
            };
            match error {
                // A broker that cannot place each shard, and no other exact way.
                e if e == NO_POSITIONS => {
                    self.parts[i].ended = true;
                    return Err(lost.clone());
                }
                // Retention deleted records past the position while the part was away (a
                // broker without positions): it continues at the oldest retained one (`next`
                // counts what was skipped); what it returned before is skipped as usual.
                ClientError::Broker { code: ErrorCode::OffsetOutOfRange, message }
                    if matches!(fallback, Some(StartAt::Offset(_))) && shards.len() == 1 =>
                {
                    tracing::warn!(
                        stream = %self.options.stream, ?fallback, %message,
                        "resuming at the oldest retained offset"
                    );
                    fallback = Some(StartAt::Earliest);
                    continue;
                }
                _ => {}
            }
            let out_of_time = self
                .options
                .resume_timeout_ms
                .is_some_and(|ms| since.elapsed() >= Duration::from_millis(ms));
            if !is_transient(&error) || out_of_time {
                tracing::warn!(stream = %self.options.stream, %error, "the subscription cannot resume");
                self.parts[i].ended = true;
                return Err(error);
            }
            *failures += 1;
            let delay = backoff.next_delay();
            tracing::warn!(
                stream = %self.options.stream, %error, failures = *failures,
                retry_in_ms = delay.as_millis() as u64, "resuming the subscription failed"
            );
            self.state.send_replace(SubscriptionState::Resuming {
                since,
                failures: *failures,
                error: error.to_string(),
            });
            tokio::time::sleep(delay).await;
        }
    }

    /// Opens the parts that read `shards` again, each shard at its next offset (or from
    /// `fallback` on a broker without positions).
    async fn open_again(
        &self,
        shards: &[ShardId],
        fallback: Option<StartAt>,
    ) -> Result<Vec<Part>, ClientError> {
        let start = Start::Positions { next: &self.next_offsets, fallback };
        let shards = Some(shards.to_vec());
        match self.client.shared.cluster.clone() {
            Some(cluster) => {
                cluster.invalidate(&self.options.stream);
                let per_core = self.client.shared.config.subscribe_per_core;
                open_in_cluster(&cluster, &self.options, shards, start, per_core).await
            }
            None => open_at_home(&self.client, &self.options, shards, start).await,
        }
    }

    /// Where a resumed part reading `shards` starts on a broker without `SUBSCRIBE_POSITIONS`,
    /// when it can resume without missing records. The broker starts a group's shard at its
    /// commit where it has one, else at the start asked for, and `Latest` then means the end
    /// of the log at the resume: records stored during the outage would be skipped. So a
    /// resume from `Latest` needs a commit (this subscriber's) for every shard it reads, or,
    /// for one shard, what was consumed.
    fn fallback_start(&self, shards: &[ShardId]) -> Option<StartAt> {
        let o = &self.options;
        if let [shard] = shards[..] {
            if let Some(next) = self.consumed.get(&shard) {
                // With a group the broker still prefers the group's commit (the records
                // between it and here are skipped as returned before).
                return Some(StartAt::Offset(*next));
            }
        }
        if o.start != StartAt::Latest {
            // Earliest, an offset or a time: read again, what was returned is skipped.
            return Some(o.start);
        }
        // In a cluster a group's positions live with each shard's leader and are not
        // replicated: after a failover the new leader knows none, and would start at Latest.
        if self.client.shared.cluster.is_some() {
            return None;
        }
        let committed = self.committed_positions();
        (o.group.is_some() && shards.iter().all(|s| committed.contains_key(s))).then_some(o.start)
    }
}

/// The delays between attempts to resume: from the client's `reconnect_backoff_min_ms`,
/// doubling up to `reconnect_backoff_max_ms` (at least 1 ms each).
struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    fn new(min_ms: u64, max_ms: u64) -> Self {
        let min = Duration::from_millis(min_ms.max(1));
        Self { next: min, max: Duration::from_millis(max_ms).max(min) }
    }

    fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (delay * 2).min(self.max);
        delay
    }
}

/// Whether another attempt to open a part may succeed where `e` failed: the broker (or the
/// shard's owner) could not be reached, is stopping or overloaded, or does not serve the shard
/// yet (a failover under way). Refusals that no retry changes (a certificate or token, a stream
/// or shard that does not exist, a closed client, a protocol violation) are final.
fn is_transient(e: &ClientError) -> bool {
    match e {
        ClientError::ConnectionLost(_)
        | ClientError::Connect(_)
        | ClientError::PortUnreachable { .. }
        | ClientError::Timeout { .. }
        | ClientError::Resolve { .. }
        | ClientError::ShardUnavailable { .. }
        | ClientError::NotOwner { .. } => true,
        ClientError::Broker { code, .. } => matches!(
            code,
            ErrorCode::ShuttingDown
                | ErrorCode::Overloaded
                | ErrorCode::ShardUnavailable
                | ErrorCode::NotOwner
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let mut b = Backoff::new(50, 300);
        let delays: Vec<u64> = (0..6).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(delays, [50, 100, 200, 300, 300, 300]);
        // A cap below the start, and a zero start, still give a positive delay.
        assert_eq!(Backoff::new(500, 100).next_delay(), Duration::from_millis(500));
        assert_eq!(Backoff::new(0, 0).next_delay(), Duration::from_millis(1));
    }

    #[test]
    fn an_absent_broker_is_retried_and_a_refusal_is_not() {
        let broker = |code| ClientError::Broker { code, message: String::new() };
        for e in [
            ClientError::ConnectionLost("lost".into()),
            ClientError::Connect("refused".into()),
            ClientError::Timeout { what: "connect", after_ms: 5000 },
            broker(ErrorCode::ShuttingDown),
            broker(ErrorCode::ShardUnavailable),
            broker(ErrorCode::NotOwner),
        ] {
            assert!(is_transient(&e), "{e}");
        }
        for e in [
            ClientError::CertificateRejected("pin".into()),
            ClientError::Refused { code: ErrorCode::InvalidToken, message: String::new() },
            ClientError::Closed,
            broker(ErrorCode::StreamNotFound),
            broker(ErrorCode::InvalidShard),
            broker(ErrorCode::Forbidden),
            broker(ErrorCode::OffsetOutOfRange),
            NO_POSITIONS,
        ] {
            assert!(!is_transient(&e), "{e}");
        }
    }
}
