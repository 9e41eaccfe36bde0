//! The write path of a stream log: the writer (queued batches -> aligned writes, several in
//! flight, published strictly in log order) and the flusher (group commit).
//!
//! Space (`StorageConfig::preallocate`): with `Preallocate::Reserve` (the default), before a
//! write that would pass the reservation the writer reserves blocks (fallocate, keeping the
//! file size) for that write and a step beyond it (as large as the segment's data, 64 KiB to
//! `SEGMENT_GROW_BYTES`). With `Preallocate::Zero` a zero fill task writes zeros ahead of the
//! writes, starting when less than a step lies between the end of the largest next write and
//! the zeroed end, and reaching two steps beyond it. One fill runs at a time; while it runs,
//! writes end before the range it zeroes (they never overlap it). Writes then overwrite
//! written blocks inside the file, so their fdatasync needs no journal commit. Either way
//! disk use follows the data in bounded steps.
//!
//! Writes: the writer takes queued batches in order, up to `WRITE_BYTES_TARGET` per write
//! (a single larger batch goes alone, up to `WRITE_BYTES_MAX`), encodes them into one
//! aligned buffer and hands it to a write task. At most `WRITE_IN_FLIGHT_BYTES_MAX` bytes
//! are in flight, so all unfinished writes lie within that distance of the oldest one (the
//! torn-tail window of recovery). Each write task waits for its predecessor before it
//! publishes: indexes, `Written` acks and `written_pos` advance in log order only.
//! Duplicates (retries of a tagged batch still queued or being written, `retry_waiters`) are
//! answered with their original: acknowledged when it publishes, failed when it fails.
//!
//! Durability, two modes (`StorageConfig::write_sync`): with `WriteSync::Dsync` segments are
//! opened O_DSYNC, so a completed write is durable with the metadata to read it;
//! a write that publishes while everything before it is durable raises `durable_pos` to its
//! end and acknowledges its durable appends (and `flush` callers) at once. With
//! `WriteSync::Fdatasync` (the default) durable appends wait for group commit:
//!
//! Flushes: when a durable append waits that no flush in flight covers, take
//! `target = written_pos` and fdatasync; when it ends, raise `durable_pos` to `target` and
//! acknowledge every waiter at or below it. Up to `FLUSHES_IN_FLIGHT_MAX` run at once, so an
//! append written while a flush runs starts its own instead of waiting for that one to end.
//! (Data reaches the files with O_DIRECT, so a failed data write fails its write, not a later
//! fdatasync; on a file system without O_DIRECT, where the kernel reports a writeback error to
//! only one of two concurrent fdatasyncs of a file, the other may still succeed.)
//!
//! Failures: a failed write fails its batches, everything queued, and every later write
//! still in flight (their offsets are handed out again, and the producer tables and epoch
//! indexes forget them); when the last of them is done the file is truncated back to the
//! published end. A failed fdatasync (also the one before a segment roll) or truncate
//! poisons the log.

use std::rc::{Rc, Weak};

use felix_proto::{AckMode, Offset};

use crate::config::{
    Preallocate, FLUSHES_IN_FLIGHT_MAX, SEGMENT_GROW_BYTES, SEGMENT_GROW_MIN_BYTES,
    WRITE_BYTES_MAX, WRITE_BYTES_TARGET, WRITE_IN_FLIGHT_BYTES_MAX,
};
use crate::error::StorageError;
use crate::format::{
    align_up, batch_slot, encode_batch, BATCH_ALIGN_BYTES, FORMAT_ALIGN_BYTES, SEGMENT_HEADER_BYTES,
};
use crate::index::IndexEntry;
use crate::io::{self, LogFile, Stopwatch, WriteBuf};
use crate::recovery::RollError;
use crate::state::{Fill, Inner, Pending, State};
use crate::sync::{completion, Completer, Completion, Signal};

pub(crate) async fn writer_loop(weak: Weak<Inner>, signal: Signal) {
    while signal.wait().await {
        loop {
            let Some(inner) = weak.upgrade() else { return };
            if !issue_write(&inner).await {
                break;
            }
        }
    }
}

