//! Packages fetched from and pushed to a real OCI registry: Debian's `docker-registry`
//! (distribution 2.8, no referrers API) started on loopback per test, driven through the
//! real binary. Tampered bytes, wrong layouts and misbehaving registries (small TCP
//! servers in the test speaking real HTTP, or not) are each refused naming the
//! reference, with their exit code, and leave the package store as it was.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common;
use crate::support::serve::{Api, Server, rt};
use crate::support::store::StoreDir;
use crate::support::*;

const REGISTRY_FAILED: i32 = 10;
const INTEGRITY: i32 = 11;

/// Debian's docker-registry, serving from a temporary directory on a loopback port.
pub struct Registry {
    child: Child,
    pub addr: String,
    pub storage: tempfile::TempDir,
}

impl Registry {
    /// Starts one; `None` (said loudly) when the binary is missing outside CI.
    pub fn start() -> Option<Registry> {
        let bin = Path::new("/usr/bin/docker-registry");
        if !bin.is_file() {
            let why = "docker-registry is not installed (apt-get install docker-registry; scripts/test does)";
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
            eprintln!("SKIPPED: {why}");
            return None;
        }
        for _attempt in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let addr = format!("127.0.0.1:{port}");
            let storage = tempfile::tempdir().unwrap();
            let config = storage.path().join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
                    storage.path().join("data").display()
                ),
            )
            .unwrap();
            let child = Command::new(bin)
                .arg("serve")
                .arg(&config)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("docker-registry starts");
            let mut r = Registry {
                child,
                addr,
                storage,
            };
            for _ in 0..200 {
                if r.answers() {
                    return Some(r);
                }
                if r.child.try_wait().unwrap().is_some() {
                    break; // the port was taken meanwhile: try another
                }
                std::thread::sleep(Duration::from_millis(25));
            }
        }
        panic!("docker-registry did not start on loopback");
    }

    fn answers(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(&self.addr) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let req = format!(
            "GET /v2/ HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.addr
        );
        if s.write_all(req.as_bytes()).is_err() {
            return false;
        }
        let mut buf = [0u8; 12];
        s.read_exact(&mut buf).is_ok() && &buf == b"HTTP/1.1 200"
    }

    /// The file holding blob `digest` in the registry's storage.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.storage
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    pub fn oci(&self, repo_tag: &str) -> String {
        format!("oci://{}/{repo_tag}", self.addr)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A working directory whose heddle.toml lets `registry` be reached over plain HTTP.
pub fn workdir(registry: &str, extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "heddle.toml",
        &format!(
            "[registry]\ninsecure = [\"{registry}\"]\ntimeout_ms = 20000\n{extra}\n[wasm]\ncache_dir = \"{}\"\n",
            common::tmp_root().join("cache").display()
        ),
    );
    dir
}

/// Runs `heddle` in `dir` with wkg's config looked up under `dir/xdg`.
pub fn run(dir: &Path, args: &[&str]) -> std::process::Output {
    command(dir)
        .args(args)
        .env("XDG_CONFIG_HOME", dir.join("xdg"))
        .env("HOME", dir)
        .output()
        .expect("the heddle binary starts")
}

