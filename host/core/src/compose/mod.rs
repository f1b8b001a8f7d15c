//! Graphs used as nodes: a `heddle.graph` node names another graph document, pinned by
//! its sha256, and planning expands it inline.
//!
//! Two steps, so that what a graph needs is known before anything is planned:
//!
//! 1. [`Composition::load`] walks the document's graph nodes (and theirs, to the depth
//!    cap), reads each referenced document once through a [`GraphSource`], checks it
//!    against the digest the node pins, parses it and refuses self-reference. Every
//!    problem is an [`Issue`] of the graph node at fault, by its path.
//! 2. [`crate::plan::plan_with`] expands the graph nodes into one flat graph whose inner
//!    nodes are named by path (`outer/inner`): the inner graph's `heddle.input` and
//!    `heddle.output` nodes become the graph node's typed ports, and everything else
//!    (correlation, declarations, retry, limits, supervision) treats inner nodes as
//!    nodes. One run, one event stream, one log.
//!
//! Documents are named by an [`IncludeKey`]: the reference resolved against the
//! including document, relative to the top document's directory (`graphs/clean.json`),
//! or inside an installed package (`package:textkit/clean.json`). A durable run stores
//! every document it expanded under its key ([`IncludedDoc`]) and resumes from those
//! bytes through a [`Bundle`], never from files that may have changed since.

mod expand;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::graph::GraphDoc;
use crate::plan::issues::{Issue, IssueKind, issue};
use crate::types::PortType;
use crate::value::Value;

pub(crate) use expand::expand;
pub use expand::{INPUT_PORT_TYPE, OUTPUT_PORT_TYPE};

/// The node type of a graph used as a node.
pub const GRAPH_TYPE: &str = "heddle.graph";
/// How deep graph nodes may nest when the configuration says nothing (`[run]
/// max_graph_depth`): a graph node inside a graph node inside … eight levels.
pub const DEFAULT_MAX_DEPTH: usize = 8;
/// The most nodes the graph nodes of one graph may expand into, unless told otherwise:
/// a few small documents each including the next several times would otherwise expand
/// into more nodes than any machine holds.
pub const DEFAULT_MAX_NODES: usize = 1_000_000;
/// Separates a graph node's id from its inner nodes' ids in a path.
pub const PATH_SEP: char = '/';
/// The graph node's own properties; every other property sets one of its inputs.
pub const OWN_PROPERTIES: [&str; 3] = ["graph", "sha256", "package"];
const PACKAGE_KEY: &str = "package:";

/// Where an included document is, independent of the directory a command runs in: a
/// path relative to the top document's directory, normalized (`graphs/clean.json`,
/// `../shared/x.json`), or `package:NAME/PATH` for a document an installed package
/// provides.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct IncludeKey(String);

impl IncludeKey {
    /// The key of a top document read from `path`: its file name (what a reference back
    /// to it from an included document resolves to).
    pub fn top(path: &Path) -> Option<IncludeKey> {
        path.file_name()
            .and_then(|n| n.to_str())
            .map(|n| IncludeKey(n.to_string()))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The package and path inside it, for a package's document.
    pub fn package(&self) -> Option<(&str, &str)> {
        self.0.strip_prefix(PACKAGE_KEY)?.split_once('/')
    }

    /// Resolves a graph node's reference (`graph`, and `package` when set) made in the
    /// document `base` (`None`: the top document): relative to `base`'s directory, inside
    /// the same package for a package's document, or at the root of `package`.
    pub fn resolve(
        base: Option<&IncludeKey>,
        graph: &str,
        package: Option<&str>,
    ) -> Result<IncludeKey, String> {
        if graph.is_empty() {
            return Err("`graph` is empty: name a graph document".into());
        }
        if graph.starts_with('/') || graph.contains('\\') || graph.contains('\0') {
            return Err(format!(
                "`graph` must be a relative path with `/` separators (relative to the including document), got `{graph}`"
            ));
        }
        if let Some(p) = package {
            if !valid_package(p) {
                return Err(format!("`package` is not a package name: `{p}`"));
            }
            return Ok(IncludeKey(format!(
                "{PACKAGE_KEY}{p}/{}",
                normalize(graph, false)
                    .ok_or_else(|| format!("`graph` leaves package {p}: `{graph}`"))?
            )));
        }
        match base.and_then(IncludeKey::package) {
            Some((pkg, path)) => {
                let joined = join(dir_of(path), graph);
                let inside = normalize(&joined, false)
                    .ok_or_else(|| format!("`graph` leaves package {pkg}: `{graph}`"))?;
                Ok(IncludeKey(format!("{PACKAGE_KEY}{pkg}/{inside}")))
            }
            None => {
                let dir = base.map_or("", |b| dir_of(&b.0));
                // Relative paths may climb above the top document's directory.
                Ok(IncludeKey(
                    normalize(&join(dir, graph), true).unwrap_or_default(),
                ))
            }
        }
    }
}

impl std::fmt::Display for IncludeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn valid_package(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= 64
        && p.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

fn dir_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(d, _)| d)
}

