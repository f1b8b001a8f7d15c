//! Network destinations: what an operator grants a package (`network = [...]` under
//! `[packages.NAME]`), what a graph narrows a node to (`limits.network`) and what a
//! package asks for (a `network` capability request).
//!
//! A destination is `scheme://host[:port]`: the scheme `http` or `https`, a host name, a
//! `*.` suffix wildcard (`*.storage.example.net`: any name under it, not the name
//! itself) or an IP address (`127.0.0.1`, `[::1]`), and a port (the scheme's default
//! when absent). Nothing else is part of it: a path, a query or user information is
//! refused rather than silently ignored, because a grant that reads narrower than it is
//! would mislead whoever reviews it.
//!
//! Parsing is strict where a lax reading would open a door: a wildcard only as the first
//! label, host names in ASCII (punycode), no name whose last label is all digits (so
//! `2130706433` or `0x7f.1` never passes for a name while meaning 127.0.0.1 to a
//! resolver), ports 1 to 65535.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The two schemes a destination may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scheme {
    /// Plain HTTP: granted only when a destination says `http://`.
    Http,
    /// HTTP over TLS.
    Https,
}

impl Scheme {
    /// Its name as a URL writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    /// The port a URL without one means.
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }

    /// The scheme named `s` (any case), if it is one of the two.
    pub fn parse(s: &str) -> Option<Scheme> {
        if s.eq_ignore_ascii_case("http") {
            Some(Scheme::Http)
        } else if s.eq_ignore_ascii_case("https") {
            Some(Scheme::Https)
        } else {
            None
        }
    }
}

/// The host part of a destination.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Host {
    /// One host name, lowercase.
    Name(String),
    /// Every name under this suffix (written `*.suffix`), lowercase, at any depth; not
    /// the suffix itself.
    Wildcard(String),
    /// One address.
    Ip(IpAddr),
}

impl Host {
    /// Reads a host as a URL's authority writes it (`[::1]` for IPv6). A wildcard is
    /// accepted only when `wildcard` is true (a grant may hold one, a request may not).
    pub fn parse(text: &str, wildcard: bool) -> Result<Host, String> {
        if let Some(inner) = text.strip_prefix('[') {
            let Some(v6) = inner.strip_suffix(']') else {
                return Err(format!("`{text}` opens a `[` it does not close"));
            };
            return v6
                .parse::<std::net::Ipv6Addr>()
                .map(|a| Host::Ip(IpAddr::V6(a)))
                .map_err(|_| format!("`{v6}` is not an IPv6 address"));
        }
        if let Ok(v4) = text.parse::<std::net::Ipv4Addr>() {
            return Ok(Host::Ip(IpAddr::V4(v4)));
        }
        if text.parse::<std::net::Ipv6Addr>().is_ok() {
            return Err(format!(
                "write the IPv6 address `{text}` in brackets: [{text}]"
            ));
        }
        let lower = text.to_ascii_lowercase();
        if let Some(suffix) = lower.strip_prefix("*.") {
            if !wildcard {
                return Err(format!(
                    "`{text}`: a request names one host, not a wildcard"
                ));
            }
            check_name(suffix, text)?;
            return Ok(Host::Wildcard(suffix.to_string()));
        }
        if lower.contains('*') {
            return Err(format!(
                "`{text}`: a wildcard may only be the whole first label, as in `*.example.com`"
            ));
        }
        check_name(&lower, text)?;
        Ok(Host::Name(lower))
    }

    /// Whether `name` (a lowercase host name of a request) is this host or, for a
    /// wildcard, under it.
    fn matches_name(&self, name: &str) -> bool {
        match self {
            Host::Name(n) => n == name,
            Host::Wildcard(suffix) => name
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            Host::Ip(_) => false,
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Wildcard(s) => write!(f, "*.{s}"),
            Host::Ip(IpAddr::V4(a)) => write!(f, "{a}"),
            Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
        }
    }
}

