//! Runs the jsonata-js reference suite against three Rust crates; prints pass counts.
use serde_json::Value as J;
use std::collections::HashMap;
use std::path::Path;

struct Case {
    expr: String,
    data: Option<J>,
    bindings: serde_json::Map<String, J>,
    want: Want,
}
enum Want {
    Result(J),
    Undefined,
    Error,
}

fn eqv(a: &J, b: &J) -> bool {
    match (a, b) {
        (J::Number(x), J::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            x == y || ((x - y).abs() / x.abs().max(y.abs()) < 1e-10)
        }
        (J::Array(x), J::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| eqv(a, b)),
        (J::Object(x), J::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| eqv(v, w)))
        }
        _ => a == b,
    }
}

fn load(root: &Path) -> Vec<(String, Case)> {
    let mut ds = HashMap::new();
    for e in std::fs::read_dir(root.join("datasets")).unwrap() {
        let p = e.unwrap().path();
        ds.insert(
            p.file_stem().unwrap().to_string_lossy().to_string(),
            serde_json::from_str::<J>(&std::fs::read_to_string(&p).unwrap()).unwrap(),
        );
    }
    let mut out = Vec::new();
    let mut groups: Vec<_> = std::fs::read_dir(root.join("groups"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    groups.sort();
    for g in groups {
        let mut files: Vec<_> = std::fs::read_dir(&g)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        for f in files {
            if f.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let Ok(v) = serde_json::from_str::<J>(&std::fs::read_to_string(&f).unwrap()) else {
                eprintln!("unreadable case {}", f.display());
                continue;
            };
            let list = match v {
                J::Array(a) => a,
                o => vec![o],
            };
            for (i, c) in list.into_iter().enumerate() {
                let name = format!(
                    "{}/{}#{i}",
                    g.file_name().unwrap().to_string_lossy(),
                    f.file_stem().unwrap().to_string_lossy()
                );
                let Some(expr) = c.get("expr").and_then(|e| e.as_str()) else {
                    continue;
                };
                let data = match c.get("data") {
                    Some(d) => Some(d.clone()),
                    None => match c.get("dataset") {
                        Some(J::String(s)) => ds.get(s).cloned(),
                        _ => None,
                    },
                };
                let bindings = c
                    .get("bindings")
                    .and_then(|b| b.as_object())
                    .cloned()
                    .unwrap_or_default();
                let want = if let Some(r) = c.get("result") {
                    Want::Result(r.clone())
                } else if c.get("undefinedResult").is_some() {
                    Want::Undefined
                } else if c.get("code").is_some() || c.get("error").is_some() {
                    Want::Error
                } else {
                    Want::Undefined
                };
                out.push((
                    name,
                    Case {
                        expr: expr.to_string(),
                        data,
                        bindings,
                        want,
                    },
                ));
            }
        }
    }
    out
}

/// Where the names of the failed cases go.
fn fails_file(which: &str) -> String {
    let dir = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| ".".into());
    format!("{dir}/fails-{which}.txt")
}

/// Ok(None) = undefined.
type Outcome = Result<Option<J>, String>;

fn run_seuil(c: &Case) -> Outcome {
    let s = seuil::Seuil::compile(&c.expr).map_err(|e| e.to_string())?;
    let cfg = seuil::EvalConfig {
        time_limit_ms: Some(2000),
        ..Default::default()
    };
    let input = c.data.clone().unwrap_or(J::Null);
    let r = s
        .evaluate_with_config_and_bindings(&input, &cfg, Some(&c.bindings))
        .map_err(|e| e.to_string())?;
    Ok(if r.is_null() { None } else { Some(r) })
}

fn run_stedi(c: &Case) -> Outcome {
    let arena = bumpalo::Bump::new();
    let j = jsonata_rs::JsonAta::new(&c.expr, &arena).map_err(|e| e.to_string())?;
    let input = c.data.as_ref().map(|d| d.to_string());
    let b: HashMap<&str, &J> = c.bindings.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let r = j
        .evaluate(input.as_deref(), Some(&b))
        .map_err(|e| e.to_string())?;
    if r.is_undefined() {
        return Ok(None);
    }
    Ok(Some(
        serde_json::from_str(&r.serialize(false)).map_err(|e| e.to_string())?,
    ))
}

fn run_core(c: &Case) -> Outcome {
    let ast = jsonata_core::parser::parse(&c.expr).map_err(|e| e.to_string())?;
    let mut cx = jsonata_core::evaluator::Context::new();
    for (k, v) in &c.bindings {
        cx.bind(k.clone(), jsonata_core::value::JValue::from(v.clone()));
    }
    let mut ev = jsonata_core::evaluator::Evaluator::with_context(cx);
    let data = c
        .data
        .clone()
        .map(jsonata_core::value::JValue::from)
        .unwrap_or(jsonata_core::value::JValue::Undefined);
    let r = ev.evaluate(&ast, &data).map_err(|e| format!("{e:?}"))?;
    if r.is_undefined() {
        return Ok(None);
    }
    Ok(Some(
        serde_json::from_str(&r.to_json_string().map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?,
    ))
}

fn main() {
    std::panic::set_hook(Box::new(|_| {}));
    let t = std::thread::Builder::new()
        .stack_size(1 << 30)
        .spawn(real_main)
        .unwrap();
    t.join().unwrap();
}

fn real_main() {
    let root = std::env::args().nth(1).expect("suite dir");
    let which = std::env::args().nth(2).expect("crate");
    let cases = load(Path::new(&root));
    if let Some(idx) = std::env::args().nth(3) {
        // Child mode: one case, verdict as the exit code (a crash is a failure).
        let (_, c) = &cases[idx.parse::<usize>().unwrap()];
        let r = match which.as_str() {
            "seuil" => run_seuil(c),
            "stedi" => run_stedi(c),
            "core" => run_core(c),
            _ => panic!(),
        };
        let ok = match (&c.want, r) {
            (Want::Error, Err(_)) => true,
            (Want::Undefined, Ok(None)) => true,
            (Want::Result(w), Ok(Some(g))) => eqv(w, &g),
            _ => false,
        };
        std::process::exit(if ok { 0 } else { 1 });
    }
    if std::env::var("ISOLATE").is_ok() {
        let me = std::env::current_exe().unwrap();
        let mut pass = 0;
        let mut fails = Vec::new();
        for (i, (name, _)) in cases.iter().enumerate() {
            let st = std::process::Command::new("timeout")
                .args(["5", me.to_str().unwrap(), &root, &which, &i.to_string()])
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap();
            if st.success() {
                pass += 1
            } else {
                fails.push(name.clone())
            }
        }
        std::fs::write(fails_file(&which), fails.join("\n")).unwrap();
        println!(
            "{which}: {pass}/{} passed ({:.1}%)",
            cases.len(),
            100.0 * pass as f64 / cases.len() as f64
        );
        return;
    }
    let (mut pass, mut total) = (0, 0);
    let mut fails = Vec::new();
    for (name, c) in &cases {
        // Skip cases that hang (timelimit) or recurse deeply: counted as failures if they panic.
        total += 1;
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match which.as_str() {
            "seuil" => run_seuil(c),
            "stedi" => run_stedi(c),
            "core" => run_core(c),
            _ => panic!(),
        }));
        let ok = match (&c.want, r) {
            (_, Err(_)) => false,
            (Want::Error, Ok(Err(_))) => true,
            (Want::Undefined, Ok(Ok(None))) => true,
            (Want::Result(w), Ok(Ok(Some(g)))) => eqv(w, &g),
            (Want::Result(J::Null), Ok(Ok(None))) => false,
            _ => false,
        };
        if ok {
            pass += 1
        } else {
            fails.push(name.clone())
        }
    }
    std::fs::write(fails_file(&which), fails.join("\n")).unwrap();
    println!(
        "{which}: {pass}/{total} passed ({:.1}%)",
        100.0 * pass as f64 / total as f64
    );
}
