//! At most one in-sync-set proposal of each shard on its way to the cluster agent.
//!
//! A leader's state machine resends an unanswered proposal every `propose_retry_ms`, also while
//! the agent cannot drain its command queue (etcd away); each one handed over is a task that
//! awaits room in that queue. [`OnePerShard`] keeps one such task per shard: a proposal made
//! while the shard's previous one is still on its way is dropped (counted by the host), and
//! the state machine's next resend goes once that one is answered. So the tasks a core holds
//! for proposals are bounded by its leading shards, however long etcd stays away.

use std::cell::RefCell;
use std::collections::HashSet;
use std::future::Future;
use std::rc::Rc;

/// The shards (stream, shard) with a proposal on its way, one task each.
#[derive(Debug, Default)]
pub struct OnePerShard {
    running: RefCell<HashSet<(String, u32)>>,
}

impl OnePerShard {
    /// Spawns `task` (the hand-over of one proposal of `shard` of `stream`) on this core,
    /// unless that shard's previous one has not ended: then nothing is spawned and this
    /// returns false.
    pub fn spawn<F>(self: &Rc<Self>, stream: &str, shard: u32, task: F) -> bool
    where
        F: Future<Output = ()> + 'static,
    {
        let key = (stream.to_owned(), shard);
        if !self.running.borrow_mut().insert(key.clone()) {
            return false;
        }
        let done = Done { set: self.clone(), key };
        glommio::spawn_local(async move {
            let _done = done;
            task.await;
        })
        .detach();
        true
    }

    /// Shards with a proposal on its way.
    pub fn len(&self) -> usize {
        self.running.borrow().len()
    }

    /// Whether no proposal is on its way.
    pub fn is_empty(&self) -> bool {
        self.running.borrow().is_empty()
    }
}

/// Frees the shard's slot when its task ends (or is dropped unfinished).
struct Done {
    set: Rc<OnePerShard>,
    key: (String, u32),
}

impl Drop for Done {
    fn drop(&mut self) {
        self.set.running.borrow_mut().remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The agent's command queue (64, as `felix_cluster`'s) left undrained, as while etcd is
    /// away: however many proposals the leaders make, each shard has one task waiting on it
    /// and one command in the queue.
    #[test]
    fn one_task_per_shard_while_the_agent_does_not_drain() {
        glommio::LocalExecutor::default().run(async {
            // A command carries its reply's sender, as `felix_cluster`'s do.
            type Command = (u32, tokio::sync::oneshot::Sender<()>);
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Command>(64);
            let gate = Rc::new(OnePerShard::default());
            let mut spawned = 0;
            for _ in 0..200 {
                for shard in 0..3u32 {
                    let tx = tx.clone();
                    let sent = gate.spawn("s", shard, async move {
                        let (reply, answer) = tokio::sync::oneshot::channel();
                        if tx.send((shard, reply)).await.is_ok() {
                            // No answer while etcd is away.
                            let _ = answer.await;
                        }
                    });
                    spawned += u32::from(sent);
                }
                glommio::yield_if_needed().await;
                glommio::timer::sleep(Duration::from_micros(50)).await;
            }
            assert_eq!(spawned, 3, "one proposal task per shard");
            assert_eq!(gate.len(), 3);
            let mut queued = Vec::new();
            while let Ok(command) = rx.try_recv() {
                queued.push(command);
            }
            assert_eq!(queued.len(), 3, "one command per shard queued for the agent");
        });
    }

    #[test]
    fn a_shard_proposes_again_once_its_previous_proposal_ended() {
        glommio::LocalExecutor::default().run(async {
            let gate = Rc::new(OnePerShard::default());
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            assert!(gate.spawn("s", 0, async move {
                let _ = rx.await;
            }));
            assert!(!gate.spawn("s", 0, async {}), "still on its way");
            assert!(gate.spawn("t", 0, async {}), "another stream's shard 0 is another shard");
            tx.send(()).unwrap();
            for _ in 0..100 {
                if gate.is_empty() {
                    break;
                }
                glommio::timer::sleep(Duration::from_millis(1)).await;
            }
            assert!(gate.is_empty(), "answered: the slots are free");
            assert!(gate.spawn("s", 0, async {}));
        });
    }
}
