//! A run's event stream under load: subscribers joining late and subscribers too slow
//! to keep up, against a real `heddle serve` over real sockets. Whenever and however a
//! subscriber reads, it gets the run's log exactly (each record once, in order), and
//! nobody waits for it: not the run, not the other subscribers.

mod support;

use std::io::{Read as _, Write as _};
use std::time::Duration;

use serde_json::Value;
use support::serve::{Api, gunzip, parse_sse, rt, split_response, unzstd};
use support::store::{Backend, StoreDir};

// On a store file and on PostgreSQL (a host of a shared database, whose subscribers
// read the history from the database).
crate::both!(
    subscribers_joining_late_get_the_history_in_order_then_the_live_records_once,
    compressed_and_plain_subscribers_of_one_run_get_the_same_records_resuming_anywhere,
);

/// Two fan-outs: `a` over `/data/a.txt`, there from the start, and `b` over
/// `/data/b.txt`, missing at first, so the run waits for a person's retry with `a`'s
/// records already in its log.
const TWO: &str = r#"{"format": "heddle.graph", "version": 1,
  "nodes": [
    {"id": "pa", "type": "heddle.constant", "properties": {"value": "/data/a.txt"}},
    {"id": "ra", "type": "files.read_text"},
    {"id": "sa", "type": "std.text.split", "properties": {"sep": "\n"}},
    {"id": "ea", "type": "heddle.foreach"},
    {"id": "ua", "type": "std.text.case", "properties": {"mode": "upper"}},
    {"id": "ca", "type": "heddle.collect"},
    {"id": "a", "type": "heddle.output"},
    {"id": "pb", "type": "heddle.constant", "properties": {"value": "/data/b.txt"}},
    {"id": "rb", "type": "files.read_text"},
    {"id": "sb", "type": "std.text.split", "properties": {"sep": "\n"}},
    {"id": "eb", "type": "heddle.foreach"},
    {"id": "ub", "type": "std.text.case", "properties": {"mode": "upper"}},
    {"id": "cb", "type": "heddle.collect"},
    {"id": "b", "type": "heddle.output"}],
  "edges": [
    {"source": "pa", "sourceHandle": "value", "target": "ra", "targetHandle": "path"},
    {"source": "ra", "sourceHandle": "text", "target": "sa", "targetHandle": "text"},
    {"source": "sa", "sourceHandle": "parts", "target": "ea", "targetHandle": "list"},
    {"source": "ea", "sourceHandle": "item", "target": "ua", "targetHandle": "text"},
    {"source": "ua", "sourceHandle": "text", "target": "ca", "targetHandle": "item"},
    {"source": "ca", "sourceHandle": "list", "target": "a", "targetHandle": "value"},
    {"source": "pb", "sourceHandle": "value", "target": "rb", "targetHandle": "path"},
    {"source": "rb", "sourceHandle": "text", "target": "sb", "targetHandle": "text"},
    {"source": "sb", "sourceHandle": "parts", "target": "eb", "targetHandle": "list"},
    {"source": "eb", "sourceHandle": "item", "target": "ub", "targetHandle": "text"},
    {"source": "ub", "sourceHandle": "text", "target": "cb", "targetHandle": "item"},
    {"source": "cb", "sourceHandle": "list", "target": "b", "targetHandle": "value"}]}"#;

