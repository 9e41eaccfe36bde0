//! The broker application's errors: [`WireError`], what a client hears when a request is
//! refused, and [`StartError`] (with [`CoreOpenError`]), why a broker could not start.
//!
//! A `WireError` becomes a frame in one place, [`WireError::into_answer`]: an acked Publish is
//! answered with `PublishError`, every other request with `Error`.

use std::net::SocketAddr;
use std::path::PathBuf;

use felix_proto::{CoreId, ErrorBody, ErrorCode, Frame, RequestId};
use felix_storage::StorageError;

use super::meta::MetaError;

/// An error to hand back to a client: a wire code and a message for people.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct WireError {
    /// The code.
    pub code: ErrorCode,
    /// The message.
    pub message: String,
}

impl WireError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    /// The frame that refuses request `request_id` with this error: `PublishError` when the
    /// request is an acked Publish (`acked_publish`, the client waits for its ack), else
    /// `Error`.
    pub fn into_answer(self, request_id: RequestId, acked_publish: bool) -> Frame {
        let body = ErrorBody { request_id, code: self.code, message: self.message };
        match acked_publish {
            true => Frame::PublishError(body),
            false => Frame::Error(body),
        }
    }
}

/// Why a broker could not start ([`super::Broker::start`]). The messages are what
/// `felix serve` prints after `felix: `, one line each.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data directory does not exist and cannot be created.
    #[error("data directory {} cannot be created: {source}", path.display())]
    DataDirCreate {
        /// The data directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file cannot be written (and removed) in the data directory.
    #[error("data directory {} is not writable: {source}", path.display())]
    DataDirNotWritable {
        /// The data directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Another broker holds the data directory's lock (`felix.lock`), or it cannot be taken.
    #[error(transparent)]
    DataDirLocked(crate::sys::lock::LockError),
    /// The listen address is bound by another socket (another broker?), and stayed bound for
    /// `PORT_RELEASE_WAIT_MS`.
    #[error("port in use: {addr} is already bound (another broker?)")]
    PortBound {
        /// The listen address.
        addr: SocketAddr,
    },
    /// The listen address cannot be bound for another reason.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The listen address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The kernel refuses io_uring to every process (`io_uring_disabled` = 2).
    #[error("io_uring is disabled ({knob} = 2); set it to 0")]
    IoUringDisabled {
        /// The sysctl file that says so.
        knob: &'static str,
    },
    /// The data directory's layout file is unreadable or written for another core count.
    #[error(transparent)]
    Layout(MetaError),
    /// `--default-shards` is more than a stream may have on this many cores.
    #[error(
        "--default-shards {shards} exceeds {max}, the most a stream may have on {cores} cores"
    )]
    DefaultShards {
        /// `--default-shards`.
        shards: u32,
        /// The most a stream may have.
        max: u32,
        /// `--cores`.
        cores: usize,
    },
    /// `--cluster-etcd` was given without `--node-id` or `--advertise`.
    #[error("--cluster-etcd needs --node-id and --advertise")]
    ClusterArgs,
    /// The node id is invalid, or the cluster agent could not start.
    #[error(transparent)]
    Cluster(felix_cluster::ClusterError),
    /// An `--auth-keys` file cannot be read or holds no usable public key.
    #[error(transparent)]
    AuthKeys(super::auth::AuthKeysError),
    /// The storage settings are out of their ranges.
    #[error(transparent)]
    Storage(StorageError),
    /// The server refused to bind: the port is taken.
    #[error("port in use: cannot bind {addr} ({source})")]
    PortTaken {
        /// The listen address.
        addr: SocketAddr,
        /// The server's error.
        #[source]
        source: crate::net::StartError,
    },
    /// The cores could not start for lack of lockable memory (io_uring's registered memory).
    #[error(
        "cannot start the cores: {0}; the memlock limit (ulimit -l) may be too low for io_uring's registered memory"
    )]
    Memlock(#[source] crate::net::StartError),
    /// The cores could not start because io_uring is not permitted or not there.
    #[error(
        "cannot start the cores: {0}; io_uring may be unavailable (check /proc/sys/kernel/io_uring_disabled, or a seccomp profile blocking io_uring_setup)"
    )]
    IoUringUnavailable(#[source] crate::net::StartError),
    /// The server could not start for another reason.
    #[error(transparent)]
    Server(crate::net::StartError),
    /// A core could not open its storage or recover its logs.
    #[error(transparent)]
    Core(#[from] CoreOpenError),
    /// A core did not report within `CORE_START_TIMEOUT_MS`, or exited before it did.
    #[error("a core did not finish starting")]
    CoreTimeout,
}

impl StartError {
    /// The start-up error for a server that did not start, with a hint at the usual causes
    /// (a taken port, the memlock limit, io_uring blocked).
    pub fn from_server(e: crate::net::StartError, listen: SocketAddr) -> Self {
        let text = e.to_string();
        if text.contains("Address already in use") || text.contains("AddrInUse") {
            return StartError::PortTaken { addr: listen, source: e };
        }
        if text.contains("ENOMEM")
            || text.contains("memlock")
            || text.contains("Cannot allocate memory")
        {
            return StartError::Memlock(e);
        }
        if text.contains("Operation not permitted") || text.contains("ENOSYS") {
            return StartError::IoUringUnavailable(e);
        }
        StartError::Server(e)
    }
}

/// Why one core could not open: its storage, its consumer positions, its streams.
#[derive(Debug, thiserror::Error)]
pub enum CoreOpenError {
    /// The core's storage could not be opened.
    #[error("{core}: storage: {source}")]
    Storage {
        /// The core.
        core: CoreId,
        /// Why.
        #[source]
        source: StorageError,
    },
    /// The log of consumer positions could not be opened or read.
    #[error("{core}: consumer offsets: {source}")]
    Offsets {
        /// The core.
        core: CoreId,
        /// Why.
        #[source]
        source: StorageError,
    },
    /// The free space of the data directory's file system cannot be read.
    #[error("{core}: free space of {}: {source}", dir.display())]
    FreeSpace {
        /// The core.
        core: CoreId,
        /// The data directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The stream definitions cannot be read.
    #[error(transparent)]
    Definitions(MetaError),
    /// The certificates other brokers are verified against (`--peer-ca`) cannot be loaded.
    #[error("{core}: replication peers' certificates (--peer-ca): {source}")]
    PeerTls {
        /// The core.
        core: CoreId,
        /// Why.
        #[source]
        source: crate::net::tls::TlsError,
    },
    /// A stream's logs could not be recovered (the message names the file and position of a
    /// corrupt log, for the operator).
    #[error("{core}: stream {name}: {source}")]
    Stream {
        /// The core.
        core: CoreId,
        /// The stream.
        name: String,
        /// Why.
        #[source]
        source: StorageError,
    },
    /// The retention task could not start.
    #[error("{core}: retention: {source}")]
    Retention {
        /// The core.
        core: CoreId,
        /// Why.
        #[source]
        source: StorageError,
    },
}

/// What a client hears when the disk is full (ENOSPC or EDQUOT, on any path).
pub const DISK_FULL_MESSAGE: &str = "the broker's disk is full";

/// The wire error for a storage error. A full disk (ENOSPC, EDQUOT) is `StorageFull` on every
/// path. Messages never carry a file path or an OS error text: those name the broker's data
/// directory and are logged instead.
pub fn storage_error(e: &StorageError) -> WireError {
    let (code, message) = match e {
        StorageError::NoSpace { .. } => (ErrorCode::StorageFull, DISK_FULL_MESSAGE.to_owned()),
        StorageError::UnknownShard { .. } => (ErrorCode::InvalidShard, e.to_string()),
        StorageError::BatchTooLarge { .. } => (ErrorCode::FrameTooLarge, e.to_string()),
        StorageError::TooManyRecords { .. } => (ErrorCode::TooManyRecords, e.to_string()),
        StorageError::QueueFull { .. } => (ErrorCode::Overloaded, e.to_string()),
        StorageError::OffsetBeforeStart { .. } => (ErrorCode::OffsetOutOfRange, e.to_string()),
        StorageError::InvalidStreamName { .. } => (ErrorCode::InvalidStreamName, e.to_string()),
        StorageError::EmptyBatch => (ErrorCode::InvalidArgument, e.to_string()),
        StorageError::OutOfOrderSequence { .. } => (ErrorCode::OutOfOrderSequence, e.to_string()),
        StorageError::SequenceTooOld { .. } => (ErrorCode::SequenceTooOld, e.to_string()),
        StorageError::SequenceMismatch { .. } => (ErrorCode::InvalidArgument, e.to_string()),
        StorageError::TooManyShards { .. } => (ErrorCode::InvalidArgument, e.to_string()),
        StorageError::Closed => (ErrorCode::StorageFailed, e.to_string()),
        StorageError::Io { context, .. } => {
            tracing::warn!(error = %e, "storage I/O failed");
            (ErrorCode::StorageFailed, format!("storage failed ({context}); see the broker's log"))
        }
        StorageError::Corrupt { .. } | StorageError::Poisoned { .. } => {
            tracing::warn!(error = %e, "stream log failed");
            (ErrorCode::StorageFailed, "the stream's log failed; see the broker's log".to_owned())
        }
        StorageError::InvalidConfig { .. }
        | StorageError::OffsetMismatch { .. }
        | StorageError::EpochRegression { .. }
        | StorageError::TruncateOutOfRange { .. }
        | StorageError::ShardBusy { .. }
        | StorageError::TooManyTruncations { .. } => (ErrorCode::StorageFailed, e.to_string()),
    };
    WireError::new(code, message)
}

/// The wire error for an error of the stream definition files, under the same rules as
/// [`storage_error`]: a full disk is `StorageFull`, the quota `LimitReached`, and messages name
/// no file.
pub fn meta_error(e: &MetaError) -> WireError {
    match e {
        MetaError::TooManyStreams { .. } => WireError::new(ErrorCode::LimitReached, e.to_string()),
        // Transient: the name is free once the delete is done.
        MetaError::BeingDeleted { .. } => {
            WireError::new(ErrorCode::ShardUnavailable, e.to_string())
        }
        MetaError::Io { source, .. } if felix_storage::is_no_space(source) => {
            WireError::new(ErrorCode::StorageFull, DISK_FULL_MESSAGE)
        }
        MetaError::Io { .. } | MetaError::Corrupt { .. } | MetaError::CoreCount { .. } => {
            tracing::warn!(error = %e, "stream definitions failed");
            WireError::new(
                ErrorCode::StorageFailed,
                "stream definitions failed; see the broker's log",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acked_publishes_are_refused_with_publish_error_and_the_rest_with_error() {
        let e = WireError::new(ErrorCode::Forbidden, "no");
        let want = ErrorBody {
            request_id: RequestId(7),
            code: ErrorCode::Forbidden,
            message: "no".into(),
        };
        assert_eq!(e.clone().into_answer(RequestId(7), true), Frame::PublishError(want.clone()));
        assert_eq!(e.into_answer(RequestId(7), false), Frame::Error(want));
    }

    #[test]
    fn server_errors_get_the_hint_for_their_cause() {
        let listen: SocketAddr = "127.0.0.1:7400".parse().unwrap();
        let taken = crate::net::StartError::Bind(std::io::Error::from_raw_os_error(98));
        let e = StartError::from_server(taken, listen);
        assert!(matches!(e, StartError::PortTaken { .. }), "{e:?}");
        assert!(
            e.to_string().starts_with("port in use: cannot bind 127.0.0.1:7400 (bind: "),
            "{e}"
        );

        let memlock = crate::net::StartError::Executor("Cannot allocate memory".into());
        let e = StartError::from_server(memlock, listen);
        assert!(matches!(e, StartError::Memlock(_)), "{e:?}");
        assert!(e.to_string().contains("the memlock limit (ulimit -l)"), "{e}");

        let blocked = crate::net::StartError::Executor("Operation not permitted".into());
        let e = StartError::from_server(blocked, listen);
        assert!(matches!(e, StartError::IoUringUnavailable(_)), "{e:?}");
        assert!(e.to_string().contains("io_uring may be unavailable"), "{e}");

        let other = crate::net::StartError::Steering("no eBPF".into());
        let e = StartError::from_server(other, listen);
        assert!(matches!(e, StartError::Server(_)), "{e:?}");
        assert_eq!(e.to_string(), "steering: no eBPF");
    }

    #[test]
    fn core_open_errors_name_the_core_and_the_stream() {
        let e = CoreOpenError::Stream {
            core: CoreId(3),
            name: "t/n/s".into(),
            source: StorageError::Closed,
        };
        assert_eq!(e.to_string(), format!("{}: stream t/n/s: stream log closed", CoreId(3)));
    }
}
