//! Capability grants, in one place: what the operator grants a package
//! (`[packages.<name>]`), the narrowing a graph node applies to it, whether a grant
//! covers what a package asks for (shown at `package add`), and the WASI context a store
//! gets from the effective grant.
//!
//! A package's manifest only *asks*; a graph can only *narrow* what is granted here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use heddle_core::graph::AccessLevel;
use heddle_core::net::Destination;
use heddle_core::{CapabilityKind, NodeLimits};
use serde::{Deserialize, Serialize};
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use crate::error::PackageError;

/// Default fuel per invocation: about a second of tight compute, far more than real
/// data-transform nodes use, small enough that a runaway loop ends quickly.
pub const DEFAULT_FUEL: u64 = 10_000_000_000;
pub const DEFAULT_MEMORY_MB: u64 = 256;

/// What the operator grants one package (`[packages.<name>]`). Everything absent is
/// denied.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PackageGrant {
    /// Fuel budget per invocation (default [`DEFAULT_FUEL`]).
    pub fuel: Option<u64>,
    /// Linear memory limit per instance, MiB (default [`DEFAULT_MEMORY_MB`]; 1 to 65536).
    #[serde(deserialize_with = "heddle_core::ranged::opt_int::<_, u64, 1, 65_536>")]
    pub memory_mb: Option<u64>,
    /// Wall-clock limit per invocation, ms (default `[wasm] default_timeout_ms`; 1 to
    /// 604800000, a week).
    #[serde(deserialize_with = "heddle_core::ranged::opt_int::<_, u64, 1, 604_800_000>")]
    pub timeout_ms: Option<u64>,
    pub dirs: Vec<DirGrant>,
    /// Bytes one invocation may add to files in the read-write `dirs`, all together
    /// (growth past a file's end, holes of sparse files included; rewriting existing
    /// bytes is free). Past it a write or `set-size` fails with ENOSPC. Absent: no quota.
    pub files_write_quota: Option<u64>,
    /// Names of host environment variables the package may read.
    pub env: Vec<String>,
    /// Names of secrets the package may read with `get-secret`.
    pub secrets: Vec<String>,
    /// How many invocations of one of the package's nodes may run at once, at most: it
    /// narrows what the manifest declares (`concurrency`), never widens it; 1 runs them
    /// one at a time (1 to 128). Absent: as declared.
    #[serde(deserialize_with = "heddle_core::ranged::opt_int::<_, u32, 1, 128>")]
    pub concurrency: Option<u32>,
    /// Destinations the package may call over HTTP (`scheme://host[:port]`, a host
    /// name, a `*.` suffix wildcard or an IP address; see `heddle_core::net`). Absent:
    /// none. A host name never reaches a loopback, private, link-local or metadata
    /// address, whatever it resolves to; only a destination naming the address (or
    /// `localhost`) does.
    pub network: Vec<Destination>,
    /// A header the host adds to every request to a destination, its value made from a
    /// secret (`[packages.X.network_auth] "https://api.example.com" = { header =
    /// "Authorization", secret = "TOKEN", format = "Bearer {}" }`): the guest never sees
    /// the secret, and a request that sets the header itself is refused. Each key is a
    /// destination inside `network`.
    pub network_auth: BTreeMap<Destination, NetworkAuth>,
    /// The sha256 of the component this grant was reviewed for (as `package add`
    /// prints it). When set, a package of that name with other bytes gets nothing:
    /// the grant belongs to what was reviewed, not to whatever takes the name.
    pub sha256: Option<String>,
    /// A fresh instance for every invocation even of the package's nodes that declare
    /// `reuse-instance` (narrowing what the declaration allows, never widening: a node
    /// that does not declare it always gets a fresh one). For an operator who wants no
    /// state of one invocation reachable from the next at any cost in start-up time
    /// (a warm Python instance is ~30× cheaper than a fresh one: sdk/README.md).
    pub fresh_instances: bool,
}

