//! The one module that reads the operating system: CPU time and RSS from /proc, interrupt time
//! per CPU, the clock tick, the CPUs a process may run on, and pinning the calling thread.

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

/// Interrupt time (hard and soft: the `irq` and `softirq` columns of `/proc/stat`) spent on
/// `cpus` since boot, in seconds. On one host over loopback this is mostly the other side's
/// work: a sent datagram's receive path runs in the sender's softirq, and a disk's completions
/// run on the CPU its interrupt is routed to. The kernel charges it to whichever task was
/// running (without `CONFIG_IRQ_TIME_ACCOUNTING`), so it is inside that task's stime.
pub fn interrupt_s(cpus: &[usize]) -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    Some(interrupt_ticks(&stat, cpus)? as f64 / clock_ticks_per_s())
}

/// `irq` + `softirq` ticks of `cpus` in a `/proc/stat` text; `None` when a CPU is missing.
fn interrupt_ticks(stat: &str, cpus: &[usize]) -> Option<u64> {
    let mut total = 0u64;
    for cpu in cpus {
        let name = format!("cpu{cpu}");
        let line = stat.lines().find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
        // cpuN user nice system idle iowait irq softirq steal ...
        let fields: Vec<u64> =
            line.split_whitespace().skip(1).map(|f| f.parse().ok()).collect::<Option<_>>()?;
        total += fields.get(5)? + fields.get(6)?;
    }
    Some(total)
}

/// The CPUs a process may run on (its main thread's `Cpus_allowed_list` in
/// `/proc/<pid>/status`; this process's with `None`).
pub fn allowed_cpu_list(pid: Option<u32>) -> Option<Vec<usize>> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".to_owned(),
    };
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with("Cpus_allowed_list:"))?;
    parse_cpu_list(line.split_once(':')?.1.trim())
}

/// A kernel CPU list ("0-3,8,10-11") as the CPUs it names, ascending.
fn parse_cpu_list(list: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if a > b {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    (!cpus.is_empty()).then_some(cpus)
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

    #[test]
    fn interrupt_ticks_are_irq_plus_softirq_of_the_named_cpus() {
        let stat = "cpu  500 0 300 9000 10 7 90 5 0 0\n\
                    cpu0 200 0 100 4500 5 3 20 2 0 0\n\
                    cpu1 300 0 200 4500 5 4 70 3 0 0\n\
                    intr 12345 0 0\n\
                    cpu10 1 1 1 1 1 100 100 1 0 0\n";
        assert_eq!(interrupt_ticks(stat, &[0]), Some(23));
        assert_eq!(interrupt_ticks(stat, &[1]), Some(74));
        assert_eq!(interrupt_ticks(stat, &[0, 1]), Some(97));
        assert_eq!(interrupt_ticks(stat, &[10]), Some(200), "cpu10 is not cpu1");
        assert_eq!(interrupt_ticks(stat, &[2]), None, "no such CPU");
        assert_eq!(interrupt_ticks(stat, &[]), Some(0));
        assert!(interrupt_s(&[0]).is_some(), "this machine has a cpu0 line");
    }

    #[test]
    fn cpu_lists_parse_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("0-3,8,10-11"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_cpu_list("5,1-2"), Some(vec![1, 2, 5]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        assert_eq!(parse_cpu_list(""), None);
        let own = allowed_cpu_list(None).expect("own status");
        assert_eq!(own.len(), allowed_cpus(), "the same mask as core_affinity reads");
    }
}
