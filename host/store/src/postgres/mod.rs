//! The PostgreSQL run store: several hosts on one database.
//!
//! The same records, checksums and rows as the SQLite store ([`crate::rows`]), in a
//! schema of their own ([`schema`]). What SQLite gets from owning the file, this store
//! gets from the database, per run: a lease row with an owner epoch and an expiry on the
//! store's clock ([`crate::fleet`]), checked by every append in the append's own
//! transaction, so a host that lost a run (paused, partitioned, slow) never writes
//! another record of it.
//!
//! Every batch commits durably (`synchronous_commit` stays on), synced or not: with an
//! asynchronous commit the server acknowledges a batch it may lose in a crash of its own
//! (`pg_ctl -m immediate`), and the writer, already numbering past it, would leave a
//! hole. The `sync` flag only says whether the caller waits.
//!
//! Calls are synchronous, as the [`RunStore`] trait is; they run on a runtime the store
//! owns ([`bridge`]). Each call is bounded by the store's operation timeout: a
//! connection that does not answer in time (a partition, a black hole) is dropped from
//! the pool and the call fails with [`StoreError::Unavailable`], never reports anything
//! written. An append that failed so may have committed all the same (the answer was
//! lost, not the request): appending the same records again finds them there and
//! succeeds, so the log writer's retry neither loses nor duplicates a record.

mod bridge;
mod fleet;
mod listen;
pub(crate) mod schema;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::GenericClient;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::error::SqlState;

use crate::artifacts::{self, ArtifactError, ArtifactPolicy, ArtifactRef};
use crate::clock::now_ms;
use crate::codec::Form;
use crate::header::HeaderRow;
use crate::rows::{self, RawRow};
use crate::sqlite::new_run_id;
use crate::{
    Frames, LogRead, NewRun, RunHeader, RunStore, RunSummary, StoreError, Stored, fault, lease,
};

pub use fleet::LostLease;

/// How a PostgreSQL store is opened, besides its URL.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// The schema holding Heddle's tables (a lower-case identifier).
    pub schema: String,
    /// This process's host id in the fleet: who a lease names. `None`: a fresh id per
    /// handle (`HOSTNAME-PID-RANDOM`), right for a command line; a server passes its
    /// configured id so operators see it.
    pub host_id: Option<String>,
    /// How long a lease lasts without renewal (store clock). Renewed every third of it.
    pub lease_ttl: Duration,
    /// How long one store call may wait for the database before it fails as
    /// [`StoreError::Unavailable`] (a partition shows as this). Also how long the server
    /// keeps a transaction of this store's whose client went silent.
    pub op_timeout: Duration,
    /// How long opening a connection may take.
    pub connect_timeout: Duration,
    /// Connections in the pool.
    pub pool_size: usize,
    /// Renew the leases this handle holds (and its host registration) every third of
    /// the TTL on the store's own runtime. Off only for tests that renew by hand.
    pub keep_leases: bool,
}

impl Default for PgOptions {
    fn default() -> PgOptions {
        PgOptions {
            schema: "heddle".into(),
            host_id: None,
            lease_ttl: lease::TTL,
            op_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            pool_size: 16,
            keep_leases: true,
        }
    }
}

/// Why the store could not be opened at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectFailure {
    /// Nothing listens there (connection refused), or the host is unknown/unreachable.
    Unreachable,
    /// No answer within the connect timeout.
    Timeout,
    /// The server refused the user or the password.
    Authentication,
    /// The database named in the URL does not exist.
    NoDatabase,
    /// The server is starting, shutting down or out of connections.
    NotAccepting,
    /// Any other refusal by the server (its message is the source).
    Refused,
}

impl std::fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConnectFailure::Unreachable => "no PostgreSQL server answers at that address",
            ConnectFailure::Timeout => "the server did not answer in time",
            ConnectFailure::Authentication => "the server refused the user or password",
            ConnectFailure::NoDatabase => "the database does not exist",
            ConnectFailure::NotAccepting => "the server does not accept connections now",
            ConnectFailure::Refused => "the server refused the connection",
        })
    }
}

/// A run store on PostgreSQL.
pub struct PgStore {
    inner: Arc<Inner>,
    bridge: bridge::Bridge,
}

pub(crate) struct Inner {
    pool: Pool,
    /// The connection settings (the listener opens its own connection with them).
    config: tokio_postgres::Config,
    /// The server, database and schema, for errors and reports (no password).
    target: String,
    schema: String,
    host_id: String,
    /// This machine and process, as the leases it takes name them.
    hostname: String,
    pid: i64,
    ttl: Duration,
    op_timeout: Duration,
    /// The runs this handle holds, by the epoch it acquired or claimed.
    held: Mutex<HashMap<String, u64>>,
    /// Leases the keeper found lost since the last [`PgStore::take_lost`].
    lost: Mutex<Vec<LostLease>>,
    /// What renewals saw of the database lately: why a lease expired.
    renewals: Mutex<fleet::Renewals>,
    /// This handle's host registration (its incarnation), once registered.
    registration: Mutex<Option<String>>,
    hub: crate::fleet::Hub,
    listening: std::sync::atomic::AtomicBool,
}

/// Maps a driver error: a connection problem (no answer from the server, a dropped
/// connection, a server going down) is [`StoreError::Unavailable`] (its target filled
/// in by [`Inner::settle`]); anything the server refused is [`StoreError::Pg`].
pub(crate) struct Pg;

impl Pg {
    pub(crate) fn op(op: &'static str) -> impl FnOnce(tokio_postgres::Error) -> StoreError {
        move |source| {
            if is_unavailable(&source) {
                StoreError::Unavailable {
                    target: String::new(),
                    op,
                    source: Box::new(source),
                }
            } else {
                StoreError::Pg { op, source }
            }
        }
    }
}

/// Whether `e` says the database could not be reached (or went away), rather than that
/// it refused the statement.
pub(crate) fn is_unavailable(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        // No answer from a server at all: I/O, a closed connection, a timeout. (A
        // parameter or column of the wrong type has no code either, and is a bug, not
        // an outage: the driver's error kinds are private, so its words tell them apart.)
        None => {
            let io = std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>());
            let text = e.to_string();
            io || e.is_closed()
                || [
                    "error communicating",
                    "error connecting",
                    "timeout",
                    "unexpected message",
                ]
                .iter()
                .any(|p| text.starts_with(p))
        }
        Some(c) => {
            let c = c.code();
            c.starts_with("08") // connection exception
                || matches!(
                    c,
                    "57P01" | "57P02" | "57P03" // admin/crash shutdown, cannot connect now
                        | "53300" // too many connections
                        | "40001" | "40P01" // serialization failure, deadlock: retry
                )
        }
    }
}

/// The SQLSTATE of a refusal raised by `append_events` (schema.rs), with its DETAIL.
fn refusal(e: &StoreError) -> Option<(&str, &str)> {
    let StoreError::Pg { source, .. } = e else {
        return None;
    };
    let db = source.as_db_error()?;
    Some((db.code().code(), db.detail().unwrap_or("")))
}

