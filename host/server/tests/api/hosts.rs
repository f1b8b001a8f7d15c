//! Two hosts on one database, in this process: any host answers for any run. A run one
//! host drives is listed, shown, streamed and cancelled through the other; its
//! escalation is listed and answered through the other (relayed through the store); a
//! run created while every worker slot of its host is taken is queued and claimed by the
//! host that has one, and one whose take failed is queued again and taken later;
//! `GET /api/hosts` lists both.

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
