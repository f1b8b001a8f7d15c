//! A headless Chromium driven through WebDriver for the web viewer's tests: chromedriver
//! started in its own process group on a port it picks itself (killed whole, browser included),
//! one session per test with a fresh profile, and waits that end as soon as the page
//! shows what a test waits for. Without Chromium a test skips with a loud message,
//! unless `HEDDLE_REQUIRE_BROWSER=1` or `CI=true`, where it fails.

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use thirtyfour::prelude::*;

/// How long the page may take to show something before the test gives up. A guard
/// against a hang, not a measurement: every wait ends as soon as the page shows it.
pub const PATIENCE: Duration = Duration::from_secs(90);

fn browser_required() -> bool {
    std::env::var("HEDDLE_REQUIRE_BROWSER").is_ok_and(|v| v == "1")
        || std::env::var("CI").is_ok_and(|v| v == "true")
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A chromedriver process of this test and the Chromium it drives.
pub struct Driver {
    child: Child,
    url: String,
    chromium: PathBuf,
    /// chromedriver's own log: quoted when a session does not start.
    log: tempfile::NamedTempFile,
}

impl Driver {
    /// The last lines of chromedriver's log, for a failure message.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Driver {
    /// Kills chromedriver's whole process group: the Chromium it started too, which a
    /// test that panicked before closing its session would otherwise leave running.
    fn drop(&mut self) {
        // SAFETY: a plain kill(2) of the process group this test created.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// Starts chromedriver on a free loopback port, or says loudly why the test is skipped.
pub fn driver() -> Option<Driver> {
    let (Some(chromium), Some(chromedriver)) = (on_path("chromium"), on_path("chromedriver"))
    else {
        let why = "chromium and chromedriver are not on PATH (Debian: apt-get install chromium chromium-driver; scripts/test installs them)";
        if browser_required() {
            panic!("{why}; HEDDLE_REQUIRE_BROWSER=1 or CI=true makes the browser tests required");
        }
        // Written to stderr itself: the test harness captures `eprintln!` of a passing
        // test, and a skip must be seen.
        let _ = writeln!(
            std::io::stderr(),
            "\n*** SKIPPED: the web viewer's browser tests did not run: {why} ***\n"
        );
        return None;
    };
    // chromedriver picks its own port (`--port=0`) and says which: a port picked here
    // and handed over could be picked by a parallel test's chromedriver too, whose
    // session requests would then reach this one's, and die with it.
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(chromedriver)
        .arg("--port=0")
        .arg(format!("--log-path={}", log.path().display()))
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    // Reads the announced port, then drains the pipe so chromedriver never blocks on it.
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        let mut tx = Some(tx);
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(port) = line
                .split("started successfully on port ")
                .nth(1)
                .and_then(|p| p.trim().trim_end_matches('.').parse::<u16>().ok())
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(port);
            }
        }
    });
    let mut d = Driver {
        child,
        url: String::new(),
        chromium,
        log,
    };
    let port = rx.recv_timeout(PATIENCE).unwrap_or_else(|_| {
        panic!(
            "chromedriver never said its port; its log:\n{}",
            d.log_tail()
        )
    });
    d.url = format!("http://127.0.0.1:{port}");
    Some(d)
}

/// One browser session with a fresh profile.
pub struct Browser {
    client: Option<WebDriver>,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    /// A test that panicked never closed its session: the WebDriver's own fallback would
    /// block this thread's runtime on a request it cannot serve (two minutes), so the
    /// session is left to the [`Driver`]'s teardown, which kills the browser with it.
    fn drop(&mut self) {
        if let Some(c) = self.client.take() {
            std::mem::forget(c);
        }
    }
}

impl Browser {
    pub async fn open(d: &Driver) -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let mut caps = DesiredCapabilities::chrome();
        caps.set_binary(d.chromium.to_str().unwrap()).unwrap();
        for arg in [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1440,1000",
            &format!("--user-data-dir={}", profile.path().display()),
        ] {
            caps.add_arg(arg).unwrap();
        }
        let client = match WebDriver::new(d.url.as_str(), caps).await {
            Ok(c) => c,
            Err(e) => panic!(
                "a Chromium session starts: {e:?}\nchromedriver's log ends:\n{}",
                d.log_tail()
            ),
        };
        Browser {
            client: Some(client),
            _profile: profile,
        }
    }

    pub fn client(&self) -> &WebDriver {
        // Only taken by `close` and `drop`, which consume the browser.
        self.client.as_ref().expect("an open session")
    }

    pub async fn close(mut self) {
        if let Some(c) = self.client.take() {
            let _ = c.quit().await;
        }
    }

    pub async fn current_url(&self) -> String {
        self.client().current_url().await.unwrap().to_string()
    }

    /// Whether an element matches `css` now.
    pub async fn has(&self, css: &str) -> bool {
        self.client().find(By::Css(css)).await.is_ok()
    }

    pub async fn goto(&self, url: &str) {
        self.client().goto(url).await.unwrap();
    }

    /// The attribute of the first element matching `css`, if both exist.
    pub async fn attr(&self, css: &str, name: &str) -> Option<String> {
        let e = self.client().find(By::Css(css)).await.ok()?;
        e.attr(name).await.ok().flatten()
    }

    pub async fn text(&self, css: &str) -> Option<String> {
        let e = self.client().find(By::Css(css)).await.ok()?;
        e.text().await.ok()
    }

    pub async fn body(&self) -> String {
        self.text("body").await.unwrap_or_default()
    }

    pub async fn click(&self, css: &str) {
        let e = self.client().find(By::Css(css)).await.unwrap();
        e.click().await.unwrap();
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let e = self.client().find(By::Css(css)).await.unwrap();
        e.send_keys(text).await.unwrap();
    }

    /// Waits until `ready` says yes, showing the page's text when it never does.
    pub async fn until(&self, what: &str, ready: impl AsyncFn(&Browser) -> bool) {
        let started = Instant::now();
        while !ready(self).await {
            if started.elapsed() > PATIENCE {
                panic!(
                    "the page never showed {what}; it shows:\n{}",
                    self.body().await
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn until_attr(&self, css: &str, name: &str, want: &str) {
        self.until(
            &format!("{css} with {name}={want:?}"),
            async |b: &Browser| b.attr(css, name).await.as_deref() == Some(want),
        )
        .await;
    }

    /// Pairs of graph nodes whose boxes overlap on the page (as drawn, in pixels).
    pub async fn overlapping_nodes(&self) -> Vec<Value> {
        let script = r#"
            const boxes = [...document.querySelectorAll("g.node")]
                .map((g) => [g.dataset.node, g.getBoundingClientRect(), g]);
            const out = [];
            for (let i = 0; i < boxes.length; i++)
                for (let j = i + 1; j < boxes.length; j++) {
                    const [a, p, x] = boxes[i], [b, q, y] = boxes[j];
                    // An opened graph node holds its inner nodes: not an overlap.
                    if (x.contains(y) || y.contains(x)) continue;
                    if (p.left < q.right && q.left < p.right && p.top < q.bottom && q.top < p.bottom)
                        out.push([a, b]);
                }
            return out;"#;
        let r = self.client().execute(script, Vec::new()).await.unwrap();
        r.json().as_array().cloned().unwrap_or_default()
    }

    pub async fn node_state(&self, node: &str) -> Option<String> {
        self.attr(&format!("g.node[data-node='{node}']"), "data-state")
            .await
    }

    pub async fn until_node(&self, node: &str, state: &str) {
        self.until_attr(&format!("g.node[data-node='{node}']"), "data-state", state)
            .await;
    }
}
