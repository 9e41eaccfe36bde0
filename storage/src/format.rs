//! The on-disk format, byte-exact as documented in `docs/storage-format.md`.
//!
//! Pure code: bytes in, bytes out, no I/O and no clock. All integers are little-endian.
//!
//! A segment file is a 4096-byte segment header block followed by batches. Every write
//! ends on a [`FORMAT_ALIGN_BYTES`] boundary; the gap after the last batch of a write is
//! zero padding. A zero magic where a batch header is expected therefore means "padding,
//! skip to the next alignment boundary".

use bytes::{Buf, Bytes};
use felix_proto::{Offset, ProducerId, ProducerTag, Record, ShardId};

/// Every write starts and ends on this boundary (O_DIRECT alignment of any device we support).
pub const FORMAT_ALIGN_BYTES: u64 = 4096;
/// Size of the segment header block at the start of each segment file.
pub const SEGMENT_HEADER_BYTES: u64 = 4096;
/// The largest log position a segment may reach: recovery refuses a segment header past it
/// (no log comes near it; a crafted or damaged header could overflow the arithmetic).
pub const POSITION_MAX: u64 = i64::MAX as u64;
/// The largest offset a segment header may start a shard at, for the same reason.
pub const OFFSET_MAX: u64 = i64::MAX as u64;
/// Magic of a segment header: "FXS1".
pub const SEGMENT_MAGIC: u32 = u32::from_le_bytes(*b"FXS1");
/// Magic of a batch header: "FXB1".
pub const BATCH_MAGIC: u32 = u32::from_le_bytes(*b"FXB1");
/// The only format version written and read.
pub const FORMAT_VERSION: u8 = 1;
/// Batches start at multiples of this inside a write, so that the zero padding at the end
/// of a write is either empty or at least 8 bytes (a zero magic can always be read there).
pub const BATCH_ALIGN_BYTES: u64 = 8;
/// Bytes of a batch header.
pub const BATCH_HEADER_BYTES: usize = 48;
/// Batch flag bit 0: a producer tag ([`PRODUCER_TAG_BYTES`]) follows the header.
///
/// Header extensions follow the 48-byte header in flag-bit order (the tag, then the epoch),
/// each present only if its bit is set; the records start after the last one. A bit not in
/// [`BATCH_FLAGS_KNOWN`] makes the batch invalid.
pub const BATCH_FLAG_PRODUCER: u8 = 1;
/// Batch flag bit 1: the leader epoch ([`EPOCH_BYTES`], u64) follows the header and the
/// producer tag if there is one.
pub const BATCH_FLAG_EPOCH: u8 = 2;
/// Every flag bit this version knows.
pub const BATCH_FLAGS_KNOWN: u8 = BATCH_FLAG_PRODUCER | BATCH_FLAG_EPOCH;
/// Bytes of a producer tag: producer id (8), sequence number (4), zero (4).
pub const PRODUCER_TAG_BYTES: usize = 16;
/// Bytes of a leader epoch extension: the epoch as a u64.
pub const EPOCH_BYTES: usize = 8;
/// Bytes before the records of a batch that carries a producer tag and no epoch.
pub const BATCH_TAGGED_HEADER_BYTES: usize = BATCH_HEADER_BYTES + PRODUCER_TAG_BYTES;
/// Bytes before the records of a batch with every extension: the most a reader needs to
/// decode any batch header.
pub const BATCH_HEADER_BYTES_MAX: usize = BATCH_HEADER_BYTES + PRODUCER_TAG_BYTES + EPOCH_BYTES;
/// Bytes of a record header (flags, key length, value length).
pub const RECORD_HEADER_BYTES: usize = 9;
/// Bytes of one shard entry in a segment header.
const SEGMENT_ENTRY_BYTES: usize = 16;
/// Bytes before the first shard entry of a segment header.
const SEGMENT_FIXED_BYTES: usize = 32;
/// Shards one stream log (and so one segment header) can describe.
pub const SHARDS_PER_LOG_MAX: usize =
    (SEGMENT_HEADER_BYTES as usize - SEGMENT_FIXED_BYTES) / SEGMENT_ENTRY_BYTES;
/// Record flag: the record has a key.
pub(crate) const RECORD_FLAG_KEY: u8 = 1;

const _: () = assert!(SEGMENT_HEADER_BYTES.is_multiple_of(FORMAT_ALIGN_BYTES));
const _: () = assert!(SHARDS_PER_LOG_MAX == 254);
const _: () = assert!(BATCH_HEADER_BYTES.is_multiple_of(8));
const _: () = assert!(BATCH_TAGGED_HEADER_BYTES.is_multiple_of(8));
const _: () = assert!(PRODUCER_TAG_BYTES.is_multiple_of(8) && EPOCH_BYTES.is_multiple_of(8));
const _: () = assert!(BATCH_HEADER_BYTES_MAX.is_multiple_of(8));
const _: () = assert!(BATCH_FLAGS_KNOWN == 0b11);
const _: () = assert!(FORMAT_ALIGN_BYTES.is_multiple_of(BATCH_ALIGN_BYTES));