/// Asserts nothing was installed: no lockfile entry, no package directory.
#[track_caller]
pub fn store_untouched(dir: &Path) {
    let store = dir.join(".heddle");
    let lock = std::fs::read_to_string(store.join("heddle.lock")).unwrap_or_default();
    assert!(
        !lock.contains("[[package]]"),
        "something was pinned:\n{lock}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(&store)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".write-lock" && n != "heddle.lock")
        .filter(|n| {
            n != "packages"
                || std::fs::read_dir(store.join("packages"))
                    .unwrap()
                    .next()
                    .is_some()
        })
        .collect();
    assert!(leftovers.is_empty(), "left in the store: {leftovers:?}");
}

/// Pushes the hostile test package to `reference` from `dir`; returns the manifest
/// digest printed.
pub fn push_hostile(dir: &Path, reference: &str) -> String {
    let pkg = common::package_dir("hostile");
    let o = run(dir, &["package", "push", pkg.to_str().unwrap(), reference]);
    expect_code(&o, OK);
    let out = stdout(&o);
    out.lines()
        .find_map(|l| l.trim().strip_prefix("manifest "))
        .unwrap_or_else(|| panic!("no manifest digest in:\n{out}"))
        .to_string()
}

fn hostile_sha256() -> String {
    let bytes = std::fs::read(common::package_dir("hostile").join("hostile.wasm")).unwrap();
    heddle_registry::client::sha256_digest(&bytes)
}

#[test]
fn a_pushed_package_is_added_by_tag_and_by_digest_pinned_and_runs() {
    let Some(reg) = Registry::start() else { return };
    let dir = workdir(&reg.addr, "");
    let reference = reg.oci("acme/hostile:0.1.0");
    let digest = push_hostile(dir.path(), &reference);
    assert!(digest.starts_with("sha256:"), "{digest}");

    let o = run(dir.path(), &["package", "add", &reference]);
    expect_code(&o, OK);
    let lock = std::fs::read_to_string(dir.path().join(".heddle/heddle.lock")).unwrap();
    let layer = hostile_sha256();
    for want in [
        format!("reference = \"{reference}\""),
        format!("registry = \"{}\"", reg.addr),
        "repository = \"acme/hostile\"".to_string(),
        format!("manifest_digest = \"{digest}\""),
        format!("layer_digest = \"{layer}\""),
        format!("sha256 = \"{}\"", layer.strip_prefix("sha256:").unwrap()),
    ] {
        assert!(lock.contains(&want), "lockfile lacks {want}:\n{lock}");
    }
    expect_code(&run(dir.path(), &["package", "verify"]), OK);
    let graph = write(dir.path(), "g.json", super::ECHO);
    let o = run(dir.path(), &["run", graph.to_str().unwrap(), "--json"]);
    expect_code(&o, OK);
    assert_eq!(json(&o)["outputs"]["out"], serde_json::json!([7]));

    // The same bytes by digest, in another store: the same pins.
    let other = workdir(&reg.addr, "");
    let by_digest = format!("{}@{digest}", reg.oci("acme/hostile"));
    let o = run(other.path(), &["package", "add", &by_digest, "--json"]);
    expect_code(&o, OK);
    let info = json(&o);
    assert_eq!(info["source"]["manifest_digest"], digest.as_str());
    assert_eq!(info["source"]["reference"], by_digest.as_str());
    // A digest that is not the manifest's is refused as the bytes not matching.
    let wrong = format!("{}@sha256:{}", reg.oci("acme/hostile"), "0".repeat(64));
    let third = workdir(&reg.addr, "");
    let o = run(third.path(), &["package", "add", &wrong]);
    assert!(
        [REGISTRY_FAILED, INTEGRITY].contains(&code(&o)),
        "{}",
        stderr(&o)
    );
    store_untouched(third.path());
}

#[test]
fn latest_is_refused_unless_asked_for() {
    let Some(reg) = Registry::start() else { return };
    let dir = workdir(&reg.addr, "");
    let pkg = common::package_dir("hostile");
    let latest = reg.oci("acme/hostile:latest");
    let o = run(
        dir.path(),
        &["package", "push", pkg.to_str().unwrap(), &latest],
    );
    expect_code(&o, INVALID);
    assert!(stderr(&o).contains("--allow-latest"), "{}", stderr(&o));
    let o = run(
        dir.path(),
        &[
            "package",
            "push",
            pkg.to_str().unwrap(),
            &latest,
            "--allow-latest",
        ],
    );
    expect_code(&o, OK);
    for reference in [reg.oci("acme/hostile:latest"), reg.oci("acme/hostile")] {
        let o = run(dir.path(), &["package", "add", &reference]);
        expect_code(&o, INVALID);
        let e = stderr(&o);
        assert!(
            e.contains(&reference) && e.contains("--allow-latest"),
            "{e}"
        );
        store_untouched(dir.path());
    }
    let o = run(
        dir.path(),
        &[
            "package",
            "add",
            &reg.oci("acme/hostile:latest"),
            "--allow-latest",
        ],
    );
    expect_code(&o, OK);
}

#[test]
fn a_wkg_spec_resolves_through_wkgs_own_config() {
    let Some(reg) = Registry::start() else { return };
    let dir = workdir(&reg.addr, "");
    push_hostile(dir.path(), &reg.oci("acme/hostile:0.2.0"));
    // No registry for the namespace: named, with where to configure one.
    let o = run(dir.path(), &["package", "add", "acme:hostile@0.2.0"]);
    expect_code(&o, INVALID);
    let e = stderr(&o);
    assert!(
        e.contains("acme:hostile@0.2.0") && e.contains("namespace `acme`"),
        "{e}"
    );
    store_untouched(dir.path());

    let wkg = dir.path().join("xdg/wasm-pkg");
    std::fs::create_dir_all(&wkg).unwrap();
    std::fs::write(
        wkg.join("config.toml"),
        format!(
            "default_registry = \"{0}\"\n[registry.\"{0}\".oci]\nprotocol = \"http\"\n",
            reg.addr
        ),
    )
    .unwrap();
    let o = run(
        dir.path(),
        &["package", "add", "acme:hostile@0.2.0", "--json"],
    );
    expect_code(&o, OK);
    let info = json(&o);
    assert_eq!(info["source"]["repository"], "acme/hostile");
    assert_eq!(info["source"]["reference"], "acme:hostile@0.2.0");
    // Without a version: the newest semver tag, only when asked.
    push_hostile(dir.path(), &reg.oci("acme/hostile:0.10.0"));
    expect_code(
        &run(dir.path(), &["package", "add", "acme:hostile"]),
        INVALID,
    );
    let o = run(
        dir.path(),
        &["package", "add", "acme:hostile", "--allow-latest", "--json"],
    );
    expect_code(&o, OK);
    assert!(
        json(&o)["source"]["manifest_digest"].is_string(),
        "{}",
        stdout(&o)
    );
    let lock = std::fs::read_to_string(dir.path().join(".heddle/heddle.lock")).unwrap();
    assert!(lock.contains("acme:hostile"), "{lock}");
}

/// Pushes a hand-made artifact (config and layers as given) under `repo:tag`.
fn push_raw(
    reg: &Registry,
    repo: &str,
    tag: &str,
    config: (&str, Vec<u8>),
    layers: Vec<(&str, Vec<u8>)>,
) {
    use heddle_registry::artifact::{Descriptor, ImageManifest};
    use heddle_registry::client::{Client, Credentials, Endpoint, sha256_digest};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = Client::new(
            Endpoint {
                registry: reg.addr.clone(),
                repository: repo.into(),
                insecure: true,
                credentials: Credentials::Anonymous,
                reference: "test".into(),
            },
            Duration::from_secs(20),
            true,
        )
        .unwrap();
        let mut descs = Vec::new();
        for (mt, bytes) in &layers {
            let d = sha256_digest(bytes);
            c.push_blob("layer", &d, bytes.clone().into())
                .await
                .unwrap();
            descs.push(Descriptor {
                media_type: mt.to_string(),
                digest: d,
                size: bytes.len() as u64,
                annotations: None,
            });
        }
        let cd = sha256_digest(&config.1);
        c.push_blob("config", &cd, config.1.clone().into())
            .await
            .unwrap();
        let m = ImageManifest {
            schema_version: 2,
            media_type: Some(heddle_registry::client::OCI_MANIFEST.into()),
            config: Descriptor {
                media_type: config.0.into(),
                digest: cd,
                size: config.1.len() as u64,
                annotations: None,
            },
            layers: descs,
            annotations: None,
        };
        c.push_manifest(
            tag,
            heddle_registry::client::OCI_MANIFEST,
            serde_json::to_vec(&m).unwrap(),
        )
        .await
        .unwrap();
    });
}

fn wasm_config(layer: &[u8]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "architecture": "wasm", "os": "wasip2",
        "layerDigests": [heddle_registry::client::sha256_digest(layer)],
    }))
    .unwrap()
}