fn join(dir: &str, rel: &str) -> String {
    if dir.is_empty() {
        rel.to_string()
    } else {
        format!("{dir}/{rel}")
    }
}

/// `a/./b/../c` → `a/c`, lexically; `None` when `..` climbs above the start and that is
/// not allowed.
fn normalize(path: &str, may_climb: bool) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => match parts.last() {
                Some(&last) if last != ".." => {
                    parts.pop();
                }
                _ if may_climb => parts.push(".."),
                _ => return None,
            },
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

/// Reads included documents by key.
pub trait GraphSource {
    /// The bytes of the document at `key`, or why they cannot be read.
    fn read(&self, key: &IncludeKey) -> Result<Vec<u8>, String>;

    /// How to name `key` to a person (the file's path as it would be opened).
    fn origin(&self, key: &IncludeKey) -> String {
        key.to_string()
    }

    /// What `key` is on disk, when it is a file: its canonical path. Two keys spelt
    /// differently (`g.json` and `../dir/g.json`, or through a symbolic link) that name
    /// one file are one document, so a loop back through another spelling is still
    /// named as a cycle. `None` (the default) compares keys as written.
    fn identity(&self, _key: &IncludeKey) -> Option<PathBuf> {
        None
    }
}

/// Documents in files: relative keys under the top document's directory, package keys
/// in the installed packages' directories.
#[derive(Clone, Debug, Default)]
pub struct FileSource {
    /// `None`: relative keys are not read from files at all (a server reads only the
    /// installed packages' documents; the rest come with the request).
    root: Option<PathBuf>,
    packages: BTreeMap<String, PathBuf>,
}

impl FileSource {
    /// Reads relative keys under `root` (the top document's directory).
    pub fn new(root: impl Into<PathBuf>) -> FileSource {
        FileSource {
            root: Some(root.into()),
            packages: BTreeMap::new(),
        }
    }

    /// Reads only `package:` keys (add the packages with [`FileSource::with_package`]);
    /// a relative key is refused.
    pub fn packages_only() -> FileSource {
        FileSource {
            root: None,
            packages: BTreeMap::new(),
        }
    }

    /// Reads relative keys next to the document at `path`.
    pub fn beside(path: &Path) -> FileSource {
        FileSource::new(path.parent().unwrap_or(Path::new("")))
    }

    /// Reads `package:NAME/…` keys in `dir`, the installed package's directory.
    pub fn with_package(mut self, name: impl Into<String>, dir: impl Into<PathBuf>) -> Self {
        self.packages.insert(name.into(), dir.into());
        self
    }

    fn path(&self, key: &IncludeKey) -> Result<PathBuf, String> {
        match key.package() {
            Some((pkg, path)) => match self.packages.get(pkg) {
                Some(dir) => Ok(dir.join(path)),
                None => Err(format!(
                    "no installed package `{pkg}` (install it with `heddle package add DIR`)"
                )),
            },
            None => match &self.root {
                Some(root) => Ok(root.join(&key.0)),
                None => {
                    Err("only an installed package's documents are read from files here".into())
                }
            },
        }
    }
}

impl GraphSource for FileSource {
    fn read(&self, key: &IncludeKey) -> Result<Vec<u8>, String> {
        let path = self.path(key)?;
        std::fs::read(&path).map_err(|e| e.to_string())
    }

