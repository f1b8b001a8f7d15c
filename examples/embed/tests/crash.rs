//! The embedding example as its user runs it: a real process, a real run store on disk,
//! real WASM nodes, killed part-way and started again. Effects are counted where they
//! land, in the lines its nodes appended to `data/log.txt`.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// A directory as a user of the example lays it out: `heddle.toml` grants `files` its
/// `data` directory (an absolute path: the grant's host side is relative to the working
/// directory) and keeps the run store beside it.
fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let config = format!(
        "[packages.files]\ndirs = [{{ host = \"{}\", guest = \"/data\", mode = \"rw\" }}]\n\n[store]\npath = \"runs.db\"\n",
        data.display()
    );
    std::fs::write(dir.path().join("heddle.toml"), config).unwrap();
    dir
}

fn embed(dir: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_embed"));
    c.current_dir(dir).env_remove("HEDDLE_FAULT");
    c
}

fn lines(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("data/log.txt"))
        .map(|s| s.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

fn text(o: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Killed right after its first write's result is on disk (the fault point aborts the
/// process as a crash would: no destructors, no flush): the next start recovers the run,
/// does not write that line again, and finishes with the outputs.
#[test]
fn a_run_killed_after_its_first_write_is_recovered_without_writing_it_again() {
    let dir = setup();
    let o = embed(dir.path())
        .env("HEDDLE_FAULT", "after-result:w1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), None, "killed: {}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("started run "));
    assert_eq!(lines(dir.path()), ["one"]);

    let o = embed(dir.path()).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("recovering run "), "{}", text(&o));
    assert!(err.contains("node w2 completed"), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("shouted: ONE"), "{}", text(&o));
    assert_eq!(lines(dir.path()), ["one", "ONE"]);
}

/// SIGKILLed the moment it says its first write completed, wherever the run then is: no
/// line is lost or written twice. The next start finishes the run, or, when the second
/// write had started and whether it happened is unknown, pauses it for a person (exit 4)
/// without writing anything.
#[test]
fn a_run_sigkilled_at_any_moment_loses_and_repeats_nothing() {
    let dir = setup();
    let mut child = embed(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut seen = String::new();
    for line in BufReader::new(stderr).lines() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line == "node w1 completed" {
            // SAFETY: kill(2) on our own child's pid; touches no memory.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            break;
        }
    }
    let status = child.wait().unwrap();
    let before = lines(dir.path());
    assert!(before.first().is_some_and(|l| l == "one"), "{seen}");
    assert!(before.len() <= 2, "{before:?}");

    let o = embed(dir.path()).output().unwrap();
    let after = lines(dir.path());
    let err = String::from_utf8_lossy(&o.stderr);
    if status.code() == Some(0) || err.contains("started run ") {
        // The run completed before the kill landed: the start is a new run.
        assert_eq!(before, ["one", "ONE"], "{seen}");
        return;
    }
    assert!(err.contains("recovering run "), "{}", text(&o));
    match o.status.code() {
        Some(0) => assert_eq!(after, ["one", "ONE"], "{}", text(&o)),
        Some(4) => {
            assert!(err.contains("Reconcile"), "{}", text(&o));
            assert_eq!(after, before, "nothing was written: {}", text(&o));
        }
        _ => panic!("{}", text(&o)),
    }
}
