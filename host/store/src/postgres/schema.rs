//! The PostgreSQL schema, its version and its migrations.
//!
//! Heddle's tables live in a schema of their own (`heddle` unless told otherwise), so a
//! database shared with another application's tables is fine: nothing outside that
//! schema is read or written. The schema says what it is in its `meta` table
//! (`application` = [`APPLICATION`], `schema_version`); both are read before anything is
//! written, so a schema of that name holding someone else's tables, or one written by a
//! newer heddle, is refused unchanged. Migrations run in one transaction under an
//! advisory lock, so hosts starting together migrate once.

use tokio_postgres::{Client, GenericClient};

use super::{Pg, is_unavailable};
use crate::StoreError;

/// What the `meta` table's `application` row says in a Heddle run store.
pub(crate) const APPLICATION: &str = "heddle-run-store";

/// Migrations in order; the schema version is how many have been applied. Never edit
/// one that has shipped: add the next.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: runs (their fixed part), their leases (the small hot table claims scan), their
    // event logs (rows as in SQLite's schema 5: rows.rs), artifacts, hosts and commands.
    r#"
    CREATE TABLE meta (
        key text PRIMARY KEY,
        value text NOT NULL
    );
    CREATE TABLE runs (
        run_id text PRIMARY KEY,
        created_ms bigint NOT NULL,
        graph_name text NOT NULL,
        graph_bytes bytea NOT NULL,
        graph_sha256 text NOT NULL,
        plan text NOT NULL,
        inputs text NOT NULL,
        secrets text NOT NULL,
        packages text NOT NULL,
        limits text NOT NULL
    );
    -- One row per run. state: 'idle' (nobody needs to drive it: new, paused, ended),
    -- 'queued' (waiting for a host), 'running' (owner_host drives it under owner_epoch
    -- until expires_at, store clock). A 'running' row whose lease expired is claimable.
    CREATE TABLE leases (
        run_id text PRIMARY KEY REFERENCES runs (run_id),
        state text NOT NULL DEFAULT 'idle' CHECK (state IN ('idle', 'queued', 'running')),
        owner_host text,
        owner_epoch bigint NOT NULL DEFAULT 0,
        expires_at timestamptz,
        queued_at timestamptz
    ) WITH (fillfactor = 70);
    CREATE INDEX leases_wanted ON leases (queued_at, run_id) WHERE state <> 'idle';
    CREATE INDEX leases_owner ON leases (owner_host) WHERE state = 'running';
    CREATE TABLE events (
        run_id text NOT NULL REFERENCES runs (run_id),
        seq bigint NOT NULL,
        at_ms bigint NOT NULL,
        kind text NOT NULL,
        json boolean NOT NULL,
        body bytea NOT NULL,
        crc bigint NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    -- What a listing folds (status::LIFECYCLE), without scanning every result.
    CREATE INDEX events_lifecycle ON events (run_id, seq)
        WHERE kind IN ('opened', 'paused', 'resumed', 'finished');
    CREATE TABLE artifacts (
        run_id text NOT NULL REFERENCES runs (run_id),
        sha256 text NOT NULL,
        size bigint NOT NULL,
        bytes bytea NOT NULL,
        PRIMARY KEY (run_id, sha256)
    );
    CREATE TABLE artifact_names (
        run_id text NOT NULL REFERENCES runs (run_id),
        name text NOT NULL,
        sha256 text NOT NULL,
        PRIMARY KEY (run_id, name)
    );
    -- Hosts and their heartbeat (for operators: `GET /api/hosts`); a registration is
    -- one incarnation of a host id, and binds the id while it has not expired.
    CREATE TABLE hosts (
        host_id text PRIMARY KEY,
        incarnation text NOT NULL,
        hostname text NOT NULL,
        pid bigint NOT NULL,
        api text NOT NULL,
        started_at timestamptz NOT NULL,
        last_seen timestamptz NOT NULL,
        expires_at timestamptz NOT NULL
    );
    -- Requests for a run's owner (cancel, resume, answers), written by any host without
    -- the lease; the owner carries each out and records its outcome.
    CREATE TABLE commands (
        id bigserial PRIMARY KEY,
        run_id text NOT NULL REFERENCES runs (run_id),
        kind text NOT NULL,
        body text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now(),
        done_at timestamptz,
        outcome text
    );
    CREATE INDEX commands_pending ON commands (run_id, id) WHERE done_at IS NULL;

    -- The append: fencing, numbering and the rows in one statement (one round trip, its
    -- own transaction). Refusals carry their own SQLSTATE and the current value in
    -- DETAIL: HDU01 unknown run, HDF01 another epoch owns it, HDL01 the lease expired,
    -- HDN01 not the next record.
    CREATE FUNCTION append_events(p_run text, p_epoch bigint, p_first bigint,
            p_seq bigint[], p_kind text[], p_json boolean[], p_body bytea[], p_crc bigint[])
        RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
    DECLARE
        l leases%ROWTYPE;
        nxt bigint;
    BEGIN
        SELECT * INTO l FROM leases WHERE run_id = p_run FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'no run %', p_run USING ERRCODE = 'HDU01';
        END IF;
        IF l.owner_epoch <> p_epoch THEN
            RAISE EXCEPTION 'run % is owned by epoch %', p_run, l.owner_epoch
                USING ERRCODE = 'HDF01', DETAIL = l.owner_epoch::text;
        END IF;
        IF l.state <> 'running' OR l.expires_at IS NULL OR l.expires_at <= now() THEN
            RAISE EXCEPTION 'the lease of run % expired', p_run
                USING ERRCODE = 'HDL01', DETAIL = coalesce(l.owner_host, '');
        END IF;
        SELECT coalesce(max(seq) + 1, 0) INTO nxt FROM events WHERE run_id = p_run;
        IF nxt <> p_first THEN
            RAISE EXCEPTION 'run %: the next record is %', p_run, nxt
                USING ERRCODE = 'HDN01', DETAIL = nxt::text;
        END IF;
        INSERT INTO events (run_id, seq, at_ms, kind, json, body, crc)
            SELECT p_run, t.s, (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
                   t.k, t.j, t.b, t.c
            FROM unnest(p_seq, p_kind, p_json, p_body, p_crc) AS t (s, k, j, b, c);
    END
    $$;
    "#,
    // 2: the run header's checksums (`runs.header_sums`, as in SQLite's schema 6: see
    // header.rs); the rows a version 1 store holds get theirs by [`checksum_headers`].
    "ALTER TABLE runs ADD COLUMN header_sums text;",
    // 3: requests to cancel a run, for its owner to see and carry out (see
    // `RunStore::request_cancel`; as in SQLite's schema 7): the owner's epoch fences
    // everyone else out of the log, so a request from another host is kept beside it.
    "CREATE TABLE IF NOT EXISTS cancel_requests (
        run_id text PRIMARY KEY REFERENCES runs (run_id),
        requested_at timestamptz NOT NULL DEFAULT now(),
        host_id text NOT NULL,
        pid bigint NOT NULL
    );",
    // 4: which process holds a run's lease (its machine and process id), so a process of
    // the same machine that died is not waited out (a resume right after a crash, a
    // host restarted at once) and a run's state is not judged by a process id of
    // another machine.
    "ALTER TABLE leases ADD COLUMN owner_hostname text, ADD COLUMN owner_pid bigint;",
    // 5: an artifact's bytes in pieces of `artifacts::PIECE_BYTES`, a row each, read a
    // piece at a time instead of whole (as in SQLite's schema 8); the bytes an older
    // store holds are cut into pieces and the column that held them whole is dropped by
    // [`cut_artifacts`].
    "CREATE TABLE IF NOT EXISTS artifact_pieces (
        run_id text NOT NULL,
        sha256 text NOT NULL,
        n bigint NOT NULL,
        bytes bytea NOT NULL,
        PRIMARY KEY (run_id, sha256, n)
    );",
];