    fn origin(&self, key: &IncludeKey) -> String {
        self.path(key)
            .map_or_else(|_| key.to_string(), |p| p.display().to_string())
    }

    fn identity(&self, key: &IncludeKey) -> Option<PathBuf> {
        std::fs::canonicalize(self.path(key).ok()?).ok()
    }
}

/// Documents given with the top one, by key: what a durable run recorded, or what an API
/// request sent along. Nothing is read from files, unless [`Bundle::or_packages`] says
/// where the installed packages' documents are.
#[derive(Clone, Debug, Default)]
pub struct Bundle {
    docs: BTreeMap<String, String>,
    /// What to say about a key the bundle lacks (where it would have to come from).
    missing: String,
    /// Where a `package:` key the bundle lacks is read.
    packages: Option<FileSource>,
}

impl Bundle {
    /// A bundle of `(path, text)` pairs, each path as a top document's graph node would
    /// name it (`./graphs/a.json` is `graphs/a.json`); a key it lacks is refused with
    /// `missing`.
    pub fn new(
        docs: impl IntoIterator<Item = (String, String)>,
        missing: impl Into<String>,
    ) -> Bundle {
        Bundle {
            docs: docs
                .into_iter()
                .map(|(k, t)| {
                    let key = IncludeKey::resolve(None, &k, None).map_or(k, |k| k.0);
                    (key, t)
                })
                .collect(),
            missing: missing.into(),
            packages: None,
        }
    }

    /// The same bundle, reading a `package:` key it lacks through `packages` (the
    /// installed packages' directories): a request sent to a server need not carry the
    /// documents the server's own packages provide.
    pub fn or_packages(mut self, packages: FileSource) -> Bundle {
        self.packages = Some(packages);
        self
    }

    /// The documents a durable run recorded.
    pub fn recorded(docs: &[IncludedDoc]) -> Bundle {
        Bundle::new(
            docs.iter().map(|d| (d.key.0.clone(), d.text.clone())),
            "the run did not record it",
        )
    }
}

impl Bundle {
    /// The packages' source, when `key` is a package's document the bundle lacks.
    fn package_source(&self, key: &IncludeKey) -> Option<&FileSource> {
        if self.docs.contains_key(&key.0) || key.package().is_none() {
            return None;
        }
        self.packages.as_ref()
    }
}

impl GraphSource for Bundle {
    fn read(&self, key: &IncludeKey) -> Result<Vec<u8>, String> {
        if let Some(packages) = self.package_source(key) {
            return packages.read(key);
        }
        self.docs
            .get(&key.0)
            .map(|t| t.clone().into_bytes())
            .ok_or_else(|| self.missing.clone())
    }

    // The origin stays the key, also for a package's document: a server's answer names
    // `package:NAME/PATH`, not where its packages are on its disk.
}

/// One document a plan expanded, as a durable run records it: resumed from these bytes,
/// checked against the digest the graph node pins.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncludedDoc {
    /// Where it was included from.
    pub key: IncludeKey,
    /// sha256 (hex) of `text`.
    pub sha256: String,
    /// The document's exact text.
    pub text: String,
}

/// One port of a graph node: an inner `heddle.input` or `heddle.output`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphPort {
    /// The handle edges name (the inner node's `name`, else its id).
    pub name: String,
    /// The plan node that carries it (`graph-node/inner-id`).
    pub node: String,
    /// Its type: an input's `type`; an output's, the type of what feeds it inside.
    #[serde(rename = "type")]
    pub ty: PortType,
    /// An input's default (`value`), used when nothing feeds the port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
    /// An input that takes a stream (`streaming: true`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub streaming: bool,
}