/// A header the host adds to requests to one destination, from a secret.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(try_from = "RawAuth")]
pub struct NetworkAuth {
    /// The header's name, lowercase (`authorization`).
    pub header: String,
    /// The secret's name (`[secrets]`); its place in heddle.toml names the line of a
    /// secret that is not set.
    pub secret: toml::Spanned<String>,
    /// The header's value, `{}` standing for the secret (default `{}`).
    pub format: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    header: String,
    secret: toml::Spanned<String>,
    #[serde(default)]
    format: Option<String>,
}

impl TryFrom<RawAuth> for NetworkAuth {
    type Error = String;

    fn try_from(raw: RawAuth) -> Result<NetworkAuth, String> {
        let header = raw.header.to_ascii_lowercase();
        if http::HeaderName::from_bytes(header.as_bytes()).is_err() {
            return Err(format!("`header = {:?}` is not a header name", raw.header));
        }
        if crate::net::RESERVED_HEADERS.contains(&header.as_str()) {
            return Err(format!(
                "`header = {:?}`: the host sets this header itself (it frames or routes the request)",
                raw.header
            ));
        }
        let format = raw.format.unwrap_or_else(|| "{}".into());
        if format.matches("{}").count() != 1 {
            return Err(format!(
                "`format = {format:?}` must hold `{{}}` exactly once, where the secret goes"
            ));
        }
        if raw.secret.get_ref().is_empty() {
            return Err("`secret` names no secret".into());
        }
        Ok(NetworkAuth {
            header,
            secret: raw.secret,
            format,
        })
    }
}

