//! The [`Runtime`]: settings and node providers, loaded once and shared by every run.
//! Providers are added in a fixed order, native built-ins, then WASM packages (the
//! first-party `std` and `files`, then the installed ones), then code nodes; the
//! registry refuses a provider that redefines a type, so a package cannot shadow a
//! built-in.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use std::path::Path;

use heddle_core::Value;
use heddle_core::compose::{Bounds, Composition, FileSource, IncludeKey};
use heddle_core::graph::GraphDoc;
use heddle_core::plan::Plan;
use heddle_kernel::runtime::RunOptions;
use heddle_kernel::supervisor::Supervisor;
use heddle_kernel::{Registry, SecretRegistry};
use heddle_runners::CodeNodes;
use heddle_wasm::WasmProvider;

use heddle_core::trace::{RunTrace, TraceParent, Traced};

use crate::driver::Drive;
use crate::error::Error;
use crate::settings::Settings;
use crate::telemetry::{Metrics, RunTracing, Telemetry};

/// What a program embedding Heddle creates once: the [`Settings`], the node registry
/// (with its WASM engine and loaded packages) and the digests of the packages loaded.
/// Every run, in memory or durable, is planned against it and takes its options from
/// it.
pub struct Runtime {
    settings: Settings,
    registry: Registry,
    package_digests: BTreeMap<String, String>,
    /// The span exporter, started with the first traced run.
    telemetry: std::sync::OnceLock<Option<Arc<Telemetry>>>,
    /// The metrics, kept once someone asked for them (a server).
    metrics: std::sync::OnceLock<Arc<Metrics>>,
    /// Where each installed package was fetched from, for those from a registry.
    package_sources: BTreeMap<String, heddle_core::package::PackageSource>,
    /// The configuration's secret values ([`crate::secrets::known_secrets`]), read once:
    /// the settings do not change under a runtime, nor does the process's environment
    /// (nothing here sets a variable), and scanning every variable per run was a
    /// server's cost per created run.
    known_secrets: std::sync::OnceLock<Vec<String>>,
}

impl Runtime {
    /// Starts the WASM engine and loads every provider, with the installed packages
    /// that declare one of the `wanted` node types (all of them when `None`). Async
    /// because loading a package compiles it (or reads the compile cache).
    pub async fn load(
        settings: Settings,
        wanted: Option<&BTreeSet<String>>,
    ) -> Result<Runtime, Error> {
        let mut registry = Registry::with_builtins();
        let wasm = WasmProvider::load_on(
            settings.wasm_host()?,
            settings.wasm.clone(),
            Some(&settings.packages_dir),
            wanted,
        )
        .await
        .map_err(|source| Error::Packages {
            dir: settings.packages_dir.clone(),
            source: Box::new(source),
        })?;
        let package_digests = wasm
            .packages()
            .iter()
            .map(|p| (p.name().to_string(), p.digest.clone()))
            .collect();
        // Where registry packages came from, for a durable run to record: no lockfile
        // is no package; one that cannot be read is an error, not "no sources" (a run
        // recorded without them could not fetch its packages again elsewhere).
        let store = heddle_wasm::PackageStore::open(&settings.packages_dir);
        let package_sources = if store.lockfile_path().is_file() {
            store
                .list()?
                .into_iter()
                .filter_map(|e| Some((e.name, e.source?)))
                .collect()
        } else {
            BTreeMap::new()
        };
        registry.add(Arc::new(wasm))?;
        registry.add(Arc::new(CodeNodes::new(settings.runners.clone())))?;
        registry.set_searched(searched(&settings.packages_dir));
        Ok(Runtime {
            settings,
            registry,
            package_digests,
            telemetry: std::sync::OnceLock::new(),
            metrics: std::sync::OnceLock::new(),
            package_sources,
            known_secrets: std::sync::OnceLock::new(),
        })
    }

