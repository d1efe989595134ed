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
    /// Per (producer, shard): the last call registered, while in flight.
    last: Mutex<HashMap<(String, u32), String>>,
}

impl Default for Calls {
    fn default() -> Self {
        Calls {
            process: uuid::Uuid::new_v4().simple().to_string(),
            next: AtomicU64::new(0),
            last: Mutex::new(HashMap::new()),
        }
    }
}

/// A call registered and not yet answered; dropping it (answered, failed
/// or given up) takes it off the shard's calls in flight.
#[derive(Debug)]
pub(crate) struct InFlight {
    calls: Arc<Calls>,
    producer: String,
    shard: u32,
    /// This call's id.
    pub(crate) id: String,
    /// The call in flight it is sent behind, if any.
    pub(crate) behind: Option<String>,
}

impl Calls {
    /// Registers a call of `producer` to `shard`, behind the one in flight
    /// there if any.
    pub(crate) fn register(self: &Arc<Self>, producer: &str, shard: u32) -> InFlight {
        let id = format!(
            "{}:{}",
            self.process,
            self.next.fetch_add(1, Ordering::Relaxed)
        );
        let behind = self
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((producer.to_owned(), shard), id.clone());
        InFlight {
            calls: self.clone(),
            producer: producer.to_owned(),
            shard,
            id,
            behind,
        }
    }
}

impl InFlight {
    /// Whether a later call of the producer to the shard was registered
    /// while this one was in flight (it is sent behind this one).
    pub(crate) fn followed(&self) -> bool {
        self.calls
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(self.producer.clone(), self.shard))
            .is_some_and(|last| *last != self.id)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut last = self
            .calls
            .last
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (std::mem::take(&mut self.producer), self.shard);
        if last.get(&key) == Some(&self.id) {
            last.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_sent_behind_the_last_one_in_flight_to_its_shard_only() {
        let calls = Arc::new(Calls::default());
        let a = calls.register("p", 0);
        assert_eq!(a.behind, None);
        let b = calls.register("p", 0);
        assert_eq!(b.behind.as_deref(), Some(a.id.as_str()));
        assert!(a.followed());
        assert!(!b.followed());
        // Another shard, another producer: nothing in flight there.
        assert_eq!(calls.register("p", 1).behind, None);
        assert_eq!(calls.register("q", 0).behind, None);
        // The first answered: the second is still the last in flight.
        drop(a);
        let c = calls.register("p", 0);
        assert_eq!(c.behind.as_deref(), Some(b.id.as_str()));
        // Everything answered: the next call is sent behind none.
        drop(b);
        drop(c);
        assert_eq!(calls.register("p", 0).behind, None);
    }
}