/// Runs `$body` (an async block's contents returning `Result<_, StoreError>`, with `$c`
/// a pooled connection) bounded by the operation timeout, and settles the connection
/// ([`Inner::settle`]).
macro_rules! on_conn {
    ($inner:expr, $op:expr, |$c:ident| $body:block) => {{
        let inner: &Inner = &$inner;
        let op: &'static str = $op;
        let mut obj = inner.client(op).await?;
        let r = {
            let $c: &mut deadpool_postgres::Object = &mut obj;
            tokio::time::timeout(inner.op_timeout, async { $body }).await
        };
        inner.settle(op, obj, r)
    }};
}
pub(crate) use on_conn;

impl Inner {
    async fn client(&self, op: &'static str) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(|e| self.pool_error(op, e))
    }

    fn pool_error(&self, op: &'static str, e: deadpool_postgres::PoolError) -> StoreError {
        use deadpool_postgres::PoolError as P;
        match e {
            P::Backend(e) => Pg::op(op)(e).targeted(&self.target),
            e => StoreError::Unavailable {
                target: self.target.clone(),
                op,
                source: Box::new(e),
            },
        }
    }

    /// The end of a call on `obj`: a call that timed out, or whose connection failed,
    /// leaves the connection in an unknown state (a request may be in flight), so it is
    /// taken out of the pool and dropped instead of being handed to the next caller.
    fn settle<T>(
        &self,
        op: &'static str,
        obj: Object,
        r: Result<Result<T, StoreError>, tokio::time::error::Elapsed>,
    ) -> Result<T, StoreError> {
        match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                if e.is_transient() {
                    drop(Object::take(obj));
                }
                Err(e.targeted(&self.target))
            }
            Err(_) => {
                drop(Object::take(obj));
                Err(StoreError::Unavailable {
                    target: self.target.clone(),
                    op,
                    source: format!("no answer within {:?}", self.op_timeout).into(),
                })
            }
        }
    }

    fn ttl_ms(&self) -> i64 {
        self.ttl.as_millis() as i64
    }

    fn channel(&self, what: &str) -> String {
        format!("{}_{what}", self.schema)
    }

    fn renewals(&self) -> std::sync::MutexGuard<'_, fleet::Renewals> {
        self.renewals.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn held_epoch(&self, run: &str) -> Option<u64> {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(run)
            .copied()
    }

    fn hold(&self, run: &str, epoch: u64) {
        self.renewals().forget(run);
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(run.to_string(), epoch);
    }

    /// The refusal of a run whose live lease another host holds (a lease of a process
    /// of this machine that died binds nobody: it cannot renew or write).
    fn owned_elsewhere(&self, run: &str, l: &LeaseNow) -> Option<StoreError> {
        (l.binds() && l.host.as_deref() != Some(&self.host_id)).then(|| StoreError::RunOwned {
            run: run.to_string(),
            host: l.host.clone().unwrap_or_default(),
            epoch: l.epoch,
            left_ms: l.left_ms,
        })
    }

    /// The write rule for what is not an append (artifacts), inside `tx` with the run's
    /// lease row locked: a handle that holds the run writes only under its epoch and
    /// while the lease lasts; any other only while no live lease of another host binds.
    async fn fence_write(
        &self,
        tx: &impl GenericClient,
        run: &str,
        op: &'static str,
    ) -> Result<(), StoreError> {
        let l = lease_now(tx, run, true, op).await?;
        match self.held_epoch(run) {
            Some(ours) if ours != l.epoch => Err(StoreError::Fenced {
                run: run.to_string(),
                ours,
                current: l.epoch,
            }),
            Some(ours) if !l.live => Err(StoreError::RunLeaseLost {
                run: run.to_string(),
                epoch: ours,
                why: self.renewals().why_expired(run),
            }),
            Some(_) => Ok(()),
            None => self.owned_elsewhere(run, &l).map_or(Ok(()), Err),
        }
    }
}

/// A run's lease row as the store's clock sees it now.
pub(crate) struct LeaseNow {
    pub(crate) state: String,
    pub(crate) host: Option<String>,
    pub(crate) epoch: u64,
    /// Running and not expired.
    pub(crate) live: bool,
    /// Milliseconds left (0: expired or none).
    pub(crate) left_ms: u64,
    /// The machine and process holding it (schema 4; none for a lease taken before).
    pub(crate) hostname: Option<String>,
    pub(crate) pid: Option<u32>,
}

impl LeaseNow {
    /// Whether the lease keeps others out: live, and not held by a process of this
    /// machine that no longer exists (it can neither renew nor write, so nobody waits
    /// it out: a resume right after a crash goes ahead).
    pub(crate) fn binds(&self) -> bool {
        let dead_here = match (&self.hostname, self.pid) {
            (Some(h), Some(pid)) => *h == lease::host_name() && !crate::status::pid_alive(pid),
            _ => false,
        };
        self.live && !dead_here
    }
}

/// Reads `run`'s lease row (locking it, with `lock`, for the rest of the transaction).
pub(crate) async fn lease_now(
    c: &impl GenericClient,
    run: &str,
    lock: bool,
    op: &'static str,
) -> Result<LeaseNow, StoreError> {
    const SQL: &str = "SELECT state, owner_host, owner_epoch, coalesce(expires_at > now(), false),
               coalesce(greatest(0, extract(epoch FROM expires_at - now()) * 1000), 0)::bigint,
               owner_hostname, owner_pid
        FROM leases WHERE run_id = $1";
    let row = if lock {
        c.query_opt(&format!("{SQL} FOR UPDATE"), &[&run]).await
    } else {
        c.query_opt(SQL, &[&run]).await
    }
    .map_err(Pg::op(op))?
    .ok_or_else(|| StoreError::UnknownRun(run.to_string()))?;
    let state: String = row.get(0);
    Ok(LeaseNow {
        live: state == "running" && row.get::<_, bool>(3),
        state,
        host: row.get(1),
        epoch: row.get::<_, i64>(2) as u64,
        left_ms: row.get::<_, i64>(4) as u64,
        hostname: row.get(5),
        pid: row.get::<_, Option<i64>>(6).map(|p| p as u32),
    })
}

impl StoreError {
    /// Fills in where an [`StoreError::Unavailable`] made below the store was headed.
    fn targeted(self, target: &str) -> StoreError {
        match self {
            StoreError::Unavailable {
                target: t,
                op,
                source,
            } if t.is_empty() => StoreError::Unavailable {
                target: target.to_string(),
                op,
                source,
            },
            e => e,
        }
    }
}

/// A row of `SELECT seq, at_ms, kind, json, body, crc`, as [`rows::check_raw`] takes it.
fn raw(row: &tokio_postgres::Row) -> RawRow<'_> {
    let json = row.try_get::<_, bool>(3).ok();
    RawRow {
        seq: row.try_get(0).ok(),
        at_ms: row.try_get(1).ok(),
        kind: row.try_get::<_, &str>(2).ok().map(str::as_bytes),
        body: json.and_then(|j| {
            let form = if j { Form::Json } else { Form::Binary };
            row.try_get::<_, &[u8]>(4).ok().map(|b| (form, b))
        }),
        crc: row.try_get(5).ok(),
    }
}

const EVENT_COLUMNS: &str = "seq, at_ms, kind, json, body, crc";

/// The append (schema 1's `append_events`): fencing, numbering and the rows.
const APPEND: &str = "SELECT append_events($1, $2, $3, $4, $5, $6, $7, $8)";

/// [`APPEND`]'s arguments: `run`'s rows of a layout, under `epoch`, from `first`.
struct Columns<'a> {
    run: &'a str,
    epoch: i64,
    first: i64,
    seqs: Vec<i64>,
    kinds: Vec<&'a str>,
    json: Vec<bool>,
    bodies: Vec<&'a [u8]>,
    crcs: Vec<i64>,
}