/// A DNS host name: labels of 1 to 63 of `a-z 0-9 -` (not starting or ending with
/// `-`), 253 bytes in all, the last label not all digits.
fn check_name(name: &str, original: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the host is empty".into());
    }
    if name.len() > 253 {
        return Err(format!(
            "the host name is {} bytes long (at most 253)",
            name.len()
        ));
    }
    if !name.is_ascii() {
        return Err(format!(
            "`{original}` is not ASCII: write an international name in its punycode form (xn--…)"
        ));
    }
    let labels: Vec<&str> = name.split('.').collect();
    for label in &labels {
        let ok = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !ok {
            return Err(format!(
                "`{original}` is not a host name (labels of letters, digits and `-`, separated by single dots)"
            ));
        }
    }
    if labels
        .last()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!(
            "`{original}` is neither an IP address nor a host name (its last label is a number)"
        ));
    }
    Ok(())
}

/// One destination: scheme, host (or wildcard, or address) and port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Destination {
    /// `http` or `https`.
    pub scheme: Scheme,
    /// What it reaches.
    pub host: Host,
    /// The port (the scheme's default when the text named none).
    pub port: u16,
}

impl Destination {
    /// Reads `text` as a capability request's target: like [`FromStr`], but a target
    /// without a scheme means `https` (`api.example.com` asks for
    /// `https://api.example.com`).
    pub fn parse_request(text: &str) -> Result<Destination, String> {
        if text.contains("://") {
            text.parse()
        } else {
            format!("https://{text}").parse()
        }
    }

    /// Whether a request to `scheme://host:port` (host lowercase, brackets off an IPv6
    /// address) is inside this destination.
    pub fn matches(&self, scheme: Scheme, host: &Host, port: u16) -> bool {
        if self.scheme != scheme || self.port != port {
            return false;
        }
        match (&self.host, host) {
            (Host::Ip(a), Host::Ip(b)) => a == b,
            (h, Host::Name(n)) => h.matches_name(n),
            _ => false,
        }
    }

    /// Whether everything `other` reaches is inside this destination (what a grant
    /// covers of a request, and what a graph's narrowing keeps of a grant).
    pub fn covers(&self, other: &Destination) -> bool {
        if self.scheme != other.scheme || self.port != other.port {
            return false;
        }
        match (&self.host, &other.host) {
            (Host::Wildcard(mine), Host::Wildcard(theirs)) => {
                mine == theirs || Host::Wildcard(mine.clone()).matches_name(theirs)
            }
            (mine, Host::Name(n)) => mine.matches_name(n),
            (Host::Ip(a), Host::Ip(b)) => a == b,
            _ => false,
        }
    }

    /// Whether this destination names the addresses it reaches itself: an IP address,
    /// or `localhost`. Only such a destination reaches loopback, private, link-local or
    /// metadata addresses; a name a resolver answers for never does, whatever the
    /// answer.
    pub fn names_address(&self) -> bool {
        match &self.host {
            Host::Ip(_) => true,
            Host::Name(n) => n == "localhost",
            Host::Wildcard(_) => false,
        }
    }
}

impl FromStr for Destination {
    type Err = String;

    fn from_str(text: &str) -> Result<Destination, String> {
        let Some((scheme, rest)) = text.split_once("://") else {
            return Err(format!(
                "`{text}` has no scheme: write https://{text} (or http:// for plain HTTP)"
            ));
        };
        let Some(scheme) = Scheme::parse(scheme) else {
            return Err(format!(
                "`{text}`: the scheme `{scheme}` is not one of http, https"
            ));
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if let Some(at) = authority.find(['/', '?', '#']) {
            return Err(format!(
                "`{text}`: a destination is scheme://host[:port]; `{}` (a path or query) would not be matched: grant the host",
                &authority[at..]
            ));
        }
        if authority.contains('@') {
            return Err(format!(
                "`{text}`: a destination holds no user name or password"
            ));
        }
        if authority.parse::<std::net::Ipv6Addr>().is_ok() {
            return Err(format!(
                "`{text}`: write the IPv6 address in brackets: {}://[{authority}]",
                scheme.as_str()
            ));
        }
        // The port follows the last ':' outside an IPv6 address's brackets.
        let (host, port) = match authority.rfind(':') {
            Some(i) if !authority[i..].contains(']') => {
                (&authority[..i], Some(&authority[i + 1..]))
            }
            _ => (authority, None),
        };
        let port = match port {
            None => scheme.default_port(),
            Some(p) => match p.parse::<u32>() {
                Ok(n) if (1..=65_535).contains(&n) => n as u16,
                Ok(n) => {
                    return Err(format!(
                        "`{text}`: the port {n} is out of range (1 to 65535)"
                    ));
                }
                Err(_) => return Err(format!("`{text}`: `{p}` is not a port number")),
            },
        };
        let host = Host::parse(host, true).map_err(|e| format!("`{text}`: {e}"))?;
        Ok(Destination { scheme, host, port })
    }
}

impl TryFrom<String> for Destination {
    type Error = String;

