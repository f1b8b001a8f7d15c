//! Opening a PostgreSQL store with something wrong: each is a typed error at open that
//! says what is wrong and where, and nothing is written anywhere. A database another
//! application shares is fine: Heddle keeps to its own schema.

mod support;

use heddle_store::postgres::ConnectFailure;
use heddle_store::{PgStore, RunStore, StoreError, StoreLocation};

fn refused(url: &str) -> StoreError {
    let e = PgStore::open(url).err().expect("the open must be refused");
    assert!(e.is_bad_store(), "{e}");
    e
}

#[test]
fn a_malformed_url_is_refused_saying_why_without_its_password() {
    for (url, says) in [
        ("postgres://heddle:hunter2@127.0.0.1:notaport/db", "invalid"),
        ("postgres:///db", "names no host"),
        ("postgres://127.0.0.1/db?sslmode=require", "TLS"),
        ("postgres://127.0.0.1/db?nonsense=1", "nonsense"),
        ("mysql://127.0.0.1/db", "postgres://"),
    ] {
        let e = refused(url);
        let msg = e.to_string();
        assert!(matches!(e, StoreError::BadUrl { .. }), "{url}: {e:?}");
        assert!(msg.contains(says), "{url}: {msg}");
        assert!(!msg.contains("hunter2"), "{url}: {msg}");
    }
    // The location a configuration names is a database only by its scheme.
    assert!(matches!(
        StoreLocation::parse("postgres://h/db"),
        StoreLocation::Postgres(_)
    ));
    let schema = heddle_store::PgOptions {
        schema: "Heddle; DROP".into(),
        ..Default::default()
    };
    let e = PgStore::open_with("postgres://127.0.0.1/db", schema)
        .err()
        .unwrap();
    assert!(e.to_string().contains("schema"), "{e}");
}

#[test]
fn a_server_that_is_not_there_is_unreachable() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = refused(&format!("postgres://postgres@127.0.0.1:{port}/db"));
    match &e {
        StoreError::Connect { why, target, .. } => {
            assert_eq!(*why, ConnectFailure::Unreachable);
            assert!(target.contains(&format!("127.0.0.1:{port}/db")), "{target}");
        }
        other => panic!("expected Connect, got {other:?}"),
    }
}

#[test]
fn a_refused_user_or_a_missing_database_says_which() {
    if support::skip_pg() {
        return;
    }
    let admin = support::admin_url();
    let base = admin.rsplit_once('/').unwrap().0;
    let stranger = base.replacen("postgres@", "nobody_here@", 1);
    for (url, why) in [
        (
            format!("{stranger}/postgres"),
            ConnectFailure::Authentication,
        ),
        (
            format!("{base}/no_such_database"),
            ConnectFailure::NoDatabase,
        ),
    ] {
        match refused(&url) {
            StoreError::Connect { why: got, .. } => assert_eq!(got, why, "{url}"),
            other => panic!("{url}: expected Connect, got {other:?}"),
        }
    }
}

/// Every table of schema `heddle` in `url` with its row count: what "nothing written"
/// is checked against.
fn heddle_tables(url: &str) -> Vec<(String, String)> {
    let tables = support::query(
        url,
        "SELECT tablename FROM pg_tables WHERE schemaname = 'heddle' ORDER BY 1",
    );
    tables
        .into_iter()
        .map(|r| {
            let t = r[0].clone().unwrap();
            let n = support::query(url, &format!("SELECT count(*) FROM heddle.\"{t}\""));
            (t, n[0][0].clone().unwrap())
        })
        .collect()
}