/// Issue one write if there is work and room. Returns false when the writer should wait
/// for a signal (nothing queued, no room in flight, a roll or a failure waiting for the
/// writes in flight, a write waiting for the zero fill ahead of it).
async fn issue_write(inner: &Rc<Inner>) -> bool {
    let seg_max = inner.config.segment_bytes_max;
    let zero = inner.config.preallocate == Preallocate::Zero;
    let (needs_roll, reserve, fill) = {
        let st = inner.state.borrow();
        if st.write_failed.is_some() || st.poisoned.is_some() {
            return false;
        }
        let Some(first) = st.queue.front() else { return false };
        let slot = align_up(batch_slot(first.len as u64));
        let needs_roll = st.issued_end > SEGMENT_HEADER_BYTES && st.issued_end + slot > seg_max;
        if st.inflight > 0
            && (needs_roll || st.inflight_bytes + slot > WRITE_IN_FLIGHT_BYTES_MAX as u64)
        {
            return false;
        }
        // A new segment's header holds every shard's next offset: it must not be taken while
        // a truncation's marker is being written (the header would hold the offsets from
        // before the marker's position); `truncate_shard` wakes the writer when it is done.
        if needs_roll && st.truncations.busy {
            return false;
        }
        let (reserve, fill) = match zero {
            false => (reservation_target(&st, seg_max), None),
            true if st.fill.is_some() => (None, None),
            true => (None, fill_range(&st, seg_max)),
        };
        // A write must not reach the zero fill in flight; the fill's end wakes the writer.
        if !needs_roll && fill.is_none() && st.issued_end + slot > st.write_limit(seg_max) {
            return false;
        }
        (needs_roll, reserve, fill)
    };
    if needs_roll {
        match crate::recovery::roll(inner).await {
            Ok(()) => {}
            Err(RollError::Sync(e)) => poison(inner, "fdatasync before a segment roll failed", &e),
            Err(RollError::Create(e)) => fail_queue(inner, Vec::new(), &e),
        }
        return true;
    }
    if let Some(range) = fill {
        start_fill(inner, range);
    } else if let Some(target) = reserve {
        grow(inner, target).await;
    } else {
        let write = take_write(inner);
        io::spawn(complete_write(inner.clone(), write));
    }
    true
}

/// The largest write the queue can make now (padded), bounded by `WRITE_BYTES_MAX`.
fn next_write_max(st: &State) -> u64 {
    // A batch's slot pads it by less than BATCH_ALIGN_BYTES; the write is padded to the
    // alignment; `take_write` never makes a write larger than WRITE_BYTES_MAX.
    let queued = st.queued_bytes as u64 + BATCH_ALIGN_BYTES * st.queue.len() as u64;
    align_up(queued.min(WRITE_BYTES_MAX as u64))
}

/// The step by which space is prepared ahead of a segment whose writes end at `issued_end`:
/// as large as its data so far, within `SEGMENT_GROW_MIN_BYTES..=SEGMENT_GROW_BYTES`.
fn step_at(issued_end: u64) -> u64 {
    align_up(issued_end).clamp(SEGMENT_GROW_MIN_BYTES, SEGMENT_GROW_BYTES)
}

/// Where the active segment's reservation must reach before the next write is issued, if
/// further than it does: the end of the largest write the queue can make now, plus a step
/// and at most `segment_bytes_max`. The steps double while the segment is small, so a small
/// log holds little more than its data and a large one is reserved 4 MiB at a time.
fn reservation_target(st: &State, segment_bytes_max: u64) -> Option<u64> {
    let need = (st.issued_end + next_write_max(st)).min(segment_bytes_max);
    if need <= st.reserved_end {
        return None;
    }
    Some((need + step_at(st.issued_end)).min(segment_bytes_max))
}

/// The range a zero fill should cover, if one should start: when less than a step of zeroed
/// space lies beyond the end of the largest next write, zero from there (or from where the
/// zeros end, if further) up to two steps beyond it, in whole blocks and at most
/// `segment_bytes_max`. The next write itself never waits for zeros: where none are ahead
/// of it (a new segment, after a restart) it extends the file as an unprepared write does.
fn fill_range(st: &State, segment_bytes_max: u64) -> Option<(u64, u64)> {
    fill_range_at(st.issued_end, st.reserved_end, next_write_max(st), segment_bytes_max)
}

