//! Configuration, limits, and the mapping of stream names to directory names.

use std::path::PathBuf;

use crate::error::{Result, StorageError};
use crate::format::{FORMAT_ALIGN_BYTES, SEGMENT_HEADER_BYTES};
use crate::producers::PRODUCERS_PER_SHARD_MAX;

/// The most bytes one write to a segment carries (several batches, padded).
pub const WRITE_BYTES_MAX: usize = 4 << 20;
/// The writer stops adding batches to a write once it holds this many bytes, so that
/// several writes can be in flight (the device is several times faster at queue depth > 1).
pub const WRITE_BYTES_TARGET: usize = 1 << 20;
/// The most bytes in flight (issued, not yet completed) per log. It is also the torn-tail
/// window of recovery: all writes that can be unfinished at a crash lie within this
/// distance of the oldest, so damage followed by valid data further away is corruption.
pub const WRITE_IN_FLIGHT_BYTES_MAX: usize = 8 << 20;
const _: () = assert!(WRITE_IN_FLIGHT_BYTES_MAX >= WRITE_BYTES_MAX);
/// The most fdatasyncs in flight per log. A durable append whose write completes while a
/// flush runs does not wait for that flush to end before its own starts: with one at a time
/// it waited the rest of that flush and then a whole one (p99 about twice the flush's).
pub const FLUSHES_IN_FLIGHT_MAX: usize = 2;
/// Largest step in which the active segment's space is prepared ahead of its writes
/// ([`Preallocate`]): the step is as large as the segment's data so far, between
/// `SEGMENT_GROW_MIN_BYTES` and this. With `Preallocate::Reserve` a segment holds at most
/// about one step more disk than its data (twice its data while it is small); with
/// `Preallocate::Zero` the zeros run up to two steps and one write ahead (at most 12 MiB). A
/// log that was never written holds one header block.
pub const SEGMENT_GROW_BYTES: u64 = 4 << 20;
/// Smallest reservation step (the first write of a segment reserves this much beyond it).
pub const SEGMENT_GROW_MIN_BYTES: u64 = 64 << 10;
const _: () = assert!(SEGMENT_GROW_BYTES.is_multiple_of(FORMAT_ALIGN_BYTES));
const _: () = assert!(SEGMENT_GROW_MIN_BYTES.is_multiple_of(FORMAT_ALIGN_BYTES));
const _: () = assert!(SEGMENT_GROW_MIN_BYTES <= SEGMENT_GROW_BYTES);
/// Upper bound for `StorageConfig::batch_bytes_max` (a batch must fit one write).
pub const BATCH_BYTES_LIMIT: usize = WRITE_BYTES_MAX - FORMAT_ALIGN_BYTES as usize;
/// Longest stream name accepted, in bytes: the protocol's one limit.
pub const STREAM_NAME_BYTES_MAX: usize = felix_proto::limits::MAX_STREAM_NAME_BYTES;
/// Longest directory name [`stream_dir_name`] returns. Kept well under the file systems'
/// 255-byte name limit so that files named after it (`<dir name>.meta`, temporaries) fit too.
pub const STREAM_DIR_NAME_BYTES_MAX: usize = 200;
/// Bytes of the escaped name kept in front of the hash when the escaped name is too long.
const STREAM_DIR_NAME_PREFIX_BYTES: usize = STREAM_DIR_NAME_BYTES_MAX - 1 - 64;
const _: () = assert!(STREAM_DIR_NAME_BYTES_MAX + 16 < 255);

/// Retention of one stream log: segments are deleted, oldest first, while either rule says
/// so. The active (last) segment is never deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetentionConfig {
    /// Keep at most about this many bytes (whole segments are deleted).
    pub bytes_max: Option<u64>,
    /// Delete segments whose newest batch is older than this.
    pub age_ms_max: Option<u64>,
}

/// `name` (the spelling in flags and configuration files), `Display` and `FromStr` of a
/// configuration enum, from its variants' names; `FromStr` names the choices when it refuses.
macro_rules! config_names {
    ($ty:ident, $what:literal, { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// The name used in flags and configuration files.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name,)+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                $(if s == $name {
                    return Ok($ty::$variant);
                })+
                let choices = [$($name),+].join(" or ");
                Err(format!("{} must be {choices}, not {s:?}", $what))
            }
        }
    };
}

/// Default of [`StorageConfig::read_cache_bytes`].
pub const READ_CACHE_BYTES_DEFAULT: u64 = 32 << 20;

