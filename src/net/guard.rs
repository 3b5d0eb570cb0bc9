//! Where outgoing connections may go. A DID document, a relay's host list or a listing names hosts
//! we then connect to: without a guard, any of them could point the server at its own loopback,
//! the private network, or a cloud's metadata service (server-side request forgery).
//!
//! Invariants:
//! - Under `AddressPolicy::public_only`, no connection is made to a loopback, private (RFC 1918),
//!   shared (CGNAT), link-local, unique-local, site-local, multicast, broadcast, reserved,
//!   documentation, benchmarking or unspecified address, nor to an IPv6 address that embeds an
//!   IPv4 one (mapped, compatible, NAT64, 6to4, Teredo): the check runs on every address DNS
//!   gives, and the connection goes to an address that passed it (no second lookup).
//! - IP-literal hosts (which skip DNS) are checked before any connection is attempted.
//! - Exceptions are explicit: an operator lists the private addresses (and ports) that may be
//!   reached, for local setups and tests.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Which addresses outgoing connections may reach.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    /// Non-public addresses allowed anyway: an address, with a port or for every port.
    allowed: Vec<(IpAddr, Option<u16>)>,
    /// Every address allowed (a client that follows only what the operator configured, such as
    /// Jetstream instances).
    any: bool,
}

impl AddressPolicy {
    /// Public addresses only.
    pub fn public_only() -> Self {
        Self::default()
    }

    /// Every address (for hosts the operator named, never for hosts the network named).
    pub fn any() -> Self {
        AddressPolicy { allowed: Vec::new(), any: true }
    }

    /// Public addresses, plus `allowed`: entries `IP` or `IP:port` (`[v6]:port`).
    pub fn with_allowed(entries: &[String]) -> Result<Self, String> {
        let allowed = entries.iter().map(|entry| parse_allowed(entry)).collect::<Result<_, _>>()?;
        Ok(AddressPolicy { allowed, any: false })
    }

    /// Whether a connection to `address` may be made.
    pub fn permits(&self, address: &SocketAddr) -> bool {
        let ip = address.ip().to_canonical();
        self.any
            || is_public(&ip)
            || self.allowed.iter().any(|(allowed, port)| *allowed == ip && port.is_none_or(|p| p == address.port()))
    }

    /// Whether plain `http` may be used to reach `host:port`: only where the operator allowed
    /// the address (a local setup), never on the public network.
    pub fn permits_plain_http(&self, host: &str, port: u16) -> bool {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        self.any || host.parse::<IpAddr>().is_ok_and(|ip| !is_public(&ip) && self.permits(&SocketAddr::new(ip, port)))
    }
}

fn parse_allowed(entry: &str) -> Result<(IpAddr, Option<u16>), String> {
    if let Ok(address) = entry.parse::<SocketAddr>() {
        return Ok((address.ip().to_canonical(), Some(address.port())));
    }
    let ip = entry.trim_start_matches('[').trim_end_matches(']');
    ip.parse::<IpAddr>()
        .map(|ip| (ip.to_canonical(), None))
        .map_err(|_| format!("{entry:?} is neither an IP address nor IP:port"))
}

/// Whether `ip` is a globally routable unicast address (the stable parts of `is_global`, by
/// hand, since `IpAddr::is_global` is not stable).
pub fn is_public(ip: &IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => is_public_v4(&v4),
        IpAddr::V6(v6) => is_public_v6(&v6),
    }
}

fn is_public_v4(ip: &Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    let reserved = a == 0 // "this network" (0.0.0.0 reaches the local host on Linux)
        || ip.is_loopback()
        || ip.is_private()
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || ip.is_link_local() // 169.254/16: cloud metadata services
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || ip.is_documentation()
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || ip.is_multicast()
        || a >= 240; // reserved, and the broadcast address
    !reserved
}

fn is_public_v6(ip: &Ipv6Addr) -> bool {
    let segments = ip.segments();
    let embeds_v4 = segments[..5] == [0; 5] // IPv4-compatible, and mapped (already canonicalized)
        || (segments[0] == 0x64 && segments[1] == 0xff9b) // NAT64
        || segments[0] == 0x2002 // 6to4
        || (segments[0] == 0x2001 && segments[1] == 0); // Teredo
    let reserved = ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || ip.is_unique_local() // fc00::/7
        || ip.is_unicast_link_local() // fe80::/10
        || (segments[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (segments[0] == 0x2001 && segments[1] == 0x0db8) // documentation
        || (segments[0] == 0x0100 && segments[1..4] == [0; 3]); // discard
    !reserved && !embeds_v4
}

/// A DNS resolver for hyper-util's connector that hands it only the addresses the policy
/// permits: the connector connects to exactly these, so what was checked is what is reached.
#[derive(Clone, Debug)]
pub struct GuardedResolver {
    policy: Arc<AddressPolicy>,
}

impl GuardedResolver {
    pub fn new(policy: Arc<AddressPolicy>) -> Self {
        GuardedResolver { policy }
    }
}

type Resolving = Pin<Box<dyn Future<Output = Result<std::vec::IntoIter<SocketAddr>, std::io::Error>> + Send>>;

impl tower_service::Service<hyper_util::client::legacy::connect::dns::Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = Resolving;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: hyper_util::client::legacy::connect::dns::Name) -> Self::Future {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_string();
            // Port 0: the connector sets the URL's port on each address.
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let permitted: Vec<SocketAddr> = found.iter().copied().filter(|a| policy.permits(a)).collect();
            if permitted.is_empty() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("{host} resolves to no permitted address ({} refused)", found.len()),
                ));
            }
            Ok(permitted.into_iter())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn public(text: &str) -> bool {
        is_public(&text.parse().unwrap())
    }

    #[test]
    fn internal_addresses_are_not_public() {
        for internal in [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "127.255.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "100.100.100.200",
            "169.254.169.254",
            "192.0.0.1",
            "192.0.2.1",
            "198.18.0.1",
            "224.0.0.1",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
            "2001::1",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "2001:db8::1",
        ] {
            assert!(!public(internal), "{internal} is internal");
        }
        for external in ["1.1.1.1", "8.8.8.8", "100.128.0.1", "172.32.0.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"] {
            assert!(public(external), "{external} is public");
        }
    }

    #[test]
    fn allowed_entries_open_exactly_what_they_name() {
        let policy = AddressPolicy::with_allowed(&["127.0.0.1:8080".into(), "10.0.0.5".into()]).unwrap();
        let address = |text: &str| text.parse::<SocketAddr>().unwrap();
        assert!(policy.permits(&address("127.0.0.1:8080")));
        assert!(!policy.permits(&address("127.0.0.1:8081")), "another port");
        assert!(policy.permits(&address("10.0.0.5:1")) && policy.permits(&address("10.0.0.5:2")));
        assert!(!policy.permits(&address("169.254.169.254:80")));
        assert!(policy.permits(&address("[::ffff:127.0.0.1]:8080")), "the mapped form is the same address");
        assert!(policy.permits(&address("8.8.8.8:443")));
        assert!(policy.permits_plain_http("127.0.0.1", 8080));
        assert!(!policy.permits_plain_http("127.0.0.1", 9), "not an allowed port");
        assert!(!policy.permits_plain_http("8.8.8.8", 80), "never on the public network");
        assert!(!policy.permits_plain_http("example.com", 80));
        assert!(AddressPolicy::with_allowed(&["localhost".into()]).is_err());
        assert!(!AddressPolicy::public_only().permits(&address("127.0.0.1:8080")));
        assert!(AddressPolicy::any().permits(&address("127.0.0.1:8080")));
    }
}
