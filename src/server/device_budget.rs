//! `--max-device-bytes`: a bound on the device memory the node's clients may take, checked before
//! XLA allocates anything.
//!
//! What counts is what is actually on the device: the buffers clients keep there (the resource
//! table's `buffer_bytes`) and, while they last, the bytes of transfers and runs in flight (a
//! `to_device`'s array, a run's host arguments and its results, known from the executable's
//! signature). A request that would take the total past the bound is answered
//! `{:error, {:resource_exhausted, message}}` and allocates nothing; everyone else is served on.
//! Without a bound (the default) nothing is refused: a device's memory is the plugin's to
//! report, and the CPU plugin reports none.

use super::error::RequestError;
use super::resources::Resources;
use std::sync::Mutex;

/// The bound and the bytes reserved by work in flight.
#[derive(Debug, Default)]
pub struct DeviceBudget {
    /// `None`: no bound.
    limit: Option<u64>,
    in_flight: Mutex<u64>,
}

/// Bytes reserved for one transfer or run; given back when dropped (after its buffers are
/// registered or dropped, so that they are never uncounted in between).
#[must_use]
pub struct Reservation<'a> {
    budget: &'a DeviceBudget,
    bytes: u64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        *self.budget.lock() -= self.bytes;
    }
}

impl DeviceBudget {
    /// A budget of `limit` bytes; `None`: no bound.
    pub fn new(limit: Option<u64>) -> DeviceBudget {
        DeviceBudget {
            limit,
            in_flight: Mutex::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bound, if any.
    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// Bytes reserved by transfers and runs in flight.
    pub fn in_flight(&self) -> u64 {
        *self.lock()
    }

    /// Reserves `bytes` for `what` (a `to_device`, a run), or says why not: the buffers
    /// `resources` holds plus what is in flight plus `bytes` would exceed the bound.
    pub fn reserve(
        &self,
        resources: &Resources,
        what: &str,
        bytes: u64,
    ) -> Result<Reservation<'_>, RequestError> {
        let mut in_flight = self.lock();
        if let Some(limit) = self.limit {
            let held = resources.held().buffer_bytes + *in_flight;
            if held.saturating_add(bytes) > limit {
                return Err(RequestError::ResourceExhausted(format!(
                    "{what} needs {bytes} bytes of device memory, but {held} are held \
                     (buffers kept and work in flight) and the node's limit is {limit} \
                     (--max-device-bytes); free buffers and retry"
                )));
            }
        }
        *in_flight += bytes;
        Ok(Reservation {
            budget: self,
            bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_past_the_limit_and_gives_back_on_drop() {
        let resources = Resources::default();
        let budget = DeviceBudget::new(Some(100));
        let first = budget.reserve(&resources, "a to_device", 60).unwrap();
        let refused = budget.reserve(&resources, "a run", 41).err().unwrap();
        assert_eq!(refused.kind().as_str(), "resource_exhausted");
        let text = refused.to_string();
        assert!(text.contains("needs 41 bytes") && text.contains("60 are held"));
        assert!(text.contains("limit is 100"), "{text}");
        let second = budget.reserve(&resources, "a run", 40).unwrap();
        assert_eq!(budget.in_flight(), 100);
        drop((first, second));
        assert_eq!(budget.in_flight(), 0);
        assert!(budget.reserve(&resources, "a run", 100).is_ok());
    }

    #[test]
    fn none_means_no_limit() {
        let budget = DeviceBudget::new(None);
        assert_eq!(budget.limit(), None);
        assert!(budget
            .reserve(&Resources::default(), "a run", u64::MAX / 2)
            .is_ok());
    }
}
