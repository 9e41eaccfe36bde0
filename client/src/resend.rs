//! A cluster's retries of an acked batch: `Resend` keeps what sending a batch again needs, and
//! follows a refusal (`NotOwner`, `ShardUnavailable`) or, for an idempotent batch, an unknown
//! outcome (lost connection, ack timeout), a stopping broker (`ShuttingDown`) or
//! `OutOfOrderSequence`, to the shard's owner (`crate::cluster::Cluster::follow`), until the
//! batch's retry time is over.
//!
//! An idempotent batch does not wait for its broker's answer for ever: while no answer comes,
//! the placement is looked at again ([`Resend::wait_or_leave`]), and once its shard has left
//! that broker (a new leader, or the old one's lease gone) the batch is sent to the shard's
//! next owner, which stores it once whatever the old one did. A broker that died (kill -9,
//! paused, cut off) keeps its connections open in the client's view until the idle timeout;
//! this is what keeps the client from waiting for that.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use felix_proto::{
    shard_for_key, AckMode, AckRequest, Capabilities, ErrorCode, Frame, ProducerTag, Publish,
    ShardId,
};

use crate::batch::{BatchResult, Completion};
use crate::cluster::{
    conn_answers, unavailable, Cluster, ANSWER_SUSPECT_MS, OWNER_CHECK_INTERVAL_MS,
};
use crate::conn::Conn;
use crate::error::ClientError;
use crate::producer::{outcome_unknown, ProducerShared};

/// An acked batch kept for sending again in a cluster.
#[derive(Clone)]
pub(crate) struct Resend {
    pub(crate) stream: String,
    pub(crate) key: Option<Bytes>,
    /// The shard of a tagged batch (its key's, or its producer's for an unkeyed one).
    pub(crate) shard: Option<ShardId>,
    pub(crate) producer: Option<ProducerTag>,
    /// Its producer's window: whether an earlier batch of it is still unresolved.
    pub(crate) producer_shared: Option<Arc<ProducerShared>>,
    pub(crate) records: Vec<felix_proto::Payload>,
    pub(crate) mode: AckMode,
    /// How long an idempotent batch is retried (`PublishSettings::retry_timeout_ms`).
    pub(crate) retry_ms: u64,
}

impl Resend {
    /// Follows `first` (see `Cluster::follow`): a NotOwner or ShardUnavailable answer sends
    /// the batch again, on the control lane of the owner's connection for its shard. An
    /// idempotent batch is also sent again when its outcome is unknown (the connection was
    /// lost, the ack timed out, or its shard left the broker while the ack was awaited: the
    /// shard's next leader stores a repeat once), when its broker is stopping
    /// (`ShuttingDown`), or when it came before an earlier batch of its producer
    /// (`OutOfOrderSequence`: that one is being sent again too), until its retry timeout.
    /// Such a batch goes at once to the shard's owner when the cached placement names a live
    /// one that is not penalized.
    pub(crate) async fn follow(
        &self,
        cluster: &Cluster,
        first: Result<Frame, ClientError>,
    ) -> Result<Frame, ClientError> {
        let shard = self.shard(cluster);
        let patience = self.producer.map(|_| self.retry_ms);
        let mut first = self.retryable(first);
        if first.as_ref().is_err_and(ClientError::is_shard_unavailable) {
            if let Some(owner) = shard.and_then(|s| cluster.live_owner(&self.stream, s)) {
                if let Ok(conn) = cluster.conn_at(&owner, shard).await {
                    first = self.send_on(cluster, conn).await;
                }
            }
        }
        let send = |conn| self.send_on(cluster, conn);
        cluster.follow(&self.stream, shard, first, patience, send).await
    }

    /// Sends the batch on `conn`'s control lane and waits for its answer (or, idempotent, for
    /// its shard to leave that broker).
    async fn send_on(&self, cluster: &Cluster, conn: Arc<Conn>) -> Result<Frame, ClientError> {
        let id = conn.next_request_id();
        let oldest_pending = conn.capabilities().contains(Capabilities::OLDEST_PENDING)
            && self
                .producer
                .zip(self.producer_shared.as_ref())
                .is_some_and(|(t, p)| p.is_oldest(t.seq));
        let frame = Frame::Publish(Publish {
            oldest_pending,
            ack: Some(AckRequest { request_id: id, mode: self.mode }),
            key: self.key.clone(),
            producer: self.producer,
            stream: self.stream.clone(),
            records: self.records.clone(),
        });
        let peer = conn.peer();
        let answer = self.wait_or_leave(cluster, &conn, conn.request(id, &frame)).await;
        note_failure(cluster, peer, &answer);
        self.retryable(answer)
    }

