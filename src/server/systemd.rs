//! systemd's notification protocol (`sd_notify`): readiness, watchdog keep-alives and stopping,
//! sent as datagrams to the socket named by `NOTIFY_SOCKET`.
//!
//! Invariants: without `NOTIFY_SOCKET` every call is a no-op (not run by systemd); a send never
//! blocks (the socket is non-blocking; a full queue drops the message, as sd_notify does).

use std::ffi::OsStr;
use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::Duration;

/// Where notifications go.
#[derive(Debug)]
enum Target {
    Path(PathBuf),
    /// A Linux abstract socket (`@name` in `NOTIFY_SOCKET`).
    #[cfg(target_os = "linux")]
    Abstract(std::os::unix::net::SocketAddr),
}

#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    target: Target,
}

/// The shortest and longest watchdog interval honoured (systemd allows microseconds to hours).
const MIN_WATCHDOG: Duration = Duration::from_millis(10);
const MAX_WATCHDOG: Duration = Duration::from_secs(24 * 3600);

impl Notifier {
    /// The notifier for `NOTIFY_SOCKET`'s value; `None` when it is unset or empty.
    pub fn new(notify_socket: Option<&OsStr>) -> io::Result<Option<Self>> {
        let Some(name) = notify_socket.filter(|n| !n.is_empty()) else { return Ok(None) };
        let target = target_of(name)?;
        let socket = UnixDatagram::unbound()?;
        socket.set_nonblocking(true)?;
        Ok(Some(Notifier { socket, target }))
    }

    /// Sends one notification (`READY=1`, `WATCHDOG=1`, `STOPPING=1`, `STATUS=...`).
    pub fn notify(&self, state: &str) -> io::Result<()> {
        let sent = match &self.target {
            Target::Path(path) => self.socket.send_to(state.as_bytes(), path),
            #[cfg(target_os = "linux")]
            Target::Abstract(addr) => self.socket.send_to_addr(state.as_bytes(), addr),
        };
        match sent {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn target_of(name: &OsStr) -> io::Result<Target> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = name.as_bytes();
    match bytes.first() {
        Some(b'/') => Ok(Target::Path(PathBuf::from(name))),
        #[cfg(target_os = "linux")]
        Some(b'@') => {
            use std::os::linux::net::SocketAddrExt;
            Ok(Target::Abstract(std::os::unix::net::SocketAddr::from_abstract_name(&bytes[1..])?))
        }
        _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "NOTIFY_SOCKET must be an absolute path or @name")),
    }
}

/// How often to send `WATCHDOG=1`: half of `WATCHDOG_USEC`, when the watchdog is meant for
/// this process (`WATCHDOG_PID` unset or equal to `own_pid`). `None`: no watchdog.
pub fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Option<Duration> {
    if pid.is_some_and(|pid| pid.trim().parse::<u32>().ok() != Some(own_pid)) {
        return None;
    }
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    Some((Duration::from_micros(usec) / 2).clamp(MIN_WATCHDOG, MAX_WATCHDOG))
}

/// Sends `WATCHDOG=1` every `every` while `alive()` says the service works; returns never.
pub async fn feed_watchdog(notifier: std::sync::Arc<Notifier>, every: Duration, alive: impl Fn() -> bool) {
    let mut ticks = tokio::time::interval(every);
    loop {
        ticks.tick().await;
        if !alive() {
            tracing::warn!("liveness probe failed; not feeding the systemd watchdog");
            continue;
        }
        if let Err(e) = notifier.notify("WATCHDOG=1") {
            tracing::warn!(error = %e, "systemd watchdog notification failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_interval_is_half_and_only_for_us() {
        assert_eq!(watchdog_interval(Some("2000000"), None, 7), Some(Duration::from_secs(1)));
        assert_eq!(watchdog_interval(Some("2000000"), Some("7"), 7), Some(Duration::from_secs(1)));
        assert_eq!(watchdog_interval(Some("2000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(None, None, 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("x"), None, 7), None);
        assert_eq!(watchdog_interval(Some("2"), None, 7), Some(MIN_WATCHDOG));
    }

    #[test]
    fn notifications_arrive_as_datagrams() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier::new(Some(path.as_os_str())).unwrap().unwrap();
        notifier.notify("READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        assert!(Notifier::new(None).unwrap().is_none());
        assert!(Notifier::new(Some(OsStr::new(""))).unwrap().is_none());
        assert!(Notifier::new(Some(OsStr::new("relative"))).is_err());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn abstract_sockets_work_too() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("backlinks-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&addr).unwrap();
        let notifier = Notifier::new(Some(OsStr::new(&format!("@{name}")))).unwrap().unwrap();
        notifier.notify("STOPPING=1").unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }
}
