//! The layers every answer goes through (`heddle_server::api::guard`): a panicking
//! handler is answered, and bodies are compressed for clients that take it, except the
//! event stream, which keeps its own shared compression.

use std::io::Read as _;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, header};
use axum::routing::get;
use tower::ServiceExt as _;

use crate::support::*;

fn gunzip(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body)
        .read_to_end(&mut out)
        .expect("a whole gzip stream");
    out
}

async fn boom() -> &'static str {
    panic!("a bug in a handler")
}

#[tokio::test]
async fn a_handler_that_panics_is_answered_500_and_the_server_goes_on() {
    let app = heddle_server::api::guard(
        Router::new()
            .route("/boom", get(boom))
            .route("/fine", get(|| async { "fine" })),
    );
    let resp = app
        .clone()
        .oneshot(Request::get("/boom").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 500);
    assert!(
        resp.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    let body: serde_json::Value = serde_json::from_slice(&body_bytes(resp).await).unwrap();
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("a bug"), "{body}");
    assert!(
        !error.contains("a bug in a handler"),
        "the panic's text stays in the log"
    );
    let resp = app
        .oneshot(Request::get("/fine").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_answers_and_the_viewers_files_are_compressed_for_clients_that_take_it() {
    let s = TestServer::start().await;
    let id = s.create(CHAIN).await;
    assert_eq!(s.ended(&id).await["state"], "completed");
    let plain = s.show(&id).await;

    let req = s
        .request("GET", &format!("/api/runs/{id}"))
        .header(header::ACCEPT_ENCODING, "gzip")
        .body(Body::empty())
        .unwrap();
    let resp = s.send(req).await;
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()[header::CONTENT_ENCODING], "gzip");
    let body = body_bytes(resp).await;
    let shown: serde_json::Value = serde_json::from_slice(&gunzip(&body)).unwrap();
    assert_eq!(shown, plain);

    for (path, coding) in [("/viewer/app.js", "zstd"), ("/", "gzip")] {
        let get = |coding: Option<&str>| {
            let mut r = Request::get(path);
            if let Some(c) = coding {
                r = r.header(header::ACCEPT_ENCODING, c);
            }
            r.body(Body::empty()).unwrap()
        };
        let identity = s.send(get(None)).await;
        assert!(identity.headers().get(header::CONTENT_ENCODING).is_none());
        let identity = body_bytes(identity).await;
        let resp = s.send(get(Some(coding))).await;
        assert_eq!(resp.headers()[header::CONTENT_ENCODING], coding, "{path}");
        let body = body_bytes(resp).await;
        let decoded = match coding {
            "zstd" => zstd::stream::decode_all(&body[..]).unwrap(),
            _ => gunzip(&body),
        };
        assert_eq!(decoded, identity, "{path}");
        assert!(body.len() < identity.len(), "{path}: compressed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_keeps_its_own_compression() {
    let s = TestServer::start().await;
    let id = s.create(CHAIN).await;
    let plain = s.stream(&id, None).await;
    let stream = |coding: &str| {
        s.request("GET", &format!("/api/runs/{id}/events"))
            .header(header::ACCEPT_ENCODING, coding)
            .body(Body::empty())
            .unwrap()
    };
    // A client that takes no coding gets the text as is (the layer leaves SSE alone).
    let resp = s.send(stream("identity")).await;
    assert!(resp.headers().get(header::CONTENT_ENCODING).is_none());
    assert_eq!(body_bytes(resp).await, plain.as_bytes());
    // One that takes gzip gets the feed's one gzip member, not the layer's second one
    // around it.
    let resp = s.send(stream("gzip")).await;
    assert_eq!(resp.headers()[header::CONTENT_ENCODING], "gzip");
    assert_eq!(
        resp.headers()
            .get_all(header::CONTENT_ENCODING)
            .iter()
            .count(),
        1
    );
    let text = gunzip(&body_bytes(resp).await);
    assert_eq!(String::from_utf8(text).unwrap(), plain);
}
