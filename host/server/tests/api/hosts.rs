//! Two hosts on one database, in this process: any host answers for any run. A run one
//! host drives is listed, shown, streamed and cancelled through the other; its
//! escalation is listed and answered through the other (relayed through the store); a
//! resume sent to the other is refused naming its owner; gates of runs one host paused
//! are approved and rejected through the other (which takes the run over), concurrent
//! approvals through both won by one; a run created while every worker slot of its host
//! is taken is queued and claimed by the host that has one (woken by the store, not by
//! its poll), and one whose take failed is queued again and taken later;
//! `GET /api/hosts` lists both with the database, the lease, each host's runs and last
//! heartbeat, and a dead host as not alive.

use std::time::Duration;

use heddle_runtime::Supervise;
use serde_json::{Value, json};

use crate::support::*;

/// A bash node that says it started (a file in the data directory), then waits far
/// longer than the test.
fn waiting(s: &TestServer) -> String {
    let code = format!(
        "echo started >> {}/started.txt; exec sleep 600",
        s.dir.path().join("data").display()
    );
    json!({"format": "heddle.graph", "version": 1, "nodes": [
        {"id": "wait", "type": "code.bash",
         "properties": {"mode": "subprocess", "timeout_s": 600, "code": code}},
        {"id": "out", "type": "heddle.output"}],
     "edges": [{"source": "wait", "sourceHandle": "result", "target": "out", "targetHandle": "value"}]})
    .to_string()
}