    /// Loads a runtime that can continue the stored durable run `h` (its graph `doc`):
    /// the registry packages it recorded that this machine's package store lacks are
    /// fetched again first, by the digests it pinned ([`crate::packages::fetch_missing`]),
    /// then the packages its node types need are loaded. What `heddle runs resume` does;
    /// a server goes through [`Runtime::for_stored_run`], so a run moves between
    /// machines the same way whoever continues it.
    pub async fn load_for_run(
        settings: Settings,
        h: &heddle_store::RunHeader,
        doc: &GraphDoc,
    ) -> Result<Runtime, Error> {
        crate::packages::fetch_missing(&settings, &h.run_id, &h.run.packages).await?;
        Runtime::load(settings, Some(&stored_run_types(h, doc))).await
    }

    /// The runtime that drives the stored durable run `h` (its graph `doc`) in a process
    /// that loaded `self` once at start (a server): the packages the run pinned that the
    /// store lacks are fetched first, as [`Runtime::load_for_run`] does. `self` itself
    /// when nothing was fetched and it knows every type the run uses; else a runtime
    /// loaded for the run, sharing this one's exporter and metrics (one process, one
    /// set of counters). Without it, a run created on another machine with a package
    /// this one never installed could not run here, and on a shared store would be
    /// queued again forever.
    pub async fn for_stored_run(
        self: &Arc<Self>,
        h: &heddle_store::RunHeader,
        doc: &GraphDoc,
    ) -> Result<Arc<Runtime>, Error> {
        let fetched =
            crate::packages::fetch_missing(&self.settings, &h.run_id, &h.run.packages).await?;
        let types = stored_run_types(h, doc);
        if fetched.is_empty()
            && types
                .iter()
                .all(|t| heddle_core::DeclLookup::decl(&self.registry, t).is_some())
        {
            return Ok(self.clone());
        }
        let runtime = Runtime::load(self.settings.clone(), Some(&types)).await?;
        let _ = runtime.telemetry.set(self.telemetry().cloned());
        if let Some(m) = self.metrics.get() {
            let _ = runtime.metrics.set(m.clone());
        }
        Ok(Arc::new(runtime))
    }

    /// The settings it was loaded with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Every node type it can run.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The sha256 of every loaded WASM package's component, by package name: a durable
    /// run records those it uses and refuses to resume on changed bytes.
    pub fn package_digests(&self) -> &BTreeMap<String, String> {
        &self.package_digests
    }

    /// What a durable run records of the package `name`: its digest and, for a package
    /// fetched from a registry, where from.
    pub fn package_pin(&self, name: &str) -> Option<heddle_store::PackagePin> {
        Some(heddle_store::PackagePin {
            sha256: self.package_digests.get(name)?.clone(),
            source: self.package_sources.get(name).cloned(),
        })
    }

    /// Plans `doc` (named `name` in errors), reporting every problem at once. A graph
    /// node is refused here (no document is read): plan such a graph with
    /// [`Runtime::plan_with`].
    pub fn plan(&self, doc: &GraphDoc, name: &str) -> Result<Plan, Error> {
        heddle_core::plan::plan(doc, &self.registry).map_err(|source| Error::Plan {
            graph: name.to_string(),
            source,
        })
    }

    /// Plans `doc` with the documents its graph nodes include ([`compose`]).
    pub fn plan_with(&self, doc: &GraphDoc, name: &str, comp: &Composition) -> Result<Plan, Error> {
        heddle_core::plan::plan_with(doc, &self.registry, comp).map_err(|source| Error::Plan {
            graph: name.to_string(),
            source,
        })
    }

    /// Every secret value a run supervised by `supervisor` could come to hold: the
    /// configuration's ([`crate::secrets::known_secrets`]) and the supervisor's own
    /// credentials, in a registry of the run's own (nodes add what they read).
    pub fn secrets(&self, supervisor: Option<&dyn Supervisor>) -> Arc<SecretRegistry> {
        let known = self
            .known_secrets
            .get_or_init(|| crate::secrets::known_secrets(&self.settings.wasm).snapshot());
        let registry = SecretRegistry::default();
        for v in known {
            registry.register(v);
        }
        for v in supervisor.map(|s| s.secrets()).unwrap_or_default() {
            registry.register(&v);
        }
        Arc::new(registry)
    }

