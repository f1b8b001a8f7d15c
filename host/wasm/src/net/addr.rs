//! Addresses a name a resolver answers for must never reach: the host itself, the
//! networks around it and the cloud metadata services on them. A grant reaches one of
//! these only by naming it (an IP address, or `localhost` for loopback): a grant of
//! `*.example.com` is never turned against the operator's own network by a DNS answer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The special range `ip` lies in, named for the log line that refuses it; `None` for
/// a public address.
pub(crate) fn special_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], bits: u32) -> bool {
    let mask = if bits == 0 {
        0
    } else {
        u32::MAX << (32 - bits)
    };
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn special_v4(ip: Ipv4Addr) -> Option<&'static str> {
    const RANGES: &[([u8; 4], u32, &str)] = &[
        ([0, 0, 0, 0], 8, "this-network 0.0.0.0/8"),
        ([10, 0, 0, 0], 8, "private 10.0.0.0/8"),
        (
            [100, 64, 0, 0],
            10,
            "shared address space 100.64.0.0/10 (carrier NAT, cloud metadata)",
        ),
        ([127, 0, 0, 0], 8, "loopback 127.0.0.0/8"),
        (
            [169, 254, 0, 0],
            16,
            "link-local 169.254.0.0/16 (cloud metadata)",
        ),
        ([172, 16, 0, 0], 12, "private 172.16.0.0/12"),
        ([192, 0, 0, 0], 24, "protocol assignments 192.0.0.0/24"),
        ([192, 0, 2, 0], 24, "documentation 192.0.2.0/24"),
        ([192, 168, 0, 0], 16, "private 192.168.0.0/16"),
        ([198, 18, 0, 0], 15, "benchmarking 198.18.0.0/15"),
        ([198, 51, 100, 0], 24, "documentation 198.51.100.0/24"),
        ([203, 0, 113, 0], 24, "documentation 203.0.113.0/24"),
        ([224, 0, 0, 0], 4, "multicast 224.0.0.0/4"),
        ([240, 0, 0, 0], 4, "reserved 240.0.0.0/4"),
    ];
    RANGES
        .iter()
        .find(|(net, bits, _)| in_v4(ip, *net, *bits))
        .map(|(_, _, name)| *name)
}

fn special_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    // Forms that carry an IPv4 address are judged by it (an IPv4-mapped ::ffff:127.0.0.1
    // is loopback on a dual-stack socket).
    if let Some(v4) = ip.to_ipv4_mapped() {
        return special_v4(v4).map(|_| "IPv4-mapped ::ffff:0:0/96 of a special IPv4 address");
    }
    let bits = u128::from(ip);
    let in_v6 = |net: u128, len: u32| bits >> (128 - len) == net >> (128 - len);
    if ip.is_unspecified() {
        return Some("unspecified ::");
    }
    if ip.is_loopback() {
        return Some("loopback ::1");
    }
    if bits >> 32 == 0 {
        return Some("IPv4-compatible ::/96");
    }
    if in_v6(0x0064_ff9b_0000_0000_0000_0000_0000_0000, 96) {
        let v4 = Ipv4Addr::from(bits as u32);
        return special_v4(v4).map(|_| "NAT64 64:ff9b::/96 of a special IPv4 address");
    }
    const RANGES: &[(u128, u32, &str)] = &[
        (0x0064_ff9b_0001 << 80, 48, "local NAT64 64:ff9b:1::/48"),
        (0x0100 << 112, 64, "discard 100::/64"),
        (0x2001 << 112, 32, "Teredo 2001::/32"),
        (0x2001_0db8 << 96, 32, "documentation 2001:db8::/32"),
        (
            0xfc00 << 112,
            7,
            "unique-local fc00::/7 (cloud metadata fd00:ec2::254)",
        ),
        (0xfe80 << 112, 10, "link-local fe80::/10"),
        (0xfec0 << 112, 10, "site-local fec0::/10"),
        (0xff00 << 112, 8, "multicast ff00::/8"),
    ];
    if let Some((_, _, name)) = RANGES.iter().find(|(net, len, _)| in_v6(*net, *len)) {
        return Some(name);
    }
    if s[0] == 0x2002 {
        // 6to4 carries an IPv4 address in its second and third segments.
        let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
        return special_v4(v4).map(|_| "6to4 2002::/16 of a special IPv4 address");
    }
    None
}

/// Whether a connection to `ip` is allowed for a request matched by a destination that
/// names its address (`names_address`: an IP literal reaches exactly that address,
/// `localhost` only loopback) or one that does not (only public addresses).
pub(crate) fn allowed(ip: IpAddr, named: Option<&NamedAddress>) -> Result<(), String> {
    match named {
        Some(NamedAddress::Exactly(want)) if *want == canonical(ip) => Ok(()),
        Some(NamedAddress::Exactly(want)) => Err(format!(
            "the connection went to {ip}, not to the granted address {want}"
        )),
        Some(NamedAddress::Loopback) if canonical(ip).is_loopback() => Ok(()),
        Some(NamedAddress::Loopback) => Err(format!(
            "`localhost` resolved to {ip}, which is not a loopback address"
        )),
        None => match special_range(ip) {
            None => Ok(()),
            Some(range) => Err(format!(
                "{ip} is in the {range} range, which a host name never reaches; grant the address itself to allow it"
            )),
        },
    }
}

/// What a destination that names its addresses lets a request reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NamedAddress {
    /// The one address an IP destination names.
    Exactly(IpAddr),
    /// Any loopback address (`localhost`).
    Loopback,
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn special(s: &str) -> bool {
        special_range(s.parse().unwrap()).is_some()
    }

    #[test]
    fn refuses_the_ranges_of_the_host_and_its_networks() {
        for s in [
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.100.100.200",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
        ] {
            assert!(special(s), "{s} must be refused");
        }
        for s in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700:4700::1111",
            "::ffff:1.1.1.1",
            "64:ff9b::808:808",
        ] {
            assert!(!special(s), "{s} is public");
        }
    }

    #[test]
    fn a_named_address_reaches_only_itself() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(allowed(lo, Some(&NamedAddress::Exactly(lo))).is_ok());
        assert!(allowed(lo, None).is_err());
        assert!(
            allowed(
                "::ffff:127.0.0.1".parse().unwrap(),
                Some(&NamedAddress::Exactly(lo))
            )
            .is_ok()
        );
        assert!(
            allowed(
                "127.0.0.2".parse().unwrap(),
                Some(&NamedAddress::Exactly(lo))
            )
            .is_err()
        );
        assert!(allowed("::1".parse().unwrap(), Some(&NamedAddress::Loopback)).is_ok());
        assert!(allowed("10.0.0.1".parse().unwrap(), Some(&NamedAddress::Loopback)).is_err());
        assert!(allowed("1.1.1.1".parse().unwrap(), None).is_ok());
    }
}
