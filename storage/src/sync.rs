//! Single-threaded wake-up primitives (no locks, no atomics): a one-shot completion and a
//! level-triggered signal with one waiter. They know nothing about glommio.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

struct Slot<T> {
    value: Option<T>,
    closed: bool,
    waker: Option<Waker>,
}

/// The sending half of a one-shot completion.
pub(crate) struct Completer<T>(Rc<RefCell<Slot<T>>>);

/// The receiving half: resolves to `Some(value)`, or `None` if the completer was dropped.
pub(crate) struct Completion<T>(Rc<RefCell<Slot<T>>>);

/// A connected completer/completion pair.
pub(crate) fn completion<T>() -> (Completer<T>, Completion<T>) {
    let slot = Rc::new(RefCell::new(Slot { value: None, closed: false, waker: None }));
    (Completer(slot.clone()), Completion(slot))
}

impl<T> Completer<T> {
    /// Deliver the value and wake the waiter.
    pub(crate) fn complete(self, value: T) {
        let waker = {
            let mut slot = self.0.borrow_mut();
            slot.value = Some(value);
            slot.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Drop for Completer<T> {
    fn drop(&mut self) {
        let waker = {
            let mut slot = self.0.borrow_mut();
            slot.closed = true;
            slot.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Future for Completion<T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut slot = self.0.borrow_mut();
        if let Some(v) = slot.value.take() {
            return Poll::Ready(Some(v));
        }
        if slot.closed {
            return Poll::Ready(None);
        }
        slot.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

struct SignalState {
    set: bool,
    closed: bool,
    waker: Option<Waker>,
}

/// A level-triggered wake-up flag for one background task.
#[derive(Clone)]
pub(crate) struct Signal(Rc<RefCell<SignalState>>);

impl Signal {
    pub(crate) fn new() -> Self {
        Signal(Rc::new(RefCell::new(SignalState { set: false, closed: false, waker: None })))
    }

    /// Set the flag and wake the waiter.
    pub(crate) fn notify(&self) {
        let w = {
            let mut s = self.0.borrow_mut();
            s.set = true;
            s.waker.take()
        };
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Tell the waiter to stop.
    pub(crate) fn close(&self) {
        self.0.borrow_mut().closed = true;
        self.notify();
    }

    /// Wait until notified (true, flag cleared) or closed (false).
    pub(crate) fn wait(&self) -> SignalWait {
        SignalWait(self.clone())
    }
}

/// Future of [`Signal::wait`].
pub(crate) struct SignalWait(Signal);

impl Future for SignalWait {
    type Output = bool;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let mut s = self.0 .0.borrow_mut();
        if s.closed {
            return Poll::Ready(false);
        }
        if s.set {
            s.set = false;
            return Poll::Ready(true);
        }
        s.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_delivers_and_reports_drop() {
        let (tx, rx) = completion::<u32>();
        tx.complete(7);
        assert_eq!(futures_lite::future::block_on(rx), Some(7));
        let (tx, rx) = completion::<u32>();
        drop(tx);
        assert_eq!(futures_lite::future::block_on(rx), None);
    }

    #[test]
    fn signal_is_level_triggered_and_closable() {
        let s = Signal::new();
        s.notify();
        s.notify();
        assert!(futures_lite::future::block_on(s.wait()));
        s.close();
        assert!(!futures_lite::future::block_on(s.wait()));
    }
}
