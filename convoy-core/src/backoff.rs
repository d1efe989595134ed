//! Waiting before trying again: the one back-off of every retry loop
//! (reconnecting, re-reading, re-sending an acknowledgement).
//!
//! Each wait doubles up to a cap and is jittered (between half and all of
//! the nominal delay), so replicas that lost Redis at the same moment do not
//! come back in step. A wait can be cut short by a stop signal.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// An exponential, jittered back-off.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `first`, doubles up to `max`.
    pub(crate) fn new(first: Duration, max: Duration) -> Self {
        let max = max.max(first);
        Backoff {
            first,
            max,
            next: first,
        }
    }

    /// The usual back-off of a lost connection: 50 ms doubling to 2 s.
    pub fn reconnect() -> Self {
        Backoff::new(Duration::from_millis(50), Duration::from_secs(2))
    }

    /// The back-off of a fenced call retried while the lease still holds:
    /// 20 ms doubling to `max`.
    pub fn retry(max: Duration) -> Self {
        Backoff::new(Duration::from_millis(20), max)
    }

    /// Starts over from the first delay (after a success).
    pub fn reset(&mut self) {
        self.next = self.first;
    }

    /// The next delay, jittered, and doubles the one after it.
    pub fn next_delay(&mut self) -> Duration {
        let nominal = self.next;
        self.next = (self.next * 2).min(self.max);
        jitter(nominal)
    }

    /// Waits the next delay; false when `stop` fired first.
    pub async fn wait_or_stop(&mut self, stop: &CancellationToken) -> bool {
        !sleep_or_stop(self.next_delay(), stop).await
    }

    /// Waits the next delay, whatever happens meanwhile (for a call that
    /// must be settled before the caller may stop).
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_delay()).await;
    }
}

/// Sleeps `d`; true when `stop` fired first.
pub async fn sleep_or_stop(d: Duration, stop: &CancellationToken) -> bool {
    tokio::select! {
        _ = stop.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

/// A delay between half of `d` and `d`, at random.
pub fn jitter(d: Duration) -> Duration {
    // Every `RandomState` is keyed afresh: a cheap random number without a
    // generator to share.
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let half = d / 2;
    let nanos = half.as_nanos() as u64;
    half + Duration::from_nanos(if nanos == 0 { 0 } else { r % (nanos + 1) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_with_jitter_and_starts_over() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let nominal = [100, 200, 350, 350];
        for ms in nominal {
            let d = b.next_delay();
            let ms = Duration::from_millis(ms);
            assert!(
                d >= ms / 2 && d <= ms,
                "{d:?} outside [{:?}, {ms:?}]",
                ms / 2
            );
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    #[tokio::test]
    async fn a_stop_cuts_the_wait_short() {
        let stop = CancellationToken::new();
        stop.cancel();
        let mut b = Backoff::new(Duration::from_secs(60), Duration::from_secs(60));
        assert!(!b.wait_or_stop(&stop).await);
    }
}