#[test]
fn artifacts_of_another_layout_or_tampered_bytes_are_refused_and_nothing_installed() {
    let Some(reg) = Registry::start() else { return };
    let dir = workdir(&reg.addr, "");
    let component = std::fs::read(common::package_dir("hostile").join("hostile.wasm")).unwrap();
    let config_mt = heddle_registry::artifact::CONFIG_MEDIA_TYPE;
    push_raw(
        &reg,
        "bad/media",
        "1.0.0",
        (
            "application/vnd.oci.image.config.v1+json",
            wasm_config(&component),
        ),
        vec![("application/wasm", component.clone())],
    );
    push_raw(
        &reg,
        "bad/layermedia",
        "1.0.0",
        (config_mt, wasm_config(&component)),
        vec![(
            "application/vnd.oci.image.layer.v1.tar+gzip",
            component.clone(),
        )],
    );
    push_raw(
        &reg,
        "bad/two",
        "1.0.0",
        (config_mt, wasm_config(&component)),
        vec![
            ("application/wasm", component.clone()),
            ("application/wasm", b"more".to_vec()),
        ],
    );
    let module = b"\0asm\x01\0\0\0".to_vec();
    push_raw(
        &reg,
        "bad/module",
        "1.0.0",
        (
            config_mt,
            serde_json::to_vec(&serde_json::json!({"architecture": "wasm", "os": "wasip1"}))
                .unwrap(),
        ),
        vec![("application/wasm", module.clone())],
    );
    let garbage = b"not a component at all".to_vec();
    push_raw(
        &reg,
        "bad/notwasm",
        "1.0.0",
        (config_mt, wasm_config(&garbage)),
        vec![("application/wasm", garbage)],
    );
    for (repo, words) in [
        (
            "bad/media",
            "config media type `application/vnd.oci.image.config.v1+json`",
        ),
        ("bad/layermedia", "layer media type"),
        ("bad/two", "2 layers"),
        ("bad/module", "os `wasip1`"),
        ("bad/notwasm", "not a valid WebAssembly component"),
    ] {
        let reference = reg.oci(&format!("{repo}:1.0.0"));
        let o = run(dir.path(), &["package", "add", &reference]);
        expect_code(&o, INVALID);
        let e = stderr(&o);
        assert!(e.contains(&reference) && e.contains(words), "{repo}: {e}");
        no_panic(&o);
        store_untouched(dir.path());
    }

    // A component over [wasm] max_component_bytes is refused before it is fetched.
    let small = workdir(&reg.addr, "[wasm]\n");
    std::fs::write(
        small.path().join("heddle.toml"),
        format!(
            "[registry]\ninsecure = [\"{}\"]\n[wasm]\nmax_component_bytes = 1000\n",
            reg.addr
        ),
    )
    .unwrap();
    let reference = reg.oci("acme/hostile:0.1.0");
    push_hostile(dir.path(), &reference);
    let o = run(small.path(), &["package", "add", &reference]);
    expect_code(&o, INVALID);
    let e = stderr(&o);
    assert!(
        e.contains("max_component_bytes") && e.contains(&reference),
        "{e}"
    );
    store_untouched(small.path());

    // Tampered in the registry's storage: the layer, then the manifest.
    let layer = hostile_sha256();
    let file = reg.blob_file(&layer);
    let original = std::fs::read(&file).unwrap();
    let mut bad = original.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    std::fs::write(&file, &bad).unwrap();
    let o = run(dir.path(), &["package", "add", &reference]);
    expect_code(&o, INTEGRITY);
    let e = stderr(&o);
    assert!(
        e.contains("component layer does not match its digest") && e.contains(&layer),
        "{e}"
    );
    store_untouched(dir.path());
    std::fs::write(&file, &original).unwrap();

    let manifest = push_hostile(dir.path(), &reference);
    let file = reg.blob_file(&manifest);
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replacen("0.1", "6.6", 1)).unwrap();
    let o = run(dir.path(), &["package", "add", &reference]);
    expect_code(&o, INTEGRITY);
    assert!(
        stderr(&o).contains("manifest does not match its digest"),
        "{}",
        stderr(&o)
    );
    store_untouched(dir.path());
}

/// What a test server answers a request head with (`None`: nothing, ever).
type Answer = fn(&str) -> Option<Vec<u8>>;

/// A TCP server on loopback answering every connection with `answer(request head)`
/// (or never, for `None`); serves at most `max` connections.
// Answers say `Connection: close`: the server drops each connection after one answer,
// and a client that kept it alive would send its next request (the retry with
// credentials) into a closed socket and fail with "connection reset", not the answer.
fn tcp_server(max: usize, answer: Answer) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().take(max) {
            let Ok(mut s) = s else { continue };
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && head.len() < 65536 {
                match s.read(&mut b) {
                    Ok(1) => head.push(b[0]),
                    _ => break,
                }
            }
            match answer(&String::from_utf8_lossy(&head)) {
                Some(bytes) => {
                    let _ = s.write_all(&bytes);
                }
                None => held.push(s), // never answered, kept open
            }
        }
    });
    addr
}