/// How many waiting runs started in `s`'s data directory.
fn started(s: &TestServer) -> usize {
    std::fs::read_to_string(s.dir.path().join("data/started.txt"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// Waits (a generous bound; nothing is asserted about the time) until `f` holds.
async fn until(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + WAIT;
    while !bounded(what, f()).await {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two hosts on a fresh database; `None` when PostgreSQL tests are skipped.
async fn two_hosts(setup: Setup) -> Option<(TestServer, TestServer)> {
    if pg::skip_pg() {
        return None;
    }
    let a = TestServer::with(Setup {
        store: Store::Shared,
        ..setup
    })
    .await;
    let b = a.second_host().await;
    Some((a, b))
}

fn host_id(s: &TestServer) -> String {
    s.host.fleet().unwrap().host_id().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_one_host_drives_is_listed_shown_streamed_and_cancelled_through_the_other() {
    let Some((a, b)) = two_hosts(Setup::default()).await else {
        return;
    };
    let id = a.create(&waiting(&a)).await;
    until("the run started on host a", async || started(&a) == 1).await;
    assert_eq!(a.host.driving(), std::slice::from_ref(&id));

    // Host b lists and shows it: running, driven by host a.
    let list = b.runs().await;
    assert_eq!(list.len(), 1, "{list:#?}");
    assert_eq!(list[0]["state"], "running");
    let show = b.show(&id).await;
    assert_eq!(show["state"], "running", "{show:#}");
    assert_eq!(show["owner_host"], host_id(&a), "{show:#}");
    let (status, hosts) = b.call("GET", "/api/hosts", None).await;
    assert_eq!(status, 200, "{hosts:#}");
    assert_eq!(hosts["shared"], true);
    assert_eq!(hosts["this_host"], host_id(&b));
    let listed: Vec<&Value> = hosts["hosts"].as_array().unwrap().iter().collect();
    assert_eq!(listed.len(), 2, "{hosts:#}");
    let of_a = listed.iter().find(|h| h["host_id"] == host_id(&a)).unwrap();
    assert_eq!(of_a["alive"], true, "{hosts:#}");
    assert_eq!(of_a["runs"], 1, "{hosts:#}");

    // Host b's event stream follows the log host a writes, until the run ends.
    // Host b cancels it meanwhile: host a is asked through the store and records it.
    let (stream, (status, body)) = tokio::join!(b.events(&id, None), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        b.call("POST", &format!("/api/runs/{id}/cancel"), None)
            .await
    });
    assert_eq!(status, 202, "{body:#}");
    let kinds: Vec<&str> = stream.iter().map(|(_, k, _)| k.as_str()).collect();
    assert_eq!(kinds.first(), Some(&"opened"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"finished"), "{kinds:?}");
    assert_eq!(stream.last().unwrap().2["status"], "cancelled");
    assert!(kinds.contains(&"cancel_requested"), "{kinds:?}");
    // Host a ended it itself (its own driver wrote every record), and let it go.
    until("host a's driver ended", async || {
        a.host.driving().is_empty()
    })
    .await;
    let show = a.show(&id).await;
    assert_eq!(show["state"], "cancelled", "{show:#}");
    let records = show["records"].as_u64().unwrap();
    assert_eq!(records as usize, stream.len());
    // The ended run cannot be cancelled again, from either host.
    for s in [&a, &b] {
        let (status, body) = s
            .call("POST", &format!("/api/runs/{id}/cancel"), None)
            .await;
        assert_eq!(status, 409, "{body:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escalation_of_a_run_one_host_drives_is_listed_and_answered_through_the_other() {
    let Some((a, b)) = two_hosts(Setup {
        supervise: Some(Supervise::Interactive),
        ..Setup::default()
    })
    .await
    else {
        return;
    };
    let id = a.create(READ).await;
    // Listed by host b: relayed to host a, whose desk holds it.
    let list = b.pending_escalations(&id).await;
    assert_eq!(list.len(), 1, "{list:#?}");
    assert_eq!(list[0]["node"], "read");
    assert_eq!(list[0]["allowed"], json!(["retry", "skip", "fail"]));
    let eid = list[0]["id"].as_str().unwrap().to_string();
    // Refusals come back as host a gave them: a verdict outside the allowed set.
    let (status, body) = b.answer(&id, &eid, json!({"verdict": "substitute"})).await;
    assert_eq!(status, 409, "{body:#}");
    assert_eq!(
        body["allowed"],
        json!(["retry", "skip", "fail"]),
        "{body:#}"
    );
    // The person fixes the cause and says retry through host b.
    std::fs::write(a.dir.path().join("data/ready.txt"), "ready\n").unwrap();
    let (status, body) = b
        .answer(&id, &eid, json!({"verdict": "retry", "note": "there now"}))
        .await;
    assert_eq!(status, 200, "{body:#}");
    assert_eq!(body["verdict"], "retry");
    let show = a.ended(&id).await;
    assert_eq!(show["state"], "completed", "{show:#}");
    // Answered once: a second answer through either host is refused.
    let (status, _) = b.answer(&id, &eid, json!({"verdict": "skip"})).await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_created_while_every_slot_is_taken_is_queued_and_claimed_by_a_free_host() {
    let Some((a, b)) = two_hosts(Setup {
        workers: Some(1),
        ..Setup::default()
    })
    .await
    else {
        return;
    };
    let graph = waiting(&a);
    let first = a.create(&graph).await;
    until("the first run started", async || started(&a) == 1).await;
    // Host a's one slot is taken: the next run is queued, and host b takes it.
    let (status, body) = a
        .call(
            "POST",
            "/api/runs",
            Some(json!({ "graph": serde_json::from_str::<Value>(&graph).unwrap() })),
        )
        .await;
    assert_eq!(status, 201, "{body:#}");
    assert_eq!(body["state"], "queued", "{body:#}");
    let second = body["run_id"].as_str().unwrap().to_string();
    until("host b claimed the queued run", async || {
        b.host.driving() == [second.clone()]
    })
    .await;
    // It writes to host a's data directory (the graph names it): both started.
    until("the second run started", async || started(&a) == 2).await;
    assert_eq!(a.host.driving(), std::slice::from_ref(&first));
    assert_eq!(b.show(&second).await["owner_host"], host_id(&b));
    // Each cancelled through the host that does not drive it.
    for (id, via) in [(&first, &b), (&second, &a)] {
        let (status, body) = via
            .call("POST", &format!("/api/runs/{id}/cancel"), None)
            .await;
        assert_eq!(status, 202, "{body:#}");
    }
    for id in [&first, &second] {
        assert_eq!(a.ended(id).await["state"], "cancelled");
    }
    // Each opened once: claimed by exactly one host.
    for id in [&first, &second] {
        let events = a.events(id, None).await;
        let opened = events.iter().filter(|(_, k, _)| k == "opened").count();
        assert_eq!(opened, 1, "{events:#?}");
    }
}

/// A queued run whose take fails (the database refuses its opening record once, as it
/// may refuse a statement for reasons of its own) is queued again and taken on a later
/// claim. Given back idle, as it was, no host ever claimed it again: it waited forever
/// (a run cut off from its host under load was lost so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_take_failed_is_queued_again_and_taken_later() {
    let Some((a, b)) = two_hosts(Setup {
        workers: Some(1),
        ..Setup::default()
    })
    .await
    else {
        return;
    };
    let graph = waiting(&a);
    let first = a.create(&graph).await;
    until("the first run started", async || started(&a) == 1).await;
    // From now on the first opening record anyone writes is refused (a sequence counts
    // the tries: a rollback does not undo it).
    let url = a.database().unwrap();
    tokio::task::spawn_blocking(move || {
        pg::sql(
            &url,
            "CREATE SEQUENCE heddle.openings;
             CREATE FUNCTION heddle.refuse_first_opening() RETURNS trigger
             LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.kind = 'opened' AND nextval('heddle.openings') = 1 THEN
                     RAISE EXCEPTION 'refused by the test';
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER refuse_first_opening BEFORE INSERT ON heddle.events
                 FOR EACH ROW EXECUTE FUNCTION heddle.refuse_first_opening();",
        )
    })
    .await
    .unwrap();
    // Host a's one slot is taken: the run is queued, host b claims it, and its take
    // is refused.
    let (status, body) = a
        .call(
            "POST",
            "/api/runs",
            Some(json!({ "graph": serde_json::from_str::<Value>(&graph).unwrap() })),
        )
        .await;
    assert_eq!(status, 201, "{body:#}");
    assert_eq!(body["state"], "queued", "{body:#}");
    let second = body["run_id"].as_str().unwrap().to_string();
    until("the refused run was taken on a later claim", async || {
        b.host.driving() == [second.clone()]
    })
    .await;
    until("the second run started", async || started(&a) == 2).await;
    let url = a.database().unwrap();
    let tries = tokio::task::spawn_blocking(move || {
        pg::query(&url, "SELECT last_value FROM heddle.openings")
    })
    .await
    .unwrap();
    assert_eq!(
        tries,
        [[Some("2".to_string())]],
        "one refused take, one taken"
    );
    for id in [&first, &second] {
        let (status, body) = a
            .call("POST", &format!("/api/runs/{id}/cancel"), None)
            .await;
        assert_eq!(status, 202, "{body:#}");
    }
    for id in [&first, &second] {
        assert_eq!(a.ended(id).await["state"], "cancelled");
    }
    // Opened once: the refused take wrote nothing.
    let events = a.events(&second, None).await;
    let opened = events.iter().filter(|(_, k, _)| k == "opened").count();
    assert_eq!(opened, 1, "{events:#?}");
}

/// A gate, then an effect: the approved run appends `shipped` to /data/log.txt (in the
/// data directory of the host that runs on from the gate).
const GATED_EFFECT: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "c", "type": "heddle.constant", "properties": {"value": "shipped\n"}},
    {"id": "ship", "type": "heddle.gate", "properties": {"title": "Ship it"}},
    {"id": "w", "type": "files.write_text", "properties": {"path": "/data/log.txt", "append": true}},
    {"id": "out", "type": "heddle.output"}],
  "edges": [
    {"source": "c", "sourceHandle": "value", "target": "ship", "targetHandle": "value"},
    {"source": "ship", "sourceHandle": "value", "target": "w", "targetHandle": "text"},
    {"source": "w", "sourceHandle": "bytes", "target": "out", "targetHandle": "value"}]}"#;

/// The kinds of run `id`'s records, as `s` streams them.
async fn kinds(s: &TestServer, id: &str) -> Vec<String> {
    s.events(id, None).await.into_iter().map(|e| e.1).collect()
}

fn count(kinds: &[String], kind: &str) -> usize {
    kinds.iter().filter(|k| *k == kind).count()
}

/// Runs host a drove to their gate are answered through host b: an approval takes the
/// paused run over on host b, which runs on from the gate (the effect lands once, in
/// its data directory; one verdict, one take-over); a rejection ends the other run
/// cancelled with nothing below the gate run; and of approvals sent at once through
/// both hosts, exactly one wins (the other is refused, writing nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_of_a_run_host_a_paused_is_approved_or_rejected_through_host_b() {
    let Some((a, b)) = two_hosts(Setup::default()).await else {
        return;
    };
    let approved = a.create(GATED_EFFECT).await;
    let rejected = a.create(GATED_EFFECT).await;
    let raced = a.create(GATED_EFFECT).await;
    for id in [&approved, &rejected, &raced] {
        let show = a.ended(id).await;
        assert_eq!(show["state"], "paused", "{show:#}");
        assert_eq!(show["pause"]["node"], "ship", "{show:#}");
    }
    assert!(a.lines().is_empty() && b.lines().is_empty());

    let (status, body) = b
        .call(
            "POST",
            &format!("/api/runs/{approved}/gates/ship/approve"),
            Some(json!({ "note": "through b" })),
        )
        .await;
    assert_eq!(status, 202, "{body:#}");
    let show = b.ended(&approved).await;
    assert_eq!(show["state"], "completed", "{show:#}");
    assert_eq!(b.lines(), ["shipped"], "host b ran on from the gate");
    assert!(a.lines().is_empty(), "host a ran it too: {:?}", a.lines());
    let k = kinds(&a, &approved).await;
    assert_eq!(count(&k, "opened"), 2, "one take-over: {k:?}");
    assert_eq!(count(&k, "verdict"), 1, "{k:?}");

    let (status, body) = b
        .call(
            "POST",
            &format!("/api/runs/{rejected}/gates/ship/reject"),
            Some(json!({ "note": "not today" })),
        )
        .await;
    assert_eq!(status, 200, "{body:#}");
    let show = a.ended(&rejected).await;
    assert_eq!(show["state"], "cancelled", "{show:#}");
    assert_eq!(show["skipped"]["w"], "cancelled", "{show:#}");
    assert_eq!(
        b.lines(),
        ["shipped"],
        "nothing below the rejected gate ran"
    );

    let path = format!("/api/runs/{raced}/gates/ship/approve");
    let (via_a, via_b) = tokio::join!(a.call("POST", &path, None), b.call("POST", &path, None));
    let answers = [via_a, via_b];
    assert_eq!(
        answers.iter().filter(|(s, _)| *s == 202).count(),
        1,
        "{answers:#?}"
    );
    let (status, refused) = answers.iter().find(|(s, _)| *s != 202).unwrap();
    assert_eq!(*status, 409, "{answers:#?}");
    let e = refused["error"].as_str().unwrap_or_default();
    assert!(
        e.contains("is owned by host")
            || e.contains("this server drives it")
            || e.contains("is not waiting at gate")
            || e.contains("taken over")
            || e.contains("is completed"),
        "a loser says what won: {e}"
    );
    assert_eq!(a.ended(&raced).await["state"], "completed");
    let k = kinds(&b, &raced).await;
    assert_eq!(count(&k, "opened"), 2, "one take-over: {k:?}");
    assert_eq!(count(&k, "verdict"), 1, "{k:?}");
    let mut all = a.lines();
    all.extend(b.lines());
    assert_eq!(
        all,
        ["shipped", "shipped"],
        "each approved run's effect once"
    );
}

/// A resume sent to host b for a run host a drives live is refused (409) naming host a
/// as its owner, and writes nothing; host a drives it on undisturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_through_host_b_of_a_run_host_a_drives_is_refused_naming_host_a() {
    let Some((a, b)) = two_hosts(Setup::default()).await else {
        return;
    };
    let id = a.create(&waiting(&a)).await;
    until("the run started on host a", async || started(&a) == 1).await;
    let records = b.show(&id).await["records"].clone();
    let (status, body) = b
        .call("POST", &format!("/api/runs/{id}/resume"), None)
        .await;
    assert_eq!(status, 409, "{body:#}");
    let e = body["error"].as_str().unwrap_or_default();
    assert!(
        e.contains("is owned by host") && e.contains(&host_id(&a)),
        "{e}"
    );
    assert_eq!(b.show(&id).await["records"], records, "the refusal wrote");
    assert_eq!(a.host.driving(), std::slice::from_ref(&id));
    assert!(b.host.driving().is_empty());
    let (status, body) = b
        .call("POST", &format!("/api/runs/{id}/cancel"), None)
        .await;
    assert_eq!(status, 202, "{body:#}");
    assert_eq!(a.ended(&id).await["state"], "cancelled");
}

/// `GET /api/hosts` as `s` answers it.
async fn hosts(s: &TestServer) -> Value {
    let (status, body) = s.call("GET", "/api/hosts", None).await;
    assert_eq!(status, 200, "{body:#}");
    body
}

/// Host `id`'s row in a `GET /api/hosts` answer.
fn of(list: &Value, id: &str) -> Value {
    list["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["host_id"] == id)
        .unwrap_or_else(|| panic!("no host {id}: {list:#}"))
        .clone()
}

/// `GET /api/hosts` names the database (never a password) and the lease TTL and
/// renewal period; per host its last heartbeat (which advances while it lives) and the
/// ids of the runs it holds; and a host that died (its handle dropped without handing
/// anything back, as a killed process leaves it) is listed not alive once its
/// registration expired, holding nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hosts_list_names_the_database_the_lease_each_hosts_runs_and_a_dead_host() {
    let Some((a, b)) = two_hosts(Setup {
        lease_ttl_ms: Some(1000),
        ..Setup::default()
    })
    .await
    else {
        return;
    };
    let id = a.create(&waiting(&a)).await;
    until("the run started on host a", async || started(&a) == 1).await;

    // A third host that registers, then dies: nothing handed back, nothing renewed.
    let url = a.database().unwrap();
    tokio::task::spawn_blocking(move || {
        use heddle_store::Fleet as _;
        let ghost = heddle_store::PgStore::open_with(
            &url,
            heddle_store::PgOptions {
                host_id: Some("ghost".into()),
                lease_ttl: Duration::from_millis(1000),
                ..pg::pg_options()
            },
        )
        .unwrap();
        ghost.register("http://127.0.0.1:9").unwrap();
        ghost.forsake();
    })
    .await
    .unwrap();

    // Host a answers with its own lease (host b's is the default).
    let first = hosts(&a).await;
    assert_eq!(first["shared"], true);
    let store = first["store"].as_str().unwrap();
    assert!(store.starts_with("postgres://"), "{first:#}");
    assert!(store.contains("schema heddle"), "{first:#}");
    assert!(
        !store.contains('@'),
        "the database names no user or password: {store}"
    );
    assert_eq!(first["lease"]["ttl_ms"], 1000, "{first:#}");
    assert_eq!(first["lease"]["renew_every_ms"], 333, "{first:#}");
    let a_row = of(&first, &host_id(&a));
    assert_eq!(a_row["alive"], true, "{first:#}");
    assert_eq!(a_row["run_ids"], json!([id]), "{first:#}");
    assert_eq!(a_row["runs"], 1, "{first:#}");
    assert_eq!(of(&first, &host_id(&b))["run_ids"], json!([]), "{first:#}");
    let seen = a_row["last_seen_ms"].as_u64().unwrap();
    assert!(seen >= a_row["started_ms"].as_u64().unwrap(), "{a_row:#}");

    // Host a's heartbeat advances; the ghost's registration expires.
    until("host a renewed its registration", async || {
        of(&hosts(&b).await, &host_id(&a))["last_seen_ms"]
            .as_u64()
            .unwrap()
            > seen
    })
    .await;
    until("the dead host is listed not alive", async || {
        of(&hosts(&a).await, "ghost")["alive"] == false
    })
    .await;
    let last = hosts(&a).await;
    let ghost = of(&last, "ghost");
    assert_eq!(ghost["runs"], 0, "{last:#}");
    assert_eq!(ghost["run_ids"], json!([]), "{last:#}");
    assert_eq!(of(&last, &host_id(&a))["alive"], true, "{last:#}");
    assert_eq!(of(&last, &host_id(&b))["alive"], true, "{last:#}");

    let (status, body) = b
        .call("POST", &format!("/api/runs/{id}/cancel"), None)
        .await;
    assert_eq!(status, 202, "{body:#}");
    assert_eq!(a.ended(&id).await["state"], "cancelled");
}

/// A run queued while its host's slots are taken is claimed by an idle host that the
/// store wakes (`LISTEN/NOTIFY`): host b here looks for work by itself only once an
/// hour, so its claim can only come from the wake-up, never from its poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_host_is_woken_by_the_store_to_claim_a_queued_run() {
    if pg::skip_pg() {
        return;
    }
    let a = TestServer::with(Setup {
        store: Store::Shared,
        workers: Some(1),
        ..Setup::default()
    })
    .await;
    let b = a
        .second_host_with(Setup {
            claim_poll: Some(Duration::from_secs(3600)),
            ..Setup::default()
        })
        .await;
    let graph = waiting(&a);
    let first = a.create(&graph).await;
    until("the first run started", async || started(&a) == 1).await;
    let (status, body) = a
        .call(
            "POST",
            "/api/runs",
            Some(json!({ "graph": serde_json::from_str::<Value>(&graph).unwrap() })),
        )
        .await;
    assert_eq!(status, 201, "{body:#}");
    assert_eq!(body["state"], "queued", "{body:#}");
    let second = body["run_id"].as_str().unwrap().to_string();
    until("host b, woken, claimed the queued run", async || {
        b.host.driving() == [second.clone()]
    })
    .await;
    for (id, via) in [(&first, &b), (&second, &a)] {
        let (status, body) = via
            .call("POST", &format!("/api/runs/{id}/cancel"), None)
            .await;
        assert_eq!(status, 202, "{body:#}");
    }
    for id in [&first, &second] {
        assert_eq!(a.ended(id).await["state"], "cancelled");
    }
}