/// Configuration of the store of one core.
#[derive(Clone, Debug)]
pub struct StorageConfig {
    /// Data directory of the whole process; the core's logs live in `<dir>/core-<n>/`.
    pub dir: PathBuf,
    /// A segment rolls when the next write would make it larger than this.
    pub segment_bytes_max: u64,
    /// Largest encoded batch accepted (header included).
    pub batch_bytes_max: usize,
    /// Most records accepted in one batch.
    pub batch_records_max: usize,
    /// Most encoded bytes queued for writing per stream log before appends get `QueueFull`.
    pub queue_bytes_max: usize,
    /// Repair corruption found before the tail by truncating there (reported), instead of
    /// refusing to open.
    pub repair: bool,
    /// Default retention of stream logs.
    pub retention: RetentionConfig,
    /// Producers whose last batches each shard remembers for idempotent appends (default
    /// [`PRODUCERS_PER_SHARD_MAX`]); beyond it, the producer whose last append is oldest is
    /// forgotten, and a retry of its batches is then stored as new. At least 1.
    pub producers_per_shard_max: usize,
    /// A producer idle longer than this, by the shard's batch times, is forgotten (default
    /// [`crate::PRODUCER_EXPIRY_MS`], 7 days): a retry of its batches is then stored as new.
    pub producer_expiry_ms: u64,
    /// Bytes of recently read log blocks a core keeps for its readers (whole
    /// [`crate::READ_CACHE_BLOCK_BYTES`] blocks; 0: no cache). See `crate::cache`.
    pub read_cache_bytes: u64,
    /// How a durable append is made durable (default [`WriteSync::Fdatasync`]).
    pub write_sync: WriteSync,
    /// How the active segment's space is prepared ahead of its writes (default
    /// [`Preallocate::Reserve`]).
    pub preallocate: Preallocate,
}

/// How the active segment's space is prepared ahead of its writes, in steps of up to
/// [`SEGMENT_GROW_BYTES`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Preallocate {
    /// Blocks are reserved (`fallocate`, keeping the file size) just before the writes
    /// reach them. Every write then changes the file's metadata (its blocks turn from
    /// unwritten to written, the file grows), so every group-commit fdatasync also commits
    /// the file system's journal.
    #[default]
    Reserve,
    /// Zeros are written ahead of the writes (a step at a time, while earlier writes go
    /// on): the writes then overwrite written blocks inside the file, and an fdatasync
    /// flushes their data and the device's cache without a journal commit. Every byte is
    /// written twice (zeros first), off the acknowledgement path. Zeros read as padding, so
    /// recovery ends the segment after its last valid batch. On this project's test disk,
    /// 1 MiB writes each followed by an fdatasync ran 1.6x faster over zeroed blocks, but the
    /// broker stored 0.83-0.91x as much saturated (the disk writes twice the bytes and its
    /// cache flushes carry the zeros too): see bench/results/2026-12-01-preallocate-zero/.
    Zero,
}

/// How the data of durable appends reaches stable storage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WriteSync {
    /// Segments are opened with O_DSYNC: a completed write is durable, and a durable append
    /// is acknowledged when its write is published (one device operation: the write, with
    /// the file system's journal commit and a cache flush inside it). Each write then pays
    /// its own commit and flush: on this project's test disk, more throughput saturated but
    /// a worse ack p99 at half load than group commit (bench/results/2026-12-01-write-sync/).
    Dsync,
    /// Plain O_DIRECT writes, then group commit: an fdatasync covering every append written
    /// when it was issued (two device operations one after the other).
    #[default]
    Fdatasync,
}

config_names!(WriteSync, "write sync", { Dsync => "dsync", Fdatasync => "fdatasync" });
config_names!(Preallocate, "preallocate", { Reserve => "reserve", Zero => "zero" });

impl StorageConfig {
    /// Defaults for `dir`: 256 MiB segments, 1 MiB batches, 10 000 records, 64 MiB queue,
    /// 32 MiB read cache.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            segment_bytes_max: 256 << 20,
            batch_bytes_max: 1 << 20,
            batch_records_max: 10_000,
            queue_bytes_max: 64 << 20,
            repair: false,
            retention: RetentionConfig::default(),
            producers_per_shard_max: PRODUCERS_PER_SHARD_MAX,
            producer_expiry_ms: crate::PRODUCER_EXPIRY_MS,
            read_cache_bytes: READ_CACHE_BYTES_DEFAULT,
            write_sync: WriteSync::default(),
            preallocate: Preallocate::default(),
        }
    }

    /// Check the limits against each other.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason| Err(StorageError::InvalidConfig { reason });
        if self.batch_bytes_max > BATCH_BYTES_LIMIT || self.batch_bytes_max < 64 {
            return bad("batch_bytes_max must be in 64..=BATCH_BYTES_LIMIT");
        }
        if self.segment_bytes_max < SEGMENT_HEADER_BYTES + WRITE_BYTES_MAX as u64 {
            return bad("segment_bytes_max must hold a header block and one full write");
        }
        if self.batch_records_max == 0 || self.batch_records_max > u32::MAX as usize {
            return bad("batch_records_max must be in 1..=u32::MAX");
        }
        if self.queue_bytes_max < self.batch_bytes_max {
            return bad("queue_bytes_max must hold at least one batch");
        }
        if self.producers_per_shard_max == 0 {
            return bad("producers_per_shard_max must be at least 1");
        }
        if self.read_cache_bytes != 0 && self.read_cache_bytes < crate::READ_CACHE_BLOCK_BYTES {
            return bad("read_cache_bytes must be 0 (no cache) or at least one 1 MiB block");
        }
        Ok(())
    }
}

