//! A subscription's queue between its pumps and its writer (`app::subscribe::queue`).
//!
//! Found by the `session` fuzz target (broker/fuzz): when a connection closed while one of its
//! subscriptions had a full queue, the writer ended but the pump blocked in `send` waited for
//! ever, keeping its session, connection and batches alive (LeakSanitizer reported them at exit).
//! glommio wakes a sender blocked on a full channel when the receiver is dropped, but the woken
//! sender finds the channel still full and waits again; the queue's receiver empties the
//! channel when it is dropped, so the sender gets an error and the pump ends.

use std::time::Duration;

use bytes::Bytes;
use felix_broker::app::subscribe::{queue, Queued, SUBSCRIPTION_QUEUE_FRAMES};
use glommio::{LocalExecutorBuilder, Placement};

/// One frame's bytes as a queue entry.
fn one(bytes: Vec<u8>) -> Queued {
    Queued { frame: Bytes::from(bytes), frames: 1 }
}

/// Bound on every wait in these tests.
const WAIT: Duration = Duration::from_secs(5);

fn run<T: 'static>(test: impl std::future::Future<Output = T> + 'static) -> T {
    LocalExecutorBuilder::new(Placement::Unbound).make().expect("executor").run(test)
}

#[test]
fn a_sender_blocked_on_a_full_queue_fails_when_the_receiver_goes() {
    let outcome = run(async {
        let (tx, rx) = queue();
        for i in 0..SUBSCRIPTION_QUEUE_FRAMES {
            tx.try_send(one(vec![i as u8])).expect("room in the queue");
        }
        let pump = glommio::spawn_local(async move { tx.send(one(b"late".to_vec())).await });
        // Let the pump block on the full queue, then the writer goes.
        glommio::timer::sleep(Duration::from_millis(20)).await;
        drop(rx);
        glommio::timer::timeout(WAIT, async { Ok(pump.await) }).await
    });
    match outcome {
        Ok(sent) => assert!(sent.is_err(), "a frame was queued for a writer that is gone"),
        Err(e) => panic!("the pump still waits {WAIT:?} after its writer went: {e}"),
    }
}

#[test]
fn the_writer_receives_every_frame_in_order() {
    let received = run(async {
        let (tx, rx) = queue();
        let pump = glommio::spawn_local(async move {
            for i in 0..3 * SUBSCRIPTION_QUEUE_FRAMES {
                tx.send(one(vec![i as u8])).await.expect("writer present");
            }
        });
        let mut got = Vec::new();
        while let Some(q) = rx.recv().await {
            got.push(q.frame[0]);
        }
        pump.await;
        got
    });
    let expected: Vec<u8> = (0..3 * SUBSCRIPTION_QUEUE_FRAMES).map(|i| i as u8).collect();
    assert_eq!(received, expected);
}