impl<'a> Columns<'a> {
    fn new(run: &'a str, epoch: u64, first: u64, layout: &'a rows::Layout) -> Columns<'a> {
        Columns {
            run,
            epoch: epoch as i64,
            first: first as i64,
            seqs: layout.rows.iter().map(|r| r.seq as i64).collect(),
            kinds: layout.rows.iter().map(|r| r.kind).collect(),
            json: layout.rows.iter().map(|r| r.form == Form::Json).collect(),
            bodies: layout
                .rows
                .iter()
                .map(|r| &layout.buf[r.body.clone()])
                .collect(),
            crcs: layout.rows.iter().map(|r| i64::from(r.crc)).collect(),
        }
    }

    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 8] {
        [
            &self.run,
            &self.epoch,
            &self.first,
            &self.seqs,
            &self.kinds,
            &self.json,
            &self.bodies,
            &self.crcs,
        ]
    }
}

/// What one take-over transaction did ([`Inner::take_over`]).
enum Taken {
    /// The run is this handle's at this epoch, its opening records in the log.
    At(u64),
    /// Nothing: the owner epoch was this, not the one before the records' epoch.
    Moved(u64),
}

/// How long a take-over is tried again while the database is out of reach (as long as a
/// run log retries a batch).
const TAKE_OVER_RETRY: Duration = Duration::from_secs(30);

/// The lifecycle kinds ([`crate::status::LIFECYCLE`]) as the partial index of schema 1
/// spells them, so the planner uses it (a test checks both).
const LIFECYCLE_WHERE: &str = "kind IN ('opened', 'paused', 'resumed', 'finished')";

/// `url` with its password (if any) masked, for errors.
pub(crate) fn masked(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (auth, host) = match rest.rsplit_once('@') {
        Some(parts) => parts,
        None => return url.to_string(),
    };
    match auth.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

/// `host:port/db` of a parsed config, for errors and reports.
fn describe(config: &tokio_postgres::Config, schema: &str) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or("postgres");
    format!("postgres://{host}:{port}/{db} (schema {schema})")
}

/// What the first connection's failure says about the URL.
fn connect_failure(target: &str, e: deadpool_postgres::PoolError) -> StoreError {
    use deadpool_postgres::PoolError as P;
    let (why, source): (ConnectFailure, Box<dyn std::error::Error + Send + Sync>) = match e {
        P::Timeout(_) => (ConnectFailure::Timeout, Box::new(e)),
        P::Backend(e) => {
            let why = match e.code() {
                Some(c) if *c == SqlState::INVALID_PASSWORD => ConnectFailure::Authentication,
                Some(c) if *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION => {
                    ConnectFailure::Authentication
                }
                Some(c) if *c == SqlState::INVALID_CATALOG_NAME => ConnectFailure::NoDatabase,
                Some(c) if c.code().starts_with("57P") || c.code() == "53300" => {
                    ConnectFailure::NotAccepting
                }
                Some(_) => ConnectFailure::Refused,
                None if e.to_string().contains("timeout") => ConnectFailure::Timeout,
                None if e.to_string().contains("authentication") => ConnectFailure::Authentication,
                None => ConnectFailure::Unreachable,
            };
            (why, Box::new(e))
        }
        e => (ConnectFailure::Unreachable, Box::new(e)),
    };
    StoreError::Connect {
        target: target.to_string(),
        why,
        source,
    }
}

/// This machine's name, the process and 16 random bits: a host id no other live process
/// is likely to hold.
fn default_host_id() -> String {
    let run_like = new_run_id(now_ms());
    let random = run_like.rsplit('-').next().unwrap_or("0000");
    format!("{}-{}-{random}", lease::host_name(), std::process::id())
}

/// A handle that goes away hands back what it holds (its runs' leases, its host
/// registration): a command line that paused or ended a run, or a host shut down, leaves
/// nothing for others to wait out. A process that dies without this (killed, aborted)
/// leaves its leases to expire, and fencing keeps it from writing meanwhile.
impl Drop for PgStore {
    fn drop(&mut self) {
        let holds = !self
            .inner
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
            || self.inner.incarnation().is_some();
        if holds {
            // Best effort: leases not handed back (the database unreachable now) expire
            // on their own, and nothing is lost either way.
            let _ = crate::Fleet::deregister(self, false);
        }
    }
}

impl PgStore {
    /// Opens the store at `url` (`postgres://user[:password]@host[:port]/database`) with
    /// the default options.
    pub fn open(url: &str) -> Result<PgStore, StoreError> {
        PgStore::open_with(url, PgOptions::default())
    }

    /// Opens the store at `url`: connects, checks what the schema holds (a schema of
    /// another application's tables, or one from a newer heddle, is refused before
    /// anything is written) and migrates an older or new one.
    pub fn open_with(url: &str, opts: PgOptions) -> Result<PgStore, StoreError> {
        let bad = |detail: String| StoreError::BadUrl {
            url: masked(url),
            detail,
        };
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(bad(
                "it does not begin with postgres:// or postgresql://".into()
            ));
        }
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e: tokio_postgres::Error| bad(e.to_string()))?;
        if config.get_hosts().is_empty() {
            return Err(bad("it names no host".into()));
        }
        if config.get_ssl_mode() == SslMode::Require {
            return Err(bad(
                "sslmode=require: this heddle connects without TLS (use a private network or a local proxy)"
                    .into(),
            ));
        }
        if !schema::valid_schema(&opts.schema) {
            return Err(bad(format!(
                "schema `{}` is not a plain lower-case identifier",
                opts.schema
            )));
        }
        let host_id = opts.host_id.clone().unwrap_or_else(default_host_id);
        if host_id.is_empty() || host_id.len() > 200 || host_id.chars().any(char::is_whitespace) {
            return Err(bad(format!(
                "host id `{host_id}` is empty, too long or has spaces"
            )));
        }
        let target = describe(&config, &opts.schema);
        // Heddle's tables are found in its schema alone (no other application's table of
        // the same name is ever read), on every connection, at no extra round trip. And a
        // transaction whose client went silent for longer than a call may last is ended
        // by the server: this client gave up on it already, and a partitioned host's open
        // transaction would otherwise hold its run's lease row locked for as long as the
        // connection looks open (hours), where claims skip it and nobody adopts the run.
        let session = format!(
            "-c search_path={} -c idle_in_transaction_session_timeout={}",
            opts.schema,
            opts.op_timeout.as_millis().max(1)
        );
        let options = match config.get_options() {
            Some(o) if !o.is_empty() => format!("{o} {session}"),
            _ => session,
        };
        config
            .options(options)
            .application_name("heddle")
            .connect_timeout(opts.connect_timeout)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(5))
            .tcp_user_timeout(opts.op_timeout);
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(opts.pool_size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(opts.op_timeout))
            .create_timeout(Some(opts.connect_timeout))
            .recycle_timeout(Some(opts.op_timeout))
            .build()
            .map_err(|e| bad(e.to_string()))?;
        let bridge = bridge::Bridge::new().map_err(|e| StoreError::Connect {
            target: target.clone(),
            why: ConnectFailure::Refused,
            source: Box::new(e),
        })?;
        let inner = Arc::new(Inner {
            pool,
            config,
            target: target.clone(),
            schema: opts.schema.clone(),
            host_id,
            hostname: lease::host_name(),
            pid: i64::from(std::process::id()),
            ttl: opts.lease_ttl,
            op_timeout: opts.op_timeout,
            held: Mutex::new(HashMap::new()),
            lost: Mutex::new(Vec::new()),
            renewals: Mutex::new(fleet::Renewals::default()),
            registration: Mutex::new(None),
            hub: crate::fleet::Hub::new(),
            listening: std::sync::atomic::AtomicBool::new(false),
        });
        {
            let inner = inner.clone();
            bridge.run(async move {
                let mut obj = inner
                    .pool
                    .get()
                    .await
                    .map_err(|e| connect_failure(&inner.target, e))?;
                let r = tokio::time::timeout(
                    inner.op_timeout,
                    schema::prepare(&mut obj, &inner.schema, &inner.target),
                )
                .await;
                inner.settle("preparing the run store", obj, r)
            })?;
        }
        if opts.keep_leases {
            fleet::keep(bridge.handle(), Arc::downgrade(&inner));
        }
        Ok(PgStore { inner, bridge })
    }

    /// Where the store is (server, database, schema; never a password).
    pub fn target(&self) -> &str {
        &self.inner.target
    }

    /// Runs `f`'s future on the store's runtime and waits for it.
    fn call<T, F>(&self, f: impl FnOnce(Arc<Inner>) -> F) -> T
    where
        T: Send + 'static,
        F: std::future::Future<Output = T> + Send + 'static,
    {
        self.bridge.run(f(self.inner.clone()))
    }
}

