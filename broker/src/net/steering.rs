//! SO_REUSEPORT steering: eBPF, classic BPF, or off.