fn lines(n: usize, width: usize) -> String {
    (0..n)
        .map(|i| format!("{i:0width$}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A stream opened now and read to its end later: its response head has arrived, so
/// the server counts it as a subscriber from here on.
async fn open(api: &Api, id: &str, last_event_id: Option<u64>) -> reqwest::Response {
    open_with(api, id, last_event_id, None).await
}

/// [`open`] with an `Accept-Encoding`.
async fn open_with(
    api: &Api,
    id: &str,
    last_event_id: Option<u64>,
    accept: Option<&str>,
) -> reqwest::Response {
    let mut r = api
        .http
        .get(format!("{}/api/runs/{id}/events", api.url))
        .bearer_auth(&api.token);
    if let Some(l) = last_event_id {
        r = r.header("Last-Event-ID", l.to_string());
    }
    if let Some(a) = accept {
        r = r.header("Accept-Encoding", a);
    }
    let resp = r.send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    resp
}

async fn body(mut resp: reqwest::Response) -> Vec<u8> {
    let mut bytes = Vec::new();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        bytes.extend_from_slice(&chunk);
    }
    bytes
}

async fn read_to_end(resp: reqwest::Response) -> Vec<(u64, String, Value)> {
    parse_sse(std::str::from_utf8(&body(resp).await).unwrap())
}

/// A compressed stream's text (this client does not decode by itself: it gets the bytes
/// as sent), checked by a strict decoder for the coding `want`.
async fn compressed_text(resp: reqwest::Response, want: &str) -> String {
    let encoding = resp.headers().get("content-encoding").cloned();
    assert_eq!(encoding.unwrap(), want);
    let bytes = body(resp).await;
    match want {
        "gzip" => gunzip(&bytes),
        "zstd" => unzstd(&bytes),
        other => panic!("no decoder for {other}"),
    }
}

fn ids(events: &[(u64, String, Value)]) -> Vec<u64> {
    events.iter().map(|e| e.0).collect()
}

fn subscribers_joining_late_get_the_history_in_order_then_the_live_records_once(b: Backend) {
    let dir = StoreDir::on(b);
    std::fs::write(dir.path().join("data/a.txt"), lines(300, 8)).unwrap();
    let server = dir.serve_with(&["--supervise", "interactive"], &[]);
    let api = Api::of(&server);
    rt().block_on(async {
        let id = api.create(TWO).await;
        let eid = api.first_escalation(&id).await;
        // Let `a` finish first: its records are history for everyone who joins now.
        loop {
            let show = api.show(&id).await;
            let ua_done = show["occurrences"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|o| o["occurrence"]["node"] == "ua" && o["result"].is_object())
                .count();
            if ua_done == 300 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let before = api.show(&id).await["records"].as_u64().unwrap();
        // A page that came and went: the run's history may be dropped with it.
        let mut gone = open(&api, &id, None).await;
        assert!(gone.chunk().await.unwrap().is_some());
        drop(gone);
        // The first subscriber of the run, and one resuming in the middle of history.
        let first = open(&api, &id, None).await;
        let middle = open(&api, &id, Some(before / 2)).await;
        std::fs::write(dir.path().join("data/b.txt"), lines(300, 8)).unwrap();
        api.retry(&id, &eid).await;
        // One more once the run went on: history and live records meet again.
        let late = open(&api, &id, None).await;
        let (first, middle, late) =
            tokio::join!(read_to_end(first), read_to_end(middle), read_to_end(late));
        // The whole log, as a client reading the finished run from the store gets it.
        let show = api.show(&id).await;
        assert_eq!(show["state"], "completed", "{show:#}");
        let log = api.events(&id, None).await;
        let n = show["records"].as_u64().unwrap();
        assert!(n >= before + 300, "b's records came after the joins: {n}");
        assert_eq!(ids(&log), (0..n).collect::<Vec<_>>());
        assert_eq!(log.last().unwrap().1, "finished");
        assert_eq!(first, log, "the first subscriber got the log exactly");
        assert_eq!(
            late, log,
            "a subscriber joining mid-run got the log exactly"
        );
        assert_eq!(
            middle,
            log[before as usize / 2 + 1..],
            "a subscriber resuming after record {} got the rest exactly",
            before / 2
        );
    });
}

fn compressed_and_plain_subscribers_of_one_run_get_the_same_records_resuming_anywhere(b: Backend) {
    let dir = StoreDir::on(b);
    std::fs::write(dir.path().join("data/a.txt"), lines(300, 8)).unwrap();
    let server = dir.serve_with(&["--supervise", "interactive"], &[]);
    let api = Api::of(&server);
    rt().block_on(async {
        let id = api.create(TWO).await;
        let eid = api.first_escalation(&id).await;
        let before = api.show(&id).await["records"].as_u64().unwrap();
        let gzip = open_with(&api, &id, None, Some("gzip")).await;
        // What Chromium sends.
        let zstd = open_with(&api, &id, None, Some("gzip, deflate, br, zstd")).await;
        let plain = open_with(&api, &id, None, Some("gzip;q=0, identity")).await;
        assert!(plain.headers().get("content-encoding").is_none());
        // Resuming in the middle of the history the feed read as one batch: its
        // compressed stream must begin at that record.
        let middle = open_with(&api, &id, Some(before / 2), Some("deflate, gzip, br")).await;
        let middle_zstd = open_with(&api, &id, Some(before / 2), Some("zstd")).await;
        std::fs::write(dir.path().join("data/b.txt"), lines(300, 8)).unwrap();
        api.retry(&id, &eid).await;
        let late = open_with(&api, &id, None, Some("*")).await;
        let (gzip, zstd, plain, middle, middle_zstd, late) = tokio::join!(
            compressed_text(gzip, "gzip"),
            compressed_text(zstd, "zstd"),
            read_to_end(plain),
            compressed_text(middle, "gzip"),
            compressed_text(middle_zstd, "zstd"),
            compressed_text(late, "zstd")
        );
        let log = api.events(&id, None).await;
        assert_eq!(log.last().unwrap().1, "finished");
        assert_eq!(plain, log);
        assert_eq!(
            parse_sse(&gzip),
            log,
            "the gzip subscriber got the log exactly"
        );
        assert_eq!(
            parse_sse(&zstd),
            log,
            "the zstd subscriber got the log exactly"
        );
        assert_eq!(parse_sse(&late), log);
        for middle in [&middle, &middle_zstd] {
            assert_eq!(parse_sse(middle), log[before as usize / 2 + 1..]);
            assert!(middle.starts_with("event: escalation\n"), "{middle:.300}");
        }
        // The escalation pending when they joined reached them compressed too.
        for text in [&gzip, &zstd] {
            assert!(text.contains("event: escalation\ndata: {"), "{text:.300}");
        }
    });
}

/// Bytes the socket of `(local port, remote port)` holds in the given queue (this
/// process's view of the kernel's `/proc/net/tcp`: `tx_queue:rx_queue`, hex).
fn queued(local: u16, remote: u16, tx: bool) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let port = |a: &str| u16::from_str_radix(a.rsplit(':').next().unwrap(), 16).unwrap();
        if port(f[1]) != local || port(f[2]) != remote {
            return None;
        }
        let (txq, rxq) = f[4].split_once(':').unwrap();
        u64::from_str_radix(if tx { txq } else { rxq }, 16).ok()
    })
}

