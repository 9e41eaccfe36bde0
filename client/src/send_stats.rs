//! How long a publisher's batches waited inside the client before they were written
//! ([`crate::Publisher::send_stats`]): the part of a record's publish latency that neither the
//! network nor the broker sees.
//!
//! A publisher worker sends its ready batches one after another. A batch that waits for its
//! producer's window (idempotent publishing), for an in-flight slot, or for QUIC to take its
//! bytes holds up every batch behind it on that worker, whatever their shards: the send delay
//! histogram shows that wait, and the wait counters say which limit it was.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hdrhistogram::Histogram;

/// The longest send delay the histogram tells apart, in microseconds (1 minute); longer ones
/// count as that.
pub const SEND_DELAY_US_MAX: u64 = 60_000_000;
/// Significant digits of the send delay histogram.
pub const SEND_DELAY_SIGNIFICANT_DIGITS: u8 = 3;

/// A publisher's send statistics since it started, summed over its workers.
#[derive(Clone, Debug)]
pub struct SendStats {
    /// Batches written to their QUIC stream for the first time (a batch sent again after a
    /// lost connection is not counted again).
    pub batches: u64,
    /// Each of those batches' send delay, in microseconds: from the moment it was ready (full,
    /// or its linger time up) until its Publish frame was written to its QUIC stream.
    pub delay_us: Histogram<u64>,
    /// Times a batch waited for its producer's window (`PRODUCER_IN_FLIGHT_MAX` unresolved
    /// batches per producer, idempotent publishing only).
    pub window_waits: u64,
    /// Microseconds spent in those waits.
    pub window_wait_us: u64,
    /// Times a batch waited for an in-flight slot (`in_flight_batches_max` per connection).
    pub in_flight_waits: u64,
    /// Microseconds spent in those waits.
    pub in_flight_wait_us: u64,
    /// Microseconds spent writing the batches' frames to their QUIC streams: short unless QUIC
    /// held the writes back (the broker's flow control, or the connection's send buffer).
    pub write_us: u64,
}

impl Default for SendStats {
    fn default() -> Self {
        Self {
            batches: 0,
            delay_us: new_delay_histogram(),
            window_waits: 0,
            window_wait_us: 0,
            in_flight_waits: 0,
            in_flight_wait_us: 0,
            write_us: 0,
        }
    }
}

impl SendStats {
    /// Adds `other`'s counts to these (another publisher's, or another worker's).
    pub fn add(&mut self, other: &SendStats) {
        self.batches += other.batches;
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = self.delay_us.add(&other.delay_us);
        self.window_waits += other.window_waits;
        self.window_wait_us += other.window_wait_us;
        self.in_flight_waits += other.in_flight_waits;
        self.in_flight_wait_us += other.in_flight_wait_us;
        self.write_us += other.write_us;
    }

    /// What happened since `earlier` (a snapshot of the same publisher): counters and
    /// histogram buckets less `earlier`'s, a bucket that shrank counting as empty.
    pub fn since(&self, earlier: &SendStats) -> SendStats {
        let mut delay_us = new_delay_histogram();
        for v in self.delay_us.iter_recorded() {
            let before = earlier.delay_us.count_at(v.value_iterated_to());
            let n = v.count_at_value().saturating_sub(before);
            if n > 0 {
                delay_us.saturating_record_n(v.value_iterated_to(), n);
            }
        }
        SendStats {
            batches: self.batches.saturating_sub(earlier.batches),
            delay_us,
            window_waits: self.window_waits.saturating_sub(earlier.window_waits),
            window_wait_us: self.window_wait_us.saturating_sub(earlier.window_wait_us),
            in_flight_waits: self.in_flight_waits.saturating_sub(earlier.in_flight_waits),
            in_flight_wait_us: self.in_flight_wait_us.saturating_sub(earlier.in_flight_wait_us),
            write_us: self.write_us.saturating_sub(earlier.write_us),
        }
    }
}