/// The fixed header of a batch, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    /// Total length of the batch in bytes, header included.
    pub len: u32,
    /// The shard the batch belongs to.
    pub shard: ShardId,
    /// Records in the batch (at least 1).
    pub record_count: u32,
    /// Offset of the first record.
    pub base_offset: Offset,
    /// Timestamp of the first record, ms since the Unix epoch.
    pub first_timestamp_ms: u64,
    /// Timestamp of the last record, ms since the Unix epoch.
    pub last_timestamp_ms: u64,
    /// The producer tag of an idempotent batch (flag [`BATCH_FLAG_PRODUCER`]).
    pub producer: Option<ProducerTag>,
    /// The leader epoch that appended the batch (flag [`BATCH_FLAG_EPOCH`]).
    pub epoch: Option<u64>,
}

impl BatchHeader {
    /// The offset after the last record of this batch.
    pub fn next_offset(&self) -> u64 {
        self.base_offset.0 + u64::from(self.record_count)
    }

    /// Byte position of the first record in the batch.
    pub fn records_start(&self) -> usize {
        header_bytes(self.producer, self.epoch)
    }
}

/// Bytes before the records of a batch with or without a producer tag and an epoch.
fn header_bytes(tag: Option<ProducerTag>, epoch: Option<u64>) -> usize {
    BATCH_HEADER_BYTES
        + if tag.is_some() { PRODUCER_TAG_BYTES } else { 0 }
        + if epoch.is_some() { EPOCH_BYTES } else { 0 }
}

/// Where the epoch extension starts: after the header and the producer tag, if any.
fn epoch_at(tag: Option<ProducerTag>) -> usize {
    header_bytes(tag, None)
}

/// Why bytes are not a valid batch or segment header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FormatError {
    /// The magic is neither a batch magic nor zero padding.
    BadMagic(u32),
    /// An unknown version byte.
    BadVersion(u8),
    /// The length field is smaller than a header or larger than the limit.
    BadLength(u32),
    /// Flag bits this version does not know, or reserved header bytes that are not zero.
    BadFlags(u8),
    /// The stored CRC32C does not match the bytes.
    BadCrc {
        /// CRC stored in the header.
        stored: u32,
        /// CRC computed over the bytes.
        computed: u32,
    },
    /// The record area does not hold exactly `record_count` well-formed records.
    BadRecords,
    /// A segment header that is not valid.
    BadSegmentHeader(&'static str),
}

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FormatError::BadMagic(m) => write!(f, "bad magic {m:#010x}"),
            FormatError::BadVersion(v) => write!(f, "unknown version {v}"),
            FormatError::BadLength(l) => write!(f, "bad batch length {l}"),
            FormatError::BadFlags(flags) => {
                write!(f, "unknown batch flags {flags:#04x} or reserved bytes not zero")
            }
            FormatError::BadCrc { stored, computed } => {
                write!(f, "crc32c mismatch: stored {stored:#010x}, computed {computed:#010x}")
            }
            FormatError::BadRecords => write!(f, "records do not match the batch header"),
            FormatError::BadSegmentHeader(why) => write!(f, "bad segment header: {why}"),
        }
    }
}

/// What the bytes at a batch position are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// A zero magic: padding up to the next alignment boundary.
    Padding,
    /// A plausible header; the whole batch is `len` bytes (not yet verified).
    Header(BatchHeader),
    /// Fewer bytes than a header are available.
    Short,
    /// Not a batch.
    Invalid(FormatError),
}

/// The encoded size of a batch holding `records`, tagged with `tag` or not, stamped with
/// `epoch` or not.
pub fn batch_encoded_len(
    records: &[Record],
    tag: Option<ProducerTag>,
    epoch: Option<u64>,
) -> usize {
    header_bytes(tag, epoch)
        + records
            .iter()
            .map(|r| RECORD_HEADER_BYTES + r.key.as_ref().map_or(0, |k| k.len()) + r.value.len())
            .sum::<usize>()
}