#[test]
fn a_store_from_a_newer_heddle_is_refused_and_left_alone() {
    if support::skip_pg() {
        return;
    }
    let url = support::fresh_database();
    let id = {
        let s = PgStore::open(&url).unwrap();
        s.create_run(&support::new_run()).unwrap().run_id
    };
    support::sql(
        &url,
        "UPDATE heddle.meta SET value = '99' WHERE key = 'schema_version'",
    );
    let before = heddle_tables(&url);
    match refused(&url) {
        StoreError::NewerPgSchema {
            found: 99,
            supported,
            schema,
            target,
        } => {
            assert!(supported < 99);
            assert_eq!(schema, "heddle");
            assert!(target.contains("heddle_t_"), "{target}");
        }
        other => panic!("expected NewerPgSchema, got {other:?}"),
    }
    assert_eq!(heddle_tables(&url), before);
    let runs = support::query(
        &url,
        &format!("SELECT count(*) FROM heddle.runs WHERE run_id = '{id}'"),
    );
    assert_eq!(runs[0][0].as_deref(), Some("1"));
}

/// A store written before run headers were checksummed (schema 1: no
/// `runs.header_sums`) migrates on open: every stored header gets its checksums over its
/// fields as they are, reads back as it was, and is verified from then on.
#[test]
fn a_version_1_store_migrates_and_its_run_headers_are_verified() {
    if support::skip_pg() {
        return;
    }
    let url = support::fresh_database();
    let (a, b) = {
        let s = PgStore::open(&url).unwrap();
        let run = support::new_run();
        (s.create_run(&run).unwrap(), s.create_run(&run).unwrap())
    };
    support::sql(
        &url,
        "ALTER TABLE heddle.runs DROP COLUMN header_sums;
         DROP TABLE heddle.cancel_requests;
         ALTER TABLE heddle.leases DROP COLUMN owner_hostname, DROP COLUMN owner_pid;
         DROP TABLE heddle.artifact_pieces;
         ALTER TABLE heddle.artifacts ADD COLUMN bytes bytea NOT NULL DEFAULT '';
         UPDATE heddle.meta SET value = '1' WHERE key = 'schema_version'",
    );
    let s = PgStore::open(&url).unwrap();
    let version = support::query(
        &url,
        "SELECT value FROM heddle.meta WHERE key = 'schema_version'",
    );
    assert_eq!(version[0][0].as_deref(), Some("5"));
    assert_eq!(s.header(&a.run_id).unwrap(), a);
    assert_eq!(s.header(&b.run_id).unwrap(), b);
    support::sql(
        &url,
        &format!(
            "UPDATE heddle.runs SET secrets = replace(secrets, 'API', 'APX') WHERE run_id = '{}'",
            b.run_id
        ),
    );
    match s.header(&b.run_id) {
        Err(StoreError::HeaderCorrupt { run, field, .. }) => {
            assert_eq!((run, field.as_str()), (b.run_id.clone(), "secrets"));
        }
        other => panic!("expected a damaged header, got {other:?}"),
    }
}

#[test]
fn a_schema_holding_another_applications_tables_is_refused_and_left_alone() {
    if support::skip_pg() {
        return;
    }
    // A schema named like Heddle's, holding someone else's tables.
    let url = support::fresh_database();
    support::sql(
        &url,
        "CREATE SCHEMA heddle; CREATE TABLE heddle.jobs (id int); INSERT INTO heddle.jobs VALUES (1);",
    );
    let e = refused(&url);
    assert!(matches!(e, StoreError::ForeignSchema { .. }), "{e:?}");
    assert!(e.to_string().contains("jobs"), "{e}");
    assert_eq!(
        heddle_tables(&url),
        vec![("jobs".to_string(), "1".to_string())]
    );

    // One with a `meta` table of another application.
    let url = support::fresh_database();
    support::sql(
        &url,
        "CREATE SCHEMA heddle; CREATE TABLE heddle.meta (key text, value text);
         INSERT INTO heddle.meta VALUES ('application', 'acme-billing');",
    );
    let e = refused(&url);
    assert!(e.to_string().contains("acme-billing"), "{e}");
    assert_eq!(
        heddle_tables(&url),
        vec![("meta".to_string(), "1".to_string())]
    );
}

