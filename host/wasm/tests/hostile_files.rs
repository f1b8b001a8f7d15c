//! A read-write grant with a write quota: a package cannot fill the host's disk, not
//! even with a sparse file, and what fits under the quota still works.

mod common;

use std::path::Path;

use common::*;
use heddle_core::Value;
use heddle_kernel::ErrorKind;
use heddle_wasm::{DirGrant, DirMode, PackageGrant, WasmConfig, WasmProvider};

const QUOTA: u64 = 1 << 20;

async fn provider(dir: &Path, quota: Option<u64>) -> WasmProvider {
    let mut c = WasmConfig::default();
    c.packages.insert(
        "hostile".into(),
        PackageGrant {
            dirs: vec![DirGrant {
                host: dir.to_path_buf(),
                guest: "/data".into(),
                mode: DirMode::Rw,
            }],
            files_write_quota: quota,
            ..Default::default()
        },
    );
    hostile_provider(c).await
}

fn len(p: &Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

/// A stream write past the quota fails; which errno the guest sees is its libc's choice
/// (wasi-libc reports a failed stream write as EIO, Rust's std then as an I/O error),
/// so what is checked is that the write failed and the file stayed within the quota.
async fn refused_stream_write(p: &WasmProvider, ins: [(&str, Value); 3]) {
    let (r, _, _) = invoke(p, "hostile.write_at", inputs(ins), None).await;
    let e = r.expect_err("the write went past the quota");
    assert_eq!(e.kind, ErrorKind::Node, "{e:?}");
    assert!(e.message.contains("write /data/"), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sparse_terabyte_file_is_refused_by_the_quota() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path(), Some(QUOTA)).await;
    let big = Value::Int(1 << 40);

    // One set-size to a terabyte.
    let (r, _, _) = invoke(
        &p,
        "hostile.grow",
        inputs([("path", Value::str("/data/sparse")), ("size", big.clone())]),
        None,
    )
    .await;
    let e = r.expect_err("set-size past the quota");
    assert_eq!(e.signature.as_deref(), Some("files:no-space"), "{e:?}");
    assert_eq!(len(&dir.path().join("sparse")), 0);

    // One byte written a terabyte in, through the file's stream.
    refused_stream_write(
        &p,
        [
            ("path", Value::str("/data/hole")),
            ("offset", big.clone()),
            ("bytes", Value::Int(1)),
        ],
    )
    .await;
    assert_eq!(len(&dir.path().join("hole")), 0);

    // Plain writes in chunks: they stop at the quota, not at the disk.
    refused_stream_write(
        &p,
        [
            ("path", Value::str("/data/fill")),
            ("offset", Value::Int(0)),
            ("bytes", Value::Int(4 * QUOTA as i64)),
        ],
    )
    .await;
    let filled = len(&dir.path().join("fill"));
    assert!(
        filled <= QUOTA,
        "{filled} bytes written past a {QUOTA}-byte quota"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_fits_under_the_quota_is_written_and_rewriting_is_free() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path(), Some(QUOTA)).await;
    let write = |offset: i64, bytes: i64| {
        inputs([
            ("path", Value::str("/data/f")),
            ("offset", Value::Int(offset)),
            ("bytes", Value::Int(bytes)),
        ])
    };
    let (r, _, _) = invoke(
        &p,
        "hostile.write_at",
        write(0, 3 * (QUOTA as i64) / 4),
        None,
    )
    .await;
    r.unwrap();
    // Each invocation has the whole quota, and rewriting existing bytes costs nothing:
    // this one writes 1.5 quotas but grows the file by only three quarters of one.
    let (r, _, _) = invoke(
        &p,
        "hostile.write_at",
        write(0, 3 * (QUOTA as i64) / 2),
        None,
    )
    .await;
    r.unwrap();
    assert_eq!(len(&dir.path().join("f")), 3 * QUOTA / 2);
    let (r, _, _) = invoke(
        &p,
        "hostile.grow",
        inputs([
            ("path", Value::str("/data/g")),
            ("size", Value::Int(QUOTA as i64)),
        ]),
        None,
    )
    .await;
    r.unwrap();
    assert_eq!(len(&dir.path().join("g")), QUOTA);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_quota_the_same_growth_is_accepted() {
    // The refusals above come from the quota, not from the file system.
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path(), None).await;
    let (r, _, _) = invoke(
        &p,
        "hostile.grow",
        inputs([
            ("path", Value::str("/data/sparse")),
            ("size", Value::Int(4 * QUOTA as i64)),
        ]),
        None,
    )
    .await;
    r.unwrap();
    assert_eq!(len(&dir.path().join("sparse")), 4 * QUOTA);
}
