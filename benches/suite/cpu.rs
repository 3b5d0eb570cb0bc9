//! CPU time, next to wall time: on a shared machine a process waits for a core as often as it
//! runs, and wall-clock rates then measure the neighbours as much as the code. CPU time does not.
//!
//! Invariants:
//! - Readings come from /proc only (Linux); a reading that cannot be taken is `None`, never a
//!   made-up zero.

/// Clock ticks per second of `/proc/<pid>/stat` times (USER_HZ, 100 on every Linux build).
const TICKS_PER_SECOND: f64 = 100.0;

/// User plus system CPU seconds of every thread of process `pid` so far.
pub fn process_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields are counted after its closing parenthesis, where
    // utime and stime are the 12th and 13th.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let user: f64 = fields.next()?.parse().ok()?;
    let system: f64 = fields.next()?.parse().ok()?;
    Some((user + system) / TICKS_PER_SECOND)
}

/// CPU nanoseconds the calling thread has run (the scheduler's own count, ns resolution).
pub fn thread_nanos() -> Option<u64> {
    let schedstat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    schedstat.split_whitespace().next()?.parse().ok()
}

/// The load average over the last minute (how busy the machine was).
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}