/// [`fill_range`] from its parts.
fn fill_range_at(
    issued_end: u64,
    reserved_end: u64,
    write_max: u64,
    segment_bytes_max: u64,
) -> Option<(u64, u64)> {
    let step = step_at(issued_end);
    let need = issued_end + write_max;
    let limit = segment_bytes_max - segment_bytes_max % FORMAT_ALIGN_BYTES;
    let from = reserved_end.max(need);
    if reserved_end >= need + step || from >= limit {
        return None;
    }
    Some((from, (need + 2 * step).min(limit)))
}

/// Start zeroing `[from, to)` of the active segment. Writes issued from now on end at or
/// before `from` until the fill is done (`State::write_limit`).
fn start_fill(inner: &Rc<Inner>, (from, to): (u64, u64)) {
    let (file, gen) = {
        let mut st = inner.state.borrow_mut();
        let gen = st.fill_gen;
        st.fill = Some(Fill { gen, from });
        st.reserved_end = to;
        (st.segments.last().expect("a log always has an active segment").file.clone(), gen)
    };
    io::spawn(zero_fill(Rc::downgrade(inner), file, from, to, gen));
}

/// Bytes of zeros per write of a fill.
const FILL_WRITE_BYTES: u64 = 1 << 20;

/// Write zeros over `[from, to)` of `file`. Best effort, like a reservation: after a failure
/// (a full disk) the fill stops and the writes extend the file themselves (where a full disk
/// shows as ENOSPC on the write); the range is not tried again.
async fn zero_fill(weak: Weak<Inner>, file: Rc<LogFile>, from: u64, to: u64, gen: u64) {
    let mut pos = from;
    // Stops early when the log is gone (dropped without `close`): nothing waits for it then.
    while pos < to && weak.strong_count() > 0 {
        let len = (to - pos).min(FILL_WRITE_BYTES);
        let mut buf = file.alloc(len as usize);
        buf.as_mut().fill(0);
        if let Err(e) = file.write_at(buf, pos).await {
            tracing::debug!(path = %file.path().display(), pos, error = %e, "zero fill failed");
            break;
        }
        pos += len;
    }
    let Some(inner) = weak.upgrade() else { return };
    {
        let mut st = inner.state.borrow_mut();
        debug_assert_eq!(st.fill.map(|f| f.gen), Some(gen));
        st.fill = None;
        st.stats.zero_fill_bytes += pos - from;
    }
    inner.writer.notify();
}

/// Reserve the active segment's blocks up to file position `target` (fallocate, keeping the
/// file size, so recovery still sees only what was written). Best effort: without the
/// reservation writes allocate as they go, and a full disk shows up as ENOSPC on the write
/// itself. The step is not tried again after a failure.
async fn grow(inner: &Rc<Inner>, target: u64) {
    let file = {
        let mut st = inner.state.borrow_mut();
        st.reserved_end = target;
        st.segments.last().expect("a log always has an active segment").file.clone()
    };
    if let Err(e) = file.reserve(target).await {
        tracing::debug!(path = %file.path().display(), target, error = %e, "segment reservation failed");
    }
}

/// One write on its way to the file.
struct Write {
    file: Rc<LogFile>,
    buf: WriteBuf,
    file_pos: u64,
    base_position: u64,
    len: u64,
    batches: Vec<Pending>,
    after: Option<Completion<()>>,
    turn: Completer<()>,
}

/// Take batches from the queue and encode them into one aligned buffer.
fn take_write(inner: &Rc<Inner>) -> Write {
    let mut st = inner.state.borrow_mut();
    let st = &mut *st;
    let active = st.segments.last().expect("a log always has an active segment");
    let (file, base_position) = (active.file.clone(), active.base_position);
    let file_pos = st.issued_end;
    let in_flight_room = WRITE_IN_FLIGHT_BYTES_MAX as u64 - st.inflight_bytes;
    let room = (st.write_limit(inner.config.segment_bytes_max) - file_pos)
        .min(WRITE_BYTES_MAX as u64)
        .min(in_flight_room);
    let mut batches = Vec::new();
    let mut total = 0u64;
    let mut queued = 0usize;
    while let Some(p) = st.queue.front() {
        let slot = batch_slot(p.len as u64);
        if !batches.is_empty()
            && (align_up(total + slot) > room || total >= WRITE_BYTES_TARGET as u64)
        {
            break;
        }
        total += slot;
        queued += p.len;
        batches.push(st.queue.pop_front().expect("front exists"));
    }
    st.queued_bytes -= queued;
    let len = align_up(total);
    let mut buf = file.alloc(len as usize);
    let out = buf.as_mut();
    let mut at = 0usize;
    for p in &batches {
        let batch = &mut out[at..at + p.len];
        let base = Offset(p.base_offset);
        encode_batch(batch, p.shard, base, p.timestamp_ms, p.producer, p.epoch, &p.records);
        let slot = batch_slot(p.len as u64) as usize;
        out[at + p.len..at + slot].fill(0);
        at += slot;
    }
    out[at..].fill(0);
    st.issued_end += len;
    st.inflight += 1;
    st.inflight_bytes += len;
    let (turn, next) = completion();
    let after = st.last_write.replace(next);
    st.debug_assert_invariants();
    Write { file, buf, file_pos, base_position, len, batches, after, turn }
}

