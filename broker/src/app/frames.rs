//! EventBatch frames encoded from a log read (`StreamLog::read_with`'s views), each payload
//! byte copied once, from the read buffer into the frame.
//!
//! Small batches of one read are encoded back to back into one shared buffer and leave as one
//! chunk: a subscriber catching up on one-record batches otherwise handed quinn a 4 KiB chunk
//! per record, and quinn's send buffer walks its chunks one by one (the walk was ~10 % of the
//! broker in such a catch-up). The frames on the wire are the same either way.

use bytes::BytesMut;
use felix_proto::{Offset, ShardId};
use felix_storage::BatchView;

use super::tail::EncodedBatch;

/// Frames smaller than this share a buffer with their neighbours.
pub const SHARED_FRAME_BYTES_MAX: usize = 64 << 10;
/// Capacity of a shared buffer (a frame that does not fit starts the next one).
pub const SHARED_BUFFER_BYTES: usize = 256 << 10;

/// A shared buffer being filled.
struct Open {
    buf: BytesMut,
    base_offset: Offset,
    end: u64,
    frames: u32,
}

/// Turns the views of one read of `shard` into [`EncodedBatch`]es, from offset `from` on.
pub struct LogFrames {
    shard: ShardId,
    from: Offset,
    out: Vec<EncodedBatch>,
    open: Option<Open>,
    batches: u64,
}

impl LogFrames {
    /// Frames of `shard` without the records before `from`.
    pub fn new(shard: ShardId, from: Offset) -> Self {
        Self { shard, from, out: Vec::new(), open: None, batches: 0 }
    }

    /// Encodes one batch as read (nothing if it ends before `from`).
    pub fn push(&mut self, view: &BatchView<'_>) {
        if view.end() <= self.from.0 {
            return;
        }
        let skip = self.from.0.saturating_sub(view.base_offset().0);
        let base_offset = Offset(view.base_offset().0 + skip);
        let records = view.records().skip(skip as usize);
        let len = felix_proto::event_batch_slices_len(records.clone());
        self.batches += 1;
        if len >= SHARED_FRAME_BYTES_MAX {
            self.close();
            let frame = felix_proto::encode_event_batch_slices(
                self.shard,
                base_offset,
                view.first_timestamp_ms(),
                records,
            );
            let count = (view.end() - base_offset.0) as u32;
            self.out.push(EncodedBatch { base_offset, count, frame, frames: 1 });
            return;
        }
        // Joins the open buffer if it continues it and has the room (never grows it: growing
        // would copy what it holds).
        let joins = self
            .open
            .as_ref()
            .is_some_and(|o| o.end == base_offset.0 && o.buf.capacity() - o.buf.len() >= len);
        if !joins {
            self.close();
            self.open = Some(Open {
                buf: BytesMut::with_capacity(SHARED_BUFFER_BYTES),
                base_offset,
                end: base_offset.0,
                frames: 0,
            });
        }
        let Some(o) = self.open.as_mut() else { return };
        felix_proto::encode_event_batch_slices_into(
            &mut o.buf,
            self.shard,
            base_offset,
            view.first_timestamp_ms(),
            records,
        );
        o.end = view.end();
        o.frames += 1;
    }

    fn close(&mut self) {
        if let Some(o) = self.open.take() {
            let count = (o.end - o.base_offset.0) as u32;
            let frame = o.buf.freeze();
            self.out.push(EncodedBatch {
                base_offset: o.base_offset,
                count,
                frame,
                frames: o.frames,
            });
        }
    }

    /// Batches encoded so far.
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// The encoded runs, in offset order.
    pub fn finish(mut self) -> Vec<EncodedBatch> {
        self.close();
        self.out
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use felix_proto::{AckMode, Capabilities, Frame, FrameDecoder, Limits, Record};
    use felix_storage::{RetentionConfig, StorageConfig, StreamLog};

    use super::*;

    fn record(offset: u64, len: usize) -> Record {
        let mut v = format!("o{offset}.").into_bytes();
        v.resize(len, b'.');
        if offset.is_multiple_of(2) {
            Record::keyed(Bytes::from(format!("k{offset}")), Bytes::from(v))
        } else {
            Record::unkeyed(Bytes::from(v))
        }
    }

    /// Batches of shard 0: 40 one-record ones of 3 KB, one of 8 x 20 KB (a frame of its own),
    /// then 120 more small ones (more than one shared buffer holds).
    async fn filled_log(dir: &std::path::Path) -> (StreamLog, Vec<Record>) {
        let config = StorageConfig::new(dir);
        let (log, _) =
            StreamLog::open("t/n/s", dir, &[ShardId(0)], &config, RetentionConfig::default())
                .await
                .unwrap();
        let mut all = Vec::new();
        let mut offset = 0u64;
        for (n, len) in std::iter::repeat_n((1, 3000), 40)
            .chain([(8, 20_000)])
            .chain(std::iter::repeat_n((1, 3000), 120))
        {
            let recs: Vec<Record> = (0..n).map(|i| record(offset + i, len)).collect();
            log.append(ShardId(0), &recs, 7, AckMode::Written).await.unwrap();
            offset += n;
            all.extend(recs);
        }
        (log, all)
    }

    #[test]
    fn small_batches_share_buffers_and_every_record_arrives_once_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_owned();
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .io_memory(256 << 10)
            .spawn(move || async move {
                let (log, all) = filled_log(&path).await;
                let from = Offset(3);
                let mut frames = LogFrames::new(ShardId(0), from);
                log.read_with(ShardId(0), from, 4 << 20, |v| frames.push(&v)).await.unwrap();
                let read = frames.batches();
                let runs = frames.finish();
                assert_eq!(read, 161 - 3, "every batch from offset 3 on");
                // Shared buffers: far fewer chunks than frames, and each holds its frames.
                assert!(runs.len() <= 6, "{} chunks", runs.len());
                assert_eq!(runs.iter().map(|r| u64::from(r.frames)).sum::<u64>(), read);
                let mut decoder = FrameDecoder::new(Limits::default(), Capabilities::ALL);
                let mut at = from.0;
                for run in &runs {
                    assert_eq!(run.base_offset, Offset(at), "runs are consecutive");
                    decoder.handle_chunk(run.frame.clone());
                    let mut in_run = 0;
                    while let Some(frame) = decoder.poll_frame() {
                        let Frame::EventBatch(b) = frame.unwrap() else {
                            panic!("not an EventBatch")
                        };
                        assert_eq!(b.base_offset, Offset(at));
                        for r in &b.records {
                            assert_eq!(r, &all[at as usize], "record {at}");
                            at += 1;
                        }
                        in_run += 1;
                    }
                    assert_eq!(in_run, run.frames);
                    assert_eq!(run.end(), at);
                }
                assert_eq!(at, all.len() as u64);
            })
            .unwrap()
            .join()
            .unwrap();
    }
}
