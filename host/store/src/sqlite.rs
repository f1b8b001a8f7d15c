//! The embedded store: one SQLite file in WAL mode.
//!
//! Synced appends commit with `synchronous=FULL` (the WAL is fsynced before the commit
//! returns). Unsynced appends commit with `NORMAL`: they are atomic and ordered, may be
//! lost to a power failure, and become durable with the next synced commit, because the
//! WAL is one sequential file. That is what lets retry-safe work be group-committed
//! while a non-retry-safe start pays exactly one synced write.

use std::hash::{BuildHasher as _, Hasher as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension as _, TransactionBehavior, params};

use crate::clock::now_ms;
use crate::header::HeaderRow;
use crate::{
    Frames, LogRead, NewRun, RunHeader, RunStore, RunSummary, StoreError, Stored, codec, fault,
    lease, rows, schema,
};

pub struct SqliteStore {
    path: PathBuf,
    conn: Mutex<Conn>,
    /// A connection of its own for reading (runs' logs, headers and list, artifacts),
    /// opened on the first read. In WAL mode it reads while `conn` writes, so no reader
    /// holds up a run's log writer: an
    /// event feed following a busy run reads and decodes thousands of records at a
    /// time, at the server's lower priority, and holding the writer's connection for
    /// that stalled the run's commits for as long as the reader waited for a core.
    reader: Mutex<Option<Connection>>,
    /// The owner-lease epoch this handle holds (0: none); see [`crate::lease`].
    lease_epoch: AtomicU64,
    /// What opening the file changed in it (an older schema brought up to date).
    upgrade: Option<schema::Upgrade>,
    /// The one host's queue and commands ([`crate::fleet::Local`]).
    pub(crate) local: crate::fleet::Local,
    pub(crate) hub: crate::fleet::Hub,
    /// Callers of a grouped write ([`SqliteStore::grouped`]) waiting for the connection:
    /// while any wait, the one holding it leaves the group's transaction open for them
    /// instead of committing it alone.
    waiting: AtomicUsize,
    /// What the connection committed ([`crate::Commits`]), counted by its commit hook.
    counted: Arc<Counted>,
}

/// [`crate::Commits`] as the writing connection's commit hook counts them.
#[derive(Default)]
struct Counted {
    commits: AtomicU64,
    synced: AtomicU64,
    /// The connection's `synchronous` setting is FULL: a commit now waits for the disk.
    full: AtomicBool,
}

pub(crate) struct Conn {
    pub(crate) db: Connection,
    /// The `synchronous` setting last applied, so switching costs nothing when unchanged.
    synced: Option<bool>,
    /// The rows of the last append, kept so each batch reuses the buffer.
    layout: rows::Layout,
    /// The members of the group transaction open on `db` (none: no group is open), each
    /// waiting for its commit ([`SqliteStore::grouped`]).
    group: Vec<Arc<Member>>,
    counted: Arc<Counted>,
}

/// What became of a grouped write's transaction: committed, or why not (shared by every
/// member of the group).
type Outcome = Result<(), Arc<String>>;

/// A grouped write waiting for its group's commit.
#[derive(Default)]
struct Member {
    outcome: Mutex<Option<Outcome>>,
    ready: Condvar,
}

impl Member {
    fn set(&self, o: Outcome) {
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(o);
        self.ready.notify_all();
    }

