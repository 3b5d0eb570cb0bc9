//! Thread priorities: work that must never slow ingest runs below it.

/// Lowers the calling thread's scheduling priority to `nice` (Linux's per-thread nice; elsewhere
/// nothing). Any thread may lower its own priority but not raise it again, so this is for threads
/// that stay low all their life. A failure is logged: the thread then runs at the usual priority.
pub fn lower_this_thread(nice: i32) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority read and set only the calling thread's scheduling value.
        let result = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
        if result != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), nice, "could not lower a thread's priority");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn a_thread_lowers_only_itself() {
        let nice_of_this_thread = || {
            // SAFETY: as above, a read of the calling thread's own value.
            unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
        };
        let before = nice_of_this_thread();
        let lowered = std::thread::spawn(move || {
            super::lower_this_thread(before + 5);
            nice_of_this_thread()
        });
        assert_eq!(lowered.join().unwrap(), before + 5);
        assert_eq!(nice_of_this_thread(), before);
    }
}