/// The version whose upgrade checksums the run headers already stored.
const HEADER_SUMS: i64 = 2;

/// Gives every run header stored without checksums its [`crate::header::sums`], over the
/// fields as they are now (the upgrade to version [`HEADER_SUMS`]).
async fn checksum_headers<C: GenericClient + Sync>(client: &C) -> Result<u64, StoreError> {
    const WHAT: &str = "checksumming the stored run headers";
    let rows = client
        .query(
            &format!(
                "SELECT run_id, {} FROM runs WHERE header_sums IS NULL",
                crate::header::COLUMNS
            ),
            &[],
        )
        .await
        .map_err(Pg::op(WHAT))?;
    for row in &rows {
        let run_id: String = row.get(0);
        let sums = super::header_row(row, 1).sums(&run_id);
        client
            .execute(
                "UPDATE runs SET header_sums = $2 WHERE run_id = $1",
                &[&run_id, &sums],
            )
            .await
            .map_err(Pg::op(WHAT))?;
    }
    Ok(rows.len() as u64)
}

/// The version whose upgrade cuts the artifacts already stored into pieces.
const ARTIFACT_PIECES: i64 = 5;

/// Moves the bytes of every artifact still held whole (`artifacts.bytes`, before
/// version [`ARTIFACT_PIECES`]) into pieces of [`crate::artifacts::PIECE_BYTES`], and
/// drops the column; nothing to do when there is no such column. One artifact at a time,
/// each read once: cutting in SQL (`substring` per piece) would fetch and decompress the
/// whole value again for every piece.
async fn cut_artifacts(client: &tokio_postgres::Transaction<'_>) -> Result<(), StoreError> {
    const WHAT: &str = "cutting the stored artifacts into pieces";
    let whole = client
        .query_opt(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()
             AND table_name = 'artifacts' AND column_name = 'bytes'",
            &[],
        )
        .await
        .map_err(Pg::op(WHAT))?
        .is_some();
    if !whole {
        return Ok(());
    }
    let keys = client
        .query("SELECT run_id, sha256 FROM artifacts WHERE size > 0", &[])
        .await
        .map_err(Pg::op(WHAT))?;
    for key in &keys {
        let (run, sha256): (String, String) = (key.get(0), key.get(1));
        let bytes: Vec<u8> = client
            .query_one(
                "SELECT bytes FROM artifacts WHERE run_id = $1 AND sha256 = $2",
                &[&run, &sha256],
            )
            .await
            .map_err(Pg::op(WHAT))?
            .get(0);
        super::insert_pieces(client, &run, &sha256, &bytes)
            .await
            .map_err(Pg::op(WHAT))?;
    }
    client
        .batch_execute("ALTER TABLE artifacts DROP COLUMN bytes")
        .await
        .map_err(Pg::op(WHAT))
}

