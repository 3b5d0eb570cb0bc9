//! Wall time, injected. Code below the binary never reads the system clock itself: it is handed
//! a `Clock`, so tests and the simulation decide what time it is.

use std::sync::Arc;

/// Unix milliseconds, injected by the caller (the binary passes `system_clock`; tests a fake).
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system's wall clock in Unix milliseconds (0 before 1970).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// `unix_ms` as a `Clock`.
pub fn system_clock() -> Clock {
    Arc::new(unix_ms)
}