#[test]
fn a_database_shared_with_another_application_is_used_beside_its_tables() {
    if support::skip_pg() {
        return;
    }
    let url = support::fresh_database();
    // Another application's tables of the same names, in the default schema.
    support::sql(
        &url,
        "CREATE TABLE public.runs (id serial PRIMARY KEY, what text);
         CREATE TABLE public.events (id serial PRIMARY KEY, at timestamptz DEFAULT now());
         INSERT INTO public.runs (what) VALUES ('payroll'), ('invoices');
         INSERT INTO public.events DEFAULT VALUES;",
    );
    let s = PgStore::open(&url).unwrap();
    let id = s.create_run(&support::new_run()).unwrap().run_id;
    let e = s.acquire(&id).unwrap();
    s.append(
        &id,
        e,
        0,
        &[heddle_core::Record::Resumed { pause: 3 }],
        true,
    )
    .unwrap();
    assert_eq!(s.read(&id, 0).unwrap().records.len(), 1);
    assert_eq!(s.list().unwrap().len(), 1);
    let theirs = support::query(&url, "SELECT what FROM public.runs ORDER BY id");
    assert_eq!(
        theirs,
        vec![
            vec![Some("payroll".to_string())],
            vec![Some("invoices".to_string())]
        ]
    );
    let columns = support::query(
        &url,
        "SELECT count(*) FROM information_schema.columns
         WHERE table_schema = 'public' AND table_name = 'events'",
    );
    assert_eq!(columns[0][0].as_deref(), Some("2"));
    // Opening again (another host) finds the store as it is.
    drop(s);
    assert_eq!(PgStore::open(&url).unwrap().list().unwrap().len(), 1);
}

/// A store written when an artifact was one `bytea` value (schema 4) migrates on open:
/// each artifact's bytes are cut into pieces, read back whole and a piece at a time,
/// and the column that held them is gone.
#[test]
fn a_version_4_store_migrates_its_artifacts_into_pieces() {
    use heddle_store::artifacts::{ArtifactPolicy, ArtifactReader, PIECE_BYTES};
    if support::skip_pg() {
        return;
    }
    let url = support::fresh_database();
    let bytes: Vec<u8> = (0..2 * PIECE_BYTES + 5).map(|i| (i % 253) as u8).collect();
    let (run, big, small, empty) = {
        let s = PgStore::open(&url).unwrap();
        let run = s.create_run(&support::new_run()).unwrap().run_id;
        let p = ArtifactPolicy::default();
        let big = s.put_artifact(&run, None, &bytes, &p).unwrap();
        let small = s.put_artifact(&run, Some("report"), b"{}", &p).unwrap();
        let empty = s.put_artifact(&run, None, b"", &p).unwrap();
        (run, big, small, empty)
    };
    // As schema 4 kept them: the bytes whole in `artifacts`.
    support::sql(
        &url,
        "ALTER TABLE heddle.artifacts ADD COLUMN bytes bytea;
         UPDATE heddle.artifacts a SET bytes = coalesce((SELECT string_agg(p.bytes, ''::bytea ORDER BY p.n)
             FROM heddle.artifact_pieces p WHERE p.run_id = a.run_id AND p.sha256 = a.sha256), ''::bytea);
         ALTER TABLE heddle.artifacts ALTER COLUMN bytes SET NOT NULL;
         DROP TABLE heddle.artifact_pieces;
         UPDATE heddle.meta SET value = '4' WHERE key = 'schema_version'",
    );
    let s = PgStore::open(&url).unwrap();
    assert!(s.get_artifact(&run, &big).unwrap() == bytes);
    assert_eq!(s.get_artifact(&run, &small).unwrap(), b"{}");
    assert_eq!(s.get_artifact(&run, &empty).unwrap(), b"");
    let mut r = ArtifactReader::open(&s, &run, &big.sha256).unwrap();
    let mut sizes = Vec::new();
    while let Some(p) = r.next_piece(&s).unwrap() {
        sizes.push(p.len());
    }
    assert_eq!(sizes, [PIECE_BYTES, PIECE_BYTES, 5]);
    let columns = support::query(
        &url,
        "SELECT column_name FROM information_schema.columns
         WHERE table_schema = 'heddle' AND table_name = 'artifacts' ORDER BY column_name",
    );
    let columns: Vec<_> = columns.into_iter().map(|r| r[0].clone().unwrap()).collect();
    assert_eq!(columns, ["run_id", "sha256", "size"]);
}
