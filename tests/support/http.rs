//! A plain HTTP server on loopback for the CLI's network tests: it counts the requests it
//! receives (the effect a test asserts on, where it lands) and answers each one, at once
//! or once the test releases it (a request "in flight" while a process is killed).

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One request the server received.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

#[derive(Default)]
struct State {
    requests: Vec<Request>,
    released: bool,
}

pub struct HttpServer {
    pub port: u16,
    state: Arc<(Mutex<State>, Condvar)>,
}

impl HttpServer {
    /// Answers every request with `status` and the JSON `reply`; with `hold`, only once
    /// [`HttpServer::release`] was called.
    pub fn start(status: u16, reply: &str, hold: bool) -> HttpServer {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new((
            Mutex::new(State {
                released: !hold,
                ..State::default()
            }),
            Condvar::new(),
        ));
        let reply = reply.to_string();
        {
            let state = state.clone();
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { return };
                    let (state, reply) = (state.clone(), reply.clone());
                    std::thread::spawn(move || serve(stream, &state, status, &reply));
                }
            });
        }
        HttpServer { port, state }
    }

    pub fn requests(&self) -> Vec<Request> {
        self.state.0.lock().unwrap().requests.clone()
    }

    pub fn count(&self) -> usize {
        self.state.0.lock().unwrap().requests.len()
    }

    /// Waits until `n` requests have arrived (two minutes at most: a hang fails the test).
    pub fn wait_for(&self, n: usize) {
        let (lock, cv) = &*self.state;
        let end = Instant::now() + Duration::from_secs(120);
        let mut s = lock.lock().unwrap();
        while s.requests.len() < n {
            let left = end.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "the server received {} of {n} requests",
                s.requests.len()
            );
            s = cv.wait_timeout(s, left).unwrap().0;
        }
    }

    /// Lets held requests (and every later one) be answered.
    pub fn release(&self) {
        let (lock, cv) = &*self.state;
        lock.lock().unwrap().released = true;
        cv.notify_all();
    }
}

fn serve(stream: std::net::TcpStream, state: &(Mutex<State>, Condvar), status: u16, reply: &str) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut first = String::new();
    if reader.read_line(&mut first).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = first.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        if let Some((n, v)) = line.split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    let _ = reader.read_exact(&mut body);
    let (lock, cv) = state;
    let mut s = lock.lock().unwrap();
    s.requests.push(Request {
        method,
        path,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    cv.notify_all();
    while !s.released {
        s = cv.wait(s).unwrap();
    }
    drop(s);
    let mut stream = stream;
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{reply}",
        reply.len()
    );
}
