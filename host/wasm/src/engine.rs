//! The wasmtime engine shared by every package: configuration, the epoch ticker, the
//! linker, the stores nodes run in and the on-disk compile cache.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, UpdateDeadline,
};

use crate::bindings::NodePackage;
use crate::config::EngineSettings;
use crate::error::PackageError;
use crate::grants::NodeGrant;
use crate::host_state::State;
use crate::net::NetShared;

/// How often the ticker advances the epoch: the granularity of deadlines, cancellation
/// and of yielding a CPU-bound guest back to tokio.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);
/// Bytes a guest may hand the host in one import call.
const HOSTCALL_FUEL: usize = 16 << 20;

/// Bytes a guest may hand the host in one call (and in one set of returned outputs).
pub(crate) fn hostcall_limit(settings: &EngineSettings) -> usize {
    HOSTCALL_FUEL.max(2 * settings.max_value_bytes)
}

/// Traps as out of fuel once the fuel charged for host calls exceeds what the guest has
/// left. (The charge is kept beside the fuel counter rather than subtracted from it: a
/// running guest caches its counter and would overwrite a change made from an epoch
/// callback.)
pub(crate) fn check_host_call_fuel(
    cx: &mut wasmtime::StoreContextMut<'_, State>,
) -> wasmtime::Result<()> {
    let charged = cx.data().budget.charged();
    // `get_fuel` fails only when fuel is off: then host calls are free like the rest.
    match cx.get_fuel() {
        Ok(left) if charged > left => Err(wasmtime::Trap::OutOfFuel.into()),
        _ => Ok(()),
    }
}

/// Bytes of a pool slot's memory and tables reset in place (not dropped) between
/// instances when PAGEMAP_SCAN finds them dirty: a small guest's working set (its stack
/// top, data and first heap pages). Past it, the rest is dropped and faulted back in.
const KEEP_RESIDENT: usize = 2 << 20;

/// Core module instances one component may make (Spin's default).
const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 200;

/// Wasm stack a guest may use (a deeper recursion traps as stack exhaustion).
pub(crate) const MAX_WASM_STACK: usize = 1 << 20;

/// A wasmtime engine with its ticker and linker. Cheap to clone.
#[derive(Clone)]
pub struct WasmHost {
    pub(crate) inner: Arc<HostInner>,
}

pub(crate) struct HostInner {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<State>,
    pub(crate) settings: EngineSettings,
    pub(crate) pooling: bool,
    /// One permit per instance slot of the pool (`pool_instances`), taken by each
    /// invocation while it runs: invocations beyond the pool (a node running many at
    /// once, beside others) wait for a slot instead of failing to instantiate. `None`
    /// without the pool (on-demand allocation has no slots to run out of).
    slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Per controller height h (index h - 1), the invocations of controllers of that
    /// height that may hold a slot at once: `pool_instances >> h`, so all controllers
    /// together hold at most `pool_instances - 1` slots and each level always leaves
    /// room for the level below it, down to nodes that control nothing. A controller
    /// holds its slot while it waits for its targets' replies; without this, as many
    /// controllers as slots (a fan-out of WASM controllers driving WASM targets) would
    /// hold every slot and wait forever for targets that cannot get one. Controllers
    /// higher than the last level share it. Empty without the pool.
    controller_slots: Vec<Arc<tokio::sync::Semaphore>>,
    /// Every executor's pool of warm instances, so an invocation that finds every slot
    /// taken can drop an idle warm instance (which holds its slot's permit) instead of
    /// waiting for one that may never be given back (idle instances of nodes that will
    /// not run again before the run ends).
    warm_pools: std::sync::Mutex<Vec<std::sync::Weak<WarmPool>>>,
    cache_dir: PathBuf,
    config_hash: String,
    stop: Arc<AtomicBool>,
    compile_notice: OnceLock<CompileNotice>,
    pub(crate) net: Arc<NetShared>,
}

/// The controller leave per height for a pool of `slots` (see
/// `HostInner::controller_slots`): `slots >> h` for every height h that gets at least one.
fn controller_levels(slots: u32) -> Vec<Arc<tokio::sync::Semaphore>> {
    (1..u32::BITS)
        .map(|h| slots >> h)
        .take_while(|&n| n > 0)
        .map(|n| Arc::new(tokio::sync::Semaphore::new(n as usize)))
        .collect()
}

/// An executor's idle warm instances (see `executor::Warm`).
pub(crate) type WarmPool = std::sync::Mutex<Vec<crate::executor::Warm>>;

/// Told the package name before a compile the cache cannot serve.
type CompileNotice = Box<dyn Fn(&str) + Send + Sync>;