    fn wait(&self) -> Outcome {
        let mut o = self.outcome.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(o) = o.take() {
                return o;
            }
            o = self.ready.wait(o).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Conn {
    /// Commits the group transaction open on the connection (synced: a group is only
    /// opened with `synchronous=FULL`) and tells its members; rolled back, and each
    /// member told why, when the commit fails.
    fn commit_group(&mut self) {
        if self.group.is_empty() {
            return;
        }
        let outcome = match self.db.execute_batch("COMMIT") {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = self.db.execute_batch("ROLLBACK");
                Err(Arc::new(e.to_string()))
            }
        };
        for m in self.group.drain(..) {
            m.set(outcome.clone());
        }
    }

    fn set_sync(&mut self, sync: bool) -> Result<(), StoreError> {
        if self.synced != Some(sync) {
            self.db
                .pragma_update(None, "synchronous", if sync { "FULL" } else { "NORMAL" })
                .map_err(StoreError::sql("setting durability"))?;
            self.synced = Some(sync);
            self.counted.full.store(sync, Ordering::Relaxed);
        }
        Ok(())
    }
}

impl SqliteStore {
    /// Opens (creating it and its directory if needed) the store at `path`. A corrupt
    /// or foreign file, or one written by a newer heddle, is refused before anything is
    /// written to it.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Dir {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let open = |source| StoreError::Open {
            path: path.to_path_buf(),
            source,
        };
        let mut db = Connection::open(path).map_err(open)?;
        db.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(open)?;
        let upgrade = schema::prepare(&mut db, path)?;
        db.pragma_update(None, "journal_mode", "WAL")
            .map_err(open)?;
        db.pragma_update(None, "synchronous", "FULL")
            .map_err(open)?;
        let counted = Arc::new(Counted {
            full: AtomicBool::new(true),
            ..Counted::default()
        });
        let hook = counted.clone();
        db.commit_hook(Some(move || {
            hook.commits.fetch_add(1, Ordering::Relaxed);
            if hook.full.load(Ordering::Relaxed) {
                hook.synced.fetch_add(1, Ordering::Relaxed);
            }
            // Never turns a commit into a rollback.
            false
        }));
        Ok(SqliteStore {
            path: path.to_path_buf(),
            conn: Mutex::new(Conn {
                db,
                synced: Some(true),
                layout: rows::Layout::default(),
                group: Vec::new(),
                counted: counted.clone(),
            }),
            reader: Mutex::new(None),
            lease_epoch: AtomicU64::new(0),
            upgrade,
            local: Default::default(),
            hub: crate::fleet::Hub::new(),
            waiting: AtomicUsize::new(0),
            counted,
        })
    }

    /// What opening the file changed in it: an older schema brought up to date (the
    /// caller says so to the user), `None` when it was current or new.
    pub fn upgrade(&self) -> Option<&schema::Upgrade> {
        self.upgrade.as_ref()
    }

    /// Runs `f` on the reading connection (see [`SqliteStore::reader`]), opening it first
    /// if needed.
    pub(crate) fn with_reader<R>(
        &self,
        f: impl FnOnce(&Connection) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        // Reading leaves nothing half-done: a poisoned lock is still usable.
        let mut reader = self.reader.lock().unwrap_or_else(|e| e.into_inner());
        if reader.is_none() {
            let open = |source| StoreError::Open {
                path: self.path.clone(),
                source,
            };
            let db = Connection::open(&self.path).map_err(open)?;
            db.busy_timeout(std::time::Duration::from_secs(10))
                .map_err(open)?;
            *reader = Some(db);
        }
        // Set just above.
        f(reader.as_ref().expect("an open reader"))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the connection (for the crate's other tables, e.g. artifacts).
    pub(crate) fn with_db<R>(&self, f: impl FnOnce(&Connection) -> R) -> R {
        f(&self.conn().db)
    }

    /// The connection, with no group transaction open on it (one that was is committed
    /// first: its members need not wait for the next grouped write).
    pub(crate) fn conn(&self) -> std::sync::MutexGuard<'_, Conn> {
        let mut c = self.conn_in_group();
        c.commit_group();
        c
    }

    /// The connection as it is, a group transaction possibly open on it.
    fn conn_in_group(&self) -> std::sync::MutexGuard<'_, Conn> {
        // A panic while holding the lock cannot leave SQLite half-written (transactions
        // roll back on drop), so a poisoned lock is still usable.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `op` as a synced write whose commit it shares with the grouped writes that
    /// queue for the connection meanwhile (group commit): each in a savepoint of one
    /// transaction, so one that fails is rolled back alone, and the last writer in line
    /// commits them all with one sync. Returns once its own write is on stable storage,
    /// exactly as a transaction of its own would; what it saves is the disk's sync per
    /// write (a few milliseconds here), which concurrent callers (runs created together,
    /// runs recording their endings) otherwise pay one after another.
    ///
    /// `op` runs inside the store-wide write rule ([`SqliteStore::check_write`]).
    fn grouped<T>(
        &self,
        what: &'static str,
        op: impl FnOnce(&Connection, &mut rows::Layout) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let mut guard = self.conn_in_group();
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        let c = &mut *guard;
        let done = Self::in_savepoint(c, what, |db, layout| {
            self.check_write(db)?;
            op(db, layout)
        });
        let member = match &done {
            Ok(_) => {
                let m = Arc::new(Member::default());
                c.group.push(m.clone());
                Some(m)
            }
            Err(_) => None,
        };
        // The last in line commits; whoever waits behind takes the group over (and the
        // connection's other users commit it before theirs: `conn`).
        if self.waiting.load(Ordering::SeqCst) == 0 {
            c.commit_group();
        }
        drop(guard);
        let value = done?;
        if let Some(m) = member {
            m.wait().map_err(|message| StoreError::GroupCommit {
                op: what,
                message: message.to_string(),
            })?;
        }
        Ok(value)
    }

    /// Runs `op` in a savepoint of the group transaction (opened first when none is):
    /// released when it succeeds, rolled back to when it fails.
    fn in_savepoint<T>(
        c: &mut Conn,
        what: &'static str,
        op: impl FnOnce(&Connection, &mut rows::Layout) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if c.group.is_empty() {
            c.set_sync(true)?;
            c.db.execute_batch("BEGIN IMMEDIATE")
                .map_err(StoreError::sql(what))?;
        }
        let alone = c.group.is_empty();
        let undo = |c: &mut Conn| {
            let _ = if alone {
                c.db.execute_batch("ROLLBACK")
            } else {
                c.db.execute_batch("ROLLBACK TO op; RELEASE op")
            };
        };
        if let Err(e) = c.db.execute_batch("SAVEPOINT op") {
            undo(c);
            return Err(StoreError::sql(what)(e));
        }
        match op(&c.db, &mut c.layout) {
            Ok(v) => match c.db.execute_batch("RELEASE op") {
                Ok(()) => Ok(v),
                Err(e) => {
                    undo(c);
                    Err(StoreError::sql(what)(e))
                }
            },
            Err(e) => {
                undo(c);
                Err(e)
            }
        }
    }

    /// What the store's writing connection has committed since it was opened.
    pub fn commits(&self) -> crate::Commits {
        crate::Commits {
            commits: self.counted.commits.load(Ordering::Relaxed),
            synced: self.counted.synced.load(Ordering::Relaxed),
        }
    }

    /// The store-wide write rule ([`lease::check_write`]) for this handle, inside a
    /// write transaction on `db`.
    pub(crate) fn check_write(&self, db: &Connection) -> Result<(), StoreError> {
        lease::check_write(db, &self.path, self.lease_epoch.load(Ordering::SeqCst))
    }

    /// The live owner of the store, if any (an expired lease, or one whose process on
    /// this host is gone, is none).
    pub fn owner(&self) -> Result<Option<lease::Owner>, StoreError> {
        lease::live_owner(&self.conn().db)
    }

    /// Makes this handle the store's single owner for `ttl`, answering requests at
    /// `api`. Refused with [`StoreError::Owned`] (naming the holder) while another
    /// owner's lease binds. From here on every write of this handle needs the lease.
    pub fn acquire_lease(&self, api: &str, ttl: Duration) -> Result<lease::Owner, StoreError> {
        let owner = lease::acquire(&mut self.conn().db, &self.path, api, ttl)?;
        self.lease_epoch.store(owner.epoch, Ordering::SeqCst);
        Ok(owner)
    }

    /// The heartbeat: extends the lease by `ttl` from now. Fails with
    /// [`StoreError::LeaseLost`] once the lease expired or another owner took it; the
    /// caller must stop (its writes are already refused).
    pub fn renew_lease(&self, ttl: Duration) -> Result<u64, StoreError> {
        let held = self.lease_epoch.load(Ordering::SeqCst);
        lease::renew(&mut self.conn().db, &self.path, held, ttl)
    }

    /// Gives the lease up (when still held); this handle writes like the command line
    /// afterwards.
    pub fn release_lease(&self) -> Result<(), StoreError> {
        let held = self.lease_epoch.swap(0, Ordering::SeqCst);
        lease::release(&self.conn().db, held)
    }
}

