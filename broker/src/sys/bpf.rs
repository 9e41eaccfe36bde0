//! bpf(2) and SO_ATTACH_REUSEPORT_{E,C}BPF syscalls for connection-ID steering.
