//! felix-bench: helpers for the benchmark scripts under `bench/` (physical limits, result files).
//!
//! Owns: measuring the machine's limits and writing results. Never does: run inside the broker.

/// Linux reports `/proc` times in USER_HZ ticks: 100 per second on every architecture Felix
/// runs on (the kernel's ABI, whatever its internal HZ).
pub const CLOCK_TICKS_PER_SEC: u64 = 100;

/// CPU time (user + system) this process has used, in microseconds, from `/proc/self/stat`;
/// 0 where it cannot be read.
pub fn process_cpu_us() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    ticks * 1_000_000 / CLOCK_TICKS_PER_SEC
}