/// A run id: creation time (base 36, so ids sort by age) and 16 random bits.
pub(crate) fn new_run_id(created_ms: u64) -> String {
    let mut n = created_ms;
    let mut digits = Vec::new();
    while n > 0 {
        let d = (n % 36) as u8;
        digits.push(if d < 10 { b'0' + d } else { b'a' + d - 10 });
        n /= 36;
    }
    digits.reverse();
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish() as u16;
    format!(
        "{}-{random:04x}",
        String::from_utf8(digits).unwrap_or_default()
    )
}

/// Rows one INSERT statement writes: a statement per row costs a cursor, a seek from
/// the root and a reset each.
const ROWS_PER_INSERT: usize = 32;

/// Writes `frames` to their run's log, laid out in rows by [`rows::lay_out`] (in
/// `layout`, reused), in statements of up to [`ROWS_PER_INSERT`] rows.
fn insert_events(
    tx: &Connection,
    layout: &mut rows::Layout,
    frames: &Frames,
    at_ms: i64,
) -> Result<(), StoreError> {
    let sql_err = |source| StoreError::Sql {
        op: "appending to a run's log",
        source,
    };
    let run_id = frames.run();
    rows::lay_out(frames, layout);
    for chunk in layout.rows.chunks(ROWS_PER_INSERT) {
        let mut ins = tx
            .prepare_cached(&insert_sql(chunk.len()))
            .map_err(sql_err)?;
        for (i, row) in chunk.iter().enumerate() {
            let body = &layout.buf[row.body.clone()];
            let p = i * 6;
            ins.raw_bind_parameter(p + 1, run_id).map_err(sql_err)?;
            ins.raw_bind_parameter(p + 2, row.seq as i64)
                .map_err(sql_err)?;
            ins.raw_bind_parameter(p + 3, at_ms).map_err(sql_err)?;
            ins.raw_bind_parameter(p + 4, row.kind).map_err(sql_err)?;
            match row.form {
                // An invariant: serde_json writes UTF-8 only.
                codec::Form::Json => ins.raw_bind_parameter(
                    p + 5,
                    std::str::from_utf8(body).expect("serde_json writes UTF-8"),
                ),
                codec::Form::Binary => ins.raw_bind_parameter(p + 5, body),
            }
            .map_err(sql_err)?;
            ins.raw_bind_parameter(p + 6, row.crc as i64)
                .map_err(sql_err)?;
        }
        ins.raw_execute().map_err(sql_err)?;
    }
    Ok(())
}