/// Write, wait for the previous write to publish, then publish this one (or fail it).
async fn complete_write(inner: Rc<Inner>, w: Write) {
    let watch = Stopwatch::start();
    let result = w.file.write_at(w.buf, w.file_pos).await;
    if result.is_ok() {
        let latency_us = watch.elapsed_us().max(1);
        inner.state.borrow_mut().stats.write_latency_us.saturating_record(latency_us);
    }
    if let Some(after) = w.after {
        after.await;
    }
    let failure = {
        let mut st = inner.state.borrow_mut();
        let st = &mut *st;
        st.inflight -= 1;
        st.inflight_bytes -= w.len;
        let earlier = st.write_failed.as_ref().map(|(_, e)| e.duplicate());
        let poisoned = st.poisoned.clone().map(|reason| StorageError::Poisoned { reason });
        match (result, earlier.or(poisoned)) {
            (Ok(()), None) => {
                publish(&inner, st, w.batches, w.base_position + w.file_pos, w.len, &w.file);
                None
            }
            (result, earlier) => {
                let e = match (earlier, result) {
                    (Some(e), _) => e,
                    (None, Err(e)) => e,
                    (None, Ok(())) => StorageError::Closed,
                };
                if matches!(e, StorageError::NoSpace { .. }) {
                    st.stats.no_space_errors += 1;
                }
                if st.write_failed.is_none() {
                    st.write_failed = Some((w.file_pos, e.duplicate()));
                }
                Some((e, w.batches))
            }
        }
    };
    if let Some((e, batches)) = failure {
        fail_queue(&inner, batches, &e);
        let truncate_to = {
            let st = inner.state.borrow();
            if st.inflight == 0 {
                st.write_failed.as_ref().map(|(pos, _)| *pos)
            } else {
                None
            }
        };
        if let Some(pos) = truncate_to {
            // Cut off whatever part of the failed writes reached the file, so that stale
            // (valid-looking) batches never sit behind later writes.
            if let Err(te) = w.file.truncate(pos).await {
                poison(&inner, "truncate after failed write", &te);
            }
            let mut st = inner.state.borrow_mut();
            st.issued_end = pos;
            // Truncating also released the blocks reserved (or zeroed) past `pos`. A fill
            // still in flight extends the file again with zeros (read as padding) past a
            // hole; until it ends, the writes still stop at its start (same file).
            st.reserved_end = st.reserved_end.min(pos);
            st.write_failed = None;
        }
    }
    w.turn.complete(());
    inner.writer.notify();
}

