//! Counters and histograms of one stream log. Single-threaded: plain integers, no atomics.

use hdrhistogram::Histogram;

/// Highest value the histograms track (values above are clamped).
const HISTOGRAM_MAX: u64 = 60_000_000;

/// A snapshot of a stream log's counters.
#[derive(Clone, Debug)]
pub struct StorageStats {
    /// Batches accepted by `append`.
    pub appends: u64,
    /// Records accepted.
    pub records: u64,
    /// Encoded batch bytes written (headers included, padding excluded).
    pub batch_bytes: u64,
    /// Bytes handed to the device (batches, padding and segment headers).
    pub bytes_written: u64,
    /// Write operations issued.
    pub writes: u64,
    /// Zeros written ahead of the writes (`Preallocate::Zero`), bytes; not in
    /// `bytes_written`.
    pub zero_fill_bytes: u64,
    /// fdatasync calls issued (group commits, segment rolls, segment creation).
    pub flushes: u64,
    /// Group-commit fdatasyncs issued while another of the same log was in flight
    /// (`FLUSHES_IN_FLIGHT_MAX`).
    pub flushes_overlapped: u64,
    /// Appends rejected with an error.
    pub append_errors: u64,
    /// Tagged appends answered from a shard's producer table as retries of a stored batch
    /// (nothing appended; not counted in `appends`).
    pub duplicates: u64,
    /// Producers forgotten because a shard's table was full (`producers_per_shard_max`);
    /// a retry of their batches is stored as new. Counts evictions since the log opened,
    /// not those of recovery's rebuild.
    pub producers_evicted: u64,
    /// Producers forgotten because they were idle longer than `producer_expiry_ms`; likewise
    /// since the log opened.
    pub producers_expired: u64,
    /// Epoch changes forgotten because a shard's epoch index was full
    /// (`EPOCH_CHANGES_PER_SHARD_MAX`): epoch queries about older epochs then answer
    /// conservatively. Counts drops since the log opened, not those of recovery's rebuild.
    pub epoch_changes_dropped: u64,
    /// Writes that failed with ENOSPC.
    pub no_space_errors: u64,
    /// Segments created.
    pub segments_created: u64,
    /// Segments deleted by retention.
    pub segments_deleted: u64,
    /// Bytes deleted by retention.
    pub retention_bytes_deleted: u64,
    /// Bytes truncated from a torn tail on recovery.
    pub torn_bytes_dropped: u64,
    /// Bytes dropped by an operator-requested repair.
    pub repaired_bytes_dropped: u64,
    /// Durable appends acknowledged by each group-commit flush.
    pub fan_in: Histogram<u64>,
    /// Latency of group-commit fdatasyncs, microseconds.
    pub flush_latency_us: Histogram<u64>,
    /// Latency of log writes (issue to completion of one O_DIRECT write through the ring),
    /// microseconds: with the flush, what a durable append waits for on the disk.
    pub write_latency_us: Histogram<u64>,
}

impl StorageStats {
    pub(crate) fn new() -> Self {
        let h =
            || Histogram::new_with_bounds(1, HISTOGRAM_MAX, 3).expect("static bounds are valid");
        Self {
            appends: 0,
            records: 0,
            batch_bytes: 0,
            bytes_written: 0,
            writes: 0,
            zero_fill_bytes: 0,
            flushes: 0,
            flushes_overlapped: 0,
            append_errors: 0,
            duplicates: 0,
            producers_evicted: 0,
            producers_expired: 0,
            epoch_changes_dropped: 0,
            no_space_errors: 0,
            segments_created: 0,
            segments_deleted: 0,
            retention_bytes_deleted: 0,
            torn_bytes_dropped: 0,
            repaired_bytes_dropped: 0,
            fan_in: h(),
            flush_latency_us: h(),
            write_latency_us: h(),
        }
    }

    pub(crate) fn record_flush(&mut self, fan_in: u64, latency_us: u64) {
        self.flushes += 1;
        if fan_in > 0 {
            self.fan_in.saturating_record(fan_in);
        }
        self.flush_latency_us.saturating_record(latency_us.max(1));
    }

    /// Flushes per GiB of batch bytes (the shard-count cost measure of the benchmark).
    pub fn flushes_per_gib(&self) -> f64 {
        if self.batch_bytes == 0 {
            return 0.0;
        }
        self.flushes as f64 / (self.batch_bytes as f64 / f64::from(1u32 << 30))
    }
}