/// `INSERT INTO events … VALUES (?, …), …` with `rows` rows of parameters.
fn insert_sql(rows: usize) -> String {
    let mut sql = String::from("INSERT INTO events (run_id, seq, at_ms, kind, body, crc) VALUES ");
    for i in 0..rows {
        if i > 0 {
            sql.push(',');
        }
        sql.push_str("(?,?,?,?,?,?)");
    }
    sql
}

pub(crate) fn to_json<T: serde::Serialize>(v: &T) -> String {
    // Serializing plain data (maps with string keys, values) cannot fail.
    serde_json::to_string(v).expect("run data serializes")
}

pub(crate) fn from_json<T: serde::de::DeserializeOwned>(
    run: &str,
    what: &'static str,
    text: &str,
) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|source| StoreError::Decode {
        run: run.to_string(),
        what,
        source,
    })
}

impl RunStore for SqliteStore {
    fn create_run(&self, run: &NewRun) -> Result<RunHeader, StoreError> {
        let created_ms = now_ms();
        let run_id = new_run_id(created_ms);
        let row = HeaderRow::new(run, created_ms);
        self.grouped("recording a new run", |db, _| {
            insert_run(db, &run_id, &row, created_ms, 0)
        })?;
        Ok(RunHeader {
            run_id,
            created_ms,
            graph_sha256: row.graph_sha256,
            run: run.clone(),
        })
    }

    fn create_and_take(
        &self,
        run: &NewRun,
        opening: &dyn Fn(u64) -> Vec<heddle_core::Record>,
    ) -> Result<(RunHeader, u64), StoreError> {
        const WHAT: &str = "recording and taking a new run";
        let created_ms = now_ms();
        let run_id = new_run_id(created_ms);
        let row = HeaderRow::new(run, created_ms);
        // A new run's first owner: epoch 1, as a take-over of a run with epoch 0 and
        // no records would make it, in the same transaction as the run itself.
        let epoch = 1;
        let records = opening(epoch);
        let frames = Frames::of(&run_id, 0, &records)?;
        self.grouped(WHAT, |db, layout| {
            insert_run(db, &run_id, &row, created_ms, epoch)?;
            if !frames.is_empty() {
                insert_events(db, layout, &frames, now_ms() as i64)?;
            }
            Ok(())
        })?;
        let header = RunHeader {
            run_id,
            created_ms,
            graph_sha256: row.graph_sha256,
            run: run.clone(),
        };
        Ok((header, epoch))
    }

    fn commits(&self) -> Option<crate::Commits> {
        Some(SqliteStore::commits(self))
    }