/// A write completed in order: index its batches, wake tail readers, ack `Written`
/// appends, and ack `Durable` ones too when the write made everything up to its end durable
/// (an O_DSYNC file, and everything published before it durable already); else queue them
/// for the flusher.
fn publish(
    inner: &Inner,
    st: &mut State,
    batches: Vec<Pending>,
    start: u64,
    len: u64,
    file: &LogFile,
) {
    let end = start + len;
    let durable = file.sync_writes() && st.durable_pos >= st.written_pos;
    let mut pos = start;
    let mut any_durable = false;
    for p in batches {
        let s = st.shards.get_mut(&p.shard).expect("queued shards exist");
        s.index.push(IndexEntry {
            base_offset: p.base_offset,
            record_count: p.records.len() as u32,
            len: p.len as u32,
            position: pos,
        });
        pos += batch_slot(p.len as u64);
        s.wake_tail_waiters();
        let active = st.segments.last_mut().expect("active segment");
        active.last_timestamp_ms = active.last_timestamp_ms.max(p.timestamp_ms);
        st.stats.batch_bytes += p.len as u64;
        let retries = match p.producer {
            Some(_) if !st.retry_waiters.is_empty() => {
                st.retry_waiters.remove(&(p.shard, p.base_offset)).unwrap_or_default()
            }
            _ => Vec::new(),
        };
        for (ack, done) in p.done.map(|d| (p.ack, d)).into_iter().chain(retries) {
            if ack == AckMode::Durable && !durable {
                st.durable_waiters.push_back((end, done));
                any_durable = true;
            } else {
                done.complete(Ok(()));
            }
        }
    }
    let active = st.segments.last_mut().expect("active segment");
    debug_assert_eq!(active.base_position + active.end, start, "writes publish in order");
    active.end += len;
    st.written_pos = end;
    st.stats.bytes_written += len;
    st.stats.writes += 1;
    if durable {
        st.durable_pos = end;
        // `StreamLog::flush` callers waiting for what is now durable.
        while st.durable_waiters.front().is_some_and(|(pos, _)| *pos <= end) {
            let (_, done) = st.durable_waiters.pop_front().expect("front exists");
            done.complete(Ok(()));
        }
    }
    st.debug_assert_invariants();
    if any_durable {
        inner.flusher.notify();
    }
}

/// Fail `taken` and everything queued behind it; hand their offsets out again (the shards'
/// producer tables and epoch indexes forget them: `ShardState::rewind`).
pub(crate) fn fail_queue(inner: &Inner, taken: Vec<Pending>, e: &StorageError) {
    let mut st = inner.state.borrow_mut();
    let st = &mut *st;
    let failed: Vec<Pending> = taken.into_iter().chain(st.queue.drain(..)).collect();
    st.queued_bytes = 0;
    st.stats.append_errors += failed.len() as u64;
    for s in st.shards.values_mut() {
        let next = s.index.next_offset();
        s.rewind(next);
    }
    for p in failed {
        let retries = match p.producer {
            Some(_) => st.retry_waiters.remove(&(p.shard, p.base_offset)).unwrap_or_default(),
            None => Vec::new(),
        };
        for done in p.done.into_iter().chain(retries.into_iter().map(|(_, d)| d)) {
            done.complete(Err(e.duplicate()));
        }
    }
}

/// An fsync (or truncate) failed: the file's state is unknown, refuse all further work.
/// The appends failed now learn the cause when it is a full disk (`NoSpace`), so that the
/// client hears "storage full"; every later call gets `Poisoned`.
pub(crate) fn poison(inner: &Inner, what: &str, cause: &StorageError) {
    let reason = format!("{what}: {cause}");
    tracing::error!(stream = %inner.name, %reason, "stream log poisoned");
    let mut st = inner.state.borrow_mut();
    if st.poisoned.is_none() {
        st.poisoned = Some(reason);
    }
    let waiters: Vec<_> = st.durable_waiters.drain(..).collect();
    for s in st.shards.values_mut() {
        s.drop_tail_waiters();
    }
    let reason = st.poisoned.clone().unwrap_or_default();
    drop(st);
    let err = match cause {
        StorageError::NoSpace { .. } => cause.duplicate(),
        _ => StorageError::Poisoned { reason },
    };
    for (_, w) in waiters {
        w.complete(Err(err.duplicate()));
    }
    fail_queue(inner, Vec::new(), &err);
}

pub(crate) async fn flusher_loop(weak: Weak<Inner>, signal: Signal) {
    while signal.wait().await {
        loop {
            let Some(inner) = weak.upgrade() else { return };
            let (target, file) = {
                let mut st = inner.state.borrow_mut();
                // Flush when a durable append waits that no flush in flight covers, and
                // fewer than FLUSHES_IN_FLIGHT_MAX run (a finished flush wakes this loop).
                let uncovered =
                    st.durable_waiters.back().is_some_and(|(pos, _)| *pos > st.flush_issued_pos);
                if !uncovered
                    || st.poisoned.is_some()
                    || st.flushes_in_flight >= FLUSHES_IN_FLIGHT_MAX
                {
                    break;
                }
                if st.flushes_in_flight > 0 {
                    st.stats.flushes_overlapped += 1;
                }
                st.flushes_in_flight += 1;
                st.flush_issued_pos = st.written_pos;
                let active = st.segments.last().expect("active segment");
                (st.written_pos, active.file.clone())
            };
            io::spawn(flush(inner, target, file));
        }
    }
}

