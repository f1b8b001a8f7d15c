//! A value over the inline limit: the event stream and the run as the API shows it
//! carry the reference (with the URL its bytes are fetched from, in the shown run), the
//! artifact route serves the bytes, a run whose values are larger than the answers the
//! server masks is still shown, and a value whose artifact is damaged is named.

use serde_json::Value;

use crate::support::*;

crate::on_both_stores!(
    the_api_shows_the_reference_and_the_artifact_route_serves_the_value,
    a_run_whose_values_exceed_what_the_server_masks_is_shown_and_an_answer_over_it_is_an_error,
    an_unreadable_artifact_is_named_by_the_api_and_by_a_whole_read,
    a_large_artifact_downloads_byte_identical_in_pieces,
    a_damaged_artifact_never_reaches_a_client_as_a_complete_answer,
);

const BIG: usize = 20_000;

/// A code node whose result is a line of `BIG` x's: over the 4 KiB inline limit set.
fn big_graph() -> String {
    let code =
        serde_json::to_string(&format!("head -c {BIG} /dev/zero | tr '\\0' x; echo")).unwrap();
    format!(
        r#"{{"format": "heddle.graph", "version": 1,
  "nodes": [
    {{"id": "big", "type": "code.bash", "properties": {{"code": {code}, "mode": "subprocess"}}}},
    {{"id": "out", "type": "heddle.output"}}],
  "edges": [{{"source": "big", "sourceHandle": "result", "target": "out", "targetHandle": "value"}}]}}"#
    )
}

async fn server(store: Store) -> TestServer {
    bounded(store, None).await
}

/// [`server`] masking JSON answers up to `max_json_bytes`.
async fn bounded(store: Store, max_json_bytes: Option<usize>) -> TestServer {
    TestServer::with(Setup {
        store,
        config: "inline_output_bytes = 4096\n",
        max_json_bytes,
        ..Setup::default()
    })
    .await
}

/// The completed record of `big` on run `id`'s stream, and the artifact's digest.
async fn big_result(s: &TestServer, id: &str) -> (Vec<(u64, String, Value)>, String) {
    let events = s.events(id, None).await;
    let (_, _, data) = events
        .iter()
        .find(|(_, kind, data)| kind == "completed" && data["occurrence"]["node"] == "big")
        .expect("big's result is on the stream");
    let reference = &data["outputs"][0][1]["$artifact"];
    assert_eq!(reference["size"], BIG + 2, "{data:#}");
    let sha = reference["sha256"].as_str().unwrap().to_string();
    assert_eq!(sha.len(), 64);
    (events, sha)
}

