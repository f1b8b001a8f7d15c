//! Every error is JSON and the token comes first: the router's own 404 and 405, an
//! extractor's rejection (a run id that is not UTF-8) and a body declared over the
//! limit answer `{"error": ...}` like every handler's refusal; without the token, any
//! path but the viewer's files is 401, whether or not a route has it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use axum::body::Body;
use axum::http::{Request, header};
use serde_json::Value;

use crate::support::*;

/// The status, the headers and the body (which must be JSON with an `error`) of `req`.
async fn refusal(s: &TestServer, req: Request<Body>) -> (u16, axum::http::HeaderMap, String) {
    let resp = s.send(req).await;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = body_bytes(resp).await;
    assert_eq!(
        content_type.as_deref(),
        Some("application/json"),
        "{status}: {}",
        String::from_utf8_lossy(&bytes)
    );
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    let error = body["error"]
        .as_str()
        .expect("an error message")
        .to_string();
    assert!(!error.is_empty());
    (status, headers, error)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routers_own_errors_and_rejections_have_json_bodies() {
    let s = TestServer::start().await;
    // A method the path does not take: 405, saying which it takes.
    let req = s
        .request("DELETE", "/api/runs")
        .body(Body::empty())
        .unwrap();
    let (status, headers, error) = refusal(&s, req).await;
    assert_eq!(status, 405, "{error}");
    assert!(headers.contains_key(header::ALLOW), "{headers:?}");
    for part in ["DELETE /api/runs", "method not allowed", "GET", "POST"] {
        assert!(error.contains(part), "{part} not in {error}");
    }
    // A path no route has.
    for path in ["/api/nope", "/api/runs/r1/nope", "/api", "/favicon.ico"] {
        let req = s.request("GET", path).body(Body::empty()).unwrap();
        let (status, _, error) = refusal(&s, req).await;
        assert_eq!(status, 404, "{path}: {error}");
        assert!(error.contains(path), "{error}");
    }
    // A run id that is not UTF-8 (an extractor's rejection, text/plain before).
    for path in ["/api/runs/%FF", "/api/runs/%C3%28/events"] {
        let req = s.request("GET", path).body(Body::empty()).unwrap();
        let (status, _, error) = refusal(&s, req).await;
        assert_eq!(status, 400, "{path}: {error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_every_api_path_is_401_before_it_is_routed() {
    let s = TestServer::start().await;
    for (method, path) in [
        ("GET", "/api/nope"),
        ("GET", "/api/runs"),
        ("DELETE", "/api/runs"),
        ("GET", "/api/runs/%FF"),
        ("POST", "/api/runs/r1/gates/g/approve"),
    ] {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap();
        let (status, headers, error) = refusal(&s, req).await;
        assert_eq!(status, 401, "{method} {path}: {error}");
        assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer");
    }
    // The viewer's files hold no data and need none.
    let resp = s
        .send(Request::get("/viewer/app.js").body(Body::empty()).unwrap())
        .await;
    assert_eq!(resp.status().as_u16(), 200);
}

/// A client that declares a body over the limit is answered 413 from its headers: the
/// body is never read (here, never polled: before, the server waited for it, and a
/// client that never sent it held the connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_declared_over_the_limit_is_refused_before_it_is_read() {
    let s = TestServer::start().await;
    let over = heddle_server::api::MAX_BODY_BYTES + 1;
    for (method, path) in [
        ("POST", "/api/runs"),
        ("POST", "/api/runs/r1/resume"),
        ("GET", "/api/runs"),
    ] {
        let polled = Arc::new(AtomicBool::new(false));
        let p = polled.clone();
        let body = Body::from_stream(futures_util::stream::poll_fn(move |_| {
            p.store(true, Ordering::SeqCst);
            Poll::Ready(Some(Err::<bytes::Bytes, _>(std::io::Error::other(
                "the body was read",
            ))))
        }));
        let req = s
            .request(method, path)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_LENGTH, over.to_string())
            .body(body)
            .unwrap();
        let (status, _, error) = refusal(&s, req).await;
        assert_eq!(status, 413, "{method} {path}: {error}");
        assert!(error.contains(&over.to_string()), "{error}");
        assert!(
            !polled.load(Ordering::SeqCst),
            "{method} {path}: the body was read"
        );
    }
    // Nothing was created.
    assert!(s.runs().await.is_empty());
}

/// A token file with fewer digits than a generated token (a hand-written `1234`) is
/// refused, naming the file; so is one that is not hex. A generated one is taken back.
#[test]
fn a_token_file_shorter_than_a_generated_token_is_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("serve.token");
    let (made, new) = heddle_server::token::load_or_create(&path).unwrap();
    assert!(new);
    assert_eq!(made.as_str().len(), heddle_server::token::TOKEN_HEX_DIGITS);
    let (again, new) = heddle_server::token::load_or_create(&path).unwrap();
    assert!(!new);
    assert_eq!(again.as_str(), made.as_str());
    let short = &made.as_str()[..heddle_server::token::TOKEN_HEX_DIGITS - 1];
    for (text, says) in [
        ("1234\n", "4 hex digits"),
        (short, "63 hex digits"),
        ("zz\n", "not one line of hex"),
    ] {
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let Err(e) = heddle_server::token::load_or_create(&path) else {
            panic!("{text:?} was taken as a token");
        };
        assert!(e.is_bad_file());
        let e = e.to_string();
        assert!(e.contains("serve.token") && e.contains(says), "{e}");
    }
}