/// Encode a batch into `out`, which must be exactly `batch_encoded_len(records, tag, epoch)`
/// long. With a `tag`, the flag [`BATCH_FLAG_PRODUCER`] is set and the tag follows the
/// header; with an `epoch`, the flag [`BATCH_FLAG_EPOCH`] is set and the epoch follows them.
///
/// One pass: each record's payload parts are copied straight from the buffers they were
/// received in, and the CRC32C is computed in the same pass ([`crate::crc::copy_append`]), so
/// a payload byte is read from memory once and written once here.
///
/// The caller has checked the limits (record count fits u32, length fits u32).
pub fn encode_batch(
    out: &mut [u8],
    shard: ShardId,
    base_offset: Offset,
    timestamp_ms: u64,
    tag: Option<ProducerTag>,
    epoch: Option<u64>,
    records: &[Record],
) {
    debug_assert_eq!(out.len(), batch_encoded_len(records, tag, epoch));
    let len = out.len() as u32;
    out[0..4].copy_from_slice(&BATCH_MAGIC.to_le_bytes());
    out[4] = FORMAT_VERSION;
    out[5] = if tag.is_some() { BATCH_FLAG_PRODUCER } else { 0 }
        | if epoch.is_some() { BATCH_FLAG_EPOCH } else { 0 };
    out[6..8].copy_from_slice(&[0, 0]);
    out[12..16].copy_from_slice(&len.to_le_bytes());
    out[16..20].copy_from_slice(&shard.0.to_le_bytes());
    out[20..24].copy_from_slice(&(records.len() as u32).to_le_bytes());
    out[24..32].copy_from_slice(&base_offset.0.to_le_bytes());
    out[32..40].copy_from_slice(&timestamp_ms.to_le_bytes());
    out[40..48].copy_from_slice(&timestamp_ms.to_le_bytes());
    if let Some(tag) = tag {
        let at = BATCH_HEADER_BYTES;
        out[at..at + 8].copy_from_slice(&tag.producer.0.to_le_bytes());
        out[at + 8..at + 12].copy_from_slice(&tag.seq.to_le_bytes());
        out[at + 12..at + 16].fill(0);
    }
    if let Some(epoch) = epoch {
        let at = epoch_at(tag);
        out[at..at + EPOCH_BYTES].copy_from_slice(&epoch.to_le_bytes());
    }
    // The CRC covers bytes 0..8 and 12..len (see `batch_crc`). After the batch's header,
    // every byte is copied and taken into the CRC in one pass (`crc::copy_append`): each
    // record's header from the stack, its key, its payload parts from the buffers they were
    // received in. Nothing written is read again.
    let mut at = header_bytes(tag, epoch);
    let mut crc = crc32c::crc32c_append(crc32c::crc32c(&out[0..8]), &out[12..at]);
    for r in records {
        let key = r.key.as_deref().unwrap_or(&[]);
        let mut header = [0u8; RECORD_HEADER_BYTES];
        header[0] = if r.key.is_some() { RECORD_FLAG_KEY } else { 0 };
        header[1..5].copy_from_slice(&(key.len() as u32).to_le_bytes());
        header[5..9].copy_from_slice(&(r.value.len() as u32).to_le_bytes());
        let parts = r.value.parts().map(|p| &p[..]);
        for part in std::iter::once(&header[..]).chain([key]).chain(parts) {
            crc = crate::crc::copy_append(&mut out[at..at + part.len()], part, crc);
            at += part.len();
        }
    }
    debug_assert_eq!(at, out.len(), "batch_encoded_len matches what was written");
    debug_assert_eq!(crc, batch_crc(out), "the one-pass CRC is the batch's CRC");
    out[8..12].copy_from_slice(&crc.to_le_bytes());
}

/// CRC32C of a batch: bytes 0..8 followed by bytes 12..len (everything but the CRC field).
fn batch_crc(batch: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&batch[0..8]), &batch[12..])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Look at the bytes at a batch position: padding, a plausible header, or garbage.
///
/// A header with extensions (producer tag, epoch) is only complete with them: give `buf` at
/// least [`BATCH_HEADER_BYTES_MAX`] where the bytes exist, else such a header is `Short`.
/// `batch_bytes_limit` bounds the length field so that garbage never makes a reader
/// allocate or read more than a batch can be.
pub fn probe(buf: &[u8], batch_bytes_limit: usize) -> Probe {
    if buf.len() < 4 {
        return if buf.iter().all(|b| *b == 0) { Probe::Padding } else { Probe::Short };
    }
    let magic = u32_at(buf, 0);
    if magic == 0 {
        return Probe::Padding;
    }
    if magic != BATCH_MAGIC {
        return Probe::Invalid(FormatError::BadMagic(magic));
    }
    if buf.len() < BATCH_HEADER_BYTES {
        return Probe::Short;
    }
    if buf[4] != FORMAT_VERSION {
        return Probe::Invalid(FormatError::BadVersion(buf[4]));
    }
    let flags = buf[5];
    if flags & !BATCH_FLAGS_KNOWN != 0 || buf[6..8] != [0, 0] {
        return Probe::Invalid(FormatError::BadFlags(flags));
    }
    let producer = if flags & BATCH_FLAG_PRODUCER != 0 {
        if buf.len() < BATCH_TAGGED_HEADER_BYTES {
            return Probe::Short;
        }
        let at = BATCH_HEADER_BYTES;
        if u32_at(buf, at + 12) != 0 {
            return Probe::Invalid(FormatError::BadFlags(flags));
        }
        Some(ProducerTag { producer: ProducerId(u64_at(buf, at)), seq: u32_at(buf, at + 8) })
    } else {
        None
    };
    let epoch = if flags & BATCH_FLAG_EPOCH != 0 {
        let at = epoch_at(producer);
        if buf.len() < at + EPOCH_BYTES {
            return Probe::Short;
        }
        Some(u64_at(buf, at))
    } else {
        None
    };
    let len = u32_at(buf, 12);
    if (len as usize) < header_bytes(producer, epoch) + RECORD_HEADER_BYTES
        || len as usize > batch_bytes_limit
    {
        return Probe::Invalid(FormatError::BadLength(len));
    }
    Probe::Header(BatchHeader {
        len,
        shard: ShardId(u32_at(buf, 16)),
        record_count: u32_at(buf, 20),
        base_offset: Offset(u64_at(buf, 24)),
        first_timestamp_ms: u64_at(buf, 32),
        last_timestamp_ms: u64_at(buf, 40),
        producer,
        epoch,
    })
}

