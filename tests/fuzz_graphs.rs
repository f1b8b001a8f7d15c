//! A bounded fuzz run of the graph parser, the planner and the run: random mutations of
//! the example graphs go through the real `heddle validate` and `heddle run`, which must
//! end (no hang), without a panic, with an exit code from the README's table.
//!
//! Deterministic by default (fixed seed, fixed case count) so a failure reproduces;
//! `HEDDLE_FUZZ_SEED` and `HEDDLE_FUZZ_CASES` explore further. A failing case is written
//! next to the message so it can be run by hand.

mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};
use support::*;

/// Exit codes the README documents (0 completed … 4 suspended).
const DOCUMENTED: [i32; 5] = [OK, FAILED, INVALID, CANCELLED, SUSPENDED];

/// Far above any example's run time: reaching it means the command hung.
const HANG: Duration = Duration::from_secs(120);

/// xorshift64*: enough to pick mutations reproducibly, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Values that have broken parsers and planners elsewhere: wrong kinds, extremes,
/// empty and enormous text, deep nesting.
fn nasty(rng: &mut Rng) -> Json {
    let deep = (0..64).fold(json!(0), |v, _| json!([v]));
    let choices = [
        Json::Null,
        json!(-1),
        json!(0),
        json!(1e300),
        json!(-1e300),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(0.5),
        json!(""),
        json!("x".repeat(100_000)),
        json!("list[list[dict]]"),
        json!("int"),
        json!(true),
        json!([]),
        json!({}),
        json!({"type": "heddle.input"}),
        deep,
    ];
    rng.pick(&choices).clone()
}

/// Every path to a value inside `v`, as JSON pointers.
fn pointers(v: &Json, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        Json::Object(m) => {
            for (k, c) in m {
                let k = k.replace('~', "~0").replace('/', "~1");
                pointers(c, format!("{at}/{k}"), out);
            }
        }
        Json::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                pointers(c, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

fn array<'a>(doc: &'a mut Json, key: &str) -> Option<&'a mut Vec<Json>> {
    doc.get_mut(key).and_then(Json::as_array_mut)
}

