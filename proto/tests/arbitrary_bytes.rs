//! Arbitrary bytes never panic the decoder and never make it allocate past the limits.
//!
//! A counting global allocator measures the bytes allocated while decoding. The bound: what a
//! decoded frame may need is proportional to its input, so allocation stays under
//! `ALLOC_FACTOR` x input + `ALLOC_CONSTANT`, and the input itself never exceeds
//! `max_frame_bytes`. `ALLOC_FACTOR` is the sum of
//!
//! - `ELEMENT_FACTOR`: a vector sized from a count on the wire holds elements of at most
//!   `ELEMENT_FACTOR` bytes per wire byte each one needs at least (the decoder checks
//!   `count x minimum <= bytes remaining` before allocating). The largest is an EventBatch
//!   record: a `Record` (88 bytes: a key `Option<Bytes>` and a `Payload`) for as few as 5 wire
//!   bytes (key presence and value length), 17.6 bytes per input byte. A valid batch of empty
//!   records needs that much however it is decoded, so no smaller factor can hold;
//! - `COPY_FACTOR`: bytes copied rather than sliced. Chunks under `MIN_ZERO_COPY_CHUNK_BYTES`
//!   go into the decoder's own buffer (the first at its size, then a second may double the
//!   buffer: at most 3 x input in all); when the second chunk is long enough to be kept, the
//!   short first one and the fields straddling the two are copied instead (at most 2 x input).

mod strategies;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::Bytes;
use felix_proto::*;
use proptest::prelude::*;

struct Counting;

thread_local! {
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: delegates to the system allocator unchanged; only counts sizes in a thread-local.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATED.try_with(|a| a.set(a.get() + layout.size()));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATED.try_with(|a| a.set(a.get() + new_size));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Heap bytes per wire byte of a decoded element, rounded up: `size_of::<T>()` over the fewest
/// wire bytes that one `T` of a counted list takes.
const fn per_wire_byte(size: usize, min_wire_bytes: usize) -> usize {
    size.div_ceil(min_wire_bytes)
}

const fn max(a: usize, b: usize) -> usize {
    if a > b {
        a
    } else {
        b
    }
}

/// The largest [`per_wire_byte`] of the counted lists the decoder allocates ahead: EventBatch
/// records, Publish payloads, StreamList names, MetadataOk owners, FetchReply batches,
/// SubscribeOk / Subscribe shards and positions.
const ELEMENT_FACTOR: usize = max(
    max(per_wire_byte(size_of::<Record>(), 5), per_wire_byte(size_of::<Payload>(), 4)),
    max(
        max(per_wire_byte(size_of::<String>(), 2), per_wire_byte(size_of::<ShardOwner>(), 5)),
        max(
            per_wire_byte(size_of::<ReplicaBatch>(), 25),
            max(per_wire_byte(size_of::<ShardId>(), 4), per_wire_byte(size_of::<Offset>(), 8)),
        ),
    ),
);
// Derived from the types so it is exact, and pinned so that a decoded type growing (a bigger
// `Record` or `Payload` is more memory per byte a peer sends) is a decision, not a side effect.
const _: () = assert!(ELEMENT_FACTOR == 18, "a decoded element's size per wire byte changed");
/// Short chunks copied into the decoder's buffer (up to 3 x input with one doubling) or, with a
/// long second chunk, the short first one and the fields straddling the two (up to 2 x input).
const COPY_FACTOR: usize = 3;
const ALLOC_FACTOR: usize = ELEMENT_FACTOR + COPY_FACTOR;
/// Per-frame fixed costs: the decoder's chunk queue, the parts of a frame, a stream name.
const ALLOC_CONSTANT: usize = 4096;

fn allocated_by<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATED.with(|a| a.get());
    let out = f();
    let after = ALLOCATED.with(|a| a.get());
    (out, after - before)
}

fn limits() -> Limits {
    Limits { max_frame_bytes: 64 * 1024, max_batch_records: 4096, max_key_bytes: 256 }
}

