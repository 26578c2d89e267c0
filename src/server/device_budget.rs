//! `--max-device-bytes` and the client nodes' quotas (`--tenant ...:max_device_bytes`): bounds on
//! the device memory the node's clients may take, all together and each client node, checked
//! before XLA allocates anything.
//!
//! What counts is what is actually on the device: the buffers clients keep there (the resource
//! table's `buffer_bytes`, and each client node's share of them) and, while they last, the bytes
//! of transfers and runs in flight (a `to_device`'s array, a run's host arguments and its
//! results, known from the executable's signature), also by client node. A request that would
//! take its node past its quota is answered `{:error, {:quota, message}}`, one that would take
//! the total past the node's bound `{:error, {:resource_exhausted, message}}`; either allocates
//! and frees nothing, and everyone else is served on. Without a bound (the default) nothing is
//! refused: a device's memory is the plugin's to report, and the CPU plugin reports none.

use super::error::RequestError;
use super::resources::Resources;
use crate::schedule::tenants::Tenant;
use std::collections::HashMap;
use std::sync::Mutex;

/// The bound and the bytes reserved by work in flight.
#[derive(Debug, Default)]
pub struct DeviceBudget {
    /// `None`: no bound.
    limit: Option<u64>,
    in_flight: Mutex<InFlight>,
}

/// Bytes reserved by work in flight, in all and by client node.
#[derive(Debug, Default)]
struct InFlight {
    total: u64,
    by_node: HashMap<String, u64>,
}

/// Bytes reserved for one transfer or run; given back when dropped (after its buffers are
/// registered or dropped, so that they are never uncounted in between).
#[must_use]
pub struct Reservation<'a> {
    budget: &'a DeviceBudget,
    node: String,
    bytes: u64,
}

impl Reservation<'_> {
    /// Gives `bytes` of it back now (at most what it holds), keeping the rest.
    pub fn give_back(&mut self, bytes: u64) {
        let bytes = bytes.min(self.bytes);
        self.budget.release(&self.node, bytes);
        self.bytes -= bytes;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.budget.release(&self.node, self.bytes);
    }
}