/// Verify a whole batch (exactly `header.len` bytes): CRC and record structure.
pub fn verify_batch(batch: &[u8], batch_bytes_limit: usize) -> Result<BatchHeader, FormatError> {
    let header = match probe(batch, batch_bytes_limit) {
        Probe::Header(h) => h,
        Probe::Invalid(e) => return Err(e),
        Probe::Padding => return Err(FormatError::BadMagic(0)),
        Probe::Short => return Err(FormatError::BadLength(batch.len() as u32)),
    };
    if header.len as usize != batch.len() {
        return Err(FormatError::BadLength(header.len));
    }
    let stored = u32_at(batch, 8);
    let computed = batch_crc(batch);
    if stored != computed {
        return Err(FormatError::BadCrc { stored, computed });
    }
    // Walk the records once so that decode_records cannot fail on a verified batch.
    let mut at = header.records_start();
    for _ in 0..header.record_count {
        if batch.len() - at < RECORD_HEADER_BYTES || batch[at] & !RECORD_FLAG_KEY != 0 {
            return Err(FormatError::BadRecords);
        }
        let key_len = u32_at(batch, at + 1) as usize;
        let value_len = u32_at(batch, at + 5) as usize;
        if batch[at] & RECORD_FLAG_KEY == 0 && key_len != 0 {
            return Err(FormatError::BadRecords);
        }
        at += RECORD_HEADER_BYTES;
        if batch.len() - at < key_len || batch.len() - at - key_len < value_len {
            return Err(FormatError::BadRecords);
        }
        at += key_len + value_len;
    }
    if at != batch.len() || header.record_count == 0 {
        return Err(FormatError::BadRecords);
    }
    // Offsets end below u64::MAX: every `base + count` past here is computed without a check.
    if header.base_offset.0.checked_add(u64::from(header.record_count)).is_none() {
        return Err(FormatError::BadRecords);
    }
    Ok(header)
}

/// Split a verified batch into records whose keys and values are zero-copy slices of it.
pub fn decode_records(batch: &Bytes, header: &BatchHeader) -> Result<Vec<Record>, FormatError> {
    if batch.len() < header.records_start() {
        return Err(FormatError::BadRecords);
    }
    let mut rest = batch.slice(header.records_start()..);
    // Sized by what the bytes can hold, not by the count alone: a header that was only
    // probed must not size an allocation.
    let fits = rest.len() / RECORD_HEADER_BYTES;
    let mut records = Vec::with_capacity((header.record_count as usize).min(fits));
    for _ in 0..header.record_count {
        if rest.len() < RECORD_HEADER_BYTES {
            return Err(FormatError::BadRecords);
        }
        let flags = rest.get_u8();
        let key_len = rest.get_u32_le() as usize;
        let value_len = rest.get_u32_le() as usize;
        if rest.len() < key_len || rest.len() - key_len < value_len {
            return Err(FormatError::BadRecords);
        }
        let key = rest.split_to(key_len);
        let value = rest.split_to(value_len);
        let key = if flags & RECORD_FLAG_KEY != 0 { Some(key) } else { None };
        records.push(Record { key, value: value.into() });
    }
    Ok(records)
}

/// The header block of a segment file: where the segment sits in the log and the next
/// offset of every shard when it was created (so offsets survive retention deleting
/// every batch of a shard).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Log position of byte 0 of this file.
    pub base_position: u64,
    /// Creation time, ms since the Unix epoch.
    pub created_ms: u64,
    /// (shard, next offset) for every shard of the log, sorted by shard.
    pub next_offsets: Vec<(ShardId, Offset)>,
}