/// Decodes `input` split at `cut`, returning every result and the bytes allocated.
fn decode_all(input: &[u8], cut: usize) -> (Vec<Result<Frame, FrameError>>, usize) {
    let owned = Bytes::copy_from_slice(input);
    let (out, allocated) = allocated_by(|| {
        let mut d = FrameDecoder::new(limits(), Capabilities::ALL);
        let mut out = Vec::new();
        let cut = cut.min(owned.len());
        d.handle_chunk(owned.slice(..cut));
        while let Some(f) = d.poll_frame() {
            out.push(f);
        }
        d.handle_chunk(owned.slice(cut..));
        while let Some(f) = d.poll_frame() {
            out.push(f);
        }
        assert!(d.buffered_bytes() <= limits().max_frame_bytes as usize + input.len());
        out
    });
    (out, allocated)
}

/// `cases` cases, or `PROPTEST_CASES` when set (`with_cases` alone would ignore it): a long run
/// is `PROPTEST_CASES=100000 cargo test -p felix-proto --test arbitrary_bytes`.
fn config(cases: u32) -> ProptestConfig {
    match std::env::var_os("PROPTEST_CASES") {
        Some(_) => ProptestConfig::default(),
        None => ProptestConfig::with_cases(cases),
    }
}

/// Mutations of valid frames reach far deeper into the decoder than random bytes do.
fn mutated_frame() -> impl Strategy<Value = Vec<u8>> {
    (strategies::frame(), proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6)).prop_map(
        |(f, edits)| {
            let mut b = f.to_bytes().to_vec();
            for (pos, byte) in edits {
                if !b.is_empty() {
                    let i = pos % b.len();
                    b[i] = byte;
                }
            }
            b
        },
    )
}

/// An EventBatch frame of small records (many records for their bytes) whose record count is
/// then rewritten: the claim a peer controls, up to the limit.
fn event_batch_with_claimed_count() -> impl Strategy<Value = Vec<u8>> {
    let record = (
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..4)),
        proptest::collection::vec(any::<u8>(), 0..4),
    );
    (proptest::collection::vec(record, 0..200), 0..=limits().max_batch_records).prop_map(
        |(records, count)| {
            let records = records
                .into_iter()
                .map(|(key, value)| Record { key: key.map(Bytes::from), value: value.into() })
                .collect();
            let batch =
                EventBatch { shard: ShardId(1), base_offset: Offset(2), timestamp_ms: 3, records };
            let mut b = Frame::EventBatch(batch).to_bytes().to_vec();
            // Shard, base offset and timestamp, then the count.
            b[HEADER_LEN + 20..HEADER_LEN + 24].copy_from_slice(&count.to_be_bytes());
            b
        },
    )
}

proptest! {
    // Past the old bound of 12 x input it failed on every run, at 1000 cases.
    #![proptest_config(config(1000))]

    #[test]
    fn claimed_record_counts_stay_within_the_bound(
        input in event_batch_with_claimed_count(),
        cut in 0usize..2048,
    ) {
        let (_, allocated) = decode_all(&input, cut);
        prop_assert!(allocated <= ALLOC_FACTOR * input.len() + ALLOC_CONSTANT,
            "allocated {} bytes for {} input bytes", allocated, input.len());
    }
}

proptest! {
    #![proptest_config(config(4000))]

    #[test]
    fn random_bytes_never_panic_or_overallocate(
        input in proptest::collection::vec(any::<u8>(), 0..2048),
        cut in 0usize..2048,
    ) {
        let (_, allocated) = decode_all(&input, cut);
        prop_assert!(allocated <= ALLOC_FACTOR * input.len() + ALLOC_CONSTANT,
            "allocated {} bytes for {} input bytes", allocated, input.len());
    }

    #[test]
    fn mutated_frames_never_panic_or_overallocate(input in mutated_frame(), cut in 0usize..512) {
        let (results, allocated) = decode_all(&input, cut);
        prop_assert!(allocated <= ALLOC_FACTOR * input.len() + ALLOC_CONSTANT,
            "allocated {} bytes for {} input bytes", allocated, input.len());
        // A fatal error is always the last thing the decoder says.
        if let Some(pos) = results.iter().position(|r| matches!(r, Err(e) if e.fatal)) {
            prop_assert_eq!(pos, results.len() - 1);
        }
    }
}

