//! The one module that reads the operating system: CPU time and RSS from /proc, the clock tick,
//! the CPUs this process may run on, and pinning the calling thread.

use std::time::{SystemTime, UNIX_EPOCH};

/// CPU time (user + system) of a process, in seconds, from `/proc/<pid>/stat`.
pub fn process_cpu_s(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let text = std::fs::read_to_string(path).ok()?;
    // The command name (field 2) may hold spaces; fields after its closing ')' are plain.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / clock_ticks_per_s())
}

/// Resident set size of a process, in bytes, from `/proc/<pid>/status`.
pub fn process_rss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The system's load average over one minute.
pub fn load_average_1m() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// How many CPUs this process may run on (its affinity mask).
pub fn allowed_cpus() -> usize {
    core_affinity::get_core_ids().map_or(1, |c| c.len().max(1))
}

/// Pins the calling thread to `cpu`; false when the kernel refused.
pub fn pin_current_thread(cpu: usize) -> bool {
    core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Microseconds since the Unix epoch.
pub fn unix_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

fn clock_ticks_per_s() -> f64 {
    // SAFETY: sysconf reads a constant of the C library and has no memory effects.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_cpu_and_rss() {
        let start = process_cpu_s(None).expect("own stat");
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let end = process_cpu_s(None).expect("own stat");
        assert!(end >= start);
        let rss = process_rss_bytes(std::process::id()).expect("own status");
        assert!(rss > 1024 * 1024, "a test process holds more than 1 MiB: {rss}");
        assert!(process_cpu_s(Some(u32::MAX)).is_none(), "no such process");
    }
}
