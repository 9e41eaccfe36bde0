//! A cluster's retries of an acked batch: `Resend` keeps what sending a batch again needs, and
//! follows a refusal (`NotOwner`, `ShardUnavailable`) or, for an idempotent batch, an unknown
//! outcome (lost connection, ack timeout) or `OutOfOrderSequence`, to the shard's owner
//! (`crate::cluster::Cluster::follow`), until the batch's retry time is over.

use bytes::Bytes;
use felix_proto::{shard_for_key, AckMode, AckRequest, ErrorCode, Frame, ProducerTag, Publish};

use crate::batch::{BatchResult, Completion};
use crate::cluster::{unavailable, Cluster};
use crate::error::ClientError;
use crate::producer::outcome_unknown;

/// An acked batch kept for sending again in a cluster.
#[derive(Clone)]
pub(crate) struct Resend {
    pub(crate) stream: String,
    pub(crate) key: Option<Bytes>,
    pub(crate) producer: Option<ProducerTag>,
    pub(crate) records: Vec<felix_proto::Payload>,
    pub(crate) mode: AckMode,
    /// How long an idempotent batch is retried (`PublishSettings::retry_timeout_ms`).
    pub(crate) retry_ms: u64,
}

impl Resend {
    /// Follows `first` (see `Cluster::follow`): a NotOwner or ShardUnavailable answer sends
    /// the batch again, on the control lane of the owner's connection for its shard. An
    /// idempotent batch is also sent again when its outcome is unknown (the connection was
    /// lost, or the ack timed out: its broker may have died, and the shard's next leader
    /// stores a repeat once) or came before an earlier batch of its producer
    /// (`OutOfOrderSequence`: that one is being sent again too), until its retry timeout.
    pub(crate) async fn follow(
        &self,
        cluster: &Cluster,
        first: Result<Frame, ClientError>,
    ) -> Result<Frame, ClientError> {
        let shard = match (&self.key, cluster.cached_shards(&self.stream)) {
            (Some(key), Some(n)) => Some(shard_for_key(key, n)),
            _ => None,
        };
        let patience = self.producer.map(|_| self.retry_ms);
        cluster
            .follow(&self.stream, shard, self.retryable(first), patience, |conn| {
                let batch = self.clone();
                async move {
                    let id = conn.next_request_id();
                    let frame = Frame::Publish(Publish {
                        ack: Some(AckRequest { request_id: id, mode: batch.mode }),
                        key: batch.key.clone(),
                        producer: batch.producer,
                        stream: batch.stream.clone(),
                        records: batch.records.clone(),
                    });
                    let answer = conn.request(id, &frame).await;
                    if let Err(e @ ClientError::Timeout { .. }) = &answer {
                        cluster.mark_unreachable(conn.peer(), e.clone());
                    }
                    batch.retryable(answer)
                }
            })
            .await
    }

    /// `answer`, with the failures an idempotent batch retries turned into `ShardUnavailable`.
    fn retryable(&self, answer: Result<Frame, ClientError>) -> Result<Frame, ClientError> {
        match answer {
            Err(e) if self.producer.is_some() && outcome_unknown(&e) => {
                Err(unavailable(&self.stream, None))
            }
            Err(ClientError::Broker { code: ErrorCode::OutOfOrderSequence, .. })
                if self.producer.is_some() =>
            {
                Err(unavailable(&self.stream, None))
            }
            other => other,
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