    /// Where this process sends its spans (started on first use); `None` when no
    /// exporter is configured ([`crate::telemetry`]).
    pub fn telemetry(&self) -> Option<&Arc<Telemetry>> {
        self.telemetry
            .get_or_init(|| crate::telemetry::start(&self.settings.telemetry))
            .as_ref()
    }

    /// This process's metrics ([`crate::telemetry::Metrics`]), kept from the first call
    /// on: runs taken from then on are counted (a server asks before it adopts any).
    /// A process that never asks (the command line) counts nothing.
    pub fn metrics(&self) -> &Arc<Metrics> {
        self.metrics.get_or_init(|| {
            Arc::new(Metrics::new(
                &self.settings.telemetry.metric_labels,
                self.telemetry().cloned(),
            ))
        })
    }

    /// What watches this process's runs, for code that ends a run without driving it
    /// ([`crate::telemetry::Watch`]): its exporter, and its metrics once kept.
    pub fn watch(&self) -> crate::telemetry::Watch {
        crate::telemetry::Watch::of(self.telemetry().cloned(), self.metrics.get().cloned())
    }

    /// Whether this process keeps metrics (someone asked for them).
    pub(crate) fn metrics_kept(&self) -> bool {
        self.metrics.get().is_some()
    }

    /// Makes a new run's options say what this process watches: an exporter traces it
    /// (under the process's `TRACEPARENT`, unless it has a trace of its own), metrics
    /// count every invocation.
    pub(crate) fn watch_options(&self, opts: &mut RunOptions) {
        if opts.trace.is_none() {
            opts.trace = self.trace(self.settings.telemetry.parent);
        }
        opts.every_invocation |= self.metrics_kept();
    }

    /// The trace of a new run: under `parent` (a caller's `traceparent`) when given,
    /// else a trace of its own; `None` when no exporter is configured (nothing is
    /// traced, and no trace is recorded). Set it as the run's `RunOptions::trace` before
    /// [`Runtime::begin`] or [`Runtime::in_memory`]; a run that has none gets one under
    /// the process's `TRACEPARENT`, if any.
    pub fn trace(&self, parent: Option<TraceParent>) -> Option<Arc<Traced>> {
        let t = self.telemetry()?;
        let trace_id = parent.map_or_else(|| t.trace_id(), |p| p.trace_id);
        let sampler = self
            .settings
            .telemetry
            .traces
            .as_ref()
            .map_or_else(Default::default, |x| x.sampler);
        let run = RunTrace {
            trace_id,
            parent: parent.map(|p| p.span_id),
            span: t.span_id(),
            // Decided once, here: a durable run records it with its trace.
            sampled: sampler.sampled(trace_id, parent.as_ref()),
        };
        Some(Arc::new(Traced::new(run, t.salt())))
    }

    /// The watching of a run traced as `traced` in this process (its spans, its
    /// metrics): `None` when nothing is exported or counted.
    pub(crate) fn run_tracing(
        &self,
        traced: Option<&Arc<Traced>>,
        info: crate::telemetry::RunInfo,
        secrets: &SecretRegistry,
    ) -> Option<RunTracing> {
        let spans = self.telemetry().cloned().zip(traced.cloned());
        RunTracing::new(spans, self.metrics.get().cloned(), info, secrets)
    }

    /// A run kept in memory only ([`Drive::in_memory`]), traced when an exporter is
    /// configured (`graph_name` names it in its span, with the sha256 of `graph_bytes`,
    /// the graph file's bytes, when given: the digest a durable run of the same file
    /// records, so a trace tells which version of a graph ran).
    pub fn in_memory(
        &self,
        plan: Plan,
        mut opts: RunOptions,
        graph_name: &str,
        graph_bytes: Option<&[u8]>,
    ) -> Drive {
        self.watch_options(&mut opts);
        let info = crate::telemetry::RunInfo {
            run_id: None,
            graph_name: graph_name.to_string(),
            // Only when the run is watched: hashing is the one cost it would add.
            graph_digest: graph_bytes
                .filter(|_| opts.trace.is_some())
                .map(heddle_store::sha256_hex),
            created: std::time::SystemTime::now(),
        };
        let tracing = self.run_tracing(opts.trace.as_ref(), info, &opts.secrets);
        Drive::in_memory(plan, opts).traced(tracing)
    }