#[test]
fn misbehaving_registries_are_named_and_time_bounded() {
    let cases: [(&str, Answer, i32, &str); 4] = [
        (
            "slow",
            |_| None,
            REGISTRY_FAILED,
            "did not answer within 1500 ms",
        ),
        (
            "garbage",
            |_| Some(b"this is not HTTP\r\n\r\n".to_vec()),
            REGISTRY_FAILED,
            "not the OCI distribution protocol",
        ),
        (
            "huge manifest",
            |head| {
                Some(if head.starts_with("GET /v2/acme/x/manifests/") {
                    let mut r = b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nConnection: close\r\n\r\n{\"schemaVersion\":2,\"annotations\":{\"x\":\"".to_vec();
                    r.extend(std::iter::repeat_n(b'a', 5 << 20));
                    r
                } else {
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .to_vec()
                })
            },
            INVALID,
            "manifest is larger than 4194304 bytes",
        ),
        (
            "credentials",
            |_| {
                Some(b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"r\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec())
            },
            REGISTRY_FAILED,
            "requires credentials",
        ),
    ];
    std::thread::scope(|s| {
        for (name, answer, want, words) in cases {
            s.spawn(move || {
                let addr = tcp_server(8, answer);
                let dir = tempfile::tempdir().unwrap();
                write(
                    dir.path(),
                    "heddle.toml",
                    &format!("[registry]\ninsecure = [\"{addr}\"]\ntimeout_ms = 1500\n"),
                );
                let reference = format!("oci://{addr}/acme/x:1.0.0");
                let o = run(dir.path(), &["package", "add", &reference]);
                expect_code(&o, want);
                let e = stderr(&o);
                assert!(e.contains(&reference) && e.contains(words), "{name}: {e}");
                no_panic(&o);
                store_untouched(dir.path());
            });
        }
    });

    // Credentials configured (wkg's config) and refused.
    let addr = tcp_server(8, |_| {
        Some(b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"r\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec())
    });
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "heddle.toml",
        &format!("[registry]\ninsecure = [\"{addr}\"]\n"),
    );
    let wkg = dir.path().join("xdg/wasm-pkg");
    std::fs::create_dir_all(&wkg).unwrap();
    std::fs::write(
        wkg.join("config.toml"),
        format!("[registry.\"{addr}\".oci]\nauth = {{ username = \"u\", password = \"wrong\" }}\n"),
    )
    .unwrap();
    let reference = format!("oci://{addr}/acme/x:1.0.0");
    let o = run(dir.path(), &["package", "add", &reference]);
    expect_code(&o, REGISTRY_FAILED);
    assert!(
        stderr(&o).contains("refused the credentials"),
        "{}",
        stderr(&o)
    );
    store_untouched(dir.path());

    // Nobody listening, and a host that does not resolve.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for (reference, insecure) in [
        (
            format!("oci://127.0.0.1:{port}/acme/x:1.0.0"),
            format!("127.0.0.1:{port}"),
        ),
        (
            "oci://registry.invalid/acme/x:1.0.0".to_string(),
            "registry.invalid".to_string(),
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "heddle.toml",
            &format!("[registry]\ninsecure = [\"{insecure}\"]\ntimeout_ms = 10000\n"),
        );
        let o = run(dir.path(), &["package", "add", &reference]);
        expect_code(&o, REGISTRY_FAILED);
        let e = stderr(&o);
        assert!(
            e.contains(&reference)
                && (e.contains("cannot be reached") || e.contains("did not answer")),
            "{e}"
        );
        store_untouched(dir.path());
    }
}

/// With no credentials in wkg's config, those `docker login` keeps in docker's
/// `config.json` are sent, as wkg sends them: a registry that answers 401 without them
/// then answers the manifest request (here: not found), and one whose kept credentials
/// it refuses says so.
#[test]
fn credentials_docker_login_keeps_are_used_when_wkg_has_none() {
    use base64::Engine as _;
    // Answers 404 to a request carrying `Basic base64(u:p)`, 401 to any other.
    let addr = tcp_server(16, |head| {
        let good = format!(
            "authorization: basic {}",
            base64::engine::general_purpose::STANDARD.encode("u:p")
        );
        Some(
            if head
                .to_ascii_lowercase()
                .contains(&good.to_ascii_lowercase())
            {
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
            } else {
                b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"r\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
            },
        )
    });
    let reference = format!("oci://{addr}/acme/x:1.0.0");
    for (password, code, said) in [
        ("p", REGISTRY_FAILED, "not found in registry"),
        ("wrong", REGISTRY_FAILED, "refused the credentials"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "heddle.toml",
            &format!("[registry]\ninsecure = [\"{addr}\"]\ntimeout_ms = 10000\n"),
        );
        let docker = dir.path().join("docker");
        std::fs::create_dir_all(&docker).unwrap();
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("u:{password}"));
        std::fs::write(
            docker.join("config.json"),
            serde_json::json!({"auths": {addr.clone(): {"auth": auth}}}).to_string(),
        )
        .unwrap();
        let o = run_env(
            dir.path(),
            &["package", "add", &reference],
            &[("DOCKER_CONFIG", docker.to_str().unwrap())],
        );
        expect_code(&o, code);
        let e = stderr(&o);
        assert!(e.contains(said), "password {password}: {e}");
        store_untouched(dir.path());
    }
}

#[test]
fn a_source_folder_is_refused_at_add_with_the_build_command() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("my-nodes");
    std::fs::create_dir(&src).unwrap();
    write(
        &src,
        "heddle-package.toml",
        "name = \"my-nodes\"\nversion = \"0.1.0\"\n[build]\nlanguage = \"c\"\n",
    );
    let o = run(dir.path(), &["package", "add", src.to_str().unwrap()]);
    expect_code(&o, INVALID);
    let e = stderr(&o);
    assert!(
        e.contains("heddle package build") && e.contains("dist"),
        "{e}"
    );
}

/// Runs `heddle` like [`run`], with `env` set.
fn run_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = command(dir);
    c.args(args)
        .env("XDG_CONFIG_HOME", dir.join("xdg"))
        .env("HOME", dir);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("the heddle binary starts")
}

/// `heddle package keygen NAME.pem` in `dir`.
fn keygen(dir: &Path, name: &str) -> PathBuf {
    let key = dir.join(format!("{name}.pem"));
    let o = run(dir, &["package", "keygen", key.to_str().unwrap()]);
    expect_code(&o, OK);
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions());
    assert_eq!(mode & 0o077, 0, "the private key is readable by others");
    key
}

/// Copies the manifest tagged `from` onto the tag `to` in `repo` (blobs are shared).
fn retag(reg: &Registry, repo: &str, from: &str, to: &str) {
    use heddle_registry::client::{Client, Credentials, Endpoint, OCI_MANIFEST};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = Client::new(
            Endpoint {
                registry: reg.addr.clone(),
                repository: repo.into(),
                insecure: true,
                credentials: Credentials::Anonymous,
                reference: "test".into(),
            },
            Duration::from_secs(20),
            true,
        )
        .unwrap();
        let (bytes, _) = c.manifest(from).await.unwrap();
        c.push_manifest(to, OCI_MANIFEST, bytes).await.unwrap();
    });
}