/// Every artifact reference in a shown run's `occurrences`: (sha256, size, url).
fn references(show: &Value) -> Vec<(String, u64, String)> {
    fn walk(v: &Value, out: &mut Vec<(String, u64, String)>) {
        match v {
            Value::Object(m) => {
                if let Some(r) = m.get("$artifact").filter(|_| m.len() == 1) {
                    out.push((
                        r["sha256"].as_str().unwrap().to_string(),
                        r["size"].as_u64().unwrap(),
                        r["url"].as_str().expect("a url").to_string(),
                    ));
                }
                m.values().for_each(|x| walk(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&show["occurrences"], &mut out);
    out
}

async fn the_api_shows_the_reference_and_the_artifact_route_serves_the_value(store: Store) {
    let s = server(store).await;
    let big = "x".repeat(BIG);
    let id = s.create(&big_graph()).await;
    let show = s.ended(&id).await;
    assert_eq!(show["state"], "completed", "{:.300}", show.to_string());
    let (events, sha) = big_result(&s, &id).await;
    assert!(
        !events.iter().any(|(_, _, d)| d.to_string().contains(&big)),
        "no event carries the value itself"
    );
    assert!(!show.to_string().contains(&big), "nor does the shown run");
    // big's result and what `out` received: one artifact, referred to twice.
    let refs = references(&show);
    assert!(refs.len() >= 2, "{refs:?}");
    for (digest, size, url) in &refs {
        assert_eq!(digest, &sha);
        assert_eq!(*size, BIG as u64 + 2);
        assert_eq!(url, &format!("/api/runs/{id}/artifacts/{sha}"));
    }
    // The viewer fetches the value from there when it is shown.
    let resp = s
        .send(
            s.request("GET", &refs[0].2)
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(resp.status().as_u16(), 200);
    let bytes = body_bytes(resp).await;
    assert_eq!(
        serde_json::from_slice::<Value>(&bytes).unwrap(),
        big.as_str()
    );
}

/// A run whose values add up to more than the JSON answers the server masks (reading
/// them whole) is shown all the same: it refers to them. An answer that is over the
/// bound anyway is a 500 with a JSON error saying so, never a 200 with an empty body
/// (before: the masking layer dropped the body and kept the 200, and the viewer showed
/// "Cannot read properties of null").
async fn a_run_whose_values_exceed_what_the_server_masks_is_shown_and_an_answer_over_it_is_an_error(
    store: Store,
) {
    // Two values of BIG bytes (big's result, what `out` received): over the bound.
    let s = bounded(store.clone(), Some(BIG + BIG / 2)).await;
    let id = s.create(&big_graph()).await;
    let show = s.ended(&id).await;
    assert_eq!(show["state"], "completed", "{show:#}");
    assert!(references(&show).len() >= 2, "{show:#}");
    assert!(show["document"]["nodes"].is_array(), "{show:#}");

    // A bound the shown run itself is over.
    let tiny = 256;
    let s = bounded(store, Some(tiny)).await;
    let id = s.create(&big_graph()).await;
    let _ = s.stream(&id, None).await;
    let (status, body) = s.call("GET", &format!("/api/runs/{id}"), None).await;
    assert_eq!(status, 500, "{body:#}");
    let error = body["error"].as_str().expect("a JSON error");
    assert!(
        error.contains(&tiny.to_string()) && error.contains("mask"),
        "{error}"
    );
}

/// A value whose artifact was corrupted or deleted on disk: `GET /api/runs/ID` still
/// shows the run (200) with a marker where the value was and the value listed under
/// `unreadable` (node, output, digest, what is wrong); reading the run whole (what
/// `heddle runs show` does) refuses with `TERMINAL_ARTIFACT`, naming the same.
async fn an_unreadable_artifact_is_named_by_the_api_and_by_a_whole_read(store: Store) {
    let s = server(store).await;
    let id = s.create(&big_graph()).await;
    assert_eq!(s.ended(&id).await["state"], "completed");
    let (_, sha) = big_result(&s, &id).await;
    for (sqlite, postgres, problem) in [
        (
            "UPDATE artifact_pieces SET bytes = x'00' WHERE sha256 = $SHA",
            "UPDATE artifact_pieces SET bytes = '\\x00'::bytea WHERE sha256 = $SHA",
            "corrupt",
        ),
        (
            "DELETE FROM artifacts WHERE sha256 = $SHA",
            "DELETE FROM artifacts WHERE sha256 = $SHA",
            "missing",
        ),
    ] {
        s.tamper(&sha, sqlite, postgres).await;
        let (status, show) = s.call("GET", &format!("/api/runs/{id}"), None).await;
        assert_eq!(status, 200, "{show:#}");
        assert_eq!(show["state"], "completed", "{show:#}");
        // Every value that pointed at it: big's result and what `out` received.
        let u = show["unreadable"].as_array().unwrap();
        assert!(!u.is_empty(), "{show:#}");
        assert!(
            u.iter()
                .any(|u| u["occurrence"]["node"] == "big" && u["handle"] == "result"),
            "{u:#?}"
        );
        for u in u {
            assert_eq!(u["sha256"], sha.as_str(), "{u:#}");
            assert_eq!(u["problem"], problem, "{u:#}");
            let error = u["error"].as_str().unwrap();
            for part in [&id, &sha, problem, "TERMINAL_ARTIFACT"] {
                assert!(error.contains(part), "{part} not in {error}");
            }
        }
        assert!(
            show["occurrences"].to_string().contains("$unreadable"),
            "a marker where the value was"
        );
        // The artifact's own route: gone or damaged is not a 200.
        let (status, body) = s
            .call("GET", &format!("/api/runs/{id}/artifacts/{sha}"), None)
            .await;
        assert_ne!(status, 200, "{body:#}");
    }
    let store = s.store();
    let Err(e) = heddle_store::session::inspect(&*store, &id) else {
        panic!("a whole read refuses");
    };
    let e = heddle_core::text::error_chain(&e);
    for part in ["node big, output `result`", "missing", "TERMINAL_ARTIFACT"] {
        assert!(e.contains(part), "{part} not in {e}");
    }
}

/// A large artifact (bytes that do not compress, so a compressed answer is as large)
/// comes back byte for byte, as is and gzip-compressed, in pieces of at most
/// `ARTIFACT_CHUNK` with its length declared up front.
async fn a_large_artifact_downloads_byte_identical_in_pieces(store: Store) {
    use http_body_util::BodyExt as _;
    let s = server(store).await;
    let id = s.create(CHAIN).await;
    assert_eq!(s.ended(&id).await["state"], "completed");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let bytes: Vec<u8> = (0..(5 << 20) + 17)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let stored = s
        .host
        .store
        .put_artifact(&id, Some("big"), &bytes, &Default::default())
        .unwrap();
    let url = format!("/api/runs/{id}/artifacts/{}", stored.sha256);

    let resp = s
        .send(
            s.request("GET", &url)
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.headers()[axum::http::header::CONTENT_LENGTH],
        bytes.len().to_string()
    );
    let mut body = resp.into_body();
    let (mut got, mut pieces) = (Vec::new(), 0);
    while let Some(frame) = body.frame().await {
        let data = frame.unwrap().into_data().unwrap();
        assert!(
            data.len() <= heddle_server::api::ARTIFACT_CHUNK,
            "{}",
            data.len()
        );
        got.extend_from_slice(&data);
        pieces += 1;
    }
    assert!(
        got == bytes,
        "byte-identical ({} of {} bytes)",
        got.len(),
        bytes.len()
    );
    assert!(
        pieces > bytes.len() / heddle_server::api::ARTIFACT_CHUNK,
        "{pieces}"
    );

    let req = s
        .request("GET", &url)
        .header(axum::http::header::ACCEPT_ENCODING, "gzip")
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = s.send(req).await;
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()[axum::http::header::CONTENT_ENCODING], "gzip");
    let mut out = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(&body_bytes(resp).await[..]),
        &mut out,
    )
    .unwrap();
    assert!(out == bytes, "byte-identical through gzip");
}

/// An artifact streamed from the store whose bytes were changed on disk (same length,
/// so nothing shows until they are read): the answer stops before its declared length,
/// the last piece withheld, so no client reads it as a complete 200. A one-piece
/// artifact damaged so is refused with a JSON error before the answer starts.
async fn a_damaged_artifact_never_reaches_a_client_as_a_complete_answer(store: Store) {
    use heddle_store::artifacts::PIECE_BYTES;
    use http_body_util::BodyExt as _;
    let s = server(store).await;
    let id = s.create(CHAIN).await;
    assert_eq!(s.ended(&id).await["state"], "completed");
    let bytes: Vec<u8> = (0..6 * PIECE_BYTES + 3).map(|i| (i % 239) as u8).collect();
    let big = s
        .host
        .store
        .put_artifact(&id, Some("big"), &bytes, &Default::default())
        .unwrap();
    let small = s
        .host
        .store
        .put_artifact(&id, Some("small"), b"0123456789", &Default::default())
        .unwrap();
    s.tamper(
        &big.sha256,
        &format!("UPDATE artifact_pieces SET bytes = zeroblob({PIECE_BYTES}) WHERE sha256 = $SHA AND n = 4"),
        &format!("UPDATE artifact_pieces SET bytes = decode(repeat('00', {PIECE_BYTES}), 'hex') WHERE sha256 = $SHA AND n = 4"),
    )
    .await;
    s.tamper(
        &small.sha256,
        "UPDATE artifact_pieces SET bytes = CAST('012345678:' AS BLOB) WHERE sha256 = $SHA",
        "UPDATE artifact_pieces SET bytes = '012345678:'::bytea WHERE sha256 = $SHA",
    )
    .await;

    let get = |sha: &str| {
        s.request("GET", &format!("/api/runs/{id}/artifacts/{sha}"))
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let resp = s.send(get(&big.sha256)).await;
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.headers()[axum::http::header::CONTENT_LENGTH],
        bytes.len().to_string()
    );
    let mut body = resp.into_body();
    let (mut got, mut broke) = (0, false);
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => got += f.into_data().map(|d| d.len()).unwrap_or(0),
            Err(_) => {
                broke = true;
                break;
            }
        }
    }
    assert!(broke, "the body ended as if whole");
    assert!(got < bytes.len(), "{got} of {} bytes sent", bytes.len());
    assert!(got <= 6 * PIECE_BYTES, "the last piece went out");

    let (status, body) = s
        .call(
            "GET",
            &format!("/api/runs/{id}/artifacts/{}", small.sha256),
            None,
        )
        .await;
    assert_eq!(status, 500, "{body:#}");
    let e = body["error"].as_str().unwrap();
    assert!(
        e.contains("corrupt") && e.contains("TERMINAL_ARTIFACT"),
        "{e}"
    );
}
