//! Which content coding a response goes out in, from the request's `Accept-Encoding`
//! (RFC 9110, 12.5.3): the coding with the highest quality the client gives it (by
//! name, else by `*`), zstd before gzip when they tie, identity when it takes neither.

use axum::http::{HeaderMap, HeaderValue, header};

/// `coding as usize` indexes per-coding counters (see `feed::Feed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coding {
    /// As is.
    Identity,
    /// gzip (RFC 1952).
    Gzip,
    /// zstd (RFC 8878).
    Zstd,
}

impl Coding {
    /// Every compressed coding, in order of preference.
    pub const COMPRESSED: [Coding; 2] = [Coding::Zstd, Coding::Gzip];

    /// Its names in `Accept-Encoding` (`x-gzip` is gzip, RFC 9110 8.4.1.3).
    fn names(self) -> &'static [&'static str] {
        match self {
            Coding::Identity => &["identity"],
            Coding::Gzip => &["gzip", "x-gzip"],
            Coding::Zstd => &["zstd"],
        }
    }

    /// Its `Content-Encoding` value (`None` for identity, which sends none).
    pub fn header(self) -> Option<HeaderValue> {
        match self {
            Coding::Identity => None,
            Coding::Gzip => Some(HeaderValue::from_static("gzip")),
            Coding::Zstd => Some(HeaderValue::from_static("zstd")),
        }
    }

    /// The compressed coding `headers` take best, identity if none.
    pub fn negotiate(headers: &HeaderMap) -> Coding {
        let offered: Vec<(&str, f32)> = headers
            .get_all(header::ACCEPT_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|item| {
                let mut parts = item.split(';');
                let name = parts.next().unwrap_or("").trim();
                let q = parts
                    .find_map(|p| p.trim().strip_prefix("q="))
                    .map(|q| q.trim().parse::<f32>().unwrap_or(0.0))
                    .unwrap_or(1.0);
                (name, q)
            })
            .collect();
        let quality = |c: Coding| {
            let named = offered
                .iter()
                .find(|(n, _)| c.names().iter().any(|c| n.eq_ignore_ascii_case(c)));
            named
                .or_else(|| offered.iter().find(|(n, _)| *n == "*"))
                .map_or(0.0, |(_, q)| *q)
        };
        let mut best = (Coding::Identity, 0.0);
        for c in Coding::COMPRESSED {
            let q = quality(c);
            if q > best.1 {
                best = (c, q);
            }
        }
        best.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(v: &str) -> Coding {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT_ENCODING, v.parse().unwrap());
        Coding::negotiate(&h)
    }

    #[test]
    fn accept_encoding_is_read_with_its_qualities() {
        // What Chromium sends, over plain HTTP to loopback too.
        assert_eq!(take("gzip, deflate, br, zstd"), Coding::Zstd);
        assert_eq!(take("gzip, deflate, br"), Coding::Gzip);
        assert_eq!(take("zstd;q=0.5, gzip"), Coding::Gzip);
        assert_eq!(take("deflate, GZIP;q=0.5"), Coding::Gzip);
        assert_eq!(take("x-gzip"), Coding::Gzip);
        assert_eq!(take("*"), Coding::Zstd);
        assert_eq!(take("zstd;q=0, *"), Coding::Gzip);
        assert_eq!(take("gzip;q=0, zstd;q=0, *"), Coding::Identity);
        assert_eq!(take("identity"), Coding::Identity);
        assert_eq!(take("br;q=1, *;q=0"), Coding::Identity);
        assert_eq!(Coding::negotiate(&HeaderMap::new()), Coding::Identity);
    }
}
