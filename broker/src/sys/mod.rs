//! Every `unsafe` block and raw syscall of the broker lives below this module.
//!
//! `bpf`: loading and attaching the SO_REUSEPORT steering programs (bpf(2), setsockopt).
//! `socket`: raw-fd plumbing between socket2, quinn-udp and glommio.
//! `lock`: the data directory's exclusive lock (flock(2)).

pub mod bpf;
pub mod lock;
pub mod slab;
pub mod socket;