impl DeviceBudget {
    /// A budget of `limit` bytes; `None`: no bound.
    pub fn new(limit: Option<u64>) -> DeviceBudget {
        DeviceBudget {
            limit,
            in_flight: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, InFlight> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `bytes` of `node`'s reservations are no longer in flight.
    fn release(&self, node: &str, bytes: u64) {
        let mut in_flight = self.lock();
        in_flight.total -= bytes;
        if let Some(n) = in_flight.by_node.get_mut(node) {
            *n -= bytes;
            if *n == 0 {
                in_flight.by_node.remove(node);
            }
        }
    }

    /// The bound, if any.
    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// Bytes reserved by transfers and runs in flight.
    pub fn in_flight(&self) -> u64 {
        self.lock().total
    }

    /// Bytes reserved by transfers and runs in flight for client node `node`.
    pub fn in_flight_of(&self, node: &str) -> u64 {
        self.lock().by_node.get(node).copied().unwrap_or(0)
    }

    /// Reserves `bytes` for `what` (a `to_device`, a run) of `tenant`, or says why not: the
    /// buffers its node's processes hold plus its node's work in flight plus `bytes` would
    /// exceed its quota (`:quota`), or the buffers `resources` holds plus what is in flight plus
    /// `bytes` would exceed the node's bound (`:resource_exhausted`).
    pub fn reserve(
        &self,
        resources: &Resources,
        what: &str,
        bytes: u64,
        tenant: &Tenant,
    ) -> Result<Reservation<'_>, RequestError> {
        let mut in_flight = self.lock();
        let of_node = in_flight.by_node.get(&*tenant.node).copied().unwrap_or(0);
        check_quota(resources, what, bytes, tenant, of_node)?;
        if let Some(limit) = self.limit {
            let held = resources.held().buffer_bytes + in_flight.total;
            if held.saturating_add(bytes) > limit {
                return Err(RequestError::ResourceExhausted(format!(
                    "{what} needs {bytes} bytes of device memory, but {held} are held \
                     (buffers kept and work in flight) and the node's limit is {limit} \
                     (--max-device-bytes); free buffers and retry"
                )));
            }
        }
        in_flight.total += bytes;
        *in_flight
            .by_node
            .entry(tenant.node.to_string())
            .or_default() += bytes;
        Ok(Reservation {
            budget: self,
            node: tenant.node.to_string(),
            bytes,
        })
    }

    /// Whether `bytes` more for `what` of `tenant` would fit under its quota now, reserving
    /// nothing: a run over it is refused when it arrives rather than after it waited.
    pub fn check_quota(
        &self,
        resources: &Resources,
        what: &str,
        bytes: u64,
        tenant: &Tenant,
    ) -> Result<(), RequestError> {
        if tenant.settings.max_device_bytes.is_none() {
            return Ok(());
        }
        let of_node = self.in_flight_of(&tenant.node);
        check_quota(resources, what, bytes, tenant, of_node)
    }
}

/// `:quota` unless `tenant`'s buffers, its `in_flight` bytes and `bytes` fit its quota.
fn check_quota(
    resources: &Resources,
    what: &str,
    bytes: u64,
    tenant: &Tenant,
    in_flight: u64,
) -> Result<(), RequestError> {
    let Some(quota) = tenant.settings.max_device_bytes else {
        return Ok(());
    };
    let buffers = resources.bytes_of_node(&tenant.node);
    let held = buffers + in_flight;
    if held.saturating_add(bytes) <= quota {
        return Ok(());
    }
    Err(RequestError::Quota(format!(
        "{what} needs {bytes} bytes of device memory, but node {node} holds {held} ({buffers} in \
         buffers, {in_flight} in transfers and runs in flight) and its quota is {quota} \
         (--tenant {rule}:max_device_bytes); free some of its buffers and retry",
        node = tenant.node,
        rule = tenant.settings.rule,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::tenants::{TenantRule, TenantRules, Tenants};

    fn tenants(flags: &[&str]) -> Tenants {
        let flags: Vec<_> = flags
            .iter()
            .map(|f| TenantRule::parse_flag(f).unwrap())
            .collect();
        Tenants::new(TenantRules::build(None, &flags).unwrap())
    }

    #[test]
    fn refuses_past_the_limit_and_gives_back_on_drop() {
        let resources = Resources::default();
        let budget = DeviceBudget::new(Some(100));
        let tenant = tenants(&[]).get("a@h");
        let first = budget
            .reserve(&resources, "a to_device", 60, &tenant)
            .unwrap();
        let refused = budget
            .reserve(&resources, "a run", 41, &tenant)
            .err()
            .unwrap();
        assert_eq!(refused.kind().as_str(), "resource_exhausted");
        let text = refused.to_string();
        assert!(text.contains("needs 41 bytes") && text.contains("60 are held"));
        assert!(text.contains("limit is 100"), "{text}");
        let mut second = budget.reserve(&resources, "a run", 40, &tenant).unwrap();
        assert_eq!(budget.in_flight(), 100);
        assert_eq!(budget.in_flight_of("a@h"), 100);
        second.give_back(30);
        assert_eq!((budget.in_flight(), budget.in_flight_of("a@h")), (70, 70));
        drop((first, second));
        assert_eq!((budget.in_flight(), budget.in_flight_of("a@h")), (0, 0));
        assert!(budget.reserve(&resources, "a run", 100, &tenant).is_ok());
    }

    #[test]
    fn none_means_no_limit() {
        let budget = DeviceBudget::new(None);
        assert_eq!(budget.limit(), None);
        let tenant = tenants(&[]).get("a@h");
        assert!(budget
            .reserve(&Resources::default(), "a run", u64::MAX / 2, &tenant)
            .is_ok());
    }

    #[test]
    fn a_quota_bounds_one_node_and_names_it() {
        let resources = Resources::default();
        let budget = DeviceBudget::new(None);
        let tenants = tenants(&["small*:max_device_bytes=100"]);
        let (small, other) = (tenants.get("small1@h"), tenants.get("other@h"));
        let held = budget.reserve(&resources, "a run", 70, &small).unwrap();
        let refused = budget
            .reserve(&resources, "the to_device", 40, &small)
            .err()
            .unwrap();
        assert_eq!(refused.kind().as_str(), "quota");
        let text = refused.to_string();
        assert!(text.contains("node small1@h holds 70"), "{text}");
        assert!(text.contains("its quota is 100"), "{text}");
        assert!(text.contains("--tenant small*:max_device_bytes"), "{text}");
        assert!(budget.check_quota(&resources, "a run", 40, &small).is_err());
        // Another node is not bound by it.
        let _other = budget.reserve(&resources, "a run", 1000, &other).unwrap();
        drop(held);
        assert!(budget.check_quota(&resources, "a run", 100, &small).is_ok());
    }
}