/// The [`HeaderRow`] in `row`'s columns from `at` on ([`crate::header::COLUMNS`]).
pub(crate) fn header_row(row: &tokio_postgres::Row, at: usize) -> HeaderRow {
    HeaderRow {
        created_ms: row.get::<_, i64>(at) as u64,
        graph_name: row.get(at + 1),
        graph_bytes: row.get(at + 2),
        graph_sha256: row.get(at + 3),
        plan: row.get(at + 4),
        inputs: row.get(at + 5),
        secrets: row.get(at + 6),
        packages: row.get(at + 7),
        limits: row.get(at + 8),
    }
}

/// The statement recording a new run's header row; its parameters are [`run_params`].
const INSERT_RUN: &str = "INSERT INTO runs (run_id, created_ms, graph_name, graph_bytes,
        graph_sha256, plan, inputs, secrets, packages, limits, header_sums)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";

/// [`INSERT_RUN`]'s parameters: run `run_id`'s header `row`, created at `created` (ms),
/// with its checksums `sums`.
fn run_params<'a>(
    run_id: &'a String,
    created: &'a i64,
    row: &'a HeaderRow,
    sums: &'a String,
) -> [&'a (dyn tokio_postgres::types::ToSql + Sync); 11] {
    [
        run_id,
        created,
        &row.graph_name,
        &row.graph_bytes,
        &row.graph_sha256,
        &row.plan,
        &row.inputs,
        &row.secrets,
        &row.packages,
        &row.limits,
        sums,
    ]
}

impl Inner {
    async fn create_run(self: Arc<Self>, run: NewRun) -> Result<RunHeader, StoreError> {
        const OP: &str = "recording a new run";
        let created_ms = now_ms();
        let row = HeaderRow::new(&run, created_ms);
        let created = created_ms as i64;
        // Run ids carry 16 random bits per millisecond; hosts creating runs in the same
        // millisecond may draw the same id, and then draw again.
        let mut attempt = 0;
        let run_id = loop {
            let run_id = new_run_id(created_ms);
            let sums = row.sums(&run_id);
            let r = on_conn!(self, OP, |c| {
                c.execute(
                    &format!(
                        "WITH r AS ({INSERT_RUN} RETURNING run_id)
                         INSERT INTO leases (run_id) SELECT run_id FROM r"
                    ),
                    &run_params(&run_id, &created, &row, &sums),
                )
                .await
                .map_err(Pg::op(OP))
            });
            match r {
                Err(StoreError::Pg { source, .. })
                    if source.code() == Some(&SqlState::UNIQUE_VIOLATION) && attempt < 5 =>
                {
                    attempt += 1;
                }
                Err(e) => return Err(e),
                Ok(_) => break run_id,
            }
        };
        Ok(RunHeader {
            run_id,
            created_ms,
            graph_sha256: row.graph_sha256,
            run,
        })
    }

