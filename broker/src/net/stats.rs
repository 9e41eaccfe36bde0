//! Per-core network counters.
//!
//! Each core owns one `CoreStats` and is its only writer; the admin thread (or a test) reads
//! them. The counters are relaxed atomics: with a single writer they are never contended (the
//! cache line moves to a reader only when the reader looks), and they cost an ordinary
//! load + store on the hot path. Nothing else is shared between cores.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::steering::EffectiveSteering;

/// Every core's network counters (name, value), copied by the main thread for the admin
/// thread's `/metrics` (`Broker::refresh`); never touched by a data core.
pub type NetSnapshot = Arc<Mutex<Vec<Vec<(&'static str, u64)>>>>;

macro_rules! core_stats {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// Counters owned (written) by one core.
        #[derive(Debug, Default)]
        pub struct CoreStats {
            $( $(#[$doc])* pub(crate) $name: AtomicU64, )*
        }

        /// A point-in-time copy of one core's counters.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct CoreStatsSnapshot {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl CoreStats {
            /// Reads every counter (relaxed).
            pub fn snapshot(&self) -> CoreStatsSnapshot {
                CoreStatsSnapshot { $( $name: self.$name.load(Ordering::Relaxed), )* }
            }
        }

        impl CoreStatsSnapshot {
            /// `(name, value)` for every counter, in declaration order (for export).
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![ $( (stringify!($name), self.$name), )* ]
            }
        }
    };
}

core_stats! {
    /// UDP datagrams this core's socket received (GRO segments counted one by one).
    datagrams_in,
    /// Receive syscalls that returned data (datagrams_in / recv_calls = batching factor).
    recv_calls,
    /// UDP datagrams sent (GSO segments counted one by one).
    datagrams_out,
    /// Send syscalls.
    send_calls,
    /// Datagrams received here whose connection ID names another core.
    misrouted,
    /// Misrouted datagrams handed to their owner over the core mesh.
    forwarded_out,
    /// Datagrams other cores handed to this core over the core mesh.
    forwarded_in,
    /// Connections currently owned by this core (gauge).
    connections,
    /// Handshakes completed on this core.
    handshakes,
    /// Connections this core opened to other brokers.
    connects,
    /// Stateless retries sent because the handshake rate limit was reached.
    retries,
    /// Connections refused because `max_conns_per_core` was reached.
    refused_conn_limit,
    /// Connections closed by the idle timeout.
    idle_timeouts,
    /// Streams opened by peers and accepted by the application.
    streams_accepted,
    /// STREAMS_BLOCKED frames received: a peer reached `max_streams_per_conn` (counted when its
    /// connection ends; peers that do not send the frame, such as quinn, only wait).
    streams_blocked_rx,
    /// Datagrams dropped because the core-mesh queue to their owner was full.
    dropped_mesh_full,
    /// Short-header datagrams dropped because their connection ID names a core that does not
    /// exist (a connection of a run with more cores: gone).
    dropped_bad_core,
    /// Long-header datagrams (a handshake's Initial, 0-RTT, Handshake) whose destination CID
    /// names a core that does not exist, handled by the core they reached instead: the
    /// Initial of a client that asked for a core this broker does not have. Never dropped.
    kept_bad_core,
    /// Established connections dropped because the application's accept queue was full.
    dropped_accept_full,
    /// Sends that found the socket buffer full (retried after `SEND_RETRY_US`).
    send_would_block,
    /// Socket errors other than WouldBlock (receive or send).
    socket_errors,
    /// Steering mode in effect (0 off, 1 cBPF, 2 eBPF), the same on every core.
    steering_mode,
    /// Thread CPU time of the core's executor thread in microseconds, updated every second.
    cpu_time_us,
    /// QUIC packets this core's connections sent (quinn-proto's path statistics: the live
    /// connections' summed once a second, plus those of every connection that ended).
    quic_packets_sent,
    /// Of those, packets QUIC's loss detection declared lost (sent again as needed): a
    /// network, or a peer's socket buffer, dropping datagrams.
    quic_packets_lost,
    /// Bytes of the packets declared lost.
    quic_bytes_lost,
    /// Congestion events (a loss or an ECN mark that made a connection slow down).
    quic_congestion_events,
    /// Times path MTU discovery took losses for a black hole and fell back to 1200 bytes.
    quic_black_holes,
    /// The smallest current path MTU (UDP payload bytes the core sends) of its live
    /// connections, a gauge; 0 with none. Below `max_udp_payload` on a path that carries it,
    /// something on the way drops large datagrams.
    quic_mtu_min,
}

impl CoreStats {
    #[inline]
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        // Single writer: a load + store is enough and cheaper than an atomic add.
        counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }

    #[inline]
    pub(crate) fn set(counter: &AtomicU64, n: u64) {
        counter.store(n, Ordering::Relaxed);
    }
}

/// The code `steering_mode` exports for a steering mode.
pub fn steering_code(mode: EffectiveSteering) -> u64 {
    match mode {
        EffectiveSteering::Ebpf => 2,
        EffectiveSteering::Cbpf => 1,
        EffectiveSteering::Off => 0,
    }
}