/// A graph node of a plan, as expanded: what it includes and the plan nodes it became.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphNodeInfo {
    /// Its path (`id`, or `outer/id` inside another graph node).
    pub id: String,
    /// The `graph` reference as written.
    pub graph: String,
    /// The `package` it names, when it names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<String>,
    /// Where the reference resolved to.
    pub key: IncludeKey,
    /// sha256 of the included document (what `sha256` pins).
    pub sha256: String,
    /// The inner document's `name` and `description`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// See `name`.
    pub description: Option<String>,
    /// Its inputs, in the inner document's order.
    pub inputs: Vec<GraphPort>,
    /// Its outputs, in the inner document's order.
    pub outputs: Vec<GraphPort>,
    /// A graph node is never retry-safe as a whole: its inner graph can hold anything.
    /// Its inner nodes keep their own retry safety.
    pub retry_safe: bool,
    /// The plan nodes inside it, at any depth, by path.
    pub nodes: Vec<String>,
}

/// A document read for a graph node.
#[derive(Clone, Debug)]
pub(crate) struct Loaded {
    pub doc: GraphDoc,
    pub sha256: String,
    pub text: String,
    pub origin: String,
}

/// How far expansion may go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Levels of graph nodes inside graph nodes.
    pub depth: usize,
    /// Nodes the included documents add, counted once per graph node including them.
    pub nodes: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            depth: DEFAULT_MAX_DEPTH,
            nodes: DEFAULT_MAX_NODES,
        }
    }
}

impl Bounds {
    /// The default node bound with nesting up to `depth` levels.
    pub fn depth(depth: usize) -> Bounds {
        Bounds {
            depth,
            ..Bounds::default()
        }
    }
}

/// Every document a graph's nodes include (to the depth cap), read and checked once,
/// with the problems found, each an issue of the graph node at fault.
#[derive(Clone, Debug, Default)]
pub struct Composition {
    pub(crate) docs: BTreeMap<IncludeKey, Result<Arc<Loaded>, String>>,
    /// Graph node path → the key its document was read under (absent: it could not be).
    pub(crate) at: HashMap<String, IncludeKey>,
    pub(crate) issues: Vec<Issue>,
}

impl Composition {
    /// Nothing included: a graph without graph nodes, or one planned where documents
    /// cannot be read (each graph node is then refused by name).
    pub fn none() -> Composition {
        Composition::default()
    }

    /// Reads what the graph nodes of `doc` include through `source`, within `bounds`.
    /// `top` is `doc`'s own key, when it is a file (a reference back to it is
    /// self-reference).
    pub fn load(
        doc: &GraphDoc,
        top: Option<&IncludeKey>,
        source: &dyn GraphSource,
        bounds: Bounds,
    ) -> Composition {
        let mut c = Composition::default();
        let mut walk = Walk {
            source,
            max_depth: bounds.depth,
            max_nodes: bounds.nodes,
            nodes: 0,
            over: false,
            top,
            top_identity: top.and_then(|t| source.identity(t)),
            chain: Vec::new(),
        };
        walk.doc(&mut c, doc, "", None);
        c
    }

    /// Every node type the included documents use: what a run needs loaded besides the
    /// top document's.
    pub fn node_types(&self) -> impl Iterator<Item = &str> {
        self.docs
            .values()
            .filter_map(|d| d.as_ref().ok())
            .flat_map(|d| d.doc.nodes.iter().map(|n| n.node_type.as_str()))
    }

    /// The problems found reading the documents (also part of planning's error).
    pub fn issues(&self) -> &[Issue] {
        &self.issues
    }

    /// `doc` with its graph nodes expanded as planning expands them (inner nodes named by
    /// path, ports as pass-through nodes), without planning it: for tools that look a
    /// node up by id, such as a gate inside a graph node.
    pub fn flatten(&self, doc: &GraphDoc) -> GraphDoc {
        struct NoDecls;
        impl crate::DeclLookup for NoDecls {
            fn decl(&self, _: &str) -> Option<Arc<crate::NodeDecl>> {
                None
            }
        }
        expand(doc, self, &NoDecls).doc
    }

    pub(crate) fn loaded(&self, path: &str) -> Option<(&IncludeKey, &Loaded)> {
        let key = self.at.get(path)?;
        match self.docs.get(key) {
            Some(Ok(l)) => Some((key, l)),
            _ => None,
        }
    }
}

