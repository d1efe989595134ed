//! The order of a producer's publish calls in a shard while one is sent
//! behind another whose reply has not come (see `publish.lua`).
//!
//! Every call gets an id, and a call sent while an earlier one to the same
//! shard is still in flight names that one: the script runs it only if the
//! earlier one was the producer's last call to run there. Calls are
//! registered when a batch is handed to the broker, before anything is
//! sent, so the order they name is the order the batches were given, not
//! the order their commands happened to leave.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// This process's publish calls in flight, per producer and shard.
#[derive(Debug)]
pub(crate) struct Calls {
    /// Names this process's calls apart from every other process's.
    process: String,
    next: AtomicU64,
    /// Per (producer, epoch, shard): the calls registered and still in
    /// flight, oldest first.
    in_flight: Mutex<HashMap<(String, u64, u32), Vec<String>>>,
}

impl Default for Calls {
    fn default() -> Self {
        Calls {
            process: uuid::Uuid::new_v4().simple().to_string(),
            next: AtomicU64::new(0),
            in_flight: Mutex::new(HashMap::new()),
        }
    }
}

/// A call registered whose batch's publish is not over; dropping it (the
/// publish over, failed or given up) takes it off the shard's calls in
/// flight. A refused call is kept until then, so a batch handed over
/// before the publisher learns of the refusal is sent behind it, and
/// refused too.
#[derive(Debug)]
pub(crate) struct InFlight {
    calls: Arc<Calls>,
    key: (String, u64, u32),
    /// This call's id.
    pub(crate) id: String,
    /// The call in flight it is sent behind, if any: the newest one still
    /// in flight when it was registered.
    pub(crate) behind: Option<String>,
}

impl Calls {
    /// Registers a call of `producer` (at `epoch`) to `shard`, behind the
    /// newest one in flight there if any.
    pub(crate) fn register(self: &Arc<Self>, producer: &str, epoch: u64, shard: u32) -> InFlight {
        let id = format!(
            "{}:{}",
            self.process,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let key = (producer.to_owned(), epoch, shard);
        let mut in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let calls = in_flight.entry(key.clone()).or_default();
        let behind = calls.last().cloned();
        calls.push(id.clone());
        InFlight {
            calls: self.clone(),
            key,
            id,
            behind,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut in_flight = self
            .calls
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(calls) = in_flight.get_mut(&self.key) {
            calls.retain(|id| *id != self.id);
            if calls.is_empty() {
                in_flight.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_sent_behind_the_newest_one_in_flight_to_its_shard_only() {
        let calls = Arc::new(Calls::default());
        let a = calls.register("p", 0, 0);
        assert_eq!(a.behind, None);
        let b = calls.register("p", 0, 0);
        assert_eq!(b.behind.as_deref(), Some(a.id.as_str()));
        // Another shard, producer or epoch: nothing in flight there.
        assert_eq!(calls.register("p", 0, 1).behind, None);
        assert_eq!(calls.register("q", 0, 0).behind, None);
        assert_eq!(calls.register("p", 1, 0).behind, None);
        // The newest answered before the one it was behind: the next call
        // is sent behind the older one, still in flight.
        drop(b);
        let c = calls.register("p", 0, 0);
        assert_eq!(c.behind.as_deref(), Some(a.id.as_str()));
        // The first answered: the last is still in flight.
        drop(a);
        let d = calls.register("p", 0, 0);
        assert_eq!(d.behind.as_deref(), Some(c.id.as_str()));
        // Everything answered: the next call is sent behind none.
        drop(c);
        drop(d);
        assert_eq!(calls.register("p", 0, 0).behind, None);
    }
}