impl Drop for HostInner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl WasmHost {
    pub fn new(settings: EngineSettings) -> Result<WasmHost, PackageError> {
        let (engine, pooling) = build_engine(&settings)?;
        let mut linker = Linker::<State>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| PackageError::engine("linking WASI", e))?;
        crate::fs_quota::add_to_linker(&mut linker)
            .map_err(|e| PackageError::engine("linking the write quota", e))?;
        // Linked for every store; what a request may reach is the node's grant, judged
        // by `net::Outgoing` before any connection.
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(|e| PackageError::engine("linking wasi:http", e))?;
        // An unreadable CA file is the operator's mistake: said now, not at the first
        // HTTPS request of some run.
        crate::net::check_ca_files(&settings.http_ca_files)?;
        NodePackage::add_to_linker::<State, HasSelf<State>>(&mut linker, |s| s)
            .map_err(|e| PackageError::engine("linking the heddle:node host", e))?;
        // 0.2 packages (controlled nodes and controllers) beside 0.1 ones: each imports
        // its own version of `host`.
        crate::bindings::v0_2::NodePackage::add_to_linker::<State, HasSelf<State>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| PackageError::engine("linking the heddle:node 0.2 host", e))?;

        let mut h = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        let config_hash = format!("{:016x}", h.finish());
        let cache_dir = settings.cache_dir.clone().unwrap_or_else(default_cache_dir);

        // A dedicated OS thread, never a tokio task: the ticker must keep running while a
        // CPU-bound guest occupies the executor threads it is meant to interrupt.
        let stop = Arc::new(AtomicBool::new(false));
        {
            let engine = engine.clone();
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("heddle-wasm-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(EPOCH_TICK);
                        engine.increment_epoch();
                    }
                })
                .map_err(|e| PackageError::engine("starting the epoch ticker", e))?;
        }

        let net = Arc::new(NetShared::new(&settings));
        Ok(WasmHost {
            inner: Arc::new(HostInner {
                engine,
                linker,
                slots: pooling.then(|| {
                    Arc::new(tokio::sync::Semaphore::new(
                        settings.pool_instances.max(1) as usize
                    ))
                }),
                controller_slots: if pooling {
                    controller_levels(settings.pool_instances.max(1))
                } else {
                    Vec::new()
                },
                settings,
                pooling,
                warm_pools: std::sync::Mutex::new(Vec::new()),
                cache_dir,
                config_hash,
                stop,
                compile_notice: OnceLock::new(),
                net,
            }),
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    pub fn settings(&self) -> &EngineSettings {
        &self.inner.settings
    }

    /// Calls `notice(package_name)` before each compile the cache cannot serve (seconds
    /// for a large component), so a front end can tell a waiting user why. Set once;
    /// later calls are ignored.
    pub fn on_compile(&self, notice: impl Fn(&str) + Send + Sync + 'static) {
        let _ = self.inner.compile_notice.set(Box::new(notice));
    }

    /// Answers host names before the system resolver does, for outgoing HTTP: `f`
    /// returns the addresses of a name, or `None` to leave it to the system. What it
    /// answers is checked like any DNS answer (a name never reaches a loopback or
    /// private address its grant does not name), which is what tests pin a name to
    /// 127.0.0.1 to show. Set once; later calls are ignored.
    pub fn on_resolve(
        &self,
        f: impl Fn(&str) -> Option<Vec<std::net::IpAddr>> + Send + Sync + 'static,
    ) {
        let _ = self.inner.net.resolve.set(Box::new(f));
    }

    pub(crate) fn notify_compile(&self, package: &str) {
        if let Some(n) = self.inner.compile_notice.get() {
            n(package);
        }
    }

    /// A slot of the instance pool for one invocation, waited for while every slot is
    /// in use; held until the invocation is done, or by the warm instance it leaves (see
    /// `HostInner::slots`). With every slot taken, an idle warm instance of any node is
    /// dropped to free one: warm instances are a cache, never a reason to wait.
    pub(crate) async fn instance_slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let slots = self.inner.slots.clone()?;
        loop {
            if let Ok(p) = slots.clone().try_acquire_owned() {
                return Some(p);
            }
            if !self.evict_warm() {
                // The semaphore is never closed.
                return slots.acquire_owned().await.ok();
            }
        }
    }

    /// Leave for a controller of `height` (its `Controls::height`, at least 1) to hold
    /// a slot while it waits for replies (see `HostInner::controller_slots`); taken before
    /// its slot or warm instance, held until the invocation ends. `None` without the pool
    /// or when the pool is too small to reserve anything (a single slot).
    pub(crate) async fn controller_slot(
        &self,
        height: u32,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let levels = &self.inner.controller_slots;
        let level = (height.max(1) as usize).min(levels.len()).checked_sub(1)?;
        // The semaphore is never closed.
        levels[level].clone().acquire_owned().await.ok()
    }

    /// Registers an executor's warm pool for [`WasmHost::instance_slot`] to evict from.
    pub(crate) fn register_warm(&self, pool: &Arc<WarmPool>) {
        let mut pools = self
            .inner
            .warm_pools
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        pools.retain(|w| w.strong_count() > 0);
        pools.push(Arc::downgrade(pool));
    }

    /// Drops one idle warm instance (releasing its slot); false when there is none.
    fn evict_warm(&self) -> bool {
        let pools: Vec<Arc<WarmPool>> = {
            let pools = self
                .inner
                .warm_pools
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            pools.iter().filter_map(std::sync::Weak::upgrade).collect()
        };
        for pool in pools {
            let evicted = pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
            if evicted.is_some() {
                // Dropped here, outside the pool's lock: the store and its slot go.
                return true;
            }
        }
        false
    }

    /// Whether the pooling allocator is in use (false after a fallback).
    pub fn is_pooling(&self) -> bool {
        self.inner.pooling
    }

    pub fn cache_dir(&self) -> &Path {
        &self.inner.cache_dir
    }

    /// Creates a store with the node's grant and the epoch policy: every tick the guest
    /// yields to tokio, and is stopped at once when its deadline passes or the run is
    /// cancelled.
    pub(crate) fn new_store(&self, grant: &NodeGrant) -> Result<Store<State>, PackageError> {
        let state = State::new(grant, self.settings().log_cap_bytes, self.inner.net.clone())?;
        let mut store = Store::new(self.engine(), state);
        store.limiter(|s| &mut s.limiter);
        // Bounds what one host call (log, emit) may make the host copy out of the guest;
        // the default is 128 MiB.
        store.set_hostcall_fuel(hostcall_limit(self.settings()));
        store.epoch_deadline_callback(|mut cx| {
            check_host_call_fuel(&mut cx)?;
            if cx.data_mut().should_interrupt() {
                Ok(UpdateDeadline::Interrupt)
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        store.set_epoch_deadline(1);
        Ok(store)
    }

    fn cache_path(&self, digest: &str) -> PathBuf {
        self.inner
            .cache_dir
            .join(format!("{digest}-{}.cwasm", self.inner.config_hash))
    }

    /// Compiles `bytes` (whose sha256 is `digest`), or loads the compiled artifact from
    /// the cache. `origin` names the file in errors.
    pub fn compile(
        &self,
        bytes: &[u8],
        digest: &str,
        origin: &Path,
    ) -> Result<Component, PackageError> {
        let cached = self.cache_path(digest);
        if cached.is_file() {
            // SAFETY: the file lives in our own cache directory, was written by
            // `Component::serialize` of an engine with the same compatibility hash (part
            // of the file name), and is keyed by the digest of the source bytes, which the
            // caller has verified. wasmtime additionally checks the header and version.
            match unsafe { Component::deserialize_file(&self.inner.engine, &cached) } {
                Ok(c) => return Ok(c),
                Err(e) => {
                    tracing::warn!(path = %cached.display(), "discarding unreadable compile cache entry: {e}");
                    let _ = std::fs::remove_file(&cached);
                }
            }
        }
        let component =
            Component::new(&self.inner.engine, bytes).map_err(|e| PackageError::BadComponent {
                path: origin.to_path_buf(),
                source: e.into(),
            })?;
        if let Err(e) = self.write_cache(&component, &cached) {
            tracing::warn!(path = %cached.display(), "could not write the compile cache: {}", crate::error::chain(&e));
        }
        Ok(component)
    }

    /// Whether `compile` of `digest` will be served from the cache (a long compile
    /// otherwise, worth telling a waiting user about).
    pub fn is_cached(&self, digest: &str) -> bool {
        self.cache_path(digest).is_file()
    }

    fn write_cache(&self, component: &Component, path: &Path) -> Result<(), PackageError> {
        let bytes = component
            .serialize()
            .map_err(|e| PackageError::engine("serializing a compiled component", e))?;
        let dir = &self.inner.cache_dir;
        std::fs::create_dir_all(dir).map_err(|e| PackageError::io(dir, e))?;
        // Write-then-rename so a concurrent reader never maps a half-written file.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, bytes).map_err(|e| PackageError::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| PackageError::io(path, e))
    }
}

fn default_cache_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("heddle/wasm");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h).join(".cache/heddle/wasm");
    }
    std::env::temp_dir().join("heddle-wasm-cache")
}