    fn header(&self, run_id: &str) -> Result<RunHeader, StoreError> {
        let row: Option<(HeaderRow, Option<String>)> = self.with_reader(|db| {
            db.query_row(
                &format!(
                    "SELECT {}, header_sums FROM runs WHERE run_id = ?1",
                    crate::header::COLUMNS
                ),
                [run_id],
                |r| Ok((header_row(r, 0)?, r.get(9)?)),
            )
            .optional()
            .map_err(StoreError::sql("reading a run"))
        })?;
        let Some((row, sums)) = row else {
            return Err(StoreError::UnknownRun(run_id.to_string()));
        };
        row.into_header(run_id, sums.as_deref())
    }

    fn list(&self) -> Result<Vec<RunSummary>, StoreError> {
        self.with_reader(list_runs)
    }

    fn acquire(&self, run_id: &str) -> Result<u64, StoreError> {
        let mut c = self.conn();
        set_sync(&mut c, true)?;
        let tx =
            c.db.transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(StoreError::sql("taking over a run"))?;
        self.check_write(&tx)?;
        let epoch: Option<i64> = tx
            .query_row(
                "SELECT owner_epoch FROM runs WHERE run_id = ?1",
                [run_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(StoreError::sql("taking over a run"))?;
        let Some(epoch) = epoch else {
            return Err(StoreError::UnknownRun(run_id.to_string()));
        };
        drop_torn_tail(&tx, run_id)?;
        let next = epoch as u64 + 1;
        tx.execute(
            "UPDATE runs SET owner_epoch = ?2 WHERE run_id = ?1",
            params![run_id, next as i64],
        )
        .map_err(StoreError::sql("taking over a run"))?;
        tx.commit().map_err(StoreError::sql("taking over a run"))?;
        Ok(next)
    }

    fn take_over(
        &self,
        run_id: &str,
        next: u64,
        opening: &dyn Fn(u64) -> Vec<heddle_core::Record>,
    ) -> Result<u64, StoreError> {
        const WHAT: &str = "taking over a run";
        // Refused in its savepoint (`NotNext`: another taker's first records are there,
        // it won), so neither the torn tail's removal nor anything else of this one lands.
        self.grouped(WHAT, |tx, layout| {
            let epoch: Option<i64> = tx
                .query_row(
                    "SELECT owner_epoch FROM runs WHERE run_id = ?1",
                    [run_id],
                    |r| r.get(0),
                )
                .optional()
                .map_err(StoreError::sql(WHAT))?;
            let Some(epoch) = epoch else {
                return Err(StoreError::UnknownRun(run_id.to_string()));
            };
            drop_torn_tail(tx, run_id)?;
            let found = next_seq(tx, run_id)?;
            if found != next {
                return Err(StoreError::NotNext {
                    run: run_id.to_string(),
                    seq: next,
                    next: found,
                });
            }
            let ours = epoch as u64 + 1;
            tx.execute(
                "UPDATE runs SET owner_epoch = ?2 WHERE run_id = ?1",
                params![run_id, ours as i64],
            )
            .map_err(StoreError::sql(WHAT))?;
            let records = opening(ours);
            let frames = Frames::of(run_id, next, &records)?;
            if !frames.is_empty() {
                insert_events(tx, layout, &frames, now_ms() as i64)?;
            }
            if crate::withdraws_cancel(&records) {
                tx.execute("DELETE FROM cancel_requests WHERE run_id = ?1", [run_id])
                    .map_err(StoreError::sql(WHAT))?;
            }
            Ok(ours)
        })
    }

    fn request_cancel(&self, run_id: &str) -> Result<(), StoreError> {
        const WHAT: &str = "requesting a run's cancel";
        let mut c = self.conn();
        set_sync(&mut c, true)?;
        let tx =
            c.db.transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(StoreError::sql(WHAT))?;
        self.check_write(&tx)?;
        let known: Option<i64> = tx
            .query_row("SELECT 1 FROM runs WHERE run_id = ?1", [run_id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(StoreError::sql(WHAT))?;
        if known.is_none() {
            return Err(StoreError::UnknownRun(run_id.to_string()));
        }
        tx.execute(
            "INSERT OR IGNORE INTO cancel_requests (run_id, requested_ms, pid)
             VALUES (?1, ?2, ?3)",
            params![run_id, now_ms() as i64, std::process::id() as i64],
        )
        .map_err(StoreError::sql(WHAT))?;
        tx.commit().map_err(StoreError::sql(WHAT))?;
        // This process's subscribers (its one host) hear of it at once.
        self.hub.send(crate::fleet::Wake::Cancel {
            run_id: run_id.to_string(),
        });
        Ok(())
    }

    fn cancel_requested(&self, run_id: &str) -> Result<bool, StoreError> {
        self.with_reader(|db| {
            db.prepare_cached("SELECT count(*) FROM cancel_requests WHERE run_id = ?1")
                .and_then(|mut s| s.query_row([run_id], |r| r.get::<_, i64>(0)))
                .map(|n| n > 0)
                .map_err(StoreError::sql("reading a run's cancel request"))
        })
    }

    fn append_frames(&self, epoch: u64, frames: &Frames, sync: bool) -> Result<(), StoreError> {
        const WHAT: &str = "appending to a run's log";
        if frames.is_empty() {
            return Ok(());
        }
        if sync {
            // Synced: its commit shared with the other synced writes queued meanwhile.
            return self.grouped(WHAT, |db, layout| append_checked(db, layout, epoch, frames));
        }
        let mut guard = self.conn();
        // Through a plain reference, so the transaction (on `db`) and the row buffer
        // (`layout`) are borrowed apart.
        let c = &mut *guard;
        set_sync(c, false)?;
        let tx =
            c.db.transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(StoreError::sql(WHAT))?;
        self.check_write(&tx)?;
        append_checked(&tx, &mut c.layout, epoch, frames)?;
        tx.commit()
            .map_err(StoreError::sql("committing a run's log"))
    }

    fn read(&self, run_id: &str, from: u64) -> Result<LogRead, StoreError> {
        self.with_reader(|db| read_log(db, run_id, from))
    }

    fn read_lifecycle(&self, run_id: &str) -> Result<Vec<Stored>, StoreError> {
        self.with_reader(|db| read_lifecycle(db, run_id))
    }

    fn put_artifact(
        &self,
        run_id: &str,
        name: Option<&str>,
        bytes: &[u8],
        policy: &crate::artifacts::ArtifactPolicy,
    ) -> Result<crate::artifacts::ArtifactRef, crate::artifacts::ArtifactError> {
        SqliteStore::put_artifact(self, run_id, name, bytes, policy)
    }

    fn artifact_piece(
        &self,
        run_id: &str,
        sha256: &str,
        index: u64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        SqliteStore::artifact_piece(self, run_id, sha256, index)
    }

    fn stored_artifact(
        &self,
        run_id: &str,
        sha256: &str,
    ) -> Result<Option<crate::artifacts::StoredArtifact>, StoreError> {
        Ok(self.stored_artifacts_of(run_id, Some(sha256))?.pop())
    }

    fn stored_artifacts(
        &self,
        run_id: &str,
    ) -> Result<Vec<crate::artifacts::StoredArtifact>, StoreError> {
        self.stored_artifacts_of(run_id, None)
    }

    fn drop_unreferenced_artifacts(
        &self,
        run_id: &str,
        referenced: &crate::spill::Referenced,
    ) -> Result<u64, StoreError> {
        SqliteStore::drop_unreferenced_artifacts(self, run_id, referenced)
    }

    fn named_artifacts(
        &self,
        run_id: &str,
    ) -> Result<Vec<(String, crate::artifacts::ArtifactRef)>, StoreError> {
        SqliteStore::named_artifacts(self, run_id)
    }
}

/// Inserts a new run's row (its header and checksums) with owner `epoch`.
fn insert_run(
    db: &Connection,
    run_id: &str,
    row: &HeaderRow,
    created_ms: u64,
    epoch: u64,
) -> Result<(), StoreError> {
    let sums = row.sums(run_id);
    db.prepare_cached(
        "INSERT INTO runs (run_id, created_ms, graph_name, graph_bytes, graph_sha256, plan,
             inputs, secrets, packages, limits, owner_epoch, header_sums)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    )
    .and_then(|mut s| {
        s.execute(params![
            run_id,
            created_ms as i64,
            row.graph_name,
            row.graph_bytes,
            row.graph_sha256,
            row.plan,
            row.inputs,
            row.secrets,
            row.packages,
            row.limits,
            epoch as i64,
            sums,
        ])
    })
    .map_err(StoreError::sql("recording a new run"))?;
    Ok(())
}

/// Appends `frames` to their run's log in the transaction open on `db`, refused unless
/// `epoch` is the run's owner's and the frames start at its next sequence number.
fn append_checked(
    db: &Connection,
    layout: &mut rows::Layout,
    epoch: u64,
    frames: &Frames,
) -> Result<(), StoreError> {
    let run_id = frames.run();
    // Cached statements: these run once per batch, and parsing them each time was a
    // visible part of a small batch's cost.
    let current: Option<i64> = db
        .prepare_cached("SELECT owner_epoch FROM runs WHERE run_id = ?1")
        .and_then(|mut s| s.query_row([run_id], |r| r.get(0)).optional())
        .map_err(StoreError::sql("appending to a run's log"))?;
    let Some(current) = current else {
        return Err(StoreError::UnknownRun(run_id.to_string()));
    };
    if current as u64 != epoch {
        return Err(StoreError::Fenced {
            run: run_id.to_string(),
            ours: epoch,
            current: current as u64,
        });
    }
    let next = next_seq(db, run_id)?;
    if next != frames.first() {
        return Err(StoreError::NotNext {
            run: run_id.to_string(),
            seq: frames.first(),
            next,
        });
    }
    insert_events(db, layout, frames, now_ms() as i64)?;
    if let Some(node) = frames.crash() {
        fault::abort(fault::Boundary::MidCommit, node);
    }
    Ok(())
}

/// The sequence number the next record of `run_id`'s log gets.
fn next_seq(tx: &Connection, run_id: &str) -> Result<u64, StoreError> {
    let last: Option<i64> = tx
        .prepare_cached("SELECT max(seq) FROM events WHERE run_id = ?1")
        .and_then(|mut s| s.query_row([run_id], |r| r.get(0)))
        .map_err(StoreError::sql("reading the end of a run's log"))?;
    Ok(last.map_or(0, |l| l as u64 + 1))
}

/// Frees the sequence numbers of a torn tail (records at the end of the log that fail
/// their checksum: a write cut short by a crash never counted) for the next owner: a
/// single row is deleted; a packed row keeps the records before the tear, or goes
/// when none verify.
fn drop_torn_tail(tx: &Connection, run_id: &str) -> Result<(), StoreError> {
    const WHAT: &str = "dropping a torn record";
    let mut last = tx
        .prepare_cached(
            "SELECT seq, at_ms, kind, body, crc FROM events WHERE run_id = ?1
             ORDER BY seq DESC LIMIT 1",
        )
        .map_err(StoreError::sql(WHAT))?;
    let mut rows = last.query([run_id]).map_err(StoreError::sql(WHAT))?;
    let Some(row) = rows.next().map_err(StoreError::sql(WHAT))? else {
        return Ok(());
    };
    let checked = rows::check_raw(run_id, rows::raw(row)?, 0)?;
    let Some(repair) = rows::torn_repair(run_id, &checked) else {
        return Ok(());
    };
    drop(rows);
    tx.execute(
        "DELETE FROM events WHERE run_id = ?1 AND seq = ?2",
        params![run_id, repair.key as i64],
    )
    .map_err(StoreError::sql(WHAT))?;
    if let Some((last, body, crc, at_ms)) = repair.keep {
        tx.execute(
            "INSERT INTO events (run_id, seq, at_ms, kind, body, crc)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                run_id,
                last as i64,
                at_ms as i64,
                rows::PACKED,
                body,
                crc as i64
            ],
        )
        .map_err(StoreError::sql(WHAT))?;
    }
    Ok(())
}

fn set_sync(c: &mut Conn, sync: bool) -> Result<(), StoreError> {
    c.set_sync(sync)
}

/// Every run of the store, oldest first (see [`RunStore::list`]).
fn list_runs(db: &Connection) -> Result<Vec<RunSummary>, StoreError> {
    let mut stmt = db
        .prepare(
            "SELECT r.run_id, r.created_ms, r.graph_name,
                    coalesce((SELECT max(seq) + 1 FROM events e WHERE e.run_id = r.run_id), 0)
             FROM runs r ORDER BY r.created_ms, r.run_id",
        )
        .map_err(StoreError::sql("listing runs"))?;
    let rows = stmt
        .query_map([], |r| {
            Ok(RunSummary {
                run_id: r.get(0)?,
                created_ms: r.get::<_, i64>(1)? as u64,
                graph_name: r.get(2)?,
                records: r.get::<_, i64>(3)? as u64,
            })
        })
        .map_err(StoreError::sql("listing runs"))?;
    rows.collect::<Result<_, _>>()
        .map_err(StoreError::sql("listing runs"))
}

/// Run `run_id`'s log from record `from` on, checked (see [`RunStore::read`]).
fn read_log(db: &Connection, run_id: &str, from: u64) -> Result<LogRead, StoreError> {
    let exists: Option<i64> = db
        .query_row("SELECT 1 FROM runs WHERE run_id = ?1", [run_id], |r| {
            r.get(0)
        })
        .optional()
        .map_err(StoreError::sql("reading a run's log"))?;
    if exists.is_none() {
        return Err(StoreError::UnknownRun(run_id.to_string()));
    }
    let mut stmt = db
        .prepare_cached(
            "SELECT seq, at_ms, kind, body, crc FROM events
             WHERE run_id = ?1 AND seq >= ?2 ORDER BY seq",
        )
        .map_err(StoreError::sql("reading a run's log"))?;
    let mut rows = stmt
        .query(params![run_id, from as i64])
        .map_err(StoreError::sql("reading a run's log"))?;
    let mut reader = rows::LogReader::new(run_id, from);
    while let Some(row) = rows
        .next()
        .map_err(StoreError::sql("reading a run's log"))?
    {
        reader.row(rows::raw(row)?)?;
    }
    Ok(reader.finish())
}

/// Run `run_id`'s lifecycle records, checked (see [`RunStore::read_lifecycle`]).
fn read_lifecycle(db: &Connection, run_id: &str) -> Result<Vec<Stored>, StoreError> {
    const WHAT: &str = "reading a run's lifecycle records";
    let last: Option<i64> = db
        .query_row(
            "SELECT (SELECT MAX(seq) FROM events WHERE run_id = ?1)
             FROM runs WHERE run_id = ?1",
            [run_id],
            |r| r.get(0),
        )
        .optional()
        .map_err(StoreError::sql(WHAT))?
        .ok_or_else(|| StoreError::UnknownRun(run_id.to_string()))?;
    let mut stmt = db
        .prepare_cached(
            "SELECT seq, at_ms, kind, body, crc FROM events
             WHERE run_id = ?1 AND kind IN (?2, ?3, ?4, ?5) ORDER BY seq",
        )
        .map_err(StoreError::sql(WHAT))?;
    let [k1, k2, k3, k4] = crate::status::LIFECYCLE;
    let mut rows = stmt
        .query(params![run_id, k1, k2, k3, k4])
        .map_err(StoreError::sql(WHAT))?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(StoreError::sql(WHAT))? {
        rows::lifecycle_row(run_id, rows::raw(row)?, last, &mut out)?;
    }
    Ok(out)
}

/// The header columns of a row, [`crate::header::COLUMNS`] in their order from column
/// `at` on: how every SQLite query of a header (a read, the schema 6 upgrade) decodes it.
pub(crate) fn header_row(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<HeaderRow> {
    Ok(HeaderRow {
        created_ms: r.get::<_, i64>(at)? as u64,
        graph_name: r.get(at + 1)?,
        graph_bytes: r.get(at + 2)?,
        graph_sha256: r.get(at + 3)?,
        plan: r.get(at + 4)?,
        inputs: r.get(at + 5)?,
        secrets: r.get(at + 6)?,
        packages: r.get(at + 7)?,
        limits: r.get(at + 8)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use heddle_core::{Occurrence, Record};

    #[test]
    fn a_run_log_commits_while_a_reader_holds_its_connection_and_the_reader_sees_it() {
        let (_dir, store, id) = crate::artifacts::tests::store();
        let epoch = store.acquire(&id).unwrap();
        let record = |node| Record::Dispatched {
            occurrence: Occurrence::new(node, "", 0),
            retry_safe: true,
        };
        store.append(&id, epoch, 0, &[record("a")], false).unwrap();
        store
            .with_reader(|db| {
                // Mid-read, the reader's connection held: the writer still commits (one
                // connection for both would wait here for ever).
                assert_eq!(read_log(db, &id, 0)?.records.len(), 1);
                store.append(&id, epoch, 1, &[record("b")], false)?;
                assert_eq!(read_log(db, &id, 0)?.records.len(), 2);
                Ok(())
            })
            .unwrap();
        assert_eq!(store.read(&id, 1).unwrap().records.len(), 1);
    }
}
