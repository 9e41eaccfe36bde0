//! A sleep with microsecond resolution for the publisher's linger.
//!
//! tokio's timer wheel counts in 1 ms ticks and rounds every sleep up to the next tick, so a
//! 1 ms linger waited 1-2 ms and added ~1.9 ms to a client's p99 (bench/results/2026-12-01-linger).
//! A `timerfd` registered with tokio's reactor wakes the worker when the kernel's high-resolution
//! timer fires instead. Where a timerfd cannot be made (or on a system other than Linux), the
//! sleep is tokio's. tokio's timer also backs every sleep up, [`BACKSTOP`] after the deadline:
//! in real time the timerfd comes first, and under a paused test clock it is what ends the sleep.
//! The crate's one `unsafe` block (registering the fd) and its timer syscalls live here.

#[cfg(target_os = "linux")]
use std::io;
#[cfg(target_os = "linux")]
use std::os::fd::OwnedFd;
use std::time::Duration;

#[cfg(target_os = "linux")]
use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};
#[cfg(target_os = "linux")]
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;

/// How long after its deadline tokio's timer ends a sleep the timerfd has not ended.
pub(crate) const BACKSTOP: Duration = Duration::from_millis(2);

/// One worker's fine-grained timer. Sleeps on it are not concurrent (`&mut self`); a sleep that
/// is dropped before it fires leaves the timer armed: the next sleep until the same instant
/// waits for that expiry without a syscall, one until another instant re-arms the timer, which
/// discards the stale expiry.
#[derive(Debug)]
pub(crate) struct FineTimer {
    #[cfg(target_os = "linux")]
    fd: Option<AsyncFd<OwnedFd>>,
    /// The instant the timer is armed for and whose expiry is not read yet.
    #[cfg(target_os = "linux")]
    armed: Option<Instant>,
}

impl FineTimer {
    /// A timer on a `timerfd`, or on tokio's timer where one cannot be made (it logs why).
    /// Must be called inside a tokio runtime with I/O enabled.
    #[cfg(target_os = "linux")]
    pub(crate) fn new() -> Self {
        match Self::timerfd() {
            Ok(fd) => Self { fd: Some(fd), armed: None },
            Err(e) => {
                tracing::warn!(error = %e, "no timerfd; linger deadlines use tokio's 1 ms timer");
                Self { fd: None, armed: None }
            }
        }
    }

    /// A timer on tokio's timer (no timerfd here).
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn new() -> Self {
        Self {}
    }

    /// Returns at `at` (or at once if it has passed), [`BACKSTOP`] after it at the latest
    /// by tokio's clock.
    pub(crate) async fn sleep_until(&mut self, at: Instant) {
        tokio::select! {
            biased;
            _ = self.fine_sleep_until(at) => {}
            _ = tokio::time::sleep_until(at + BACKSTOP) => {}
        }
    }

    #[cfg(not(target_os = "linux"))]
    async fn fine_sleep_until(&mut self, at: Instant) {
        tokio::time::sleep_until(at).await
    }

    #[cfg(target_os = "linux")]
    fn timerfd() -> io::Result<AsyncFd<OwnedFd>> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        // SAFETY: `AsyncFd::register` needs the fd to stay open and the same for the AsyncFd's
        // whole life. An `OwnedFd` owns it and closes it only when dropped, which is after the
        // AsyncFd deregisters it (the AsyncFd owns the OwnedFd), and always returns that fd.
        #[allow(unsafe_code)]
        let registered = unsafe { AsyncFd::register(fd) };
        Ok(registered?)
    }

    /// Whether sleeps use a timerfd.
    #[cfg(all(test, target_os = "linux"))]
    pub(crate) fn is_fine(&self) -> bool {
        self.fd.is_some()
    }

    #[cfg(target_os = "linux")]
    async fn fine_sleep_until(&mut self, at: Instant) {
        let Some(fd) = &self.fd else {
            return tokio::time::sleep_until(at).await;
        };
        let wait = at.saturating_duration_since(Instant::now());
        if wait.is_zero() {
            return;
        }
        if self.armed != Some(at) {
            self.armed = None;
            if arm(fd, wait).is_err() {
                // Cannot happen with a valid fd and value; tokio's timer still keeps the deadline.
                return tokio::time::sleep_until(at).await;
            }
            self.armed = Some(at);
        }
        loop {
            let Ok(mut guard) = fd.readable().await else {
                return tokio::time::sleep_until(at).await;
            };
            let mut expirations = [0u8; 8];
            match rustix::io::read(fd.get_ref(), &mut expirations) {
                Ok(8) => {
                    self.armed = None;
                    return;
                }
                // Readiness left from an expiry the re-arm discarded: wait for the new one.
                Err(rustix::io::Errno::AGAIN) => guard.clear_ready(),
                _ => {
                    self.armed = None;
                    return tokio::time::sleep_until(at).await;
                }
            }
        }
    }
}

