//! Request ids: which frames carry one at body offset 0, and reading it from a decoded frame
//! or from the raw bytes of one that failed to decode, so that every answer (an error above
//! all) can be matched to its request. docs/protocol.md, "Frame header", states the rule.

use crate::frame::{Frame, RequestId};
use crate::header::{Flags, FrameType, RawHeader};

impl Frame {
    /// The request id at the start of this frame's body, for the types that carry one there
    /// (a Publish only with an ack request); `Error` may carry 0, "no request".
    pub fn request_id(&self) -> Option<RequestId> {
        Some(match self {
            Self::CreateStream(f) => f.request_id,
            Self::DescribeStream(f) | Self::DeleteStream(f) => f.request_id,
            Self::AlterStream(f) => f.request_id,
            Self::StreamInfo(f) => f.request_id,
            Self::ListStreams(f) => f.request_id,
            Self::StreamList(f) => f.request_id,
            Self::Metadata(f) => f.request_id,
            Self::MetadataOk(f) => f.request_id,
            Self::NotOwner(f) => f.request_id,
            Self::Publish(p) => return p.ack.map(|a| a.request_id),
            Self::PublishAck(f) => f.request_id,
            Self::PublishError(e) | Self::Error(e) => e.request_id,
            Self::Subscribe(f) => f.request_id,
            Self::SubscribeOk(f) => f.request_id,
            Self::CommitOffset(f) => f.request_id,
            Self::CommitOk(id) => *id,
            Self::Hello(_)
            | Self::HelloOk(_)
            | Self::SubscriptionStart(_)
            | Self::EventBatch(_)
            | Self::Ping(_)
            | Self::Pong(_)
            | Self::Replicate(_) => return None,
        })
    }
}

/// Whether a frame of this header starts its body with a request id: the types that always
/// do, and a Publish with flag `ACKED` (whatever other bits, known or not, are set).
pub(crate) fn carries_request_id(raw: &RawHeader) -> bool {
    match FrameType::from_u8(raw.frame_type) {
        Some(FrameType::Publish) => raw.flags.contains(Flags::ACKED),
        Some(t) => t.has_request_id(),
        None => false,
    }
}

/// How many body bytes hold the request id: 8, or 0 when the body has none (or is too short
/// to hold one).
pub(crate) fn request_id_bytes(raw: &RawHeader) -> usize {
    if carries_request_id(raw) && raw.body_len >= 8 {
        8
    } else {
        0
    }
}

/// The request id at the start of `body` (the body's first bytes, or all of it), when the
/// header says one is there and enough of the body arrived.
pub(crate) fn request_id_of(raw: &RawHeader, body: &[u8]) -> Option<RequestId> {
    if request_id_bytes(raw) == 0 {
        return None;
    }
    let id: [u8; 8] = body.get(..8)?.try_into().ok()?;
    Some(RequestId(u64::from_be_bytes(id)))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::*;

    /// One frame of every type (a Publish with and without an ack request).
    fn one_of_each() -> Vec<Frame> {
        let id = RequestId(9);
        let body = ErrorBody { request_id: id, code: ErrorCode::Internal, message: "m".into() };
        let publish = |ack: Option<AckRequest>| {
            Frame::Publish(Publish {
                oldest_pending: false,
                ack,
                key: None,
                producer: None,
                stream: "a/b/c".into(),
                records: vec![Bytes::from_static(b"r").into()],
            })
        };
        vec![
            Frame::Hello(Hello { version: 1, capabilities: Capabilities::ALL, token: None }),
            Frame::HelloOk(HelloOk {
                version: 1,
                capabilities: Capabilities::ALL,
                limits: Limits::default(),
                core: CoreId(0),
                core_count: 1,
            }),
            Frame::CreateStream(CreateStream {
                request_id: id,
                stream: "a/b/c".into(),
                shards: 1,
                retention: Retention::default(),
                replicas: None,
            }),
            Frame::DescribeStream(DescribeStream { request_id: id, stream: "a/b/c".into() }),
            Frame::StreamInfo(StreamInfo {
                request_id: id,
                stream: "a/b/c".into(),
                shards: 1,
                retention: Retention::default(),
            }),
            Frame::ListStreams(ListStreams { request_id: id, prefix: String::new() }),
            Frame::StreamList(StreamList { request_id: id, streams: vec![] }),
            Frame::Metadata(crate::Metadata { request_id: id, stream: "a/b/c".into() }),
            Frame::MetadataOk(crate::MetadataOk {
                request_id: id,
                stream: "a/b/c".into(),
                owners: vec![],
            }),
            Frame::DeleteStream(DescribeStream { request_id: id, stream: "a/b/c".into() }),
            Frame::AlterStream(crate::AlterStream {
                request_id: id,
                stream: "a/b/c".into(),
                changes: crate::StreamChanges { replicas: Some(3), ..Default::default() },
            }),
            publish(None),
            publish(Some(AckRequest { request_id: id, mode: AckMode::None })),
            Frame::PublishAck(PublishAck {
                request_id: id,
                shard: ShardId(0),
                base_offset: Offset(0),
                count: 1,
            }),
            Frame::PublishError(body.clone()),
            Frame::NotOwner(crate::NotOwner {
                request_id: id,
                stream: "a/b/c".into(),
                shard: ShardId(0),
                owner: crate::ShardOwner { node: "b".into(), address: String::new(), live: false },
            }),
            Frame::Subscribe(Subscribe {
                request_id: id,
                stream: "a/b/c".into(),
                shards: None,
                start: StartAt::Earliest,
                group: None,
                positions: None,
            }),
            Frame::SubscribeOk(SubscribeOk {
                request_id: id,
                subscription_id: SubscriptionId(1),
                shards: vec![],
                positions: None,
            }),
            Frame::SubscriptionStart(SubscriptionId(1)),
            Frame::EventBatch(EventBatch {
                shard: ShardId(0),
                base_offset: Offset(0),
                timestamp_ms: 0,
                records: vec![],
            }),
            Frame::CommitOffset(CommitOffset {
                request_id: id,
                stream: "a/b/c".into(),
                group: "g".into(),
                shard: ShardId(0),
                offset: Offset(0),
            }),
            Frame::CommitOk(id),
            Frame::Error(body),
            Frame::Ping(9),
            Frame::Pong(9),
            Frame::Replicate(crate::Replicate {
                stream: "a/b/c".into(),
                shard: ShardId(0),
                from: 1,
                epoch: 2,
                body: crate::ReplicaBody::Fetch { from: Offset(3), durable_end: Offset(3) },
            }),
        ]
    }

    #[test]
    fn a_decoded_frame_and_its_raw_bytes_agree_on_the_request_id() {
        let frames = one_of_each();
        let mut types: Vec<FrameType> = frames.iter().map(Frame::frame_type).collect();
        types.dedup();
        assert_eq!(types, FrameType::ALL, "every type is covered");
        for frame in frames {
            let bytes = frame.to_bytes();
            let head: &[u8; HEADER_LEN] = bytes[..HEADER_LEN].try_into().unwrap();
            let raw = FrameHeader::decode(head).unwrap();
            assert_eq!(frame.request_id(), request_id_of(&raw, &bytes[HEADER_LEN..]), "{frame:?}");
            assert_eq!(frame.request_id().map(|id| id.0), carries_request_id(&raw).then_some(9));
        }
    }
}