#[test]
fn signatures_are_checked_against_the_trusted_keys_offline() {
    let Some(reg) = Registry::start() else { return };
    let dir = workdir(&reg.addr, "");
    let acme = keygen(dir.path(), "acme");
    let stranger = keygen(dir.path(), "stranger");
    // A key file is never overwritten.
    expect_code(
        &run(dir.path(), &["package", "keygen", acme.to_str().unwrap()]),
        INVALID,
    );
    let trusting = workdir(
        &reg.addr,
        &format!(
            "[trust]\nrequire_signatures = true\n[trust.keys]\nacme = \"{}.pub\"\n",
            acme.display()
        ),
    );
    let pkg = common::package_dir("hostile");
    let push = |tag: &str, epoch: &str, key: Option<&Path>| -> String {
        let reference = reg.oci(&format!("acme/hostile:{tag}"));
        let mut args = vec!["package", "push", pkg.to_str().unwrap(), reference.as_str()];
        if let Some(k) = key {
            args.extend(["--key", k.to_str().unwrap()]);
        }
        let o = run_env(dir.path(), &args, &[("SOURCE_DATE_EPOCH", epoch)]);
        expect_code(&o, OK);
        stdout(&o)
            .lines()
            .find_map(|l| l.trim().strip_prefix("manifest ").map(str::to_string))
            .unwrap()
    };

    // Unsigned: refused where signatures are required, installed where they are not.
    push("1.0.0", "1000", None);
    let o = run(
        trusting.path(),
        &["package", "add", &reg.oci("acme/hostile:1.0.0")],
    );
    expect_code(&o, INTEGRITY);
    assert!(
        stderr(&o).contains("unsigned") && stderr(&o).contains("require_signatures"),
        "{}",
        stderr(&o)
    );
    store_untouched(trusting.path());

    // Signed by a key nobody trusts.
    let o = run(
        dir.path(),
        &[
            "package",
            "sign",
            &reg.oci("acme/hostile:1.0.0"),
            "--key",
            stranger.to_str().unwrap(),
        ],
    );
    expect_code(&o, OK);
    let o = run(
        trusting.path(),
        &["package", "add", &reg.oci("acme/hostile:1.0.0")],
    );
    expect_code(&o, INTEGRITY);
    let e = stderr(&o);
    assert!(
        e.contains("none by a key in [trust]") && e.contains("acme (sha256:"),
        "{e}"
    );
    store_untouched(trusting.path());

    // Signed by acme when pushed: installed, the signer pinned.
    let signed = push("2.0.0", "2000", Some(&acme));
    let o = run(
        trusting.path(),
        &["package", "add", &reg.oci("acme/hostile:2.0.0"), "--json"],
    );
    expect_code(&o, OK);
    assert_eq!(json(&o)["source"]["signer"], "acme");
    let lock = std::fs::read_to_string(trusting.path().join(".heddle/heddle.lock")).unwrap();
    assert!(lock.contains("signer = \"acme\""), "{lock}");

    // acme's signature of 2.0.0 copied onto 3.0.0's signature tag: over another digest.
    let other = push("3.0.0", "3000", None);
    assert_ne!(other, signed);
    let tag = |d: &str| format!("{}.sig", d.replacen(':', "-", 1));
    retag(&reg, "acme/hostile", &tag(&signed), &tag(&other));
    let fresh = workdir(
        &reg.addr,
        &format!("[trust.keys]\nacme = \"{}.pub\"\n", acme.display()),
    );
    let o = run(
        fresh.path(),
        &["package", "add", &reg.oci("acme/hostile:3.0.0")],
    );
    expect_code(&o, INTEGRITY);
    let e = stderr(&o);
    assert!(
        e.contains(&format!("covers manifest {signed}, not this one ({other})")),
        "{e}"
    );
    store_untouched(fresh.path());
}

/// A copy of the hostile package with `edit` applied to its manifest text.
fn hostile_variant(root: &Path, name: &str, edit: impl Fn(&str) -> String) -> PathBuf {
    let src = common::package_dir("hostile");
    let dst = root.join(name);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let m = dst.join("heddle-package.toml");
    let text = std::fs::read_to_string(&m).unwrap();
    std::fs::write(&m, edit(&text)).unwrap();
    dst
}

#[test]
fn an_update_is_reviewed_before_it_takes_effect_and_grants_say_what_they_cover() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let v1 = common::package_dir("hostile");
    expect_code(&run(d, &["package", "add", v1.to_str().unwrap()]), OK);
    let lock_before = std::fs::read_to_string(d.join(".heddle/heddle.lock")).unwrap();
    let v2 = hostile_variant(d, "v2", |t| {
        let kept: Vec<&str> = t
            .lines()
            .filter(|l| !l.starts_with("version") && !l.starts_with("description"))
            .collect();
        format!(
            "version = \"9.9.9\"\ndescription = \"Now reads your home directory\"\n{}\n[[capabilities]]\nkind = \"env\"\ntarget = \"HOME\"\nreason = \"to find your files\"\n",
            kept.join("\n")
        )
    });
    let o = run(d, &["package", "add", v2.to_str().unwrap()]);
    expect_code(&o, INVALID);
    let out = stdout(&o);
    for want in [
        "version",
        "-> 9.9.9",
        "capabilities added: env `HOME`",
        "Now reads your home directory",
    ] {
        assert!(out.contains(want), "review lacks {want}:\n{out}");
    }
    assert!(stderr(&o).contains("--yes"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(d.join(".heddle/heddle.lock")).unwrap(),
        lock_before,
        "a refused update changed the lockfile"
    );
    let o = run(d, &["package", "add", v2.to_str().unwrap(), "--yes"]);
    expect_code(&o, OK);
    assert!(
        stdout(&o).contains("installed hostile@9.9.9"),
        "{}",
        stdout(&o)
    );

    // A grant without a pin warns; a pin to other bytes says so instead of "add
    // [packages.hostile]"; remove names the grant it leaves.
    write(d, "heddle.toml", "[packages.hostile]\nenv = [\"HOME\"]\n");
    let o = run(d, &["package", "list"]);
    expect_code(&o, OK);
    assert!(
        stdout(&o).contains("not pinned by digest: any package named hostile receives it"),
        "{}",
        stdout(&o)
    );
    write(
        d,
        "heddle.toml",
        &format!(
            "[packages.hostile]\nenv = [\"HOME\"]\nsha256 = \"{}\"\n",
            "0".repeat(64)
        ),
    );
    let o = run(d, &["package", "list"]);
    let out = stdout(&o);
    assert!(
        out.contains(&format!(
            "is pinned to sha256 {}, not to these bytes",
            "0".repeat(64)
        )),
        "{out}"
    );
    assert!(!out.contains("to grant: add [packages.hostile]"), "{out}");
    let o = run(d, &["package", "remove", "hostile"]);
    expect_code(&o, OK);
    assert!(
        stdout(&o).contains("the grant [packages.hostile] in heddle.toml stays"),
        "{}",
        stdout(&o)
    );
}

