//! felix-bench: helpers for the benchmark scripts under `bench/` (physical limits, result files).
//!
//! Owns: measuring the machine's limits and writing results. Never does: run inside the broker.

/// Linux reports `/proc` times in USER_HZ ticks: 100 per second on every architecture Felix
/// runs on (the kernel's ABI, whatever its internal HZ).
pub const CLOCK_TICKS_PER_SEC: u64 = 100;

/// CPU time (user + system) this process has used, in microseconds, from `/proc/self/stat`;
/// 0 where it cannot be read.
pub fn process_cpu_us() -> u64 {
    stat_cpu_us("/proc/self/stat").unwrap_or(0)
}

/// CPU time (user + system) process `pid` has used, in microseconds, from `/proc/<pid>/stat`;
/// `None` where it cannot be read (the process is gone).
pub fn pid_cpu_us(pid: u32) -> Option<u64> {
    stat_cpu_us(&format!("/proc/{pid}/stat"))
}

fn stat_cpu_us(path: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks * 1_000_000 / CLOCK_TICKS_PER_SEC)
}

#[cfg(test)]
mod tests {
    #[test]
    fn own_cpu_time_read_by_pid_matches_self() {
        // Burn a little CPU so both readings are non-zero, then read self both ways.
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let by_pid = super::pid_cpu_us(std::process::id()).expect("own /proc entry");
        let by_self = super::process_cpu_us();
        assert!(by_self >= by_pid, "{by_self} < {by_pid}");
        assert!(by_self - by_pid < 100_000, "{by_self} vs {by_pid}");
        assert_eq!(super::pid_cpu_us(u32::MAX), None);
    }
}
