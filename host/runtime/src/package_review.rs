//! A WASM package's review: what it is and what it asks for, next to what the
//! operator's config grants it, and what re-adding it would change. What `heddle
//! package add|list|verify` shows (and prints as JSON), here so any front end shows the
//! same review.

use std::fmt::Write as _;

use heddle_core::CapabilityKind;
use heddle_wasm::{PackageGrant, PackageSource, WasmPackage};
use serde::Serialize;

use crate::Settings;

/// One capability request and whether the config grants it.
#[derive(Debug, Serialize)]
pub struct CapabilityLine {
    /// What kind of capability.
    pub kind: CapabilityKind,
    /// What it is asked for (a directory, a host, a variable…).
    pub target: String,
    /// Why, in the package's words.
    pub reason: String,
    /// Who asks: the package manifest, or a node type.
    pub requested_by: String,
    /// Whether the operator's config grants it.
    pub granted: bool,
}

/// A package's review: what it is and asks for, against what the config grants it
/// (`heddle package add|list|verify`, also as JSON).
#[derive(Debug, Serialize)]
pub struct PackageInfo {
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// What it says it does.
    pub description: String,
    /// The digest of its component.
    pub sha256: String,
    /// Where it was fetched from, for a package added from a registry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<PackageSource>,
    /// The node types it provides.
    pub node_types: Vec<String>,
    /// Every capability it asks for, and whether it is granted.
    pub capabilities: Vec<CapabilityLine>,
    /// The destinations the config grants (`network`), whatever the package asked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub network_granted: Vec<String>,
    /// The headers the host adds per destination (`network_auth`): names, never values.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub network_auth: Vec<AuthLine>,
    /// What the operator's config says about this package.
    pub grant: GrantState,
    /// What a re-add changed against the installed version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub change: Option<Change>,
}

/// A header the host injects for a destination, from a secret.
#[derive(Debug, Serialize)]
pub struct AuthLine {
    /// The destination whose requests get it.
    pub destination: String,
    /// The header's name.
    pub header: String,
    /// The secret its value comes from (named, never shown).
    pub secret: String,
}

/// What re-adding a package changes: shown before it takes effect.
#[derive(Debug, Serialize)]
pub struct Change {
    /// The package.
    pub name: String,
    /// Its version installed, and the new one.
    pub version: (String, String),
    /// Its digest installed, and the new one.
    pub sha256: (String, String),
    /// Who signed the installed one, and the new one (`None`: unsigned).
    pub signer: (Option<String>, Option<String>),
    /// Node types the new one adds.
    pub node_types_added: Vec<String>,
    /// Node types the new one no longer has.
    pub node_types_removed: Vec<String>,
    /// Capability requests the new one adds (`kind `target``).
    pub capabilities_added: Vec<String>,
    /// Capability requests the new one no longer makes.
    pub capabilities_removed: Vec<String>,
    /// What the new one says it does.
    pub description: String,
}

/// A package's capability requests as `kind `target``, one each.
fn requests(pkg: &WasmPackage) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for c in &pkg.manifest.capabilities {
        out.insert(format!("{} `{}`", kind_name(c.kind), c.target));
    }
    for d in pkg.declarations() {
        for c in &d.capabilities {
            out.insert(format!("{} `{}`", kind_name(c.kind), c.target));
        }
    }
    out
}

