//! A core's tasks that hold its state ([`CoreTasks`]): spawned so that stopping the core ends
//! them, and the clock the application reads ([`now_ms`]).

use std::rc::Rc;

use glommio::sync::Semaphore;

/// The tasks of one core that hold its state, ended when the core stops.
///
/// glommio never drops a task that is still pending when its executor exits: a task holding
/// the core's [`CoreApp`] (its mesh loops, a subscription's pumps, a session) kept the core's
/// state, with every stream log's open files, until the process exited, so an in-process
/// broker stopped and started again leaked them each time. Every task that holds it, or
/// waits for ever, is spawned with [`CoreTasks::spawn`]; [`CoreTasks::stop`] (once the
/// server stops accepting, or when the core's application future is dropped) ends them all
/// at their next poll, while the executor still runs.
#[derive(Clone)]
pub struct CoreTasks {
    /// Never granted a permit: closed at stop, which wakes every task waiting on it.
    stopped: Rc<Semaphore>,
}

impl CoreTasks {
    pub(super) fn new() -> Self {
        CoreTasks { stopped: Rc::new(Semaphore::new(0)) }
    }

    /// Runs `fut` on this core until it ends or the core stops, whichever comes first (once
    /// stopped, a task spawned here ends at its first poll).
    pub fn spawn(
        &self,
        fut: impl std::future::Future<Output = ()> + 'static,
    ) -> glommio::task::JoinHandle<()> {
        let stopped = self.stopped.clone();
        let stop = async move {
            // Err once closed: the semaphore never has a permit to give.
            let _ = stopped.acquire(1).await;
        };
        glommio::spawn_local(futures_lite::future::or(fut, stop)).detach()
    }

    /// Ends every task spawned with [`CoreTasks::spawn`], at its next poll.
    pub fn stop(&self) {
        self.stopped.close();
    }

    /// A guard that calls [`CoreTasks::stop`] when dropped.
    pub fn stop_on_drop(&self) -> StopOnDrop {
        StopOnDrop(self.clone())
    }
}

/// Stops a core's tasks when dropped ([`CoreTasks::stop_on_drop`]).
pub struct StopOnDrop(CoreTasks);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