    /// The options of a run with `inputs`, supervised by `supervisor`: its secret set
    /// built before its first event and the configured node time limit.
    pub fn options(
        &self,
        inputs: BTreeMap<String, Value>,
        supervisor: Option<Arc<dyn Supervisor>>,
    ) -> RunOptions {
        RunOptions {
            secrets: self.secrets(supervisor.as_deref()),
            supervisor,
            inputs,
            node_timeout: self.settings.run.node_timeout,
            ..RunOptions::default()
        }
    }
}

/// Where node types come from, for the error about an unknown one: what is installed in
/// the package store, and how to point at another.
fn searched(packages_dir: &std::path::Path) -> String {
    let installed = match heddle_wasm::PackageStore::open(packages_dir).list() {
        Ok(l) if !l.is_empty() => {
            let names: Vec<&str> = l.iter().map(|e| e.name.as_str()).collect();
            format!("installed: {}", names.join(", "))
        }
        Ok(_) => "nothing installed".to_string(),
        Err(e) => format!("unreadable: {e}"),
    };
    format!(
        "node types come from the built-ins, the code runners, the first-party packages ({}) and the package store {} ({installed}); install one with `heddle package add DIR`, or use another store with `--packages DIR` or `[cli] packages_dir` in heddle.toml",
        heddle_wasm::FIRST_PARTY.join(", "),
        packages_dir.display()
    )
}

/// The node types a graph uses: what a run or a validation needs loaded.
pub fn graph_types(doc: &GraphDoc) -> BTreeSet<String> {
    doc.nodes.iter().map(|n| n.node_type.clone()).collect()
}

/// The node types continuing the stored run `h` needs: its graph's and those its plan
/// recorded (inside its graph nodes too).
fn stored_run_types(h: &heddle_store::RunHeader, doc: &GraphDoc) -> BTreeSet<String> {
    let mut types = graph_types(doc);
    types.extend(crate::durable::recorded_types(h));
    types
}

/// The node types a graph and the documents its graph nodes include use.
pub fn composed_types(doc: &GraphDoc, comp: &Composition) -> BTreeSet<String> {
    let mut types = graph_types(doc);
    types.extend(comp.node_types().map(str::to_string));
    types
}

/// `source`, reading `package:NAME/…` documents in the installed packages' directories
/// (what `heddle serve` reads for a request that does not send them, and `run` and
/// `validate` for every graph node naming a `package`).
pub fn with_package_graphs(settings: &Settings, mut source: FileSource) -> FileSource {
    let store = heddle_wasm::PackageStore::open(&settings.packages_dir);
    // An unreadable lockfile leaves package documents unreadable, each said by the node
    // naming one; the packages' own loading reports the lockfile.
    for entry in store.list().unwrap_or_default() {
        let dir = store.entry_dir(&entry);
        source = source.with_package(entry.name, dir);
    }
    source
}

/// Reads what the graph nodes of `doc` include, nested up to `[run] max_graph_depth`:
/// documents relative to the file `path` (the top document's; the working directory
/// when it was not read from a file), and `package:` documents from the installed
/// packages' directories. Reads nothing for a graph without graph nodes.
pub fn compose(settings: &Settings, doc: &GraphDoc, path: Option<&Path>) -> Composition {
    if !doc
        .nodes
        .iter()
        .any(|n| n.node_type == heddle_core::compose::GRAPH_TYPE)
    {
        return Composition::none();
    }
    let source = with_package_graphs(
        settings,
        match path {
            Some(p) => FileSource::beside(p),
            None => FileSource::new("."),
        },
    );
    let top = path.and_then(IncludeKey::top);
    Composition::load(
        doc,
        top.as_ref(),
        &source,
        Bounds::depth(settings.run.max_graph_depth),
    )
}