/// sha256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The walk over graph nodes, with the chain of documents above the current one.
struct Walk<'a> {
    source: &'a dyn GraphSource,
    max_depth: usize,
    max_nodes: usize,
    /// Nodes the documents read so far add, per including node; past `max_nodes` the
    /// walk stops (`over`).
    nodes: usize,
    over: bool,
    top: Option<&'a IncludeKey>,
    /// The top document's file, canonical (see [`GraphSource::identity`]).
    top_identity: Option<PathBuf>,
    /// (graph node path, key, its file) from the top down to the document being walked.
    chain: Vec<(String, IncludeKey, Option<PathBuf>)>,
}

impl Walk<'_> {
    fn doc(
        &mut self,
        c: &mut Composition,
        doc: &GraphDoc,
        prefix: &str,
        base: Option<&IncludeKey>,
    ) {
        for n in doc
            .nodes
            .iter()
            .filter(|n| n.node_type == GRAPH_TYPE && !n.is_bypassed())
        {
            if self.over {
                return;
            }
            let path = format!("{prefix}{}", n.id);
            let props = n.merged_properties();
            let text = |k: &str| props.get(k).filter(|v| !v.is_null());
            let graph = match text("graph").map(Value::as_str) {
                Some(Some(g)) => g,
                Some(None) => {
                    c.issues.push(issue(
                        IssueKind::InvalidGraphNode,
                        Some(&path),
                        None,
                        Some("graph"),
                        "`graph` must be text: the path of a graph document".into(),
                    ));
                    continue;
                }
                None => {
                    c.issues.push(issue(
                        IssueKind::InvalidGraphNode,
                        Some(&path),
                        None,
                        Some("graph"),
                        "a graph node needs `graph`: the path of a graph document, relative to this one (or inside the package `package` names)".into(),
                    ));
                    continue;
                }
            };
            let package = match text("package").map(Value::as_str) {
                None => None,
                Some(Some(p)) => Some(p),
                Some(None) => {
                    c.issues.push(issue(
                        IssueKind::InvalidGraphNode,
                        Some(&path),
                        None,
                        Some("package"),
                        "`package` must be text: the name of an installed package".into(),
                    ));
                    continue;
                }
            };
            let key = match IncludeKey::resolve(base, graph, package) {
                Ok(k) => k,
                Err(why) => {
                    c.issues.push(issue(
                        IssueKind::InvalidGraphNode,
                        Some(&path),
                        None,
                        Some("graph"),
                        why,
                    ));
                    continue;
                }
            };
            let identity = self.source.identity(&key);
            if let Some(cycle) = self.cycle(&path, &key, identity.as_ref()) {
                c.issues.push(issue(
                    IssueKind::GraphCycle,
                    Some(&path),
                    None,
                    Some("graph"),
                    format!(
                        "graph `{key}` includes itself: {cycle}; a graph cannot contain itself, directly or through other graphs"
                    ),
                ));
                continue;
            }
            if self.chain.len() >= self.max_depth {
                c.issues.push(issue(
                    IssueKind::GraphDepth,
                    Some(&path),
                    None,
                    Some("graph"),
                    format!(
                        "graph nodes nest deeper than {} levels here ({}); raise `[run] max_graph_depth` if this is meant",
                        self.max_depth,
                        self.trail(&path, &key)
                    ),
                ));
                continue;
            }
            let loaded = c
                .docs
                .entry(key.clone())
                .or_insert_with(|| read(self.source, &key).map(Arc::new))
                .clone();
            let loaded = match loaded {
                Ok(l) => l,
                Err(why) => {
                    // Read once per key: every node naming it is told the same.
                    c.issues.push(issue(
                        IssueKind::InvalidGraphNode,
                        Some(&path),
                        None,
                        Some("graph"),
                        why,
                    ));
                    continue;
                }
            };
            match text("sha256").map(Value::as_str) {
                Some(Some(pin)) if pin.eq_ignore_ascii_case(&loaded.sha256) => {}
                Some(Some(pin)) => c.issues.push(issue(
                    IssueKind::GraphDigest,
                    Some(&path),
                    None,
                    Some("sha256"),
                    format!(
                        "graph document {} changed since it was pinned: the node pins sha256 {pin}, the document's is {}; if the change is meant, pin the new digest",
                        loaded.origin, loaded.sha256
                    ),
                )),
                _ => c.issues.push(issue(
                    IssueKind::GraphDigest,
                    Some(&path),
                    None,
                    Some("sha256"),
                    format!(
                        "graph document {} is not pinned: add \"sha256\": \"{}\" to the node's properties (a changed document is then refused, like a changed package)",
                        loaded.origin, loaded.sha256
                    ),
                )),
            }
            self.nodes = self.nodes.saturating_add(loaded.doc.nodes.len());
            if self.nodes > self.max_nodes {
                // Said once; the walk reads nothing more.
                self.over = true;
                c.issues.push(issue(
                    IssueKind::GraphDepth,
                    Some(&path),
                    None,
                    Some("graph"),
                    format!(
                        "the graph nodes expand into more than {} nodes (here, including {key}); include fewer or smaller graphs",
                        self.max_nodes
                    ),
                ));
                return;
            }
            c.at.insert(path.clone(), key.clone());
            self.chain.push((path.clone(), key.clone(), identity));
            let inner_prefix = format!("{path}{PATH_SEP}");
            self.doc(c, &loaded.doc, &inner_prefix, Some(&key));
            self.chain.pop();
        }
    }

    /// The chain from the top to `key` when `key` is already on it (or is the top): the
    /// same key, or another spelling of the same file (`identity`).
    fn cycle(&self, path: &str, key: &IncludeKey, identity: Option<&PathBuf>) -> Option<String> {
        let same = |k: &IncludeKey, i: Option<&PathBuf>| {
            k == key || identity.is_some_and(|id| i == Some(id))
        };
        let on_chain = self
            .top
            .is_some_and(|t| same(t, self.top_identity.as_ref()))
            || self.chain.iter().any(|(_, k, i)| same(k, i.as_ref()));
        on_chain.then(|| self.trail(path, key))
    }

    /// `top.json → g (graphs/a.json) → g/h (graphs/b.json)`: the documents from the top
    /// to `path`, which includes `key`.
    fn trail(&self, path: &str, key: &IncludeKey) -> String {
        let mut parts = vec![
            self.top
                .map_or_else(|| "the graph".to_string(), |t| t.to_string()),
        ];
        for (p, k, _) in &self.chain {
            parts.push(format!("{p} ({k})"));
        }
        parts.push(format!("{path} ({key})"));
        parts.join(" → ")
    }
}