    /// [`RunStore::create_and_take`] under run id `run_id`: the run, its lease held by
    /// this host at epoch 1 and its opening records (laid out in `layout` for that id),
    /// in one transaction. `Ok(false)` when the id is taken (another host drew the same
    /// one in the same millisecond): nothing was written, draw again.
    async fn create_taken(
        self: Arc<Self>,
        run_id: String,
        row: HeaderRow,
        layout: rows::Layout,
    ) -> Result<bool, StoreError> {
        const OP: &str = "recording and taking a new run";
        let sums = row.sums(&run_id);
        let created = row.created_ms as i64;
        let columns = Columns::new(&run_id, 1, 0, &layout);
        let r = on_conn!(self, OP, |c| {
            let tx = c.transaction().await.map_err(Pg::op(OP))?;
            tx.execute(INSERT_RUN, &run_params(&run_id, &created, &row, &sums))
                .await
                .map_err(Pg::op(OP))?;
            // Its lease as a take-over leaves it: running here, at the first epoch.
            tx.execute(
                "INSERT INTO leases (run_id, state, owner_host, owner_epoch, expires_at,
                     owner_hostname, owner_pid)
                 VALUES ($1, 'running', $2, 1,
                     now() + $3::bigint * interval '1 millisecond', $4, $5)",
                &[
                    &run_id,
                    &self.host_id,
                    &self.ttl_ms(),
                    &self.hostname,
                    &self.pid,
                ],
            )
            .await
            .map_err(Pg::op(OP))?;
            if !layout.rows.is_empty() {
                tx.execute(APPEND, &columns.params())
                    .await
                    .map_err(Pg::op(OP))?;
            }
            tx.commit().await.map_err(Pg::op(OP))?;
            Ok(())
        });
        match r {
            Err(StoreError::Pg { source, .. })
                if source.code() == Some(&SqlState::UNIQUE_VIOLATION) =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
            Ok(()) => {
                self.hold(&run_id, 1);
                Ok(true)
            }
        }
    }

    async fn header(self: Arc<Self>, run_id: String) -> Result<RunHeader, StoreError> {
        const OP: &str = "reading a run";
        let sql = format!(
            "SELECT {}, header_sums FROM runs WHERE run_id = $1",
            crate::header::COLUMNS
        );
        let row = on_conn!(self, OP, |c| {
            c.query_opt(sql.as_str(), &[&run_id])
                .await
                .map_err(Pg::op(OP))
        })?;
        let Some(r) = row else {
            return Err(StoreError::UnknownRun(run_id));
        };
        let sums: Option<String> = r.get(9);
        header_row(&r, 0).into_header(&run_id, sums.as_deref())
    }

    async fn list(self: Arc<Self>) -> Result<Vec<RunSummary>, StoreError> {
        const OP: &str = "listing runs";
        let rows = on_conn!(self, OP, |c| {
            c.query(
                "SELECT r.run_id, r.created_ms, r.graph_name,
                        coalesce((SELECT max(seq) + 1 FROM events e WHERE e.run_id = r.run_id), 0)
                 FROM runs r ORDER BY r.created_ms, r.run_id",
                &[],
            )
            .await
            .map_err(Pg::op(OP))
        })?;
        Ok(rows
            .iter()
            .map(|r| RunSummary {
                run_id: r.get(0),
                created_ms: r.get::<_, i64>(1) as u64,
                graph_name: r.get(2),
                records: r.get::<_, i64>(3) as u64,
            })
            .collect())
    }

    async fn acquire(self: Arc<Self>, run_id: String) -> Result<u64, StoreError> {
        const OP: &str = "taking over a run";
        let epoch = on_conn!(self, OP, |c| {
            let tx = c.transaction().await.map_err(Pg::op(OP))?;
            let l = lease_now(&tx, &run_id, true, OP).await?;
            if let Some(e) = self.owned_elsewhere(&run_id, &l) {
                return Err(e);
            }
            drop_torn_tail(&tx, &run_id).await?;
            let epoch: i64 = tx
                .query_one(
                    "UPDATE leases SET state = 'running', owner_host = $2,
                         owner_epoch = owner_epoch + 1,
                         expires_at = now() + $3::bigint * interval '1 millisecond',
                         owner_hostname = $4, owner_pid = $5
                     WHERE run_id = $1 RETURNING owner_epoch",
                    &[
                        &run_id,
                        &self.host_id,
                        &self.ttl_ms(),
                        &self.hostname,
                        &self.pid,
                    ],
                )
                .await
                .map_err(Pg::op(OP))?
                .get(0);
            tx.commit().await.map_err(Pg::op(OP))?;
            Ok(epoch as u64)
        })?;
        self.hold(&run_id, epoch);
        Ok(epoch)
    }

    async fn append(
        self: Arc<Self>,
        run: String,
        epoch: u64,
        first: u64,
        layout: rows::Layout,
        crash: Option<String>,
    ) -> Result<(), StoreError> {
        const OP: &str = "appending to a run's log";
        let columns = Columns::new(&run, epoch, first, &layout);
        let r = on_conn!(self, OP, |c| {
            let stmt = c.prepare_cached(APPEND).await.map_err(Pg::op(OP))?;
            let params = columns.params();
            if let Some(node) = &crash {
                // The `mid-commit` fault: the rows are in, the transaction is not
                // committed, and the process dies.
                let tx = c.transaction().await.map_err(Pg::op(OP))?;
                tx.execute(&stmt, &params).await.map_err(Pg::op(OP))?;
                fault::abort(fault::Boundary::MidCommit, node);
            }
            c.execute(&stmt, &params).await.map_err(Pg::op(OP))
        });
        let e = match r {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        match refusal(&e) {
            Some(("HDU01", _)) => Err(StoreError::UnknownRun(run)),
            Some(("HDF01", current)) => Err(StoreError::Fenced {
                current: current.parse().unwrap_or(0),
                run,
                ours: epoch,
            }),
            Some(("HDL01", _)) => Err(StoreError::RunLeaseLost {
                why: self.renewals().why_expired(&run),
                run,
                epoch,
            }),
            Some(("HDN01", next)) => {
                let next: u64 = next.parse().unwrap_or(0);
                // An earlier attempt of this very batch may have committed with its
                // answer lost: then the log ends with exactly these rows.
                let last = layout.rows.last().map_or(first, |r| r.seq);
                if next == last + 1 && self.clone().holds_rows(&run, &layout).await? {
                    return Ok(());
                }
                Err(StoreError::NotNext {
                    run,
                    seq: first,
                    next,
                })
            }
            _ => Err(e),
        }
    }

    /// The epoch `run`'s lease row holds now.
    async fn epoch(self: Arc<Self>, run: String) -> Result<u64, StoreError> {
        const OP: &str = "reading a run's owner epoch";
        on_conn!(self, OP, |c| {
            Ok(lease_now(&*c, &run, false, OP).await?.epoch)
        })
    }

    /// The transaction of [`RunStore::take_over`] for the new owner epoch `epoch`, with
    /// `layout` the opening records made for it: under the run's lease lock, a torn tail
    /// dropped, refused unless the log still ends before `next` (then nothing is
    /// written), and refused while another host's lease is live; then the lease is this
    /// host's at `epoch` and the records are appended, all committed together. An epoch
    /// that moved since it was read (an acquire that wrote nothing) is answered with the
    /// current one, nothing written, for the records to be made again. With `withdraw`
    /// (the records reopen a pause) the run's cancel requests go with it.
    async fn take_over(
        self: Arc<Self>,
        run: String,
        next: u64,
        epoch: u64,
        layout: rows::Layout,
        withdraw: bool,
    ) -> Result<Taken, StoreError> {
        const OP: &str = "taking over a run";
        let columns = Columns::new(&run, epoch, next, &layout);
        let taken = on_conn!(self, OP, |c| {
            let tx = c.transaction().await.map_err(Pg::op(OP))?;
            let l = lease_now(&tx, &run, true, OP).await?;
            drop_torn_tail(&tx, &run).await?;
            let found: i64 = tx
                .query_one(
                    "SELECT coalesce(max(seq) + 1, 0) FROM events WHERE run_id = $1",
                    &[&run],
                )
                .await
                .map_err(Pg::op(OP))?
                .get(0);
            if found as u64 != next {
                // This very take-over, committed by an earlier attempt whose answer was
                // lost: the lease is this host's at `epoch` and the log ends with
                // exactly its opening records.
                if l.epoch == epoch
                    && l.host.as_deref() == Some(&self.host_id)
                    && layout.rows.last().map(|r| r.seq + 1) == Some(found as u64)
                    && rows_match(&tx, &run, &layout).await?
                {
                    return Ok(Taken::At(epoch));
                }
                // Another taker's first records are there: it won. Rolled back on drop,
                // so neither the torn tail's removal nor anything else of this one lands.
                return Err(StoreError::NotNext {
                    run: run.clone(),
                    seq: next,
                    next: found as u64,
                });
            }
            if let Some(e) = self.owned_elsewhere(&run, &l) {
                return Err(e);
            }
            if l.epoch + 1 != epoch {
                return Ok(Taken::Moved(l.epoch));
            }
            tx.execute(
                "UPDATE leases SET state = 'running', owner_host = $2, owner_epoch = $3,
                     expires_at = now() + $4::bigint * interval '1 millisecond',
                     owner_hostname = $5, owner_pid = $6
                 WHERE run_id = $1",
                &[
                    &run,
                    &self.host_id,
                    &(epoch as i64),
                    &self.ttl_ms(),
                    &self.hostname,
                    &self.pid,
                ],
            )
            .await
            .map_err(Pg::op(OP))?;
            if !layout.rows.is_empty() {
                tx.execute(APPEND, &columns.params())
                    .await
                    .map_err(Pg::op(OP))?;
            }
            if withdraw {
                tx.execute("DELETE FROM cancel_requests WHERE run_id = $1", &[&run])
                    .await
                    .map_err(Pg::op(OP))?;
            }
            tx.commit().await.map_err(Pg::op(OP))?;
            Ok(Taken::At(epoch))
        })?;
        if let Taken::At(epoch) = taken {
            self.hold(&run, epoch);
        }
        Ok(taken)
    }

    async fn request_cancel(self: Arc<Self>, run: String) -> Result<(), StoreError> {
        const OP: &str = "requesting a run's cancel";
        let pid = i64::from(std::process::id());
        let channel = self.channel("command");
        // The owner's host is woken at once (command 0 is a cancel request); a process
        // that does not listen finds the row when it next looks.
        let known: i64 = on_conn!(self, OP, |c| {
            Ok(c.query_one(
                "WITH r AS (SELECT run_id FROM runs WHERE run_id = $1),
                      i AS (INSERT INTO cancel_requests (run_id, host_id, pid)
                            SELECT run_id, $2, $3 FROM r
                            ON CONFLICT (run_id) DO NOTHING)
                 SELECT count(pg_notify($4, '0 ' || run_id)) FROM r",
                &[&run, &self.host_id, &pid, &channel],
            )
            .await
            .map_err(Pg::op(OP))?
            .get(0))
        })?;
        if known == 0 {
            return Err(StoreError::UnknownRun(run));
        }
        Ok(())
    }

    async fn cancel_requested(self: Arc<Self>, run: String) -> Result<bool, StoreError> {
        const OP: &str = "reading a run's cancel request";
        on_conn!(self, OP, |c| {
            Ok(c.query_one(
                "SELECT EXISTS (SELECT 1 FROM cancel_requests WHERE run_id = $1)",
                &[&run],
            )
            .await
            .map_err(Pg::op(OP))?
            .get(0))
        })
    }

    /// Whether `run`'s log holds exactly `layout`'s rows at their keys.
    async fn holds_rows(
        self: Arc<Self>,
        run: &str,
        layout: &rows::Layout,
    ) -> Result<bool, StoreError> {
        on_conn!(self, "checking an append that lost its answer", |c| {
            rows_match(&*c, run, layout).await
        })
    }

    async fn read(self: Arc<Self>, run_id: String, from: u64) -> Result<LogRead, StoreError> {
        const OP: &str = "reading a run's log";
        on_conn!(self, OP, |c| {
            let exists = c
                .query_opt("SELECT 1 FROM runs WHERE run_id = $1", &[&run_id])
                .await
                .map_err(Pg::op(OP))?;
            if exists.is_none() {
                return Err(StoreError::UnknownRun(run_id.clone()));
            }
            let stmt = c
                .prepare_cached(&format!(
                    "SELECT {EVENT_COLUMNS} FROM events WHERE run_id = $1 AND seq >= $2 ORDER BY seq"
                ))
                .await
                .map_err(Pg::op(OP))?;
            let rows = c
                .query(&stmt, &[&run_id, &(from as i64)])
                .await
                .map_err(Pg::op(OP))?;
            let mut reader = rows::LogReader::new(&run_id, from);
            for r in &rows {
                reader.row(raw(r))?;
            }
            Ok(reader.finish())
        })
    }

    async fn read_lifecycle(self: Arc<Self>, run_id: String) -> Result<Vec<Stored>, StoreError> {
        const OP: &str = "reading a run's lifecycle records";
        on_conn!(self, OP, |c| {
            let last: Option<i64> = c
                .query_opt(
                    "SELECT (SELECT max(seq) FROM events WHERE run_id = $1) FROM runs WHERE run_id = $1",
                    &[&run_id],
                )
                .await
                .map_err(Pg::op(OP))?
                .ok_or_else(|| StoreError::UnknownRun(run_id.clone()))?
                .get(0);
            let rows = c
                .query(
                    &format!(
                        "SELECT {EVENT_COLUMNS} FROM events
                         WHERE run_id = $1 AND {LIFECYCLE_WHERE} ORDER BY seq"
                    ),
                    &[&run_id],
                )
                .await
                .map_err(Pg::op(OP))?;
            let mut out = Vec::new();
            for r in &rows {
                rows::lifecycle_row(&run_id, raw(r), last, &mut out)?;
            }
            Ok(out)
        })
    }

    async fn put_artifact(
        self: Arc<Self>,
        run: String,
        name: Option<String>,
        bytes: Vec<u8>,
        sha256: String,
        policy: ArtifactPolicy,
    ) -> Result<ArtifactRef, ArtifactError> {
        const OP: &str = "storing an artifact";
        let size = bytes.len() as u64;
        on_conn!(self, OP, |c| {
            let tx = c.transaction().await.map_err(Pg::op(OP))?;
            self.fence_write(&tx, &run, OP).await?;
            let exists = tx
                .query_opt(
                    "SELECT 1 FROM artifacts WHERE run_id = $1 AND sha256 = $2",
                    &[&run, &sha256],
                )
                .await
                .map_err(Pg::op(OP))?;
            if exists.is_none() {
                let used: i64 = tx
                    .query_one(
                        "SELECT coalesce(sum(size), 0)::bigint FROM artifacts WHERE run_id = $1",
                        &[&run],
                    )
                    .await
                    .map_err(Pg::op(OP))?
                    .get(0);
                artifacts::within_quota(&run, used as u64, size, &policy)
                    .map_err(StoreError::from)?;
                tx.execute(
                    "INSERT INTO artifacts (run_id, sha256, size) VALUES ($1, $2, $3)",
                    &[&run, &sha256, &(size as i64)],
                )
                .await
                .map_err(Pg::op(OP))?;
                insert_pieces(&tx, &run, &sha256, &bytes)
                    .await
                    .map_err(Pg::op(OP))?;
            }
            if let Some(name) = &name {
                tx.execute(
                    "INSERT INTO artifact_names (run_id, name, sha256) VALUES ($1, $2, $3)
                     ON CONFLICT (run_id, name) DO UPDATE SET sha256 = excluded.sha256",
                    &[&run, name, &sha256],
                )
                .await
                .map_err(Pg::op("naming an artifact"))?;
            }
            tx.commit().await.map_err(Pg::op(OP))
        })
        .map_err(|e| match e {
            // The refusal itself (the quota), carried through the store's error.
            StoreError::Artifact(a) => *a,
            e => ArtifactError::Store(e),
        })?;
        Ok(ArtifactRef { sha256, size })
    }

    async fn drop_unreferenced_artifacts(
        self: Arc<Self>,
        run: String,
        referenced: Vec<String>,
    ) -> Result<u64, StoreError> {
        const OP: &str = "dropping unreferenced artifacts";
        on_conn!(self, OP, |c| {
            let tx = c.transaction().await.map_err(Pg::op(OP))?;
            self.fence_write(&tx, &run, OP).await?;
            let freed: i64 = tx
                .query_one(
                    "WITH d AS (
                        DELETE FROM artifacts a WHERE a.run_id = $1 AND NOT (a.sha256 = ANY($2))
                        AND NOT EXISTS (SELECT 1 FROM artifact_names n
                                        WHERE n.run_id = a.run_id AND n.sha256 = a.sha256)
                        RETURNING sha256, size),
                     p AS (
                        DELETE FROM artifact_pieces p USING d
                        WHERE p.run_id = $1 AND p.sha256 = d.sha256)
                     SELECT coalesce(sum(size), 0)::bigint FROM d",
                    &[&run, &referenced],
                )
                .await
                .map_err(Pg::op(OP))?
                .get(0);
            tx.commit().await.map_err(Pg::op(OP))?;
            Ok(freed as u64)
        })
    }

    async fn artifact_piece(
        self: Arc<Self>,
        run: String,
        sha256: String,
        n: u64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        const OP: &str = "reading an artifact";
        on_conn!(self, OP, |c| {
            Ok(c.query_opt(
                "SELECT bytes FROM artifact_pieces WHERE run_id = $1 AND sha256 = $2 AND n = $3",
                &[&run, &sha256, &(n as i64)],
            )
            .await
            .map_err(Pg::op(OP))?
            .map(|r| r.get(0)))
        })
    }

    /// The stored artifacts of `run` (only `sha256` with it), without their bytes:
    /// `octet_length` of a stored value reads its length, not its content.
    async fn stored_artifacts(
        self: Arc<Self>,
        run: String,
        sha256: Option<String>,
    ) -> Result<Vec<artifacts::StoredArtifact>, StoreError> {
        const OP: &str = "reading what artifacts are stored";
        let rows = on_conn!(self, OP, |c| {
            c.query(
                "SELECT a.sha256, a.size,
                        (SELECT coalesce(sum(octet_length(p.bytes)), 0)::bigint FROM artifact_pieces p
                         WHERE p.run_id = a.run_id AND p.sha256 = a.sha256)
                 FROM artifacts a WHERE a.run_id = $1 AND ($2::text IS NULL OR a.sha256 = $2)
                 ORDER BY a.sha256",
                &[&run, &sha256],
            )
            .await
            .map_err(Pg::op(OP))
        })?;
        Ok(rows
            .iter()
            .map(|r| artifacts::StoredArtifact {
                sha256: r.get(0),
                size: r.get::<_, i64>(1) as u64,
                stored: r.get::<_, i64>(2) as u64,
            })
            .collect())
    }

    async fn named_artifacts(
        self: Arc<Self>,
        run: String,
    ) -> Result<Vec<(String, ArtifactRef)>, StoreError> {
        const OP: &str = "reading artifact names";
        let rows = on_conn!(self, OP, |c| {
            c.query(
                "SELECT n.name, n.sha256, a.size FROM artifact_names n
                 LEFT JOIN artifacts a ON a.run_id = n.run_id AND a.sha256 = n.sha256
                 WHERE n.run_id = $1 ORDER BY n.name",
                &[&run],
            )
            .await
            .map_err(Pg::op(OP))
        })?;
        Ok(rows
            .iter()
            .map(|r| {
                (
                    r.get(0),
                    ArtifactRef {
                        sha256: r.get(1),
                        size: r.get::<_, Option<i64>>(2).unwrap_or(0) as u64,
                    },
                )
            })
            .collect())
    }
}