/// One structural or value mutation of a graph document.
fn mutate(doc: &mut Json, rng: &mut Rng) {
    let node_ids: Vec<String> = doc["nodes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    match rng.below(12) {
        // Any value anywhere becomes a nasty one; half the time only a property value,
        // which keeps the graph's shape so the run gets to start.
        0..=4 => {
            let mut ps = Vec::new();
            pointers(doc, String::new(), &mut ps);
            let props: Vec<String> = ps
                .iter()
                .filter(|p| p.contains("/properties/"))
                .cloned()
                .collect();
            let p = if !props.is_empty() && rng.below(2) == 0 {
                rng.pick(&props).clone()
            } else {
                rng.pick(&ps).clone()
            };
            let v = nasty(rng);
            if let Some(slot) = doc.pointer_mut(&p) {
                *slot = v;
            }
        }
        // A node or an edge disappears.
        5 => {
            let key = *rng.pick(&["nodes", "edges"]);
            if let Some(a) = array(doc, key)
                && !a.is_empty()
            {
                let i = rng.below(a.len());
                a.remove(i);
            }
        }
        // A node is duplicated (same id twice).
        6 => {
            if let Some(a) = array(doc, "nodes")
                && !a.is_empty()
            {
                let n = a[rng.below(a.len())].clone();
                a.push(n);
            }
        }
        // An edge is reversed (cycles, outputs used as inputs).
        7 => {
            if let Some(a) = array(doc, "edges")
                && !a.is_empty()
            {
                let i = rng.below(a.len());
                let e = &mut a[i];
                let (s, t) = (e["source"].clone(), e["target"].clone());
                e["source"] = t;
                e["target"] = s;
            }
        }
        // A new edge between random nodes and made-up or real handles.
        8 => {
            let handles = ["value", "item", "list", "text", "nope", "", "control"];
            let e = json!({
                "source": rng.pick(&node_ids).clone(),
                "sourceHandle": rng.pick(&handles).to_string(),
                "target": rng.pick(&node_ids).clone(),
                "targetHandle": rng.pick(&handles).to_string(),
            });
            if !node_ids.is_empty()
                && let Some(a) = array(doc, "edges")
            {
                a.push(e);
            }
        }
        // A node changes type (a real one, a made-up one, an absurdly long one).
        9 => {
            let types = [
                "heddle.foreach",
                "heddle.collect",
                "heddle.output",
                "heddle.input",
                "std.json.parse",
                "std.math.running_sum",
                "code.python",
                "no.such.type",
                "",
            ];
            let long = "t".repeat(1 << 16);
            if let Some(a) = array(doc, "nodes")
                && !a.is_empty()
            {
                let i = rng.below(a.len());
                a[i]["type"] = if rng.below(8) == 0 {
                    json!(long)
                } else {
                    json!(rng.pick(&types))
                };
            }
        }
        // A node id becomes enormous (every message echoing it must stay bounded).
        10 => {
            if let Some(a) = array(doc, "nodes")
                && !a.is_empty()
            {
                let i = rng.below(a.len());
                a[i]["id"] = json!("n".repeat(1 << 20));
            }
        }
        // Limits and properties with out-of-range numbers.
        _ => {
            if let Some(a) = array(doc, "nodes")
                && !a.is_empty()
            {
                let i = rng.below(a.len());
                let (key, field) = if rng.below(2) == 0 {
                    let f = *rng.pick(&["fuel", "timeout_ms", "files", "env", "secrets"]);
                    ("limits", f)
                } else {
                    let f = *rng.pick(&[
                        "timeout_s",
                        "memory_mb",
                        "tmp_size_mb",
                        "streaming",
                        "type",
                        "value",
                        "mode",
                        "pattern",
                    ]);
                    ("properties", f)
                };
                let v = nasty(rng);
                if !a[i][key].is_object() {
                    a[i][key] = json!({});
                }
                a[i][key][field] = v;
            }
        }
    }
}