fn new_delay_histogram() -> Histogram<u64> {
    // Constant bounds that satisfy new_with_bounds (low >= 1, high >= 2 * low, sigfig <= 5).
    Histogram::new_with_bounds(1, SEND_DELAY_US_MAX, SEND_DELAY_SIGNIFICANT_DIGITS)
        .expect("constant histogram bounds")
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Reads a publisher's send statistics from anywhere (another thread, a sampler), without
/// holding the publisher itself ([`crate::Publisher::send_stats_reader`]). Cheap to clone.
#[derive(Clone, Debug)]
pub struct SendStatsReader(pub(crate) Arc<SendRecorder>);

impl SendStatsReader {
    /// The statistics as of now (a copy).
    pub fn read(&self) -> SendStats {
        self.0.snapshot()
    }
}

/// The workers' shared recorder of one publisher.
#[derive(Debug, Default)]
pub(crate) struct SendRecorder(Mutex<SendStats>);

impl SendRecorder {
    fn lock(&self) -> MutexGuard<'_, SendStats> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A batch was written `delay` after it was ready; the write itself took `write`.
    pub(crate) fn written(&self, delay: Duration, write: Duration) {
        let mut s = self.lock();
        s.batches += 1;
        s.delay_us.saturating_record(us(delay).max(1));
        s.write_us += us(write);
    }

    /// A batch waited `d` for its producer's window.
    pub(crate) fn window_wait(&self, d: Duration) {
        let mut s = self.lock();
        s.window_waits += 1;
        s.window_wait_us += us(d);
    }

    /// A batch waited `d` for an in-flight slot.
    pub(crate) fn in_flight_wait(&self, d: Duration) {
        let mut s = self.lock();
        s.in_flight_waits += 1;
        s.in_flight_wait_us += us(d);
    }

    pub(crate) fn snapshot(&self) -> SendStats {
        self.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_keeps_only_what_came_after_the_earlier_snapshot() {
        let r = SendRecorder::default();
        for _ in 0..1_000 {
            r.written(Duration::from_micros(50), Duration::from_micros(5));
        }
        r.in_flight_wait(Duration::from_millis(2));
        let earlier = r.snapshot();
        for _ in 0..10 {
            r.written(Duration::from_millis(20), Duration::from_micros(5));
        }
        r.window_wait(Duration::from_millis(3));
        let later = r.snapshot();
        let d = later.since(&earlier);
        assert_eq!(d.batches, 10);
        assert_eq!(d.delay_us.len(), 10);
        // The 1,000 short delays before the edge are gone: the window's median is 20 ms.
        let p50 = d.delay_us.value_at_quantile(0.5);
        assert!((19_900..=20_100).contains(&p50), "{p50}");
        assert_eq!((d.window_waits, d.window_wait_us), (1, 3_000));
        assert_eq!((d.in_flight_waits, d.in_flight_wait_us), (0, 0));
        assert_eq!(d.write_us, 50);
        // Against itself, nothing happened.
        let none = later.since(&later);
        assert_eq!((none.batches, none.delay_us.len(), none.write_us), (0, 0, 0));
    }

    #[test]
    fn add_sums_two_publishers() {
        let (a, b) = (SendRecorder::default(), SendRecorder::default());
        a.written(Duration::from_micros(10), Duration::ZERO);
        b.written(Duration::from_millis(40), Duration::from_micros(7));
        b.in_flight_wait(Duration::from_millis(1));
        let mut sum = a.snapshot();
        sum.add(&b.snapshot());
        assert_eq!(sum.batches, 2);
        assert_eq!(sum.delay_us.len(), 2);
        assert!(sum.delay_us.max() >= 39_000, "{}", sum.delay_us.max());
        assert_eq!((sum.in_flight_waits, sum.in_flight_wait_us, sum.write_us), (1, 1_000, 7));
    }
}
