//! Package digests checked before a worker loads anything: the run records the sha256
//! of every installed package it uses, and a worker must run exactly that code. The
//! watchdog checks before each launch (a changed package ends the run with
//! `PACKAGE_CHANGED` instead of a restart loop), the worker again before loading, and
//! the load itself compares the digest of the very bytes it compiled (`runs resume`).

use std::collections::BTreeMap;

use heddle_store::{PackagePin, StoreError};
use heddle_wasm::PackageStore;

use crate::error::Error;

/// The first installed package of `recorded` whose component bytes no longer hash to
/// the recorded digest. Packages not installed in the package store (the first-party
/// ones built into heddle) are left to the check at load.
pub fn changed(
    run: &str,
    recorded: &BTreeMap<String, PackagePin>,
    store: &PackageStore,
) -> Result<Option<StoreError>, Error> {
    if recorded.is_empty() || !store.lockfile_path().is_file() {
        return Ok(None);
    }
    for entry in store.list()? {
        let Some(want) = recorded.get(&entry.name) else {
            continue;
        };
        let path = store.entry_dir(&entry).join(&entry.component);
        let current = match std::fs::read(&path) {
            Ok(bytes) => heddle_store::sha256_hex(&bytes),
            Err(e) => format!("unreadable ({e})"),
        };
        if current != want.sha256 {
            return Ok(Some(StoreError::PackageChanged {
                run: run.to_string(),
                package: entry.name.clone(),
                recorded: want.sha256.clone(),
                current,
            }));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installed_bytes_that_no_longer_match_the_recorded_digest_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let pkg = dir.path().join("packages/echo-1");
        std::fs::create_dir_all(&pkg).unwrap();
        std::fs::write(pkg.join("echo.wasm"), b"component bytes").unwrap();
        let digest = heddle_store::sha256_hex(b"component bytes");
        std::fs::write(
            dir.path().join("heddle.lock"),
            format!(
                "version = 1\n[[package]]\nname = \"echo\"\nversion = \"0.1.0\"\ncomponent = \"echo.wasm\"\nsha256 = \"{digest}\"\nmanifest_sha256 = \"{digest}\"\ndir = \"echo-1\"\n"
            ),
        )
        .unwrap();
        let env = PackageStore::open(dir.path());
        let recorded = BTreeMap::from([("echo".to_string(), PackagePin::digest(digest.clone()))]);
        assert!(changed("r", &recorded, &env).unwrap().is_none());
        // A package the run does not use is not looked at.
        assert!(changed("r", &BTreeMap::new(), &env).unwrap().is_none());

        std::fs::write(pkg.join("echo.wasm"), b"other bytes").unwrap();
        let e = changed("r", &recorded, &env).unwrap().expect("a change");
        let text = e.to_string();
        assert!(text.contains("package echo changed"), "{text}");
        assert!(text.contains(&digest), "{text}");
    }
}
