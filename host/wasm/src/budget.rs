//! What the host does for a guest is paid for and bounded per invocation.
//!
//! A host call is cheap for the guest (a handful of instructions) but not for the host
//! (a fiber switch, copies, locks), so each one is charged fuel in proportion to its cost:
//! a loop of host calls exhausts the budget like a loop of instructions does. And what a
//! guest hands the host to keep (asset ids, refused secret names that get logged) is
//! bounded in size and count, so host memory cannot be filled through the imports.

use std::sync::Arc;

use heddle_kernel::NodeError;

use crate::net::HttpMeter;

/// Fuel charged per host call: about what a microsecond of guest compute burns (the
/// default budget of 1e10 is about a second), roughly what a call costs the host.
pub(crate) const CALL_FUEL: u64 = 10_000;
/// Fuel charged per byte the host copies or parses for a call.
pub(crate) const BYTE_FUEL: u64 = 1;
/// Longest asset id a guest may record.
pub(crate) const MAX_ASSET_ID: usize = 1024;
/// Asset ids one invocation may record.
pub(crate) const MAX_ASSETS: usize = 1000;
/// Longest secret name looked up (longer names are never granted: refused unlogged).
pub(crate) const MAX_SECRET_NAME: usize = 256;
/// Refused secret requests logged per invocation (later ones are counted).
pub(crate) const MAX_REFUSALS_LOGGED: usize = 8;
/// Longest log line kept from the `log` import.
pub(crate) const MAX_LOG_LINE: usize = 16 << 10;

/// Per-invocation account of host work done for the guest.
#[derive(Debug, Default)]
pub(crate) struct HostBudget {
    /// Fuel charged for host calls so far, checked against the fuel left at every epoch
    /// tick and at the end.
    charged: u64,
    pub assets: usize,
    pub refusals: usize,
    /// A host-side rule the guest broke (a limit, a lie on `emit`): it fails the
    /// invocation whatever the guest does next. Complete, naming node and port.
    pub violation: Option<NodeError>,
    /// Outgoing HTTP requests and the bytes they moved (counted where the bytes flow,
    /// outside the store): each request is charged as a host call, each byte as a
    /// copied one.
    pub http: Arc<HttpMeter>,
}

impl HostBudget {
    /// Charges one host call that made the host handle `bytes` bytes.
    pub fn charge(&mut self, bytes: usize) {
        self.charged = self
            .charged
            .saturating_add(CALL_FUEL + (bytes as u64).saturating_mul(BYTE_FUEL));
    }

    pub fn charged(&self) -> u64 {
        let http = self
            .http
            .requests()
            .saturating_mul(CALL_FUEL)
            .saturating_add(self.http.bytes().saturating_mul(BYTE_FUEL));
        self.charged.saturating_add(http)
    }

    /// Records the first violation (later ones follow from it).
    pub fn violate(&mut self, e: NodeError) {
        self.violation.get_or_insert(e);
    }
}
