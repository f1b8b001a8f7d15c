//! The secret values a run could come to hold, registered before its first event: the
//! kernel masks every escalation, error and log line against them, and the run store
//! refuses to keep a value holding one, from the first record on (not only after a node
//! happened to read a secret).

use std::sync::Arc;

use heddle_kernel::SecretRegistry;
use heddle_wasm::WasmConfig;

/// The secret values the configuration knows of, without loading any package: the
/// literal `[secrets] values`, every secret granted to a package, and every variable
/// under the secrets prefix (`HEDDLE_SECRET_*`). What a write of a person's text into a
/// run's log outside a run (a rejection's note) masks out.
pub fn known_secrets(wasm: &WasmConfig) -> Arc<SecretRegistry> {
    let registry = SecretRegistry::default();
    let source = &wasm.secrets;
    for v in source.values.values() {
        registry.register(v);
    }
    for grant in wasm.packages.values() {
        for name in &grant.secrets {
            if let Some(v) = source.lookup(name) {
                registry.register(&v);
            }
        }
        // The host's own headers (`network_auth`): the secret, and the header value it
        // makes, never the guest's to see, never anywhere in a run.
        for auth in grant.network_auth.values() {
            if let Some(v) = source.lookup(auth.secret.get_ref()) {
                registry.register(&auth.value(&v));
                registry.register(&v);
            }
        }
    }
    if !source.env_prefix.is_empty() {
        for (k, v) in std::env::vars_os() {
            if k.to_string_lossy().starts_with(&source.env_prefix)
                && let Some(v) = v.to_str()
            {
                registry.register(v);
            }
        }
    }
    Arc::new(registry)
}
