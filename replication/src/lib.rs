//! Replication of one shard over a group of 1..=5 brokers, as a sans-IO state machine, and the
//! driver's decisions around a core's replicas ([`driver`]), sans-IO too.
//!
//! [`Replica`] is one shard's replica on one broker. It performs no I/O and reads no clock (like
//! quinn-proto): messages from other replicas, controller (etcd) records, lease confirmations,
//! disk completions, client appends and ticks go in, each with `now`; messages, ordered disk
//! operations, acks and compare-and-swap proposals come out of [`Replica::poll`]. The driver
//! that wires it to QUIC, etcd and `felix-storage` is not part of this crate.
//!
//! The protocol (docs/replication.md): the controller's record of a group ([`GroupState`]) is
//! changed only by compare-and-swap, by an election (a new epoch, leader taken from the live
//! in-sync replicas) or by the leader's in-sync-set proposals. Followers truncate by leader
//! epoch, then pull with long polls. A batch is committed (visible, and acked when `Durable`)
//! once fdatasync'd on every in-sync replica; a leader acks only while its lease holds.
//!
//! A driver's loop, reduced to one replica (replication factor 1) with a disk that completes at
//! once:
//!
//! ```
//! use bytes::Bytes;
//! use felix_replication::*;
//!
//! let me = ReplicaNumber(0);
//! let mut replica = Replica::new(me, ReplicaConfig::for_replicas(1), ReplicaLog::default());
//! let now = Time(0);
//! // From etcd: this process's lease, then the group record naming it leader under that lease.
//! replica.handle_lease(now, LeaseId(7), now.plus_ms(5_000));
//! let mut group = GroupState::new(vec![me]);
//! group.elect(me, LeaseId(7), &[me].into_iter().collect()).unwrap();
//! replica.handle_controller(now, group);
//! // A client's durable append.
//! let append = AppendRequest {
//!     request: AppendId(1),
//!     producer: None,
//!     records: 3,
//!     oldest_pending: false,
//!     time_ms: 1_796_000_000_000,
//!     payload: Bytes::from_static(b"three records"),
//!     mode: AckMode::Durable,
//! };
//! replica.handle_append(now, append);
//! let mut acked = None;
//! while acked.is_none() {
//!     match replica.poll() {
//!         // A real driver writes, fdatasyncs (in order) and reports later.
//!         Some(Output::Disk(op)) => replica.handle_disk_done(now, op.id()),
//!         Some(Output::Ack { base, records, .. }) => acked = Some((base, records)),
//!         Some(other) => panic!("unexpected {other:?}"),
//!         None => panic!("no ack"),
//!     }
//! }
//! assert_eq!(acked, Some((Offset(0), 3)));
//! assert_eq!(replica.committed(), Offset(3));
//! ```
//!
//! The `felix-sim` crate runs 3-5 brokers' [`Driver`]s (with their replicas), a model of etcd
//! and producers on a seeded PRNG with message faults, partitions, crashes that lose unsynced
//! bytes and restarts, and checks the invariants after every step.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod checkpoint;
pub mod config;
pub mod controller;
pub mod disk;
pub mod driver;
pub mod error;
pub mod log;
pub mod message;
pub mod producers;
mod replica;
pub mod types;
pub mod wire;

pub use checkpoint::CheckpointError;
pub use config::{InjectedBugs, ReplicaConfig, Retention};
pub use controller::{GroupState, IsrProposal};
pub use disk::{DiskOp, DiskOpId};
pub use driver::{Action, Driver, GroupView, ShardDriver, ShardKey, StopReason, Submitted};
pub use error::{AppendError, CasError, LogError};
pub use log::ReplicaLog;
pub use message::{Message, Output};
pub use producers::{ProducerLimits, PRODUCERS_PER_SHARD_MAX, PRODUCER_EXPIRY_MS};
pub use replica::{AppendRequest, FollowerView, Replica, ReplicaStats, RoleView};
pub use types::{
    AckMode, AppendId, Batch, Epoch, LeaseId, Offset, ProducerId, ProducerSeq, ReplicaNumber, Seq,
    Time,
};