impl Change {
    /// `old` is the installed package (`None` when it no longer loads: then everything
    /// the new one asks for counts as added).
    pub fn between(
        old: Option<&WasmPackage>,
        old_entry: &heddle_wasm::LockEntry,
        new: &WasmPackage,
        origin: Option<&PackageSource>,
    ) -> Change {
        let old_types: std::collections::BTreeSet<String> =
            old_entry.node_types.iter().cloned().collect();
        let new_types: std::collections::BTreeSet<String> = new
            .declarations()
            .iter()
            .map(|d| d.type_name.clone())
            .collect();
        let old_caps = old.map(requests).unwrap_or_default();
        let new_caps = requests(new);
        Change {
            name: new.name().to_string(),
            version: (old_entry.version.clone(), new.manifest.version.clone()),
            sha256: (old_entry.sha256.clone(), new.digest.clone()),
            signer: (
                old_entry.source.as_ref().and_then(|s| s.signer.clone()),
                origin.and_then(|s| s.signer.clone()),
            ),
            node_types_added: new_types.difference(&old_types).cloned().collect(),
            node_types_removed: old_types.difference(&new_types).cloned().collect(),
            capabilities_added: new_caps.difference(&old_caps).cloned().collect(),
            capabilities_removed: old_caps.difference(&new_caps).cloned().collect(),
            description: new.manifest.description.clone(),
        }
    }
}

/// The operator's grant of a package, as the review shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum GrantState {
    /// No `[packages.NAME]` section: nothing is granted.
    None,
    /// A section without `sha256`: any package of that name receives it.
    Unpinned,
    /// A section pinned to these bytes.
    Pinned,
    /// A section pinned to other bytes: nothing is granted to these.
    PinMismatch {
        /// The digest the config pins.
        pinned: String,
    },
}

/// What the config grants the package `name` whose component is `digest`, and how.
pub fn grant_of(settings: &Settings, name: &str, digest: &str) -> (PackageGrant, GrantState) {
    let Some(g) = settings.wasm.packages.get(name) else {
        return (PackageGrant::default(), GrantState::None);
    };
    match &g.sha256 {
        None => (g.clone(), GrantState::Unpinned),
        Some(p) if p.eq_ignore_ascii_case(digest) => (g.clone(), GrantState::Pinned),
        Some(p) => (
            PackageGrant::default(),
            GrantState::PinMismatch { pinned: p.clone() },
        ),
    }
}

/// A package's review: what it asks for against what `settings` grants it.
pub fn review(settings: &Settings, pkg: &WasmPackage, sha256: &str) -> PackageInfo {
    let (grant, state) = grant_of(settings, pkg.name(), sha256);
    let mut info = describe(pkg, sha256, &grant);
    info.grant = state;
    info
}

/// What `pkg` (its component's digest `sha256`) asks for against `grant`, with no
/// judgement of the grant itself ([`review`] adds that).
pub fn describe(pkg: &WasmPackage, sha256: &str, grant: &PackageGrant) -> PackageInfo {
    let mut caps = Vec::new();
    for c in &pkg.manifest.capabilities {
        caps.push(CapabilityLine {
            kind: c.kind,
            target: c.target.clone(),
            reason: c.reason.clone(),
            requested_by: "manifest".into(),
            granted: grant.covers(c.kind, &c.target),
        });
    }
    for d in pkg.declarations() {
        for c in &d.capabilities {
            caps.push(CapabilityLine {
                kind: c.kind,
                target: c.target.clone(),
                reason: c.reason.clone(),
                requested_by: d.type_name.clone(),
                granted: grant.covers(c.kind, &c.target),
            });
        }
    }
    PackageInfo {
        name: pkg.name().to_string(),
        version: pkg.manifest.version.clone(),
        description: pkg.manifest.description.clone(),
        sha256: sha256.to_string(),
        source: None,
        node_types: pkg
            .declarations()
            .iter()
            .map(|d| d.type_name.clone())
            .collect(),
        capabilities: caps,
        network_granted: grant.network.iter().map(ToString::to_string).collect(),
        network_auth: grant
            .network_auth
            .iter()
            .map(|(d, a)| AuthLine {
                destination: d.to_string(),
                header: a.header.clone(),
                secret: a.secret.get_ref().clone(),
            })
            .collect(),
        grant: GrantState::None,
        change: None,
    }
}