    fn try_from(s: String) -> Result<Destination, String> {
        s.parse()
    }
}

impl From<Destination> for String {
    fn from(d: Destination) -> String {
        d.to_string()
    }
}

/// The canonical text: lowercase, the port only when it is not the scheme's default.
impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme.as_str(), self.host)?;
        if self.port != self.scheme.default_port() {
            write!(f, ":{}", self.port)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Destination {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn parses_the_grant_syntax_canonically() {
        assert_eq!(
            d("https://API.Example.com").to_string(),
            "https://api.example.com"
        );
        assert_eq!(
            d("https://api.example.com:443/").to_string(),
            "https://api.example.com"
        );
        assert_eq!(d("http://127.0.0.1:8080").port, 8080);
        assert_eq!(d("https://[::1]:9443").to_string(), "https://[::1]:9443");
        assert_eq!(
            d("https://*.storage.example.net:443").host,
            Host::Wildcard("storage.example.net".into())
        );
        assert_eq!(d("https://a.com"), d("https://a.com:443"));
    }

    #[test]
    fn refuses_what_would_read_narrower_or_wider_than_it_is() {
        for (bad, why) in [
            ("api.example.com", "no scheme"),
            ("ftp://example.com", "scheme"),
            ("https://api.*.example.com", "first label"),
            ("https://a*.example.com", "first label"),
            ("https://*", "first label"),
            ("https://example.com:0", "out of range"),
            ("https://example.com:70000", "out of range"),
            ("https://example.com:", "not a port"),
            ("https://example.com/v1", "path"),
            ("https://example.com?q=1", "path"),
            ("https://user@example.com", "user"),
            ("https://", "empty"),
            ("https://exa_mple.com", "host name"),
            ("https://2130706433", "number"),
            ("https://0x7f.1", "number"),
            ("https://bücher.de", "punycode"),
            ("https://::1", "brackets"),
            ("https://[::1", "close"),
            ("https://-a.com", "host name"),
        ] {
            let e = bad.parse::<Destination>().unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn matching_checks_scheme_host_and_port() {
        let g = d("https://api.example.com");
        let name = |s: &str| Host::parse(s, false).unwrap();
        assert!(g.matches(Scheme::Https, &name("api.example.com"), 443));
        assert!(!g.matches(Scheme::Http, &name("api.example.com"), 443));
        assert!(!g.matches(Scheme::Https, &name("api.example.com"), 8443));
        assert!(!g.matches(Scheme::Https, &name("evil.example.com"), 443));
        assert!(!g.matches(Scheme::Https, &name("api.example.com.evil.net"), 443));
        let w = d("https://*.example.net");
        assert!(w.matches(Scheme::Https, &name("a.example.net"), 443));
        assert!(w.matches(Scheme::Https, &name("a.b.example.net"), 443));
        assert!(!w.matches(Scheme::Https, &name("example.net"), 443));
        assert!(!w.matches(Scheme::Https, &name("evilexample.net"), 443));
        let ip = d("http://127.0.0.1:8080");
        assert!(ip.matches(Scheme::Http, &name("127.0.0.1"), 8080));
        assert!(!ip.matches(Scheme::Http, &name("localhost"), 8080));
        assert!(Host::parse("*.example.net", false).is_err());
    }

    #[test]
    fn covers_only_what_is_inside() {
        let w = d("https://*.example.net");
        assert!(w.covers(&d("https://a.example.net")));
        assert!(w.covers(&d("https://*.a.example.net")));
        assert!(w.covers(&w));
        assert!(!w.covers(&d("https://example.net")));
        assert!(!w.covers(&d("http://a.example.net")));
        assert!(!d("https://a.example.net").covers(&w));
        assert_eq!(
            Destination::parse_request("api.example.com").unwrap(),
            d("https://api.example.com")
        );
    }

    #[test]
    fn only_addresses_and_localhost_name_their_addresses() {
        assert!(d("http://127.0.0.1").names_address());
        assert!(d("http://localhost:8080").names_address());
        assert!(!d("https://api.example.com").names_address());
        assert!(!d("https://*.example.com").names_address());
    }
}