/// Map a broker stream name ("tenant/namespace/stream") to one directory name.
///
/// Bytes `[A-Za-z0-9_-]` are kept; every other byte (including `/`, `.` and `%`) becomes
/// `%XX` with two upper-case hex digits. If that escaped form is longer than
/// [`STREAM_DIR_NAME_BYTES_MAX`], the name is its first bytes, `~` and the SHA-256 of the
/// whole stream name in hex (escaping never produces `~`, so the two forms cannot collide).
/// The mapping is injective (up to SHA-256 collisions), the result never contains `/`, never
/// starts with `.`, and is at most `STREAM_DIR_NAME_BYTES_MAX` bytes, so every name within
/// [`STREAM_NAME_BYTES_MAX`] has a directory.
/// Rejected: empty names, names longer than `STREAM_NAME_BYTES_MAX`, empty components
/// (leading, trailing or doubled `/`), and control characters.
pub fn stream_dir_name(name: &str) -> Result<String> {
    let reject = |reason| Err(StorageError::InvalidStreamName { name: name.to_owned(), reason });
    if name.is_empty() {
        return reject("empty");
    }
    if name.len() > STREAM_NAME_BYTES_MAX {
        return reject("longer than STREAM_NAME_BYTES_MAX bytes");
    }
    if name.split('/').any(str::is_empty) {
        return reject("empty path component");
    }
    if name.chars().any(char::is_control) {
        return reject("control character");
    }
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.len() > STREAM_DIR_NAME_BYTES_MAX {
        use sha2::Digest;
        out.truncate(STREAM_DIR_NAME_PREFIX_BYTES);
        out.push('~');
        for b in sha2::Sha256::digest(name.as_bytes()) {
            out.push_str(&format!("{b:02x}"));
        }
    }
    debug_assert!(out.len() <= STREAM_DIR_NAME_BYTES_MAX);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_escape_to_one_safe_component() {
        assert_eq!(stream_dir_name("t/ns/s-1_x").unwrap(), "t%2Fns%2Fs-1_x");
        assert_eq!(stream_dir_name("..").unwrap(), "%2E%2E");
        assert_eq!(stream_dir_name("a%2F").unwrap(), "a%252F");
        assert_eq!(stream_dir_name("é").unwrap(), "%C3%A9");
        // Injective on a pair that would collide under naive escaping.
        assert_ne!(stream_dir_name("a/b").unwrap(), stream_dir_name("a%2Fb").unwrap());
    }

    #[test]
    fn every_name_within_the_limit_has_a_short_distinct_directory() {
        let seg = "a.".repeat(32);
        let longest = format!("{seg}/{seg}/{seg}");
        assert_eq!(longest.len(), STREAM_NAME_BYTES_MAX);
        let dir = stream_dir_name(&longest).unwrap();
        assert!(dir.len() <= STREAM_DIR_NAME_BYTES_MAX, "{} bytes", dir.len());
        assert!(dir.contains('~'));
        // Names sharing the kept prefix still map apart.
        let other = format!("{seg}/{seg}/{}b", &seg[..63]);
        assert_ne!(stream_dir_name(&other).unwrap(), dir);
        // Short names keep the readable escaped form.
        assert!(!stream_dir_name("t/ns/s").unwrap().contains('~'));
    }

    #[test]
    fn bad_names_are_typed_errors() {
        let long = "x".repeat(STREAM_NAME_BYTES_MAX + 1);
        for bad in ["", "/a", "a/", "a//b", "a\nb", &long] {
            assert!(
                matches!(stream_dir_name(bad), Err(StorageError::InvalidStreamName { .. })),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn mode_names_parse_back_and_refusals_name_the_choices() {
        for w in [WriteSync::Dsync, WriteSync::Fdatasync] {
            assert_eq!(w.name().parse::<WriteSync>(), Ok(w));
            assert_eq!(w.to_string(), w.name());
        }
        for p in [Preallocate::Reserve, Preallocate::Zero] {
            assert_eq!(p.name().parse::<Preallocate>(), Ok(p));
        }
        assert_eq!(
            "ahead".parse::<Preallocate>(),
            Err("preallocate must be reserve or zero, not \"ahead\"".to_owned())
        );
        assert_eq!(
            "sometimes".parse::<WriteSync>(),
            Err("write sync must be dsync or fdatasync, not \"sometimes\"".to_owned())
        );
    }

    #[test]
    fn config_limits_are_checked() {
        let mut c = StorageConfig::new("/tmp/x");
        assert!(c.validate().is_ok());
        c.batch_bytes_max = BATCH_BYTES_LIMIT + 1;
        assert!(matches!(c.validate(), Err(StorageError::InvalidConfig { .. })));
        let mut c = StorageConfig::new("/tmp/x");
        c.segment_bytes_max = 4096;
        assert!(c.validate().is_err());
        let mut c = StorageConfig::new("/tmp/x");
        c.producers_per_shard_max = 0;
        assert!(matches!(c.validate(), Err(StorageError::InvalidConfig { .. })));
    }
}