const GATED: &str = r#"{"format": "heddle.graph", "version": 1, "nodes": [
  {"id": "in", "type": "heddle.input", "properties": {"type": "int", "value": 7}},
  {"id": "ship", "type": "heddle.gate", "properties": {"title": "ship it"}},
  {"id": "echo", "type": "hostile.echo"},
  {"id": "out", "type": "heddle.output"}],
 "edges": [
  {"source": "in", "sourceHandle": "value", "target": "ship", "targetHandle": "value"},
  {"source": "ship", "sourceHandle": "value", "target": "echo", "targetHandle": "value"},
  {"source": "echo", "sourceHandle": "value", "target": "out", "targetHandle": "value"}]}"#;

#[test]
fn a_durable_run_pins_its_registry_packages_and_resumes_where_the_store_lacks_them() {
    let Some(reg) = Registry::start() else { return };
    let dir = workdir(&reg.addr, "");
    let d = dir.path();
    let reference = reg.oci("acme/hostile:0.1.0");
    let digest = push_hostile(d, &reference);
    expect_code(&run(d, &["package", "add", &reference]), OK);
    let graph = write(d, "g.json", GATED);
    let o = run(d, &["run", graph.to_str().unwrap(), "--durable"]);
    expect_code(&o, SUSPENDED);
    let o = run(d, &["runs", "list", "--json"]);
    expect_code(&o, OK);
    let run_id = json(&o)[0]["run_id"].as_str().unwrap().to_string();
    let o = run(d, &["runs", "show", &run_id, "--json"]);
    let shown = json(&o);
    assert_eq!(
        shown["packages"]["hostile"]["source"]["manifest_digest"],
        digest.as_str(),
        "{shown}"
    );

    // Another package store that lacks it: the approval fetches exactly that digest.
    let o = run(
        d,
        &[
            "runs",
            "approve",
            &run_id,
            "ship",
            "--packages",
            "elsewhere",
            "--json",
        ],
    );
    expect_code(&o, OK);
    assert!(
        stderr(&o).contains(&format!("fetching {reference} (manifest {digest})")),
        "{}",
        stderr(&o)
    );
    let lock = std::fs::read_to_string(d.join("elsewhere/heddle.lock")).unwrap();
    assert!(
        lock.contains(&format!("manifest_digest = \"{digest}\"")),
        "{lock}"
    );
}

/// The commands of a README section's first `sh` block.
fn readme_commands(readme: &str, section: &str) -> Vec<String> {
    let start = readme
        .find(section)
        .unwrap_or_else(|| panic!("README lacks {section}"));
    let block = &readme[start..];
    let open = block.find("```sh\n").unwrap() + 6;
    let close = open + block[open..].find("```").unwrap();
    block[open..close]
        .lines()
        .map(|l| l.split('#').next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn the_readme_sections_on_publishing_and_installing_work_as_written() {
    let Some(reg) = Registry::start() else { return };
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let publish = readme_commands(&readme, "## Publishing a package");
    let install = readme_commands(&readme, "## Installing packages from a registry");
    assert!(
        publish.len() >= 2 && install.len() >= 2,
        "{publish:?} {install:?}"
    );
    // Where the author works, and a newcomer's machine that only installs.
    let author = workdir(&reg.addr, "");
    let user = workdir(&reg.addr, "");
    let template = root().join("sdk/c/template");
    let src = author.path().join("my-nodes");
    std::fs::create_dir(&src).unwrap();
    for e in std::fs::read_dir(&template).unwrap().flatten() {
        std::fs::copy(e.path(), src.join(e.file_name())).unwrap();
    }
    for (dir, lines) in [(author.path(), &publish), (user.path(), &install)] {
        for line in lines {
            let line = line.replace("localhost:5000", &reg.addr);
            let words: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(words[0], "heddle", "{line}");
            let o = run(dir, &words[1..]);
            expect_code(&o, OK);
        }
    }
    let o = run(user.path(), &["nodes", "myc", "--json"]);
    expect_code(&o, OK);
    assert!(stdout(&o).contains("myc.shout"), "{}", stdout(&o));
}

/// `wkg` on PATH (`cargo install wkg`), required when `HEDDLE_REQUIRE_WKG=1`.
fn wkg() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("wkg"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var("HEDDLE_REQUIRE_WKG").as_deref() != Ok("1"),
            "wkg is not on PATH (cargo install --locked wkg --version 0.16.1)"
        );
        eprintln!("wkg not on PATH: its layout is replicated byte for byte instead");
    }
    found
}

#[test]
fn a_package_pushed_by_wkg_is_added_and_wkg_pulls_what_heddle_pushed() {
    let Some(reg) = Registry::start() else { return };
    let dir = workdir(&reg.addr, "");
    let d = dir.path();
    let component_path = common::package_dir("hostile").join("hostile.wasm");
    let component = std::fs::read(&component_path).unwrap();
    let wkg = wkg();
    match &wkg {
        Some(wkg) => {
            let o = Command::new(wkg)
                .current_dir(d)
                .env("XDG_CONFIG_HOME", d.join("xdg"))
                .args(["oci", "push", "--insecure", &reg.addr])
                .arg(format!("{}/wkgns/hostile:0.3.0", reg.addr))
                .arg(&component_path)
                .args([
                    "--annotation",
                    "org.opencontainers.image.version=0.3.0",
                    "--annotation",
                    "org.opencontainers.image.description=pushed by wkg",
                ])
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "wkg push: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        None => {
            // What wkg 0.16.1 writes (oci-wasm's WasmConfig through oci-client), checked
            // against a real `wkg oci push` to this registry: config fields in this
            // order, the layer titled, the annotations given on its command line.
            let (exports, imports) = {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let host = common::host();
                    let pkg =
                        heddle_wasm::WasmPackage::load_dir(&host, &common::package_dir("hostile"))
                            .await
                            .unwrap();
                    pkg.world()
                })
            };
            let layer = heddle_registry::client::sha256_digest(&component);
            let config = format!(
                "{{\"created\":\"2026-12-07T00:37:29.452263332Z\",\"author\":null,\"architecture\":\"wasm\",\"os\":\"wasip2\",\"layerDigests\":[\"{layer}\"],\"component\":{{\"exports\":{},\"imports\":{},\"target\":null}}}}",
                serde_json::to_string(&exports).unwrap(),
                serde_json::to_string(&imports).unwrap()
            );
            push_replica(
                &reg,
                "wkgns/hostile",
                "0.3.0",
                config.into_bytes(),
                component.clone(),
            );
        }
    }
    let reference = reg.oci("wkgns/hostile:0.3.0");
    let o = run(d, &["package", "add", &reference, "--json"]);
    expect_code(&o, OK);
    let info = json(&o);
    assert_eq!(info["name"], "hostile");
    assert_eq!(info["version"], "0.3.0");
    assert_eq!(info["description"], "pushed by wkg");
    let graph = write(d, "g.json", super::ECHO);
    let o = run(d, &["run", graph.to_str().unwrap(), "--json"]);
    expect_code(&o, OK);

    // What Heddle pushes, wkg pulls: the component byte for byte.
    let Some(wkg) = wkg else { return };
    push_hostile(d, &reg.oci("heddlens/hostile:0.4.0"));
    let out = d.join("pulled.wasm");
    let o = Command::new(&wkg)
        .current_dir(d)
        .env("XDG_CONFIG_HOME", d.join("xdg"))
        .args(["oci", "pull", "--insecure", &reg.addr])
        .arg(format!("{}/heddlens/hostile:0.4.0", reg.addr))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "wkg pull: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(std::fs::read(&out).unwrap(), component);
}