impl SegmentHeader {
    /// Encode into a `SEGMENT_HEADER_BYTES` block. `next_offsets.len() <= SHARDS_PER_LOG_MAX`.
    pub fn encode(&self, out: &mut [u8]) {
        assert!(out.len() == SEGMENT_HEADER_BYTES as usize);
        assert!(self.next_offsets.len() <= SHARDS_PER_LOG_MAX);
        out.fill(0);
        out[0..4].copy_from_slice(&SEGMENT_MAGIC.to_le_bytes());
        out[4] = FORMAT_VERSION;
        out[12..16].copy_from_slice(&(self.next_offsets.len() as u32).to_le_bytes());
        out[16..24].copy_from_slice(&self.base_position.to_le_bytes());
        out[24..32].copy_from_slice(&self.created_ms.to_le_bytes());
        for (i, (shard, next)) in self.next_offsets.iter().enumerate() {
            let at = SEGMENT_FIXED_BYTES + i * SEGMENT_ENTRY_BYTES;
            out[at..at + 4].copy_from_slice(&shard.0.to_le_bytes());
            out[at + 8..at + 16].copy_from_slice(&next.0.to_le_bytes());
        }
        let crc = batch_crc(out);
        out[8..12].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decode and verify a segment header block.
    pub fn decode(block: &[u8]) -> Result<Self, FormatError> {
        if block.len() < SEGMENT_HEADER_BYTES as usize {
            return Err(FormatError::BadSegmentHeader("short"));
        }
        let block = &block[..SEGMENT_HEADER_BYTES as usize];
        if u32_at(block, 0) != SEGMENT_MAGIC {
            return Err(FormatError::BadSegmentHeader("bad magic"));
        }
        if block[4] != FORMAT_VERSION {
            return Err(FormatError::BadSegmentHeader("unknown version"));
        }
        if u32_at(block, 8) != batch_crc(block) {
            return Err(FormatError::BadSegmentHeader("crc32c mismatch"));
        }
        let count = u32_at(block, 12) as usize;
        if count > SHARDS_PER_LOG_MAX {
            return Err(FormatError::BadSegmentHeader("too many shards"));
        }
        let next_offsets = (0..count)
            .map(|i| {
                let at = SEGMENT_FIXED_BYTES + i * SEGMENT_ENTRY_BYTES;
                (ShardId(u32_at(block, at)), Offset(u64_at(block, at + 8)))
            })
            .collect();
        Ok(SegmentHeader {
            base_position: u64_at(block, 16),
            created_ms: u64_at(block, 24),
            next_offsets,
        })
    }
}

/// The space a batch of `len` bytes takes in a write: `len` rounded up to 8.
pub fn batch_slot(len: u64) -> u64 {
    len.div_ceil(BATCH_ALIGN_BYTES) * BATCH_ALIGN_BYTES
}

/// Round up to the format alignment.
pub fn align_up(x: u64) -> u64 {
    x.div_ceil(FORMAT_ALIGN_BYTES) * FORMAT_ALIGN_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_proto::Payload;

    fn sample() -> Vec<Record> {
        vec![Record::unkeyed(&b"hello"[..]), Record::keyed(&b""[..], &b"v"[..])]
    }

    fn encoded(records: &[Record]) -> Vec<u8> {
        let mut out = vec![0u8; batch_encoded_len(records, None, None)];
        encode_batch(&mut out, ShardId(3), Offset(42), 1_000, None, None, records);
        out
    }

    #[test]
    fn batch_round_trip_keeps_keys_distinct_from_no_key() {
        let records = sample();
        let buf = encoded(&records);
        let header = verify_batch(&buf, 1 << 20).unwrap();
        assert_eq!(header.shard, ShardId(3));
        assert_eq!(header.base_offset, Offset(42));
        assert_eq!(header.record_count, 2);
        assert_eq!(header.next_offset(), 44);
        assert_eq!(header.first_timestamp_ms, 1_000);
        let decoded = decode_records(&Bytes::from(buf), &header).unwrap();
        assert_eq!(decoded, records);
        assert_eq!(decoded[1].key, Some(Bytes::new()));
    }

    /// Found by fuzzing: a header's record count sized the allocation before the bytes were
    /// looked at (u32::MAX records: hundreds of GB, the process aborted).
    #[test]
    fn a_record_count_the_bytes_cannot_hold_sizes_no_allocation() {
        let buf = encoded(&sample());
        let mut header = verify_batch(&buf, 1 << 20).unwrap();
        header.record_count = u32::MAX;
        let got = decode_records(&Bytes::from(buf), &header);
        assert!(matches!(got, Err(FormatError::BadRecords)), "{got:?}");
    }

    #[test]
    fn a_batch_whose_offsets_would_pass_u64_max_is_refused() {
        let records = sample();
        for (base, ok) in [(u64::MAX - 2, true), (u64::MAX - 1, false), (u64::MAX, false)] {
            let mut out = vec![0u8; batch_encoded_len(&records, None, None)];
            encode_batch(&mut out, ShardId(3), Offset(base), 1_000, None, None, &records);
            let got = verify_batch(&out, 1 << 20);
            assert_eq!(got.is_ok(), ok, "base {base}: {got:?}");
            if !ok {
                assert!(matches!(got, Err(FormatError::BadRecords)), "{got:?}");
            }
        }
    }

    #[test]
    fn header_layout_is_byte_exact() {
        let buf = encoded(&[Record::unkeyed(&b"ab"[..])]);
        assert_eq!(&buf[0..4], b"FXB1");
        assert_eq!(buf[4], 1);
        assert_eq!(u32_at(&buf, 12) as usize, buf.len());
        assert_eq!(buf.len(), 48 + 9 + 2);
        assert_eq!(u32_at(&buf, 16), 3);
        assert_eq!(u64_at(&buf, 24), 42);
        assert_eq!(&buf[48..57], &[0, 0, 0, 0, 0, 2, 0, 0, 0]);
    }

    #[test]
    fn doc_test_vector() {
        // The example in docs/storage-format.md, section 2.
        let hex = "46 58 42 31 01 00 00 00 8a 2b 58 ee 3b 00 00 00 03 00 00 00 01 00 00 00 \
                   2a 00 00 00 00 00 00 00 e8 03 00 00 00 00 00 00 e8 03 00 00 00 00 00 00 \
                   00 00 00 00 00 02 00 00 00 61 62";
        let want: Vec<u8> =
            hex.split_whitespace().map(|b| u8::from_str_radix(b, 16).unwrap()).collect();
        let records = [Record::unkeyed(&b"ab"[..])];
        let mut out = vec![0u8; batch_encoded_len(&records, None, None)];
        encode_batch(&mut out, ShardId(3), Offset(42), 1000, None, None, &records);
        assert_eq!(out, want);
    }

    fn tagged(records: &[Record], tag: ProducerTag) -> Vec<u8> {
        stamped(records, Some(tag), None)
    }

    fn stamped(records: &[Record], tag: Option<ProducerTag>, epoch: Option<u64>) -> Vec<u8> {
        let mut out = vec![0u8; batch_encoded_len(records, tag, epoch)];
        encode_batch(&mut out, ShardId(3), Offset(42), 1_000, tag, epoch, records);
        out
    }

    const TAG: ProducerTag = ProducerTag { producer: ProducerId(0x0102_0304_0506_0708), seq: 9 };

    #[test]
    fn a_tagged_batch_round_trips_with_its_tag_before_the_records() {
        let records = sample();
        let buf = tagged(&records, TAG);
        assert_eq!(buf.len(), encoded(&records).len() + PRODUCER_TAG_BYTES);
        assert_eq!(buf[5], BATCH_FLAG_PRODUCER);
        assert_eq!(&buf[48..56], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&buf[56..64], &[9, 0, 0, 0, 0, 0, 0, 0]);
        // The records are the untagged batch's, 16 bytes later.
        assert_eq!(&buf[BATCH_TAGGED_HEADER_BYTES..], &encoded(&records)[BATCH_HEADER_BYTES..]);
        let header = verify_batch(&buf, 1 << 20).unwrap();
        assert_eq!(header.producer, Some(TAG));
        assert_eq!(header.records_start(), 64);
        assert_eq!(decode_records(&Bytes::from(buf), &header).unwrap(), records);
        // Untagged batches decode without a tag.
        assert_eq!(verify_batch(&encoded(&records), 1 << 20).unwrap().producer, None);
        assert_eq!(verify_batch(&encoded(&records), 1 << 20).unwrap().epoch, None);
    }

    const EPOCH: u64 = 0x1112_1314_1516_1718;

    #[test]
    fn an_epoch_follows_the_header_or_the_tag_and_round_trips() {
        let records = sample();
        let plain = encoded(&records);
        // Epoch only: right after the 48-byte header.
        let buf = stamped(&records, None, Some(EPOCH));
        assert_eq!(buf.len(), plain.len() + EPOCH_BYTES);
        assert_eq!(buf[5], BATCH_FLAG_EPOCH);
        assert_eq!(&buf[48..56], &[0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11]);
        assert_eq!(&buf[56..], &plain[BATCH_HEADER_BYTES..]);
        let header = verify_batch(&buf, 1 << 20).unwrap();
        assert_eq!((header.producer, header.epoch), (None, Some(EPOCH)));
        assert_eq!(header.records_start(), 56);
        assert_eq!(decode_records(&Bytes::from(buf), &header).unwrap(), records);
        // Tag and epoch: the tag first (bit 0), then the epoch (bit 1).
        let buf = stamped(&records, Some(TAG), Some(EPOCH));
        assert_eq!(buf.len(), plain.len() + PRODUCER_TAG_BYTES + EPOCH_BYTES);
        assert_eq!(buf[5], BATCH_FLAG_PRODUCER | BATCH_FLAG_EPOCH);
        assert_eq!(&buf[48..64], &tagged(&records, TAG)[48..64]);
        assert_eq!(&buf[64..72], &EPOCH.to_le_bytes());
        assert_eq!(&buf[BATCH_HEADER_BYTES_MAX..], &plain[BATCH_HEADER_BYTES..]);
        let header = verify_batch(&buf, 1 << 20).unwrap();
        assert_eq!((header.producer, header.epoch), (Some(TAG), Some(EPOCH)));
        assert_eq!(header.records_start(), BATCH_HEADER_BYTES_MAX);
        assert_eq!(decode_records(&Bytes::from(buf), &header).unwrap(), records);
        // Epoch 0 is an epoch (flag set), distinct from none.
        let zero = stamped(&records, None, Some(0));
        assert_eq!(verify_batch(&zero, 1 << 20).unwrap().epoch, Some(0));
    }

    #[test]
    fn damage_to_the_epoch_bytes_or_flag_is_detected() {
        for tag in [None, Some(TAG)] {
            let buf = stamped(&sample(), tag, Some(EPOCH));
            let at = epoch_at(tag);
            for byte in at..at + EPOCH_BYTES {
                for bit in 0..8 {
                    let mut bad = buf.clone();
                    bad[byte] ^= 1 << bit;
                    assert!(
                        matches!(verify_batch(&bad, 1 << 20), Err(FormatError::BadCrc { .. })),
                        "flip {byte}:{bit} of the epoch undetected"
                    );
                }
            }
            // A header cut before its epoch is short, not a header.
            assert_eq!(probe(&buf[..at + EPOCH_BYTES - 1], 1 << 20), Probe::Short);
            assert!(matches!(probe(&buf[..at + EPOCH_BYTES], 1 << 20), Probe::Header(_)));
        }
        // Clearing the flag of a stamped batch (CRC recomputed): the epoch bytes are read as
        // records, which do not line up.
        let mut bad = stamped(&[Record::unkeyed(&b"ab"[..])], None, Some(EPOCH));
        bad[5] = 0;
        let crc = batch_crc(&bad);
        bad[8..12].copy_from_slice(&crc.to_le_bytes());
        assert!(verify_batch(&bad, 1 << 20).is_err());
    }

    #[test]
    fn unknown_flags_and_nonzero_reserved_bytes_are_invalid_even_with_a_valid_crc() {
        // Damage that a writer of a later version could produce on purpose: the CRC is
        // recomputed, so only the header checks can refuse it.
        let fix_crc = |b: &mut Vec<u8>| {
            let crc = batch_crc(b);
            b[8..12].copy_from_slice(&crc.to_le_bytes());
        };
        for (at, value) in [(5usize, 4u8), (5, 0x80), (6, 1), (7, 1)] {
            let mut bad = encoded(&sample());
            bad[at] |= value;
            fix_crc(&mut bad);
            assert!(
                matches!(verify_batch(&bad, 1 << 20), Err(FormatError::BadFlags(_))),
                "byte {at} = {value:#x} accepted"
            );
        }
        let mut bad = tagged(&sample(), TAG);
        bad[60] = 1;
        fix_crc(&mut bad);
        assert!(matches!(verify_batch(&bad, 1 << 20), Err(FormatError::BadFlags(_))));
        // An untagged batch claiming a tag: its records do not line up (or the length is
        // too short for a tag).
        let mut bad = encoded(&[Record::unkeyed(&b"ab"[..])]);
        bad[5] = BATCH_FLAG_PRODUCER;
        fix_crc(&mut bad);
        assert!(verify_batch(&bad, 1 << 20).is_err());
        // A tagged header cut before its tag is short, not a header.
        let buf = tagged(&sample(), TAG);
        assert_eq!(probe(&buf[..BATCH_HEADER_BYTES], 1 << 20), Probe::Short);
        assert!(matches!(probe(&buf[..BATCH_TAGGED_HEADER_BYTES], 1 << 20), Probe::Header(_)));
    }

    #[test]
    fn doc_tagged_test_vector() {
        // The tagged example in docs/storage-format.md, section 2.
        let hex = "46 58 42 31 01 01 00 00 2d 87 21 97 4b 00 00 00 03 00 00 00 01 00 00 00 \
                   2a 00 00 00 00 00 00 00 e8 03 00 00 00 00 00 00 e8 03 00 00 00 00 00 00 \
                   08 07 06 05 04 03 02 01 09 00 00 00 00 00 00 00 \
                   00 00 00 00 00 02 00 00 00 61 62";
        let want: Vec<u8> =
            hex.split_whitespace().map(|b| u8::from_str_radix(b, 16).unwrap()).collect();
        assert_eq!(tagged(&[Record::unkeyed(&b"ab"[..])], TAG), want);
    }

    #[test]
    fn doc_epoch_test_vectors() {
        // The stamped examples in docs/storage-format.md, section 2: epoch 5 alone, then
        // with the producer tag before it.
        let unhex = |hex: &str| -> Vec<u8> {
            hex.split_whitespace().map(|b| u8::from_str_radix(b, 16).unwrap()).collect()
        };
        let epoch_only = "46 58 42 31 01 02 00 00 fb 58 4d 46 43 00 00 00 03 00 00 00 01 00 00 00 \
                          2a 00 00 00 00 00 00 00 e8 03 00 00 00 00 00 00 e8 03 00 00 00 00 00 00 \
                          05 00 00 00 00 00 00 00 \
                          00 00 00 00 00 02 00 00 00 61 62";
        let both = "46 58 42 31 01 03 00 00 a9 d6 79 e1 53 00 00 00 03 00 00 00 01 00 00 00 \
                    2a 00 00 00 00 00 00 00 e8 03 00 00 00 00 00 00 e8 03 00 00 00 00 00 00 \
                    08 07 06 05 04 03 02 01 09 00 00 00 00 00 00 00 \
                    05 00 00 00 00 00 00 00 \
                    00 00 00 00 00 02 00 00 00 61 62";
        let records = [Record::unkeyed(&b"ab"[..])];
        assert_eq!(stamped(&records, None, Some(5)), unhex(epoch_only));
        assert_eq!(stamped(&records, Some(TAG), Some(5)), unhex(both));
    }

    /// Every batch layout: plain, tagged, stamped with an epoch, and both.
    #[test]
    fn every_single_bit_flip_is_detected() {
        let layouts = [
            encoded(&sample()),
            tagged(&sample(), TAG),
            stamped(&sample(), None, Some(EPOCH)),
            stamped(&sample(), Some(TAG), Some(EPOCH)),
        ];
        for buf in layouts {
            for byte in 0..buf.len() {
                for bit in 0..8 {
                    let mut bad = buf.clone();
                    bad[byte] ^= 1 << bit;
                    assert!(verify_batch(&bad, 1 << 20).is_err(), "flip {byte}:{bit} undetected");
                }
            }
        }
    }

    #[test]
    fn zero_magic_is_padding_and_garbage_is_invalid() {
        assert_eq!(probe(&[0u8; 64], 1 << 20), Probe::Padding);
        assert!(matches!(probe(&[7u8; 64], 1 << 20), Probe::Invalid(FormatError::BadMagic(_))));
        let buf = encoded(&sample());
        assert_eq!(probe(&buf[..20], 1 << 20), Probe::Short);
        assert!(matches!(probe(&buf, 10), Probe::Invalid(FormatError::BadLength(_))));
    }

    #[test]
    fn segment_header_round_trip_and_crc() {
        let h = SegmentHeader {
            base_position: 1 << 30,
            created_ms: 7,
            next_offsets: vec![(ShardId(0), Offset(5)), (ShardId(9), Offset(0))],
        };
        let mut block = vec![0u8; SEGMENT_HEADER_BYTES as usize];
        h.encode(&mut block);
        assert_eq!(&block[0..4], b"FXS1");
        assert_eq!(SegmentHeader::decode(&block).unwrap(), h);
        block[40] ^= 1;
        assert!(SegmentHeader::decode(&block).is_err());
    }

    proptest::proptest! {
        #[test]
        fn any_batch_round_trips(
            values in proptest::collection::vec(
                (proptest::option::of(proptest::collection::vec(0u8.., 0..20)),
                 proptest::collection::vec(0u8.., 0..100)), 1..20),
            base in 0u64..u64::MAX / 2,
            tag in proptest::option::of((0u64.., 0u32..)),
            epoch in proptest::option::of(0u64..),
        ) {
            let records: Vec<Record> = values
                .into_iter()
                .map(|(k, v)| Record { key: k.map(Bytes::from), value: v.into() })
                .collect();
            let tag = tag.map(|(p, seq)| ProducerTag { producer: ProducerId(p), seq });
            let mut out = vec![0u8; batch_encoded_len(&records, tag, epoch)];
            encode_batch(&mut out, ShardId(1), Offset(base), 5, tag, epoch, &records);
            let header = verify_batch(&out, 1 << 20).unwrap();
            proptest::prop_assert_eq!(header.base_offset, Offset(base));
            proptest::prop_assert_eq!(header.producer, tag);
            proptest::prop_assert_eq!(header.epoch, epoch);
            let decoded = decode_records(&Bytes::from(out), &header).unwrap();
            proptest::prop_assert_eq!(decoded, records);
        }

        /// Records whose payloads are split into parts (the QUIC chunks they arrived in)
        /// encode to the same bytes, CRC included, as the same records held contiguously, and
        /// the CRC computed while copying is the one over the finished batch.
        #[test]
        fn a_batch_encoded_from_parts_equals_the_contiguous_encoding(
            values in proptest::collection::vec(
                (proptest::option::of(proptest::collection::vec(0u8.., 0..20)),
                 proptest::collection::vec(0u8.., 0..3000),
                 proptest::collection::vec(0usize..3000, 0..6)), 1..12),
        ) {
            let mut contiguous = Vec::new();
            let mut split = Vec::new();
            for (k, v, cuts) in values {
                let key = k.map(Bytes::from);
                let whole = Bytes::from(v);
                let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (whole.len() + 1)).collect();
                cuts.sort_unstable();
                let mut parts = Vec::new();
                let mut at = 0;
                for c in cuts.into_iter().chain([whole.len()]) {
                    parts.push(Bytes::copy_from_slice(&whole[at..c]));
                    at = c;
                }
                split.push(Record { key: key.clone(), value: Payload::from_parts(parts) });
                contiguous.push(Record { key, value: whole.into() });
            }
            let want = encoded(&contiguous);
            let got = encoded(&split);
            proptest::prop_assert_eq!(&got, &want);
            proptest::prop_assert_eq!(u32_at(&got, 8), batch_crc(&got));
            proptest::prop_assert!(verify_batch(&got, 1 << 20).is_ok());
        }
    }
}