fn base_config(settings: &EngineSettings) -> Config {
    let mut c = Config::new();
    c.wasm_component_model(true);
    c.consume_fuel(settings.fuel);
    c.epoch_interruption(true);
    c.parallel_compilation(true);
    // 1 MiB of wasm stack inside a 2 MiB+ fiber stack leaves the host headroom for
    // the functions the guest calls into.
    c.max_wasm_stack(MAX_WASM_STACK);
    c.async_stack_size(4 << 20);
    c
}

fn build_engine(settings: &EngineSettings) -> Result<(Engine, bool), PackageError> {
    if settings.pooling {
        let mut pool = PoolingAllocationConfig::new();
        let n = settings.pool_instances.max(1);
        let scan = PoolingAllocationConfig::is_pagemap_scan_available();
        let keep_resident = if scan { KEEP_RESIDENT } else { 0 };
        pool.total_component_instances(n)
            // Every component may instantiate as many core modules as the per-component
            // limit allows: a componentize-py guest instantiates 14 (libc, libpython, ...
            // dynamically linked), so `n * 8` let a 147-node Python chain fail with the
            // pool's "maximum concurrent limit of 2048 for core instances". The pool
            // reserves nothing per core instance (it is a counter), so this costs nothing.
            .total_core_instances(n.saturating_mul(MAX_CORE_INSTANCES_PER_COMPONENT))
            .total_memories(n)
            .total_tables(n * 4)
            .total_stacks(n)
            .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
            .max_memories_per_component(32)
            .max_tables_per_component(64)
            .table_elements(100_000)
            .max_memory_size((settings.max_memory_mb.max(1) as usize) << 20)
            // A fresh instance per invocation reuses a pool slot: the pages the last one
            // dirtied are reset in place to the slot's initial contents, found with the
            // PAGEMAP_SCAN ioctl (Linux 6.7+), instead of dropped (`madvise(DONTNEED)`)
            // and faulted back in by the next instance: a fresh Rust instance ~30 ->
            // ~11 µs. Either way the next instance, of any package and any run, sees
            // nothing of the last.
            //
            // Needs wasmtime 48.0.11+ (Cargo.toml). Until then the scan asked for pages
            // written *and present*, so a written page the kernel had unmapped for a
            // moment was neither reset nor dropped and the next instance could read it
            // (bytecodealliance/wasmtime#14357; most likely the one-off "unknown handle
            // index 1" of a fresh `files.write_text` under load). 48.0.11 (and 51) ask
            // for WRITTEN pages that are PRESENT *or* SWAPPED, which covers both ways a
            // dirty anonymous page leaves its page table entry: swapped out, and being
            // migrated (compaction, NUMA balancing). Linux's `pagemap_page_category`
            // gives every non-present, non-empty entry, swap and migration entries
            // alike (`is_swap_pte`), PAGE_IS_SWAPPED, and PAGE_IS_WRITTEN unless
            // userfaultfd write-protects it (never here); such a page reads back the
            // old contents once faulted in, so it is reset like a present one. An
            // empty entry (never touched, or dropped) reads as the slot's initial
            // contents and needs nothing. The scan also resumes when its 64-region
            // buffer fills instead of dropping the rest of memory.
            //
            // Where the scan is unavailable (older kernels, not Linux) nothing is kept
            // resident: without it `keep_resident` is a blind memset of the first bytes,
            // a Rust guest's whole 1 MiB stack region on every instance.
            .pagemap_scan(if scan {
                wasmtime::Enabled::Yes
            } else {
                wasmtime::Enabled::No
            })
            .linear_memory_keep_resident(keep_resident)
            .table_keep_resident(keep_resident);
        let mut c = base_config(settings);
        c.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        match Engine::new(&c) {
            Ok(e) => return Ok((e, true)),
            Err(e) => {
                tracing::warn!(
                    "the pooling instance allocator could not start ({e:#}); falling back to on-demand allocation (slower instantiation)"
                );
            }
        }
    }
    let c = base_config(settings);
    Engine::new(&c)
        .map(|e| (e, false))
        .map_err(|e| PackageError::engine("creating the wasmtime engine", e))
}

#[cfg(test)]
mod tests {
    use super::controller_levels;

    /// Every level gets at least one slot and all of them together leave at least one
    /// for nodes that control nothing, whatever the pool's size.
    #[test]
    fn controller_levels_leave_room_for_the_level_below() {
        for slots in [1u32, 2, 3, 4, 7, 256, 65_536] {
            let levels: Vec<usize> = controller_levels(slots)
                .iter()
                .map(|s| s.available_permits())
                .collect();
            assert!(levels.iter().all(|&n| n >= 1), "{slots}: {levels:?}");
            assert!(
                levels.iter().sum::<usize>() < slots as usize,
                "{slots}: {levels:?}"
            );
            assert!(
                levels.windows(2).all(|w| w[0] >= w[1]),
                "{slots}: {levels:?}"
            );
        }
        assert_eq!(
            controller_levels(256)
                .iter()
                .map(|s| s.available_permits())
                .collect::<Vec<_>>(),
            [128, 64, 32, 16, 8, 4, 2, 1]
        );
        assert!(controller_levels(1).is_empty());
    }
}