/// Breaks the text itself: cut short, a byte changed, a bracket dropped.
fn mangle_text(text: &str, rng: &mut Rng) -> String {
    let mut b = text.as_bytes().to_vec();
    match rng.below(3) {
        0 => b.truncate(rng.below(b.len())),
        1 => {
            let i = rng.below(b.len());
            b[i] = *rng.pick(b"{}[]\",:\\\x00\xff");
        }
        _ => {
            if let Some(i) = b.iter().rposition(|c| *c == b'}') {
                b.remove(i);
            }
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

/// Runs one command to its end or the hang limit; returns the exit code and stderr.
fn run_bounded(dir: &Path, args: &[&str], case: &str) -> (i32, String) {
    let out = std::fs::File::create(dir.join("stdout")).unwrap();
    let err = std::fs::File::create(dir.join("stderr")).unwrap();
    let mut child = command(dir)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > HANG {
            let _ = child.kill();
            let _ = child.wait();
            panic!("`heddle {}` hung on case {case}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
    let code = status
        .code()
        .unwrap_or_else(|| panic!("killed by a signal on case {case}: {status:?}\n{stderr}"));
    (code, stderr)
}

#[test]
fn mutated_examples_never_panic_hang_or_exit_off_the_table() {
    let seed: u64 = std::env::var("HEDDLE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x4845_4444_4c45);
    let cases: usize = std::env::var("HEDDLE_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let mut examples: Vec<_> = std::fs::read_dir(root().join("examples"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    examples.sort();
    let mut rng = Rng(seed | 1);
    let dir = tempfile::tempdir().unwrap();
    // The documents the examples' graph nodes include, beside them as in examples/, so a
    // mutated graph node example can get as far as running.
    std::fs::create_dir(dir.path().join("graphs")).unwrap();
    for e in std::fs::read_dir(root().join("examples/graphs")).unwrap() {
        let e = e.unwrap().path();
        std::fs::copy(&e, dir.path().join("graphs").join(e.file_name().unwrap())).unwrap();
    }
    // Exit codes of `run` per code: a fuzz run that never gets past the parser (or never
    // fails it) would test much less than it claims.
    let mut run_codes = std::collections::BTreeMap::<i32, usize>::new();
    // Runs that got past the parser: they ran, or validation listed their problems.
    let mut past_parser = 0usize;
    for case in 0..cases {
        // The first is the README's first example reordered: a run that must go on.
        let example = if case == 0 {
            root().join("examples/quickstart.json")
        } else {
            rng.pick(&examples).clone()
        };
        let text = std::fs::read_to_string(&example).unwrap();
        let graph = if case % 8 == 0 {
            // Every eighth case keeps its meaning (its nodes and edges in another
            // order): the runs the others break are measured against runs that go on.
            let mut doc: Json = serde_json::from_str(&text).unwrap();
            for key in ["nodes", "edges"] {
                if let Some(a) = array(&mut doc, key) {
                    for i in (1..a.len()).rev() {
                        a.swap(i, rng.below(i + 1));
                    }
                }
            }
            doc.to_string()
        } else if rng.below(5) == 0 {
            mangle_text(&text, &mut rng)
        } else {
            let mut doc: Json = serde_json::from_str(&text).unwrap();
            for _ in 0..1 + rng.below(2) {
                mutate(&mut doc, &mut rng);
            }
            doc.to_string()
        };
        let name = format!("case-{case}.json");
        std::fs::write(dir.path().join(&name), &graph).unwrap();
        let label = format!("{case} (seed {seed}, from {})", example.display());
        for args in [
            vec!["validate", name.as_str()],
            vec!["validate", name.as_str(), "--json"],
            vec!["run", name.as_str(), "--json", "--node-timeout-ms", "20000"],
        ] {
            let (code, stderr) = run_bounded(dir.path(), &args, &label);
            if args[0] == "run" {
                if std::env::var_os("HEDDLE_FUZZ_VERBOSE").is_some() {
                    eprintln!(
                        "case {label}: run exited {code}: {}",
                        stderr.lines().next().unwrap_or("")
                    );
                }
                *run_codes.entry(code).or_default() += 1;
                // Refused with the problems validation found: parsed, then checked.
                let report: Option<Json> = std::fs::read_to_string(dir.path().join("stdout"))
                    .ok()
                    .and_then(|t| serde_json::from_str(&t).ok());
                let issues = report
                    .as_ref()
                    .and_then(|r| r["issues"].as_array())
                    .is_some_and(|i| !i.is_empty());
                if code != INVALID || issues {
                    past_parser += 1;
                }
            }
            let keep = || {
                let kept = std::env::temp_dir().join(format!("heddle-fuzz-{seed}-{case}.json"));
                let _ = std::fs::write(&kept, &graph);
                kept
            };
            assert!(
                !stderr.contains("panicked"),
                "`heddle {}` panicked on case {label} (graph kept at {}):\n{stderr}",
                args.join(" "),
                keep().display()
            );
            assert!(
                DOCUMENTED.contains(&code),
                "`heddle {}` exited {code} on case {label} (graph kept at {}):\n{stderr}",
                args.join(" "),
                keep().display()
            );
            // An error quoting user text quotes it bounded, not whole.
            assert!(
                stderr.len() < 64 << 10,
                "`heddle {}` wrote {} bytes to stderr on case {label} (graph kept at {})",
                args.join(" "),
                stderr.len(),
                keep().display()
            );
        }
    }
    eprintln!(
        "run exit codes over {cases} cases (seed {seed}): {run_codes:?}; {past_parser} got past the parser"
    );
    if cases >= 24 {
        assert!(
            run_codes.contains_key(&OK) && run_codes.contains_key(&INVALID) && past_parser > cases / 4,
            "mutations should run graphs, break them, and mostly get past the parser: {run_codes:?}, {past_parser} past the parser"
        );
    }
}