/// Whether `run`'s log holds exactly `layout`'s rows at their keys: a write whose
/// answer was lost finds its own rows this way, and succeeds without writing them twice.
async fn rows_match(
    c: &impl GenericClient,
    run: &str,
    layout: &rows::Layout,
) -> Result<bool, StoreError> {
    let (Some(a), Some(b)) = (layout.rows.first(), layout.rows.last()) else {
        return Ok(true);
    };
    let (a, b) = (a.seq as i64, b.seq as i64);
    let stored = c
        .query(
            "SELECT seq, kind, json, body, crc FROM events
             WHERE run_id = $1 AND seq >= $2 AND seq <= $3 ORDER BY seq",
            &[&run, &a, &b],
        )
        .await
        .map_err(Pg::op("checking a write that lost its answer"))?;
    Ok(stored.len() == layout.rows.len()
        && stored.iter().zip(&layout.rows).all(|(s, r)| {
            s.get::<_, i64>(0) == r.seq as i64
                && s.get::<_, &str>(1) == r.kind
                && s.get::<_, bool>(2) == (r.form == Form::Json)
                && s.get::<_, &[u8]>(3) == &layout.buf[r.body.clone()]
                && s.get::<_, i64>(4) == i64::from(r.crc)
        }))
}

/// Frees the sequence numbers of a torn tail for the next owner, as the SQLite store
/// does ([`rows::torn_repair`]). A PostgreSQL transaction is never torn by a crash, so
/// this only ever finds a row altered at the end of the log.
/// Stores `bytes` as the pieces of artifact `sha256` of `run`
/// ([`artifacts::PIECE_BYTES`] each, numbered from 0), in one statement.
pub(crate) async fn insert_pieces(
    client: &tokio_postgres::Transaction<'_>,
    run: &str,
    sha256: &str,
    bytes: &[u8],
) -> Result<u64, tokio_postgres::Error> {
    let pieces: Vec<&[u8]> = bytes.chunks(artifacts::PIECE_BYTES).collect();
    let numbers: Vec<i64> = (0..pieces.len() as i64).collect();
    client
        .execute(
            "INSERT INTO artifact_pieces (run_id, sha256, n, bytes)
             SELECT $1, $2, p.n, p.bytes FROM unnest($3::bigint[], $4::bytea[]) AS p (n, bytes)",
            &[&run, &sha256, &numbers, &pieces],
        )
        .await
}