impl NetworkAuth {
    /// The header's value with `secret` in its place.
    pub fn value(&self, secret: &str) -> String {
        self.format.replacen("{}", secret, 1)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DirGrant {
    /// Directory on the host.
    pub host: PathBuf,
    /// Where the guest sees it (e.g. `/data`).
    pub guest: String,
    #[serde(default)]
    pub mode: DirMode,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DirMode {
    #[default]
    Ro,
    Rw,
}

impl PackageGrant {
    /// Whether this grant covers one capability request, for the operator's review.
    /// Directories are matched by the guest path the package asks for; a network request
    /// (`https://api.example.com`, a bare host meaning https) by a granted destination
    /// that holds all of it.
    pub fn covers(&self, kind: CapabilityKind, target: &str) -> bool {
        match kind {
            CapabilityKind::FilesRead => self.dirs.iter().any(|d| d.guest == target),
            CapabilityKind::FilesWrite => self
                .dirs
                .iter()
                .any(|d| d.guest == target && d.mode == DirMode::Rw),
            CapabilityKind::Env => self.env.iter().any(|e| e == target),
            CapabilityKind::Secret => self.secrets.iter().any(|s| s == target),
            // `*` asks for whatever destinations the operator grants (a generic client
            // such as the first-party `http`): covered by any.
            CapabilityKind::Network if target == "*" => !self.network.is_empty(),
            CapabilityKind::Network => Destination::parse_request(target)
                .is_ok_and(|want| self.network.iter().any(|d| d.covers(&want))),
        }
    }
}

/// What a node may reach over the network: its package's destinations narrowed by the
/// graph, and the headers the host adds per destination.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NetGrant {
    /// What the package's grant names (a refused request says which grant to add, or
    /// that the graph narrowed it away).
    pub granted: Vec<Destination>,
    /// What this node may reach.
    pub allowed: Vec<Destination>,
    /// The headers the host adds, per destination.
    pub auth: Vec<(Destination, NetworkAuth)>,
}

impl NetGrant {
    fn new(grant: &PackageGrant) -> NetGrant {
        NetGrant {
            granted: grant.network.clone(),
            allowed: grant.network.clone(),
            auth: grant
                .network_auth
                .iter()
                .map(|(d, a)| (d.clone(), a.clone()))
                .collect(),
        }
    }

    /// Keeps what lies inside both the grant and the graph's list: of each overlapping
    /// pair, the narrower destination.
    fn narrow(&mut self, to: &[Destination]) {
        let mut kept = Vec::new();
        for g in &self.granted {
            for l in to {
                let inside = if g.covers(l) {
                    l
                } else if l.covers(g) {
                    g
                } else {
                    continue;
                };
                if !kept.contains(inside) {
                    kept.push(inside.clone());
                }
            }
        }
        self.allowed = kept;
    }
}

/// The effective authority of one node: its package's grant narrowed by the graph's
/// `NodeLimits`. Narrowing only ever removes authority.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeGrant {
    pub fuel: u64,
    pub memory_bytes: usize,
    pub timeout_ms: Option<u64>,
    pub dirs: Vec<DirGrant>,
    pub files_write_quota: Option<u64>,
    pub env: BTreeSet<String>,
    pub secrets: BTreeSet<String>,
    pub network: Arc<NetGrant>,
    /// [`PackageGrant::fresh_instances`].
    pub fresh_instances: bool,
}

impl NodeGrant {
    /// `max_memory_mb` is the engine's ceiling (`[wasm] max_memory_mb`), above which no
    /// grant reaches.
    pub fn new(grant: &PackageGrant, limits: Option<&NodeLimits>, max_memory_mb: u64) -> Self {
        let ceiling = max_memory_mb.max(1);
        let memory_mb = grant.memory_mb.unwrap_or(DEFAULT_MEMORY_MB).min(ceiling);
        let mut g = NodeGrant {
            fuel: grant.fuel.unwrap_or(DEFAULT_FUEL),
            memory_bytes: (memory_mb as usize) << 20,
            timeout_ms: grant.timeout_ms,
            dirs: grant.dirs.clone(),
            files_write_quota: grant.files_write_quota,
            env: grant.env.iter().cloned().collect(),
            secrets: grant.secrets.iter().cloned().collect(),
            network: Arc::new(NetGrant::new(grant)),
            fresh_instances: grant.fresh_instances,
        };
        let Some(l) = limits else { return g };
        if let Some(f) = l.fuel {
            g.fuel = g.fuel.min(f);
        }
        if let Some(t) = l.timeout_ms {
            g.timeout_ms = Some(g.timeout_ms.map_or(t, |own| own.min(t)));
        }
        match l.files {
            Some(AccessLevel::None) => g.dirs.clear(),
            Some(AccessLevel::Read) => {
                for d in &mut g.dirs {
                    d.mode = DirMode::Ro;
                }
            }
            Some(AccessLevel::Write) | None => {}
        }
        if let Some(env) = &l.env {
            let keep: BTreeSet<&String> = env.iter().collect();
            g.env.retain(|e| keep.contains(e));
        }
        if let Some(sec) = &l.secrets {
            let keep: BTreeSet<&String> = sec.iter().collect();
            g.secrets.retain(|s| keep.contains(s));
        }
        if let Some(net) = &l.network {
            Arc::make_mut(&mut g.network).narrow(net);
        }
        g
    }

    /// The grant of a package nobody granted anything (used for `describe()` at load).
    pub fn nothing(max_memory_mb: u64) -> Self {
        NodeGrant::new(&PackageGrant::default(), None, max_memory_mb)
    }

    /// Whether `get-secret` may return the secret `name`.
    pub fn allows_secret(&self, name: &str) -> bool {
        self.secrets.contains(name)
    }