/// One fdatasync covering the log up to `target` (everything written when it was issued; an
/// earlier segment was synced when it was rolled). Acknowledges every durable waiter up to
/// the highest position a completed flush covers, so flushes may complete in any order.
async fn flush(inner: Rc<Inner>, target: u64, file: Rc<LogFile>) {
    let watch = Stopwatch::start();
    let result = file.fdatasync().await;
    let latency_us = watch.elapsed_us();
    match result {
        Ok(()) => {
            let mut st = inner.state.borrow_mut();
            st.flushes_in_flight -= 1;
            st.durable_pos = st.durable_pos.max(target);
            let durable = st.durable_pos;
            let mut done = Vec::new();
            while st.durable_waiters.front().is_some_and(|(pos, _)| *pos <= durable) {
                done.push(st.durable_waiters.pop_front().expect("front exists").1);
            }
            st.stats.record_flush(done.len() as u64, latency_us);
            st.debug_assert_invariants();
            drop(st);
            for d in done {
                d.complete(Ok(()));
            }
        }
        Err(e) => {
            inner.state.borrow_mut().flushes_in_flight -= 1;
            poison(&inner, "fdatasync failed", &e);
        }
    }
    inner.flusher.notify();
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::state::write_limit;

    proptest! {
        /// The writer's space rules, driven through random queue sizes and fill completion
        /// times (the way `issue_write` and `take_write` apply them): a write never overlaps
        /// the zero fill in flight, the zeros never run more than a write and two steps past
        /// the data, and a write waits only while a fill runs right ahead of it.
        #[test]
        fn writes_never_overlap_the_zero_fill_in_flight(
            events in proptest::collection::vec((1u64..6 << 20, any::<bool>()), 1..400),
            segment_bytes_max in (8u64 << 20)..(64 << 20),
        ) {
            let mut issued_end = SEGMENT_HEADER_BYTES;
            let mut reserved_end = issued_end;
            let mut fill: Option<(Fill, u64)> = None;
            let fill_gen = 0;
            for (queued, fill_done) in events {
                if fill_done {
                    fill = None;
                }
                // A write as large as the queue allows, one batch at least.
                let first = align_up(queued.min(WRITE_BYTES_MAX as u64));
                let write_max = first;
                if issued_end + first > segment_bytes_max {
                    // A roll: a new segment, the fill in flight is the old one's.
                    issued_end = SEGMENT_HEADER_BYTES;
                    reserved_end = issued_end;
                    fill = None;
                    continue;
                }
                if fill.is_none() {
                    if let Some((from, to)) =
                        fill_range_at(issued_end, reserved_end, write_max, segment_bytes_max)
                    {
                        prop_assert!(from >= issued_end + write_max && from < to);
                        prop_assert_eq!(from % FORMAT_ALIGN_BYTES, 0);
                        prop_assert_eq!(to % FORMAT_ALIGN_BYTES, 0);
                        prop_assert!(to <= segment_bytes_max);
                        fill = Some((Fill { gen: fill_gen, from }, to));
                        reserved_end = to;
                    }
                }
                let limit = write_limit(fill.map(|f| f.0), fill_gen, segment_bytes_max);
                if issued_end + first > limit {
                    prop_assert!(fill.is_some(), "a write waits only for a fill");
                    continue;
                }
                let len = first.min(limit - issued_end);
                if let Some((f, to)) = fill {
                    let overlaps = issued_end < to && f.from < issued_end + len;
                    prop_assert!(!overlaps, "write {issued_end}+{len} over fill {}..{to}", f.from);
                }
                issued_end += len;
                prop_assert!(
                    reserved_end <= issued_end + WRITE_BYTES_MAX as u64 + 2 * SEGMENT_GROW_BYTES,
                    "zeros at {reserved_end}, data at {issued_end}"
                );
            }
        }
    }

    #[test]
    fn a_fill_in_flight_bounds_the_writes_only_in_its_own_segment() {
        let fill = Some(Fill { gen: 3, from: 1 << 20 });
        assert_eq!(write_limit(fill, 3, 64 << 20), 1 << 20);
        // After a roll the fill zeroes the old segment: it no longer bounds the writes.
        assert_eq!(write_limit(fill, 4, 64 << 20), 64 << 20);
        assert_eq!(write_limit(None, 3, 64 << 20), 64 << 20);
    }
}