    /// `answer` (the broker on `conn` answering this batch), or, for an idempotent batch with
    /// no answer after [`ANSWER_SUSPECT_MS`], a lost connection as soon as its shard has left
    /// that broker ([`Cluster::owner_moved`], looked at every [`OWNER_CHECK_INTERVAL_MS`]; the
    /// broker is then penalized), or as soon as the broker, still the owner, does not answer a
    /// probe on that connection (`conn_answers`: the connection is closed). A batch that is not
    /// idempotent waits for its answer: its outcome would be unknown, and it cannot be sent
    /// again.
    pub(crate) async fn wait_or_leave(
        &self,
        cluster: &Cluster,
        conn: &Arc<Conn>,
        answer: impl Future<Output = Result<Frame, ClientError>>,
    ) -> Result<Frame, ClientError> {
        let peer = conn.peer();
        let (Some(_), Some(shard)) = (self.producer, self.shard(cluster)) else {
            return answer.await;
        };
        tokio::pin!(answer);
        let mut check = tokio::time::Instant::now() + Duration::from_millis(ANSWER_SUSPECT_MS);
        loop {
            tokio::select! {
                a = &mut answer => return a,
                _ = tokio::time::sleep_until(check) => {}
            }
            if cluster.owner_moved(&self.stream, shard, peer).await {
                // An answer that came meanwhile still counts.
                tokio::select! {
                    biased;
                    a = &mut answer => return a,
                    _ = std::future::ready(()) => {}
                }
                tracing::debug!(broker = %peer, stream = self.stream, shard = shard.0, "no ack, and the shard has a new owner: sending the batch there");
                let e = ClientError::ConnectionLost(format!(
                    "no answer from {peer}, and shard {} of {} has left it",
                    shard.0, self.stream
                ));
                cluster.mark_unreachable(peer, e.clone());
                return Err(e);
            }
            // Still the owner: it must at least answer (a broker restarted on its address
            // does not know this connection, which stays open until the idle timeout).
            if !conn_answers(conn, &self.stream).await {
                let e = ClientError::ConnectionLost(format!("{peer} does not answer"));
                cluster.mark_unreachable(peer, e.clone());
                return Err(e);
            }
            check = tokio::time::Instant::now() + Duration::from_millis(OWNER_CHECK_INTERVAL_MS);
        }
    }

    /// The batch's shard: its producer's, or its key's by the cached placement.
    fn shard(&self, cluster: &Cluster) -> Option<ShardId> {
        self.shard.or_else(|| match (&self.key, cluster.cached_shards(&self.stream)) {
            (Some(key), Some(n)) => Some(shard_for_key(key, n)),
            _ => None,
        })
    }

    /// `answer`, with the failures an idempotent batch retries turned into `ShardUnavailable`
    /// (`OutOfOrderSequence` is left for `Cluster::follow`, which sends it again soon).
    fn retryable(&self, answer: Result<Frame, ClientError>) -> Result<Frame, ClientError> {
        match answer {
            Err(e) if self.producer.is_some() && (outcome_unknown(&e) || is_shutting_down(&e)) => {
                Err(unavailable(&self.stream, self.shard))
            }
            other => other,
        }
    }
}

/// Whether the broker answered that it is stopping. For an idempotent batch a retry elsewhere
/// is safe whatever it stored; a plain batch may have been stored (the broker answers so for
/// an append its owner core did not confirm), so it is not sent again.
pub(crate) fn is_shutting_down(e: &ClientError) -> bool {
    matches!(e, ClientError::Broker { code: ErrorCode::ShuttingDown, .. })
}

/// Penalizes the broker at `peer` when its answer says it is gone or going: a lost
/// connection, a timeout, `ShuttingDown`.
pub(crate) fn note_failure(
    cluster: &Cluster,
    peer: SocketAddr,
    answer: &Result<Frame, ClientError>,
) {
    if let Err(e) = answer {
        if outcome_unknown(e) || is_shutting_down(e) {
            cluster.mark_unreachable(peer, e.clone());
        }
    }
}

/// Resolves a batch of `count` records with its ack (or failure).
pub(crate) fn resolve(completion: Completion, count: usize, answer: Result<Frame, ClientError>) {
    let result = match answer {
        Ok(Frame::PublishAck(ack)) if ack.count as usize == count => {
            BatchResult::Acked { shard: ack.shard, base: ack.base_offset }
        }
        Ok(Frame::PublishAck(ack)) => BatchResult::Failed(ClientError::Protocol(format!(
            "ack for {} records of {count}",
            ack.count
        ))),
        Ok(other) => {
            BatchResult::Failed(crate::conn::unexpected(&other, felix_proto::FrameType::PublishAck))
        }
        Err(e) => BatchResult::Failed(e),
    };
    completion.resolve(result);
}