/// Reads and parses the document at `key`: an unreadable or malformed one is an error
/// naming the file (and line and column).
fn read(source: &dyn GraphSource, key: &IncludeKey) -> Result<Loaded, String> {
    let origin = source.origin(key);
    let bytes = source
        .read(key)
        .map_err(|why| format!("cannot read graph document {origin}: {why}"))?;
    let sha256 = sha256_hex(&bytes);
    let text = String::from_utf8(bytes)
        .map_err(|e| format!("graph document {origin} is not UTF-8 text: {e}"))?;
    let doc = GraphDoc::parse(&text, &origin).map_err(|e| e.to_string())?;
    Ok(Loaded {
        doc,
        sha256,
        text,
        origin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_resolve_against_the_including_document() {
        let top = IncludeKey::resolve(None, "./graphs/a.json", None).unwrap();
        assert_eq!(top.as_str(), "graphs/a.json");
        let nested = IncludeKey::resolve(Some(&top), "../shared/b.json", None).unwrap();
        assert_eq!(nested.as_str(), "shared/b.json");
        let up = IncludeKey::resolve(None, "../x.json", None).unwrap();
        assert_eq!(up.as_str(), "../x.json");
        let pkg = IncludeKey::resolve(None, "g/clean.json", Some("textkit")).unwrap();
        assert_eq!(pkg.as_str(), "package:textkit/g/clean.json");
        let inside = IncludeKey::resolve(Some(&pkg), "other.json", None).unwrap();
        assert_eq!(inside.as_str(), "package:textkit/g/other.json");
        assert!(IncludeKey::resolve(Some(&pkg), "../../x.json", None).is_err());
        assert!(IncludeKey::resolve(None, "/etc/x.json", None).is_err());
        assert!(IncludeKey::resolve(None, "x.json", Some("../up")).is_err());
    }
}