#[test]
fn a_subscriber_that_stops_reading_holds_up_neither_the_run_nor_the_others() {
    let dir = StoreDir::new();
    std::fs::write(dir.path().join("data/a.txt"), lines(1, 8)).unwrap();
    let server = dir.serve_with(&["--supervise", "interactive"], &[]);
    let api = Api::of(&server);
    let rt = rt();
    let id = rt.block_on(api.create(TWO));
    let eid = rt.block_on(api.first_escalation(&id));
    // A subscriber that reads its response head and then nothing: a small receive
    // buffer, so the server's writes to it stall as soon as its queues are full.
    let addr: std::net::SocketAddr = api.url.trim_start_matches("http://").parse().unwrap();
    let mut slow = socket_with_small_receive_buffer(addr);
    write!(
        slow,
        "GET /api/runs/{id}/events HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {}\r\nconnection: close\r\n\r\n",
        api.token
    )
    .unwrap();
    let mut head = [0u8; 12];
    slow.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let slow_port = slow.local_addr().unwrap().port();
    rt.block_on(async {
        let other = open(&api, &id, None).await;
        // Far more than the kernel buffers between the server and the slow subscriber.
        std::fs::write(dir.path().join("data/b.txt"), lines(24_000, 36)).unwrap();
        api.retry(&id, &eid).await;
        let other = read_to_end(other).await;
        let show = api.show(&id).await;
        assert_eq!(show["state"], "completed", "{show:#}");
        assert_eq!(other.last().unwrap().1, "finished");
        // The slow subscriber really is behind: the server holds bytes it cannot send
        // it, and it has not read past its response head.
        let stuck = queued(addr.port(), slow_port, true).unwrap();
        assert!(
            stuck > 0,
            "the server's queue to the slow subscriber is empty"
        );
        // Now it reads: everything, in order, once.
        let mut rest = Vec::new();
        slow.read_to_end(&mut rest).unwrap();
        let (_, body) = split_response(&rest);
        let log = api.events(&id, None).await;
        assert_eq!(parse_sse(std::str::from_utf8(&body).unwrap()), log);
        assert_eq!(other, log);
    });
}

fn socket_with_small_receive_buffer(addr: std::net::SocketAddr) -> std::net::TcpStream {
    // SAFETY: plain socket calls on a descriptor this function owns until it is wrapped.
    unsafe {
        use std::os::fd::FromRawFd as _;
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let size: libc::c_int = 4096;
        let r = libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &size as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        assert_eq!(r, 0);
        let s = std::net::TcpStream::from_raw_fd(fd);
        let std::net::SocketAddr::V4(v4) = addr else {
            panic!("the server listens on IPv4 loopback")
        };
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(v4.ip().octets()),
            },
            sin_zero: [0; 8],
        };
        let r = libc::connect(
            fd,
            &sin as *const _ as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        s
    }
}
