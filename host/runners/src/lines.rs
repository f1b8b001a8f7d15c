//! Turns the byte chunks of stdout/stderr into lines for the consumer, shared by both
//! execution modes: output cap, long-line splitting, the result marker, the stderr tail.

use std::collections::VecDeque;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::spec::{Exit, Line, Stream};

/// Bytes of stderr kept for error messages.
const STDERR_TAIL: usize = 4096;

/// Why forwarding stopped before the output ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Interrupt {
    Stopped,
    Timeout,
}

pub(crate) struct LineSink {
    tx: mpsc::Sender<Line>,
    stop: CancellationToken,
    deadline: Instant,
    partial: [Vec<u8>; 2],
    forwarded: usize,
    limit: usize,
    max_line: usize,
    marker: Option<String>,
    truncated: bool,
    /// The text after the marker on the last marker line.
    result: Option<String>,
    last_stdout: Option<String>,
    stderr_tail: VecDeque<String>,
    stderr_tail_len: usize,
    /// Once the consumer has gone, lines are only tracked (tail, result), not sent.
    consumer_gone: bool,
}

impl LineSink {
    pub fn new(
        tx: mpsc::Sender<Line>,
        stop: CancellationToken,
        deadline: Instant,
        limit: usize,
        max_line: usize,
        marker: Option<String>,
    ) -> Self {
        LineSink {
            tx,
            stop,
            deadline,
            partial: [Vec::new(), Vec::new()],
            forwarded: 0,
            limit,
            max_line: max_line.max(1),
            marker,
            truncated: false,
            result: None,
            last_stdout: None,
            stderr_tail: VecDeque::new(),
            stderr_tail_len: 0,
            consumer_gone: false,
        }
    }

    /// Fills in what the output told about the run (result, last line, stderr tail,
    /// truncation) and why it was cut short, if it was.
    pub fn conclude(self, interrupt: Option<Interrupt>, exit: &mut Exit) {
        match interrupt {
            Some(Interrupt::Stopped) => exit.stopped = true,
            Some(Interrupt::Timeout) => exit.timed_out = true,
            None => {}
        }
        exit.truncated = self.truncated;
        exit.result = self.result;
        exit.last_stdout = self.last_stdout;
        exit.stderr_tail = Vec::from(self.stderr_tail).join("\n");
    }

    /// Feeds a chunk read from `stream`; complete lines go to the consumer.
    pub async fn push(&mut self, stream: Stream, mut bytes: &[u8]) -> Result<(), Interrupt> {
        let idx = stream as usize;
        while !bytes.is_empty() {
            match bytes.iter().position(|&b| b == b'\n') {
                Some(nl) => {
                    let mut line = std::mem::take(&mut self.partial[idx]);
                    line.extend_from_slice(&bytes[..nl]);
                    bytes = &bytes[nl + 1..];
                    self.line(stream, line).await?;
                }
                None => {
                    self.partial[idx].extend_from_slice(bytes);
                    bytes = &[];
                }
            }
            while self.partial[idx].len() >= self.max_line {
                let rest = self.partial[idx].split_off(self.max_line);
                let head = std::mem::replace(&mut self.partial[idx], rest);
                self.line(stream, head).await?;
            }
        }
        Ok(())
    }

    /// Flushes unterminated last lines once the output has ended.
    pub async fn finish(&mut self) -> Result<(), Interrupt> {
        for stream in [Stream::Stdout, Stream::Stderr] {
            let rest = std::mem::take(&mut self.partial[stream as usize]);
            if !rest.is_empty() {
                self.line(stream, rest).await?;
            }
        }
        Ok(())
    }

    async fn line(&mut self, stream: Stream, mut bytes: Vec<u8>) -> Result<(), Interrupt> {
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        let text = match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        };
        match stream {
            Stream::Stdout => {
                if let Some(m) = &self.marker
                    && let Some(rest) = text.strip_prefix(m.as_str())
                {
                    self.result = Some(rest.to_string());
                    return Ok(());
                }
                if !text.trim().is_empty() {
                    self.last_stdout = Some(text.clone());
                }
            }
            Stream::Stderr => {
                self.stderr_tail_len += text.len();
                self.stderr_tail.push_back(text.clone());
                while self.stderr_tail_len > STDERR_TAIL && self.stderr_tail.len() > 1 {
                    if let Some(old) = self.stderr_tail.pop_front() {
                        self.stderr_tail_len -= old.len();
                    }
                }
            }
        }
        if self.truncated || self.consumer_gone {
            return Ok(());
        }
        let cost = text.len() + 1;
        if self.forwarded + cost > self.limit {
            self.truncated = true;
            let marker = Line {
                stream: Stream::Stderr,
                text: format!(
                    "[heddle: output limit of {} bytes reached; further output dropped]",
                    self.limit
                ),
            };
            return self.send(marker).await;
        }
        self.forwarded += cost;
        self.send(Line { stream, text }).await
    }

    async fn send(&mut self, line: Line) -> Result<(), Interrupt> {
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => Err(Interrupt::Stopped),
            _ = tokio::time::sleep_until(self.deadline) => Err(Interrupt::Timeout),
            r = self.tx.send(line) => {
                if r.is_err() {
                    self.consumer_gone = true;
                }
                Ok(())
            }
        }
    }
}