/// Arms the timer to fire once, `wait` from now; this resets any expiry not yet read.
#[cfg(target_os = "linux")]
fn arm(fd: &AsyncFd<OwnedFd>, wait: Duration) -> io::Result<()> {
    let value = Itimerspec {
        it_interval: Timespec { tv_sec: 0, tv_nsec: 0 },
        it_value: Timespec {
            tv_sec: wait.as_secs() as _,
            // A zero value would disarm the timer; `wait` is not zero here.
            tv_nsec: wait.subsec_nanos() as _,
        },
    };
    timerfd_settime(fd.get_ref(), TimerfdTimerFlags::empty(), &value)?;
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sleep_lasts_at_least_its_wait() {
        let mut t = FineTimer::new();
        assert!(t.is_fine(), "timerfd is available on Linux");
        // Its precision is measured by the fixed-rate latency bench, not asserted here.
        for wait_us in [1, 50, 200, 1_500] {
            let start = Instant::now();
            t.sleep_until(start + Duration::from_micros(wait_us)).await;
            let took = start.elapsed();
            assert!(took >= Duration::from_micros(wait_us), "{took:?} before {wait_us} us");
        }
    }

    #[tokio::test]
    async fn a_stale_expiry_does_not_end_the_next_sleep_early() {
        let mut t = FineTimer::new();
        // Arm for 100 us and give up on it at once; it expires unread.
        tokio::select! {
            biased;
            _ = t.sleep_until(Instant::now() + Duration::from_micros(100)) => panic!("fired at once"),
            _ = std::future::ready(()) => {}
        }
        std::thread::sleep(Duration::from_millis(2));
        let start = Instant::now();
        t.sleep_until(start + Duration::from_millis(5)).await;
        assert!(start.elapsed() >= Duration::from_millis(5), "{:?}", start.elapsed());
    }

    #[tokio::test]
    async fn a_sleep_given_up_and_taken_up_again_keeps_its_deadline() {
        let mut t = FineTimer::new();
        let start = Instant::now();
        let at = start + Duration::from_millis(3);
        for _ in 0..3 {
            tokio::select! {
                biased;
                _ = t.sleep_until(at) => panic!("fired at once"),
                _ = std::future::ready(()) => {}
            }
        }
        t.sleep_until(at).await;
        assert!(start.elapsed() >= Duration::from_millis(3), "{:?}", start.elapsed());
        // Its expiry was read: a later sleep waits for its own.
        let again = Instant::now();
        t.sleep_until(again + Duration::from_millis(2)).await;
        assert!(again.elapsed() >= Duration::from_millis(2), "{:?}", again.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_paused_clock_ends_a_sleep_by_the_backstop() {
        let mut t = FineTimer::new();
        let start = Instant::now();
        t.sleep_until(start + Duration::from_secs(3600)).await;
        assert!(start.elapsed() >= Duration::from_secs(3600));
        assert!(start.elapsed() <= Duration::from_secs(3600) + BACKSTOP);
    }

    #[tokio::test]
    async fn a_deadline_in_the_past_returns_at_once() {
        let mut t = FineTimer::new();
        let start = Instant::now();
        t.sleep_until(start - Duration::from_millis(1)).await;
        t.sleep_until(start).await;
        assert!(start.elapsed() < Duration::from_millis(100));
    }
}