async fn drop_torn_tail(tx: &impl GenericClient, run: &str) -> Result<(), StoreError> {
    const OP: &str = "dropping a torn record";
    let Some(row) = tx
        .query_opt(
            &format!(
                "SELECT {EVENT_COLUMNS} FROM events WHERE run_id = $1 ORDER BY seq DESC LIMIT 1"
            ),
            &[&run],
        )
        .await
        .map_err(Pg::op(OP))?
    else {
        return Ok(());
    };
    let checked = rows::check_raw(run, raw(&row), 0)?;
    let Some(repair) = rows::torn_repair(run, &checked) else {
        return Ok(());
    };
    tx.execute(
        "DELETE FROM events WHERE run_id = $1 AND seq = $2",
        &[&run, &(repair.key as i64)],
    )
    .await
    .map_err(Pg::op(OP))?;
    if let Some((last, body, crc, at_ms)) = repair.keep {
        tx.execute(
            "INSERT INTO events (run_id, seq, at_ms, kind, json, body, crc)
             VALUES ($1, $2, $3, $4, false, $5, $6)",
            &[
                &run,
                &(last as i64),
                &(at_ms as i64),
                &rows::PACKED,
                &body,
                &i64::from(crc),
            ],
        )
        .await
        .map_err(Pg::op(OP))?;
    }
    Ok(())
}

impl RunStore for PgStore {
    fn create_run(&self, run: &NewRun) -> Result<RunHeader, StoreError> {
        let run = run.clone();
        self.call(|i| i.create_run(run))
    }

    fn create_and_take(
        &self,
        run: &NewRun,
        opening: &dyn Fn(u64) -> Vec<heddle_core::Record>,
    ) -> Result<(RunHeader, u64), StoreError> {
        let created_ms = now_ms();
        let row = HeaderRow::new(run, created_ms);
        // The first owner's epoch, as a take-over of the new run would make it.
        let epoch = 1;
        let records = opening(epoch);
        // Run ids carry 16 random bits per millisecond (see `Inner::create_run`).
        for _ in 0..6 {
            let run_id = new_run_id(created_ms);
            // Each record's checksum covers the run id: laid out for this one.
            let mut layout = rows::Layout::default();
            rows::lay_out(&Frames::of(&run_id, 0, &records)?, &mut layout);
            let (id, r) = (run_id.clone(), row.clone());
            if self.call(|i| i.create_taken(id, r, layout))? {
                let header = RunHeader {
                    run_id,
                    created_ms,
                    graph_sha256: row.graph_sha256.clone(),
                    run: run.clone(),
                };
                return Ok((header, epoch));
            }
        }
        // Six draws taken in one millisecond: the default's two steps draw again.
        let header = self.create_run(run)?;
        let epoch = self.take_over(&header.run_id, 0, opening)?;
        Ok((header, epoch))
    }

