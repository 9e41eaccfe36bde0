//! A replica log's checkpoint: what the log keeps of its archived prefix (committed and durable
//! batches, which no truncation reaches) encoded as bytes, so a restarted replica starts from
//! it and reads from storage only the batches after it, instead of every batch of its log.
//!
//! Layout (integers big-endian):
//!
//! ```text
//! "FXREPCK2"                      magic and version (a replica reads its whole log
//!                                 instead of a checkpoint of another version)
//! u32 body length, body, u32 CRC32C of the body
//! body:
//!   u64 origin, u64 batches, u64 end, u64 payload bytes
//!   u64 last base, u32 last records, u64 last epoch     (the last archived batch)
//!   u32 n, n x (u64 epoch, u64 first offset)             (epoch boundaries)
//!   u32 n, n x (u64 offset, u64 bytes before it, u64 time ms)   (byte marks)
//!   u64 expiry ms, u64 max producers, u64 stamps, u64 clock ms, u64 expired, u64 evicted
//!   u32 n, n x (u64 producer, u64 stamp, u64 last ms,
//!               u8 k, k x (u32 seq, u64 base, u32 records))
//! ```
//!
//! Decoding checks every length and count against what is left and against the format's
//! bounds, so bad bytes give an error, never a panic or a huge allocation.

use std::collections::{BTreeMap, HashMap, VecDeque};

use bytes::{Buf, BufMut};

use crate::config::PRODUCER_SEQ_WINDOW;
use crate::log::Archive;
use crate::producers::{Entry, ProducerLimits, ProducerTable};
use crate::types::{Epoch, Offset, ProducerId, Seq};

const MAGIC: &[u8; 8] = b"FXREPCK2";

/// Why a checkpoint was not used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CheckpointError {
    /// Not a checkpoint, cut short, or inconsistent.
    #[error("malformed checkpoint: {0}")]
    Malformed(&'static str),
    /// The body's CRC does not match.
    #[error("checkpoint checksum mismatch")]
    Checksum,
    /// Made with other producer limits: the table it holds is not the one this replica's
    /// limits give (the log is read again from the start instead).
    #[error("checkpoint made with other producer limits ({0:?})")]
    OtherLimits(ProducerLimits),
}

/// The checkpoint of `archive`.
pub(crate) fn encode(archive: &Archive) -> Vec<u8> {
    let mut body = Vec::with_capacity(
        104 + 16 * archive.epochs.len()
            + 24 * archive.marks.len()
            + archive.producers.producers.len() * (25 + 16 * PRODUCER_SEQ_WINDOW),
    );
    body.put_u64(archive.origin.0);
    body.put_u64(archive.batches);
    body.put_u64(archive.end.0);
    body.put_u64(archive.bytes);
    let (base, records, epoch) = archive.last.unwrap_or((Offset(0), 0, Epoch(0)));
    body.put_u64(base.0);
    body.put_u32(records);
    body.put_u64(epoch.0);
    body.put_u32(archive.epochs.len() as u32);
    for &(e, at) in &archive.epochs {
        body.put_u64(e.0);
        body.put_u64(at.0);
    }
    body.put_u32(archive.marks.len() as u32);
    for &(at, before, time_ms) in &archive.marks {
        body.put_u64(at.0);
        body.put_u64(before);
        body.put_u64(time_ms);
    }
    let t = &archive.producers;
    body.put_u64(t.limits.expiry_ms);
    body.put_u64(t.limits.max as u64);
    body.put_u64(t.stamps);
    body.put_u64(t.clock_ms);
    body.put_u64(t.expired);
    body.put_u64(t.evicted);
    body.put_u32(t.producers.len() as u32);
    // In stamp order, so equal tables encode alike.
    for (&stamp, id) in &t.by_age {
        let Some(e) = t.producers.get(id) else { continue };
        body.put_u64(id.0);
        body.put_u64(stamp);
        body.put_u64(e.last_ms);
        body.put_u8(e.recent.len() as u8);
        for &(seq, base, records) in &e.recent {
            body.put_u32(seq.0);
            body.put_u64(base.0);
            body.put_u32(records);
        }
    }
    let mut out = Vec::with_capacity(body.len() + 16);
    out.extend_from_slice(MAGIC);
    out.put_u32(body.len() as u32);
    out.extend_from_slice(&body);
    out.put_u32(crc32c::crc32c(&body));
    out
}