#[test]
fn a_huge_claimed_record_count_allocates_nothing_for_it() {
    // Publish, stream "a/b/c", record count 4096 and no records: rejected before Vec::with_capacity.
    let mut body = vec![0, 5, b'a', b'/', b'b', b'/', b'c'];
    body.extend_from_slice(&4096u32.to_be_bytes());
    let mut frame = vec![0x46, 0x58, 1, 0x10, 0, 0];
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    let (results, allocated) = decode_all(&frame, frame.len());
    assert_eq!(results.len(), 1);
    let err = results[0].as_ref().unwrap_err();
    assert_eq!(err.error, DecodeError::Truncated { what: "records" });
    assert!(allocated < 1024, "allocated {allocated}");
}

#[test]
fn a_header_claiming_a_huge_body_is_refused_without_buffering() {
    let mut frame = vec![0x46, 0x58, 1, 0x10, 0, 0];
    frame.extend_from_slice(&u32::MAX.to_be_bytes());
    let (results, allocated) = decode_all(&frame, frame.len());
    assert!(matches!(&results[0], Err(e) if e.fatal && e.code() == ErrorCode::FrameTooLarge));
    assert!(allocated < 1024, "allocated {allocated}");
}

/// An EventBatch frame of `count` records without key or value, `body_len` long (zero-padded).
fn event_batch_of_empty_records(count: u32, body_len: u32) -> Vec<u8> {
    let mut frame = vec![0x46, 0x58, 1, 0x23, 0, 0];
    frame.extend_from_slice(&body_len.to_be_bytes());
    // Shard, base offset, timestamp.
    frame.extend_from_slice(&[0u8; 20]);
    frame.extend_from_slice(&count.to_be_bytes());
    frame.resize(HEADER_LEN + body_len as usize, 0);
    frame
}

fn assert_within_bound(input: &[u8], cut: usize) -> Vec<Result<Frame, FrameError>> {
    let (results, allocated) = decode_all(input, cut);
    let bound = ALLOC_FACTOR * input.len() + ALLOC_CONSTANT;
    assert!(
        allocated <= bound,
        "cut {cut}: allocated {allocated} bytes for {} input bytes (bound {bound})",
        input.len()
    );
    results
}

#[test]
fn the_bound_covers_an_event_batch_of_empty_records() {
    // Built on the start of the input proptest once shrank a failure to ("FX", version 1,
    // EventBatch, body 0x2cb = 715 bytes; the rest was not kept, so zeros and the largest count
    // the body allows): 138 records of 5 bytes (690 of the 691 left), 138 x 88-byte `Record`s
    // for 725 input bytes, past the old 12 x input + 4096 = 12796. One byte is left over, so
    // the frame is then refused (trailing bytes), after the records were allocated.
    let shrunk = event_batch_of_empty_records(138, 0x2cb);
    assert_eq!(&shrunk[..11], &[70, 88, 1, 35, 0, 0, 0, 0, 2, 203, 0]);
    // The same records in a valid frame, and the most records the limits allow: each record
    // decoded is a `Record`, so the allocation is inherent, not a decoder overshoot.
    let valid = event_batch_of_empty_records(161, 24 + 5 * 161);
    let most = event_batch_of_empty_records(4096, 24 + 5 * 4096);
    for cut in [0, 1, 100, 511, 512, 600, usize::MAX] {
        let results = assert_within_bound(&shrunk, cut);
        assert!(matches!(&results[..], [Err(e)] if e.error == DecodeError::TrailingBytes(1)));
        for (frame, count) in [(&valid, 161), (&most, 4096)] {
            let results = assert_within_bound(frame, cut);
            assert!(
                matches!(&results[..], [Ok(Frame::EventBatch(b))] if b.records.len() == count),
                "{results:?}"
            );
        }
    }
}

#[test]
fn the_bound_covers_a_publish_of_empty_records() {
    // 4096 empty records of 4 bytes each: 4096 x 56-byte `Payload`s, 14 bytes per input byte.
    let mut body = vec![0, 5, b'a', b'/', b'b', b'/', b'c'];
    body.extend_from_slice(&4096u32.to_be_bytes());
    body.resize(body.len() + 4 * 4096, 0);
    let mut frame = vec![0x46, 0x58, 1, 0x10, 0, 0];
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    for cut in [0, 511, 512, usize::MAX] {
        let results = assert_within_bound(&frame, cut);
        assert!(matches!(&results[..], [Ok(Frame::Publish(p))] if p.records.len() == 4096));
    }
}
