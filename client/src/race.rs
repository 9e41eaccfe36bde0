//! Staggered races ("happy eyeballs", RFC 8305): several ways of getting one answer, tried
//! one after another without waiting for each to fail. The next attempt starts when the ones
//! running have all failed, or a fixed delay after the last one started, whichever comes
//! first; the first decisive outcome wins and the attempts still running are dropped
//! (cancelled).
//!
//! Used for the connection to the first seed broker, and in a cluster for the requests any
//! broker can answer (`Metadata`, stream descriptions): a broker that died without closing its
//! connections never answers, and must not hold the client for a connect or ack timeout while
//! another broker would answer at once.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

/// Runs `attempts` in order, each starting when every attempt started before it has finished
/// without a decisive outcome, or `stagger` after the last start. Returns the first outcome
/// `decisive` accepts, or, when none is, the last outcome (`None`: no attempts).
///
/// Bounded: at most `attempts.len()` futures, each polled only once started.
pub(crate) async fn first_decisive<F: Future>(
    attempts: Vec<F>,
    stagger: Duration,
    decisive: impl Fn(&F::Output) -> bool,
) -> Result<F::Output, Option<F::Output>> {
    let mut slots: Vec<Option<Pin<Box<F>>>> =
        attempts.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut started = slots.len().min(1);
    let mut last = None;
    let mut timer = Box::pin(tokio::time::sleep(stagger));
    std::future::poll_fn(|cx| loop {
        for slot in slots[..started].iter_mut() {
            let Some(attempt) = slot else { continue };
            if let Poll::Ready(out) = attempt.as_mut().poll(cx) {
                *slot = None;
                if decisive(&out) {
                    return Poll::Ready(Ok(out));
                }
                last = Some(out);
            }
        }
        let running = slots[..started].iter().any(Option::is_some);
        if started < slots.len() && (!running || timer.as_mut().poll(cx).is_ready()) {
            started += 1;
            timer.as_mut().reset(tokio::time::Instant::now() + stagger);
            continue;
        }
        if !running {
            return Poll::Ready(Err(last.take()));
        }
        return Poll::Pending;
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An attempt that answers `out` after `after_ms`.
    async fn answer(after_ms: u64, out: u32) -> u32 {
        tokio::time::sleep(Duration::from_millis(after_ms)).await;
        out
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_first_attempt_does_not_hold_the_next() {
        let started = tokio::time::Instant::now();
        // The first never answers in time; the second answers 10 ms after it starts.
        let attempts = vec![answer(60_000, 1), answer(10, 2), answer(10, 3)];
        let out = first_decisive(attempts, Duration::from_millis(100), |_| true).await;
        assert_eq!(out, Ok(2));
        assert_eq!(started.elapsed(), Duration::from_millis(110));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_attempt_starts_the_next_at_once() {
        let started = tokio::time::Instant::now();
        let attempts = vec![answer(5, 0), answer(5, 0), answer(5, 7)];
        let out = first_decisive(attempts, Duration::from_secs(10), |o| *o != 0).await;
        assert_eq!(out, Ok(7));
        assert_eq!(started.elapsed(), Duration::from_millis(15));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_decisive_outcome_the_last_one_is_returned() {
        let attempts = vec![answer(30, 1), answer(5, 2)];
        let out = first_decisive(attempts, Duration::from_millis(10), |_| false).await;
        assert_eq!(out, Err(Some(1)), "the second failed first, the first last");
        let none: Vec<std::future::Ready<u32>> = Vec::new();
        assert_eq!(first_decisive(none, Duration::from_millis(10), |_| true).await, Err(None));
    }
}