/// How a capability kind is spelled in manifests and in the review.
pub fn kind_name(k: CapabilityKind) -> String {
    serde_json::to_value(k)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

impl Change {
    /// What re-adding a package changes, as `heddle package add` shows it before it
    /// takes effect.
    pub fn text(&self) -> String {
        let c = self;
        // Writing to a String cannot fail.
        let mut out = String::new();
        let same = |a: &str, b: &str| {
            if a == b {
                format!("{a} (unchanged)")
            } else {
                format!("{a} -> {b}")
            }
        };
        let signer = |s: &Option<String>| s.clone().unwrap_or_else(|| "unsigned".into());
        let _ = writeln!(out, "update of {} already installed:", c.name);
        let _ = writeln!(out, "  version {}", same(&c.version.0, &c.version.1));
        let _ = writeln!(out, "  sha256 {}", same(&c.sha256.0, &c.sha256.1));
        let _ = writeln!(
            out,
            "  signer {}",
            same(&signer(&c.signer.0), &signer(&c.signer.1))
        );
        if !c.description.is_empty() {
            let _ = writeln!(out, "  description: {}", c.description);
        }
        for (what, list) in [
            ("node types added", &c.node_types_added),
            ("node types removed", &c.node_types_removed),
            ("capabilities added", &c.capabilities_added),
            ("capabilities removed", &c.capabilities_removed),
        ] {
            if !list.is_empty() {
                let _ = writeln!(out, "  {what}: {}", list.join(", "));
            }
        }
        out
    }
}

impl PackageInfo {
    /// An installed package as `heddle package list` shows it: what it asks for next to
    /// what the operator's configuration file `config` grants it, and how to grant the rest.
    pub fn text(&self, config: &str) -> String {
        let info = self;
        // Writing to a String cannot fail.
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{}@{}  sha256 {}",
            info.name, info.version, info.sha256
        );
        if !info.description.is_empty() {
            let _ = writeln!(out, "  {}", info.description);
        }
        if let Some(s) = &info.source {
            let _ = writeln!(
                out,
                "  from {} (manifest {}){}",
                s.reference,
                s.manifest_digest,
                s.signer
                    .as_deref()
                    .map(|k| format!(", signed by {k}"))
                    .unwrap_or_default()
            );
        }
        let _ = writeln!(out, "  node types: {}", info.node_types.join(", "));
        if info.capabilities.is_empty() {
            let _ = writeln!(out, "  requests no capabilities");
        }
        for c in &info.capabilities {
            let _ = writeln!(
                out,
                "  {} {} `{}` ({}): {}",
                if c.granted {
                    "granted    "
                } else {
                    "NOT granted"
                },
                kind_name(c.kind),
                c.target,
                c.requested_by,
                c.reason
            );
        }
        if !info.network_granted.is_empty() {
            let _ = writeln!(
                out,
                "  network granted: {}",
                info.network_granted.join(", ")
            );
        }
        for a in &info.network_auth {
            let _ = writeln!(
                out,
                "  header `{}` added to requests to {} from secret `{}` (the package never sees it)",
                a.header, a.destination, a.secret
            );
        }
        let _ = match &info.grant {
            GrantState::PinMismatch { pinned } => writeln!(
                out,
                "  [packages.{}] in {config} is pinned to sha256 {pinned}, not to these bytes ({}): nothing is granted; review the package and update the pin",
                info.name, info.sha256
            ),
            GrantState::Unpinned => writeln!(
                out,
                "  warning: [packages.{0}] in {config} is not pinned by digest: any package named {0} receives it; add sha256 = \"{1}\" to grant it to these reviewed bytes only",
                info.name, info.sha256
            ),
            GrantState::None if info.capabilities.iter().any(|c| !c.granted) => writeln!(
                out,
                "  to grant: add [packages.{}] to {config} (see README, \"Packages and capability grants\")",
                info.name
            ),
            GrantState::None | GrantState::Pinned => Ok(()),
        };
        out
    }
}