/// Pushes `config` and `component` as wkg does (manifest as oci-client serializes it).
fn push_replica(reg: &Registry, repo: &str, tag: &str, config: Vec<u8>, component: Vec<u8>) {
    use heddle_registry::client::{Client, Credentials, Endpoint, OCI_MANIFEST, sha256_digest};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = Client::new(
            Endpoint {
                registry: reg.addr.clone(),
                repository: repo.into(),
                insecure: true,
                credentials: Credentials::Anonymous,
                reference: "test".into(),
            },
            Duration::from_secs(20),
            true,
        )
        .unwrap();
        let (cd, ld) = (sha256_digest(&config), sha256_digest(&component));
        let manifest = format!(
            "{{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{{\"mediaType\":\"application/vnd.wasm.config.v0+json\",\"digest\":\"{cd}\",\"size\":{}}},\"layers\":[{{\"mediaType\":\"application/wasm\",\"digest\":\"{ld}\",\"size\":{},\"annotations\":{{\"org.opencontainers.image.title\":\"hostile.wasm\"}}}}],\"annotations\":{{\"org.opencontainers.image.description\":\"pushed by wkg\",\"org.opencontainers.image.version\":\"0.3.0\"}}}}",
            config.len(),
            component.len()
        );
        c.push_blob("layer", &ld, component.into()).await.unwrap();
        c.push_blob("config", &cd, config.into()).await.unwrap();
        c.push_manifest(tag, OCI_MANIFEST, manifest.into_bytes()).await.unwrap();
    });
}

/// A package that provides graphs carries them through `package push`: another store
/// that adds it by reference gets each graph byte for byte and runs it as a graph node.
/// An artifact whose manifest lists a graph it does not carry is refused naming it, and
/// nothing is installed.
#[test]
fn a_pushed_package_carries_its_graphs_to_the_store_that_pulls_it() {
    let Some(reg) = Registry::start() else { return };
    let dir = workdir(&reg.addr, "");
    let pkg = super::package_with_graph(dir.path(), super::ECHO_GRAPH);
    let reference = reg.oci("acme/hostile:0.5.0");
    let o = run(
        dir.path(),
        &["package", "push", pkg.to_str().unwrap(), &reference],
    );
    expect_code(&o, OK);

    let other = workdir(&reg.addr, "");
    let d = other.path();
    let o = run(d, &["package", "add", &reference]);
    expect_code(&o, OK);
    let installed: Vec<std::path::PathBuf> = std::fs::read_dir(d.join(".heddle/packages"))
        .unwrap()
        .map(|e| e.unwrap().path().join("graphs/echo.json"))
        .collect();
    assert_eq!(installed.len(), 1, "{installed:?}");
    assert_eq!(
        std::fs::read_to_string(&installed[0]).unwrap(),
        super::ECHO_GRAPH
    );
    write(d, "g.json", &super::graph_of_package_graph());
    let o = run(d, &["run", "--json", "g.json"]);
    expect_code(&o, OK);
    assert_eq!(
        json(&o)["outputs"]["out"],
        serde_json::json!([41]),
        "{}",
        stdout(&o)
    );
    expect_code(&run(d, &["package", "verify"]), OK);

    // The manifest lists the graph, the config does not carry it.
    let component = std::fs::read(pkg.join("hostile.wasm")).unwrap();
    let manifest = std::fs::read_to_string(pkg.join("heddle-package.toml")).unwrap();
    let mut config: serde_json::Value = serde_json::from_slice(&wasm_config(&component)).unwrap();
    config["heddlePackage"] = manifest.into();
    push_raw(
        &reg,
        "bad/graphless",
        "1.0.0",
        (
            heddle_registry::artifact::CONFIG_MEDIA_TYPE,
            serde_json::to_vec(&config).unwrap(),
        ),
        vec![("application/wasm", component)],
    );
    let third = workdir(&reg.addr, "");
    let o = run(
        third.path(),
        &["package", "add", &reg.oci("bad/graphless:1.0.0")],
    );
    expect_code(&o, INVALID);
    no_panic(&o);
    let e = stderr(&o);
    assert!(
        e.contains("lists the graph `graphs/echo.json`, which the artifact does not carry"),
        "{e}"
    );
    store_untouched(third.path());
}

/// `hostile.echo` between an input and the output, no gate: killed before `echo` is
/// dispatched, the run is interrupted and a server adopts it at start.
const ECHOED: &str = r#"{"format": "heddle.graph", "version": 1, "nodes": [
  {"id": "in", "type": "heddle.input", "properties": {"type": "int", "value": 7}},
  {"id": "echo", "type": "hostile.echo"},
  {"id": "out", "type": "heddle.output"}],
 "edges": [
  {"source": "in", "sourceHandle": "value", "target": "echo", "targetHandle": "value"},
  {"source": "echo", "sourceHandle": "value", "target": "out", "targetHandle": "value"}]}"#;