    fn header(&self, run_id: &str) -> Result<RunHeader, StoreError> {
        let run_id = run_id.to_string();
        self.call(|i| i.header(run_id))
    }

    fn list(&self) -> Result<Vec<RunSummary>, StoreError> {
        self.call(|i| i.list())
    }

    fn acquire(&self, run_id: &str) -> Result<u64, StoreError> {
        let run_id = run_id.to_string();
        self.call(|i| i.acquire(run_id))
    }

    fn take_over(
        &self,
        run_id: &str,
        next: u64,
        opening: &dyn Fn(u64) -> Vec<heddle_core::Record>,
    ) -> Result<u64, StoreError> {
        // The opening records name the epoch they open, which is settled inside the
        // transaction, on the store's runtime, where `opening` cannot go. So they are
        // made here for the epoch after the current one, and the transaction takes the
        // run only at that epoch; one overtaken meanwhile by an acquire that wrote
        // nothing (a taker that wrote is refused by the log check) is made again.
        const TRIES: usize = 5;
        let run = run_id.to_string();
        let mut epoch = {
            let run = run.clone();
            self.call(|i| i.epoch(run))? + 1
        };
        let mut tries = 0;
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(10);
        while tries < TRIES {
            let mut layout = rows::Layout::default();
            let records = opening(epoch);
            rows::lay_out(&Frames::of(run_id, next, &records)?, &mut layout);
            let withdraw = crate::withdraws_cancel(&records);
            let run = run.clone();
            match self.call(|i| i.take_over(run, next, epoch, layout, withdraw)) {
                Ok(Taken::At(epoch)) => return Ok(epoch),
                Ok(Taken::Moved(current)) => {
                    epoch = current + 1;
                    tries += 1;
                }
                // The database out of reach, or the answer lost after it committed: tried
                // again with the same records, which recognises a commit of its own.
                Err(e) if e.is_transient() && started.elapsed() + pause < TAKE_OVER_RETRY => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Fenced {
            run,
            ours: epoch,
            current: epoch - 1,
        })
    }

    fn request_cancel(&self, run_id: &str) -> Result<(), StoreError> {
        let run = run_id.to_string();
        self.call(|i| i.request_cancel(run))
    }

    fn cancel_requested(&self, run_id: &str) -> Result<bool, StoreError> {
        let run = run_id.to_string();
        self.call(|i| i.cancel_requested(run))
    }

    fn liveness(&self, run_id: &str) -> Result<crate::status::Liveness, StoreError> {
        let run = run_id.to_string();
        let l = self.call(|i| async move {
            on_conn!(i, "reading a run's lease", |c| {
                lease_now(&*c, &run, false, "reading a run's lease").await
            })
        })?;
        Ok(crate::status::Liveness::Lease {
            holder: if l.binds() { l.host.clone() } else { None },
            queued: l.state == "queued",
            left_ms: l.left_ms,
        })
    }

    fn let_go(&self, run_id: &str, epoch: u64) -> Result<(), StoreError> {
        crate::Fleet::release(self, run_id, epoch, crate::fleet::GiveBack::Idle)
    }

    fn append_frames(&self, epoch: u64, frames: &Frames, _sync: bool) -> Result<(), StoreError> {
        if frames.is_empty() {
            return Ok(());
        }
        // Laid out here, on the calling thread, as the SQLite store does; the rows travel
        // to the store's runtime as one buffer.
        let mut layout = rows::Layout::default();
        rows::lay_out(frames, &mut layout);
        let run = frames.run().to_string();
        let first = frames.first();
        let crash = frames.crash().map(str::to_string);
        self.call(|i| i.append(run, epoch, first, layout, crash))
    }

    fn read(&self, run_id: &str, from: u64) -> Result<LogRead, StoreError> {
        let run_id = run_id.to_string();
        self.call(|i| i.read(run_id, from))
    }

    fn read_lifecycle(&self, run_id: &str) -> Result<Vec<Stored>, StoreError> {
        let run_id = run_id.to_string();
        self.call(|i| i.read_lifecycle(run_id))
    }

    fn put_artifact(
        &self,
        run_id: &str,
        name: Option<&str>,
        bytes: &[u8],
        policy: &ArtifactPolicy,
    ) -> Result<ArtifactRef, ArtifactError> {
        let sha256 = artifacts::admit(run_id, bytes, policy)?;
        let (run, name, bytes, policy) = (
            run_id.to_string(),
            name.map(str::to_string),
            bytes.to_vec(),
            policy.clone(),
        );
        self.call(|i| i.put_artifact(run, name, bytes, sha256, policy))
    }

    fn drop_unreferenced_artifacts(
        &self,
        run_id: &str,
        referenced: &crate::spill::Referenced,
    ) -> Result<u64, StoreError> {
        let run = run_id.to_string();
        let referenced = referenced.digests();
        self.call(|i| i.drop_unreferenced_artifacts(run, referenced))
    }

    fn named_artifacts(&self, run_id: &str) -> Result<Vec<(String, ArtifactRef)>, StoreError> {
        let run = run_id.to_string();
        self.call(|i| i.named_artifacts(run))
    }

    fn artifact_piece(
        &self,
        run_id: &str,
        sha256: &str,
        index: u64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let (run, sha256) = (run_id.to_string(), sha256.to_string());
        self.call(|i| i.artifact_piece(run, sha256, index))
    }

    fn stored_artifact(
        &self,
        run_id: &str,
        sha256: &str,
    ) -> Result<Option<artifacts::StoredArtifact>, StoreError> {
        let (run, sha256) = (run_id.to_string(), sha256.to_string());
        Ok(self.call(|i| i.stored_artifacts(run, Some(sha256)))?.pop())
    }

    fn stored_artifacts(&self, run_id: &str) -> Result<Vec<artifacts::StoredArtifact>, StoreError> {
        let run = run_id.to_string();
        self.call(|i| i.stored_artifacts(run, None))
    }
}

#[cfg(test)]
mod tests {
    /// The lifecycle kinds are spelled out in SQL (the partial index and the query that
    /// uses it): they must be exactly the ones a listing folds.
    #[test]
    fn the_sql_names_the_lifecycle_kinds() {
        let listed: Vec<String> = crate::status::LIFECYCLE
            .iter()
            .map(|k| format!("'{k}'"))
            .collect();
        assert_eq!(
            super::LIFECYCLE_WHERE,
            format!("kind IN ({})", listed.join(", "))
        );
        assert!(super::schema::MIGRATIONS[0].contains(super::LIFECYCLE_WHERE));
    }

    #[test]
    fn a_password_never_shows() {
        assert_eq!(
            super::masked("postgres://u:hunter2@h:5/db"),
            "postgres://u:***@h:5/db"
        );
        assert_eq!(super::masked("postgres://u@h/db"), "postgres://u@h/db");
        assert!(super::schema::valid_schema("heddle_2"));
        for bad in ["", "Heddle", "a b", "x;drop", "pg_catalog", "9x"] {
            assert!(!super::schema::valid_schema(bad), "{bad}");
        }
    }
}