    /// Gives a WASI context exactly the granted directories and env vars; nothing else
    /// is added, so anything not written here stays out of the guest's reach.
    pub(crate) fn apply_to(&self, b: &mut WasiCtxBuilder) -> Result<(), PackageError> {
        for d in &self.dirs {
            let perms = match d.mode {
                DirMode::Ro => FsPerms::ReadOnly,
                DirMode::Rw => FsPerms::ReadWrite,
            };
            b.preopened_dir(&d.host, &d.guest, perms)
                .map_err(|e| PackageError::GrantDir {
                    host: d.host.clone(),
                    guest: d.guest.clone(),
                    source: e.into(),
                })?;
        }
        for name in &self.env {
            if let Ok(v) = std::env::var(name) {
                b.env(name, v);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_limits_narrow_never_widen() {
        let grant = PackageGrant {
            fuel: Some(1000),
            dirs: vec![DirGrant {
                host: "/tmp".into(),
                guest: "/data".into(),
                mode: DirMode::Ro,
            }],
            env: vec!["A".into()],
            secrets: vec!["S".into()],
            ..Default::default()
        };
        let limits = NodeLimits {
            fuel: Some(5000),
            files: Some(AccessLevel::Write),
            env: Some(vec!["A".into(), "B".into()]),
            secrets: Some(vec!["T".into()]),
            timeout_ms: Some(10),
            retry: None,
            network: None,
        };
        let g = NodeGrant::new(&grant, Some(&limits), 1024);
        assert_eq!(g.fuel, 1000, "fuel can only be lowered");
        assert_eq!(
            g.dirs[0].mode,
            DirMode::Ro,
            "write cannot widen a read-only grant"
        );
        assert_eq!(g.env.len(), 1);
        assert!(
            !g.allows_secret("S") && !g.allows_secret("T"),
            "narrowing to an ungranted secret grants nothing"
        );
        assert_eq!(g.timeout_ms, Some(10));
        let none = NodeLimits {
            files: Some(AccessLevel::None),
            ..Default::default()
        };
        assert!(NodeGrant::new(&grant, Some(&none), 1024).dirs.is_empty());
    }

    #[test]
    fn covers_judges_each_request_kind() {
        let grant = PackageGrant {
            dirs: vec![DirGrant {
                host: "/srv".into(),
                guest: "/data".into(),
                mode: DirMode::Ro,
            }],
            env: vec!["LANG".into()],
            secrets: vec!["KEY".into()],
            ..Default::default()
        };
        assert!(grant.covers(CapabilityKind::FilesRead, "/data"));
        assert!(
            !grant.covers(CapabilityKind::FilesWrite, "/data"),
            "a read-only directory does not cover a write request"
        );
        assert!(!grant.covers(CapabilityKind::FilesRead, "/other"));
        assert!(grant.covers(CapabilityKind::Env, "LANG"));
        assert!(!grant.covers(CapabilityKind::Env, "HOME"));
        assert!(grant.covers(CapabilityKind::Secret, "KEY"));
        assert!(!grant.covers(CapabilityKind::Network, ""));
        assert!(!grant.covers(CapabilityKind::Network, "*"));
        let net = PackageGrant {
            network: vec![
                "https://*.example.com".parse().unwrap(),
                "http://127.0.0.1:8080".parse().unwrap(),
            ],
            ..Default::default()
        };
        assert!(net.covers(CapabilityKind::Network, "https://api.example.com"));
        assert!(net.covers(CapabilityKind::Network, "api.example.com"));
        assert!(net.covers(CapabilityKind::Network, "*"));
        assert!(!net.covers(CapabilityKind::Network, "http://api.example.com"));
        assert!(!net.covers(CapabilityKind::Network, "https://example.com"));
        assert!(!net.covers(CapabilityKind::Network, "http://127.0.0.1:8081"));
    }

    #[test]
    fn a_graph_narrows_destinations_to_what_both_hold() {
        let d = |s: &str| s.parse::<Destination>().unwrap();
        let grant = PackageGrant {
            network: vec![d("https://*.example.com"), d("https://api.other.net")],
            ..Default::default()
        };
        let limits = |l: Vec<Destination>| NodeLimits {
            network: Some(l),
            ..Default::default()
        };
        let g = NodeGrant::new(
            &grant,
            Some(&limits(vec![d("https://api.example.com")])),
            1024,
        );
        assert_eq!(g.network.allowed, [d("https://api.example.com")]);
        // A wider limit keeps the grant as it is; one outside it keeps nothing.
        let g = NodeGrant::new(
            &grant,
            Some(&limits(vec![
                d("https://*.other.net"),
                d("https://evil.com"),
            ])),
            1024,
        );
        assert_eq!(g.network.allowed, [d("https://api.other.net")]);
        assert!(
            NodeGrant::new(&grant, Some(&limits(vec![])), 1024)
                .network
                .allowed
                .is_empty()
        );
        assert_eq!(
            NodeGrant::new(&grant, None, 1024).network.allowed,
            grant.network
        );
    }
}