/// A run store whose runs use `hostile`, pushed to `reg` and installed from it in the
/// directory's own package store: one run interrupted before `echo` (`g.json`, killed)
/// and one waiting at gate `ship` (`gated.json`). Returns the directory, the reference,
/// the manifest digest and the two run ids.
fn runs_pinning_hostile(
    reg: &Registry,
    backend: Backend,
) -> (StoreDir, String, String, String, String) {
    let sd = StoreDir::with_graph_on(backend, ECHOED).with_config(&format!(
        "[registry]\ninsecure = [\"{}\"]\ntimeout_ms = 20000\n[wasm]\ncache_dir = \"{}\"\n",
        reg.addr,
        common::tmp_root().join("cache").display()
    ));
    let d = sd.path();
    let reference = reg.oci("acme/hostile:0.1.0");
    let digest = push_hostile(d, &reference);
    expect_code(&run(d, &["package", "add", &reference]), OK);
    let killed = sd.crash("before-dispatch:echo", &[]);
    let gated = write(d, "gated.json", GATED);
    expect_code(
        &run(d, &["run", gated.to_str().unwrap(), "--durable"]),
        SUSPENDED,
    );
    let o = run(d, &["runs", "list", "--json"]);
    expect_code(&o, OK);
    let waiting = json(&o)
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .find(|id| *id != killed)
        .expect("the gated run");
    (sd, reference, digest, killed, waiting)
}

/// `heddle serve` in `sd` on the package store `packages` (relative to it), which lacks
/// what the runs use; wkg's config looked up as [`run`] does.
fn serve_on(sd: &StoreDir, packages: &str) -> Server {
    let xdg = sd.path().join("xdg");
    let home = sd.path().to_str().unwrap().to_string();
    sd.serve_with(
        &["--packages", packages],
        &[("XDG_CONFIG_HOME", xdg.to_str().unwrap()), ("HOME", &home)],
    )
}

crate::both!(
    a_server_fetches_the_packages_a_run_it_adopts_or_approves_pinned_where_its_store_lacks_them,
    a_server_whose_registry_is_gone_says_which_run_waits_for_which_package,
);

/// On a shared store (PostgreSQL) the killed run is adopted once the lease of the
/// process that died expires, through the fleet's claim: the same fetch.
fn a_server_fetches_the_packages_a_run_it_adopts_or_approves_pinned_where_its_store_lacks_them(
    backend: Backend,
) {
    let Some(reg) = Registry::start() else { return };
    let (sd, reference, digest, killed, waiting) = runs_pinning_hostile(&reg, backend);
    let server = serve_on(&sd, "elsewhere");
    let api = Api::of(&server);
    let rt = rt();

    // Adopted at start: fetched by the pinned digest, then driven to its end.
    let (show, _) = rt.block_on(api.drive_to_end(&killed));
    assert_eq!(show["state"], "completed", "{show:#}\n{}", server.log());
    // Approved through the API: the package is there now, and the run goes on.
    let (status, body) = rt.block_on(api.call(
        "POST",
        &format!("/api/runs/{waiting}/gates/ship/approve"),
        Some(serde_json::json!({})),
    ));
    assert_eq!(status, 202, "{body:#}\n{}", server.log());
    let (show, _) = rt.block_on(api.drive_to_end(&waiting));
    assert_eq!(show["state"], "completed", "{show:#}\n{}", server.log());
    let log = server.log();
    assert!(
        log.contains(&format!("fetching {reference} (manifest {digest})")),
        "{log}"
    );

    // The package is in the server's store with the digests the runs pinned.
    let lock = std::fs::read_to_string(sd.path().join("elsewhere/heddle.lock")).unwrap();
    assert!(
        lock.contains(&format!("manifest_digest = \"{digest}\"")),
        "{lock}"
    );
    let o = run(
        sd.path(),
        &["package", "list", "--json", "--packages", "elsewhere"],
    );
    expect_code(&o, OK);
    let listed = json(&o);
    let hostile = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "hostile")
        .unwrap_or_else(|| panic!("hostile not installed: {listed:#}"));
    assert!(
        hostile.to_string().contains(&hostile_sha256()),
        "{hostile:#}"
    );
}

/// On a shared store the killed run, claimed once its lease expires, goes back to the
/// queue with the backoff of a failed take.
fn a_server_whose_registry_is_gone_says_which_run_waits_for_which_package(backend: Backend) {
    let Some(reg) = Registry::start() else { return };
    let (sd, reference, _digest, killed, waiting) = runs_pinning_hostile(&reg, backend);
    drop(reg);
    let server = serve_on(&sd, "elsewhere");
    let api = Api::of(&server);
    let rt = rt();

    // The interrupted run is not adopted, and the log says why (on a shared store once
    // its lease expired and a claim failed: waited for, with a generous bound).
    let said = format!("run {killed} uses package hostile ({reference})");
    for _ in 0..3000 {
        if server.log().contains(&said) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = server.log();
    assert!(log.contains(&said), "{log}");
    if backend == Backend::Postgres {
        assert!(log.contains("queued again, claimable in"), "{log}");
    }
    // The approval is refused saying why; the run still waits at its gate.
    let before = rt.block_on(api.show(&waiting));
    let (status, body) = rt.block_on(api.call(
        "POST",
        &format!("/api/runs/{waiting}/gates/ship/approve"),
        Some(serde_json::json!({})),
    ));
    assert_eq!(status, 502, "{body:#}");
    let said = body.to_string();
    assert!(
        said.contains(&format!("run {waiting} uses package hostile ({reference})")),
        "{said}"
    );
    let after = rt.block_on(api.show(&waiting));
    assert_eq!(after["state"], before["state"], "{after:#}");
    assert_eq!(after["pause"], before["pause"], "{after:#}");
    let shown = rt.block_on(api.show(&killed));
    let state = shown["state"].as_str().unwrap();
    assert!(["interrupted", "queued"].contains(&state), "{shown:#}");
    assert!(
        !sd.path().join("elsewhere/heddle.lock").is_file() || {
            let lock = std::fs::read_to_string(sd.path().join("elsewhere/heddle.lock")).unwrap();
            !lock.contains("hostile")
        }
    );
    let (code, log) = server.stop();
    assert_eq!(code, 0, "{log}");
    assert!(!log.contains("panicked"), "{log}");
}