/// The archive `bytes` holds, if they are a well-formed checkpoint made with `limits`.
pub(crate) fn decode(bytes: &[u8], limits: ProducerLimits) -> Result<Archive, CheckpointError> {
    use CheckpointError::Malformed;
    let mut r = bytes;
    if r.len() < MAGIC.len() + 4 || &r[..MAGIC.len()] != MAGIC {
        return Err(Malformed("no magic"));
    }
    r.advance(MAGIC.len());
    let len = r.get_u32() as usize;
    if r.len() < len + 4 {
        return Err(Malformed("cut short"));
    }
    let body = &r[..len];
    let crc = (&r[len..len + 4]).get_u32();
    if crc32c::crc32c(body) != crc {
        return Err(CheckpointError::Checksum);
    }
    let mut b = body;
    let need = |b: &[u8], n: usize| if b.len() < n { Err(Malformed("cut short")) } else { Ok(()) };
    need(b, 32 + 20 + 4)?;
    let origin = Offset(b.get_u64());
    let (batches, end, payload) = (b.get_u64(), Offset(b.get_u64()), b.get_u64());
    let last = (Offset(b.get_u64()), b.get_u32(), Epoch(b.get_u64()));
    let n = b.get_u32() as usize;
    need(b, n.saturating_mul(16))?;
    let epochs: Vec<(Epoch, Offset)> =
        (0..n).map(|_| (Epoch(b.get_u64()), Offset(b.get_u64()))).collect();
    need(b, 4)?;
    let n = b.get_u32() as usize;
    need(b, n.saturating_mul(24))?;
    let marks: Vec<crate::log::Mark> =
        (0..n).map(|_| (Offset(b.get_u64()), b.get_u64(), b.get_u64())).collect();
    need(b, 48 + 4)?;
    let stored = ProducerLimits { expiry_ms: b.get_u64(), max: b.get_u64() as usize };
    if stored != limits {
        return Err(CheckpointError::OtherLimits(stored));
    }
    let mut table = ProducerTable::new(limits);
    table.stamps = b.get_u64();
    table.clock_ms = b.get_u64();
    table.expired = b.get_u64();
    table.evicted = b.get_u64();
    let n = b.get_u32() as usize;
    if n > limits.max {
        return Err(Malformed("more producers than the limit"));
    }
    let (mut producers, mut by_age) = (HashMap::with_capacity(n), BTreeMap::new());
    for _ in 0..n {
        need(b, 25)?;
        let (id, stamp, last_ms) = (ProducerId(b.get_u64()), b.get_u64(), b.get_u64());
        let k = usize::from(b.get_u8());
        if k == 0 || k > PRODUCER_SEQ_WINDOW {
            return Err(Malformed("a producer's window"));
        }
        need(b, k * 16)?;
        let recent: VecDeque<(Seq, Offset, u32)> =
            (0..k).map(|_| (Seq(b.get_u32()), Offset(b.get_u64()), b.get_u32())).collect();
        if stamp > table.stamps
            || by_age.insert(stamp, id).is_some()
            || producers.insert(id, Entry { recent, stamp, last_ms }).is_some()
        {
            return Err(Malformed("producer stamps or ids repeat"));
        }
    }
    if !b.is_empty() {
        return Err(Malformed("bytes after the producer table"));
    }
    let epochs_ordered = epochs.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1);
    let inside = last.0 >= origin && marks.iter().all(|&(at, _, _)| at >= origin && at < end);
    if batches == 0
        || last.0 .0 + u64::from(last.1) != end.0
        || last.1 == 0
        || !epochs_ordered
        || !inside
    {
        return Err(Malformed("inconsistent archive"));
    }
    if epochs.last().is_none_or(|&(e, _)| e != last.2) {
        return Err(Malformed("the last batch's epoch is not the archive's last"));
    }
    table.producers = producers;
    table.by_age = by_age;
    Ok(Archive {
        origin,
        batches,
        end,
        bytes: payload,
        epochs,
        marks,
        last: Some(last),
        producers: table,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::ReplicaLog;
    use crate::types::{Batch, ProducerSeq};
    use bytes::Bytes;

    fn log_with(batches: u64, limits: ProducerLimits) -> ReplicaLog {
        let mut log = ReplicaLog::with_producer_limits(limits);
        for i in 0..batches {
            let epoch = Epoch(1 + i / 7);
            let producer = (i % 3 != 0)
                .then_some(ProducerSeq { producer: ProducerId(i % 5), seq: Seq((i / 5) as u32) });
            let batch = Batch {
                epoch,
                base: log.end(),
                records: 1 + (i % 4) as u32,
                producer,
                time_ms: 1_000 * i,
                payload: Bytes::from(vec![7u8; 100 + i as usize]),
            };
            log.append(batch).unwrap();
        }
        log
    }

    #[test]
    fn a_log_from_its_checkpoint_is_the_log_with_its_prefix_archived() {
        let limits = ProducerLimits { expiry_ms: 20_000, max: 4 };
        let mut whole = log_with(60, limits);
        let below = whole.batches()[40].base;
        whole.archive(below);
        let bytes = whole.checkpoint().expect("something archived");
        let (mut restarted, last) = ReplicaLog::from_checkpoint(&bytes, limits).unwrap();
        assert_eq!(restarted.end(), below);
        assert_eq!(last.0 .0 + u64::from(last.1), below.0);
        for b in whole.batches() {
            restarted.append(b.clone()).unwrap();
        }
        assert_eq!(restarted.end(), whole.end());
        assert_eq!(restarted.producer_ids(), whole.producer_ids());
        assert_eq!(restarted.clock_ms(), whole.clock_ms());
        assert_eq!(restarted.producers_forgotten(), whole.producers_forgotten());
        for at in [0, 3, 17, below.0, whole.end().0] {
            assert_eq!(restarted.bytes_after(Offset(at)), whole.bytes_after(Offset(at)), "{at}");
        }
        for e in 0..12 {
            let asked = Epoch(e);
            assert_eq!(
                restarted.epoch_answer(asked, Epoch(20)),
                whole.epoch_answer(asked, Epoch(20))
            );
        }
        for p in 0..5 {
            for s in 0..14 {
                let tag = ProducerSeq { producer: ProducerId(p), seq: Seq(s) };
                assert_eq!(restarted.check_seq(tag, false), whole.check_seq(tag, false), "{tag:?}");
            }
        }
        // The checkpoint of the restarted log is the same bytes.
        assert_eq!(restarted.checkpoint().unwrap(), bytes);
    }

    #[test]
    fn bad_bytes_are_errors_never_panics() {
        let limits = ProducerLimits::default();
        let mut log = log_with(30, limits);
        log.archive(log.end());
        let good = log.checkpoint().unwrap();
        assert!(ReplicaLog::from_checkpoint(&good, limits).is_ok());
        let other = ProducerLimits { max: 9, ..limits };
        assert!(matches!(
            ReplicaLog::from_checkpoint(&good, other),
            Err(CheckpointError::OtherLimits(_))
        ));
        for cut in 0..good.len() {
            assert!(ReplicaLog::from_checkpoint(&good[..cut], limits).is_err(), "cut at {cut}");
        }
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            assert!(ReplicaLog::from_checkpoint(&bad, limits).is_err(), "byte {i} flipped");
        }
    }
}
