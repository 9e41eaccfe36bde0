//! felix-storage: the durable logs of the shards that one core owns.
//!
//! Owns: the on-disk format ([`format`], byte-exact in `docs/storage-format.md`), group
//! commit, recovery, per-shard indexes, per-shard producer tables (idempotent appends),
//! per-shard epoch indexes (leader epochs, for replication's truncation handshake) and
//! retention.
//! Never does: talk to the network, or share any state with another core. Everything in
//! this crate runs inside one glommio executor; nothing is `Send` on purpose.
//!
//! Layout: one physical log per (stream, core) holding all of that core's shards of the
//! stream, so shard count never multiplies fdatasyncs; a per-shard in-memory index maps
//! offsets to log positions and is rebuilt on recovery.
//!
//! Code map: [`format`], [`crc`] (the copy into the write buffer that computes the CRC in
//! the same pass), [`index`], `producers` and `epochs` are pure; `state` is a log's shared state; `log`
//! (appends, reads), `commit` (writer and group commit), `recovery`, `retention` and
//! `truncate` (logical truncation of one shard, durable markers) hold the logic; `cache` is the
//! core's read cache of log blocks, shared by its readers; `io` is
//! the only module that touches glommio, files and clocks; `sys` wraps the syscalls
//! glommio does not offer (`statvfs`) and the crate's one `unsafe` block, the call of
//! [`crc`]'s SSE4.2 copy-and-CRC kernel.

#![deny(unsafe_code)]

mod cache;
mod commit;
mod config;
pub mod crc;
mod epochs;
mod error;
pub mod format;
pub mod index;
mod io;
mod log;
mod producers;
mod read;
mod recovery;
mod retention;
mod scan;
mod state;
mod stats;
mod store;
mod sync;
mod sys;
mod truncate;

pub use cache::{ReadCacheStats, READ_CACHE_BATCH_BYTES_MAX, READ_CACHE_BLOCK_BYTES};
pub use config::{
    stream_dir_name, Preallocate, RetentionConfig, StorageConfig, WriteSync, BATCH_BYTES_LIMIT,
    READ_CACHE_BYTES_DEFAULT, SEGMENT_GROW_BYTES, SEGMENT_GROW_MIN_BYTES, STREAM_NAME_BYTES_MAX,
    WRITE_BYTES_MAX, WRITE_BYTES_TARGET, WRITE_IN_FLIGHT_BYTES_MAX,
};
pub use epochs::EPOCH_CHANGES_PER_SHARD_MAX;
pub use error::{is_no_space, Result, StorageError};
pub use log::{
    AppendOutcome, Appending, BatchMeta, RetentionOutcome, StoredBatch, StreamLog,
    READ_GAP_BYTES_MAX, SIDECAR_BYTES_MAX,
};
pub use producers::{PRODUCERS_PER_SHARD_MAX, PRODUCER_EXPIRY_MS, PRODUCER_SEQ_WINDOW};
pub use read::{BatchView, RecordSlices};
pub use recovery::{RecoveryReport, RepairReport, SEGMENT_SUFFIX};
pub use stats::StorageStats;
pub use store::{CoreStore, BACKGROUND_SHARES};
pub use sys::{fs_space, FsSpace};
pub use truncate::{Marker, MARKER_BLOCK_BYTES, TRUNCATIONS_FILE, TRUNCATION_MARKERS_MAX};
