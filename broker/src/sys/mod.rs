//! Every `unsafe` block and raw syscall of the broker lives below this module.
//!
//! `bpf`: loading and attaching the SO_REUSEPORT steering programs (bpf(2), setsockopt).
//! `socket`: raw-fd plumbing between socket2, quinn-udp and glommio.

pub mod bpf;
pub mod slab;
pub mod socket;