/// A stable key for the advisory lock the migrations of `schema` take.
fn lock_key(schema: &str) -> i64 {
    let mut h = crc32fast::Hasher::new();
    h.update(APPLICATION.as_bytes());
    h.update(schema.as_bytes());
    i64::from(h.finalize())
}

/// What the schema holds, read without writing.
enum Found {
    /// No schema, or an empty one: a new store.
    Nothing,
    /// A Heddle store at this version.
    Version(i64),
}

async fn inspect<C: GenericClient + Sync>(
    client: &C,
    schema: &str,
    target: &str,
    supported: i64,
) -> Result<Found, StoreError> {
    let foreign = |detail: String| StoreError::ForeignSchema {
        target: target.to_string(),
        schema: schema.to_string(),
        detail,
    };
    let tables: Vec<String> = client
        .query(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
             ORDER BY 1",
            &[&schema],
        )
        .await
        .map_err(Pg::op("reading the run store's schema"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if tables.is_empty() {
        return Ok(Found::Nothing);
    }
    if !tables.iter().any(|t| t == "meta") {
        let mut some: Vec<&str> = tables.iter().map(String::as_str).take(5).collect();
        if tables.len() > 5 {
            some.push("…");
        }
        return Err(foreign(format!(
            "it holds tables Heddle did not create ({}) and no `meta` table",
            some.join(", ")
        )));
    }
    let rows = match client
        .query(
            "SELECT key::text, value::text FROM meta WHERE key IN ('application', 'schema_version')",
            &[],
        )
        .await
    {
        Ok(rows) => rows,
        Err(e) if is_unavailable(&e) => {
            return Err(Pg::op("reading the run store's version")(e));
        }
        Err(e) => {
            return Err(foreign(format!(
                "its `meta` table is not Heddle's ({})",
                e.as_db_error().map_or_else(|| e.to_string(), |d| d.message().to_string())
            )));
        }
    };
    let get = |k: &str| {
        rows.iter()
            .find(|r| r.get::<_, String>(0) == k)
            .map(|r| r.get::<_, String>(1))
    };
    match get("application") {
        Some(a) if a == APPLICATION => {}
        Some(a) => return Err(foreign(format!("its `meta` table names application `{a}`"))),
        None => return Err(foreign("its `meta` table names no application".into())),
    }
    let version = get("schema_version")
        .and_then(|v| v.parse::<i64>().ok())
        .ok_or_else(|| foreign("its `meta` table holds no schema version".into()))?;
    if version > supported {
        return Err(StoreError::NewerPgSchema {
            target: target.to_string(),
            schema: schema.to_string(),
            found: version,
            supported,
        });
    }
    Ok(Found::Version(version))
}

/// Checks what `schema` holds and brings an older store up to date (creating a new one).
/// The connection's `search_path` is `schema` alone.
pub(crate) async fn prepare(
    client: &mut Client,
    schema: &str,
    target: &str,
) -> Result<(), StoreError> {
    prepare_with(client, schema, target, MIGRATIONS).await
}

/// [`prepare`] by a heddle that knows `migrations` (a prefix of [`MIGRATIONS`]): how the
/// tests see what an older build does with a store this one wrote.
pub(crate) async fn prepare_with(
    client: &mut Client,
    schema: &str,
    target: &str,
    migrations: &[&str],
) -> Result<(), StoreError> {
    let supported = migrations.len() as i64;
    if let Found::Version(v) = inspect(client, schema, target, supported).await?
        && v == supported
    {
        return Ok(());
    }
    const WHAT: &str = "migrating the run store's schema";
    let tx = client.transaction().await.map_err(Pg::op(WHAT))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock_key(schema)])
        .await
        .map_err(Pg::op(WHAT))?;
    // Another host may have migrated while this one waited for the lock.
    let from = match inspect(&tx, schema, target, supported).await? {
        Found::Nothing => 0,
        Found::Version(v) => v,
    };
    if from == supported {
        return tx.commit().await.map_err(Pg::op(WHAT));
    }
    // The identifier was checked when the store was opened (`valid_schema`).
    tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
        .await
        .map_err(Pg::op("creating the run store's schema"))?;
    for (i, m) in migrations.iter().enumerate().skip(from as usize) {
        tx.batch_execute(m).await.map_err(Pg::op(WHAT))?;
        if i as i64 + 1 == HEADER_SUMS {
            checksum_headers(&tx).await?;
        }
        if i as i64 + 1 == ARTIFACT_PIECES {
            cut_artifacts(&tx).await?;
        }
    }
    tx.execute(
        "INSERT INTO meta (key, value) VALUES ('application', $1), ('schema_version', $2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[&APPLICATION, &supported.to_string()],
    )
    .await
    .map_err(Pg::op(WHAT))?;
    tx.commit().await.map_err(Pg::op(WHAT))
}

/// Whether `schema` is a plain lower-case identifier (it is spliced into SQL text).
pub(crate) fn valid_schema(schema: &str) -> bool {
    let mut chars = schema.chars();
    matches!(chars.next(), Some('a'..='z' | '_'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
        && schema.len() <= 63
        && !schema.starts_with("pg_")
}
