//! The entry for another broker's replication traffic: once a connection's stream said Hello
//! with `REPLICATION` (and its client certificate passed; `Session::handle_peer_hello`), the
//! client session hands the stream here, and from then on it carries only `Replicate` frames
//! (answered by nothing) and Ping/Pong. Nothing of the client session (grants, publishes,
//! subscriptions, budgets) applies to it.

use std::rc::Rc;

use felix_proto::{ErrorCode, Frame, FrameDecoder, RequestId};
use glommio::channels::local_channel::LocalSender;

use super::ReplicationShell;
use crate::app::error::WireError;
use crate::app::session::{ready, Answer, READ_CHUNK_BYTES};
use crate::app::stats;
use crate::net::RecvStream;

/// Serves a peer's replication stream until it ends: frames still buffered in `decoder` first,
/// then what `recv` brings. Answers (Pong, refusals) go to the stream's responder on `tx`.
pub async fn serve(
    host: Rc<ReplicationShell>,
    mut decoder: FrameDecoder,
    recv: &mut RecvStream,
    tx: &LocalSender<Answer>,
) {
    loop {
        while let Some(result) = decoder.poll_frame() {
            let answer = match result {
                Ok(Frame::Replicate(r)) => {
                    host.handle_frame(r);
                    continue;
                }
                Ok(Frame::Ping(n)) => Some(Frame::Pong(n)),
                Ok(Frame::Pong(_)) => continue,
                Ok(other) => {
                    stats::add(&host.stats().counters.rejected_frames, 1);
                    let id = other.request_id().unwrap_or(RequestId(0));
                    let e = WireError::new(
                        ErrorCode::InvalidArgument,
                        "a replication peer sends only Replicate",
                    );
                    Some(e.into_answer(id, false))
                }
                Err(e) => {
                    stats::add(&host.stats().counters.rejected_frames, 1);
                    tracing::warn!(error = %e, fatal = e.fatal, "a replication peer's frame refused");
                    let answer = WireError::new(e.code(), e.to_string())
                        .into_answer(e.request_id.unwrap_or_default(), false);
                    if tx.send(ready(Some(answer))).await.is_err() || e.fatal {
                        recv.stop(ErrorCode::Malformed as u32);
                        return;
                    }
                    continue;
                }
            };
            if tx.send(ready(answer)).await.is_err() {
                return;
            }
        }
        let wanted = decoder.wanted_bytes().clamp(1, READ_CHUNK_BYTES);
        match recv.read_chunks(wanted, |chunk| decoder.handle_chunk(chunk)).await {
            Ok(true) => {}
            Ok(false) | Err(_) => return,
        }
    }
}
