//! Outage, not poison: one handler's view, on one instance, of how many of
//! its keys fail with *transient* errors (a dependency of the handler is
//! down) right now.
//!
//! - A key whose event fails transiently is noted ([`Outage::failed`]); a
//!   success clears it ([`Outage::succeeded`]). Transient failures never
//!   count toward `max_retries` and never halt: the worker retries the
//!   same event with capped, jittered back-off.
//! - When `outage_threshold` keys fail so at once, the handler **pauses**:
//!   no worker starts a new event ([`Outage::admit`] waits) but one probe
//!   at a time, spaced by a back-off that doubles up to
//!   `max_transient_backoff_ms`. Leases are kept; the heartbeat renews
//!   them.
//! - The first probe that succeeds resumes the handler: every waiting
//!   worker goes on, in its key's order.
//! - One log line when the pause starts and one when it ends (with how
//!   long it lasted), not one per key per attempt; the
//!   `convoy_handler_paused` gauge and `convoy_handler_paused_seconds_total`
//!   counter; the engine's health lists the paused handlers.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::plan::HealthState;
use crate::config::RetryConfig;
use crate::metrics;
use crate::tracing;

/// What [`Outage::admit`] decided for one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[doc(hidden)]
pub enum Admission {
    /// The handler is not paused: run it.
    Run,
    /// The handler is paused and this event is its probe: run it, then
    /// report with [`Outage::succeeded`] or [`Outage::failed`] (either ends
    /// the probe).
    Probe,
}

/// One handler's transient failures on this instance.
#[derive(Debug)]
#[doc(hidden)]
pub struct Outage {
    handler: &'static str,
    threshold: usize,
    retry: RetryConfig,
    health: Arc<HealthState>,
    state: Mutex<State>,
    resumed: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Keys whose current event failed transiently.
    failing: HashSet<String>,
    /// When the pause started; `None`: not paused.
    paused_since: Option<Instant>,
    /// A probe is running.
    probing: bool,
    /// Failed probes in a row (the next probe's back-off).
    probes_failed: u32,
    /// No probe starts before this.
    next_probe: Option<Instant>,
}

impl Outage {
    /// The outage view of `handler`, with `[server.retry]`'s threshold and
    /// back-off, reporting to `health`.
    #[doc(hidden)]
    pub fn new(handler: &'static str, retry: &RetryConfig, health: Arc<HealthState>) -> Self {
        Outage {
            handler,
            threshold: retry.outage_threshold as usize,
            retry: retry.clone(),
            health,
            state: Mutex::default(),
            resumed: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the handler is paused now.
    #[cfg(test)]
    fn is_paused(&self) -> bool {
        self.state().paused_since.is_some()
    }

    /// When the current pause started, in ms since the Unix epoch; `None`
    /// while not paused. The heartbeat publishes it for the operators'
    /// tools.
    #[doc(hidden)]
    pub fn paused_since_ms(&self) -> Option<u64> {
        let since = self.state().paused_since?;
        let ago = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX);
        Some(crate::envelope::now_ms().saturating_sub(ago))
    }

    /// Waits until an event may start: at once when the handler is not
    /// paused; while it is, until this worker gets the probe or the
    /// handler resumes. Cancel-safe (a probe is taken only on return).
    #[doc(hidden)]
    pub async fn admit(&self) -> Admission {
        loop {
            let notified = self.resumed.notified();
            let wait = match self.admission() {
                Ok(admission) => return admission,
                Err(wait) => wait,
            };
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// [`Outage::admit`] without waiting: `None` where it would wait (the
    /// handler is paused and its probe is not due).
    #[doc(hidden)]
    pub fn try_admit(&self) -> Option<Admission> {
        self.admission().ok()
    }

    /// The admission now, or how long to wait before asking again.
    fn admission(&self) -> Result<Admission, Duration> {
        let mut s = self.state();
        if s.paused_since.is_none() {
            return Ok(Admission::Run);
        }
        let now = Instant::now();
        match s.next_probe {
            _ if s.probing => Err(Duration::from_millis(250)),
            Some(at) if at > now => Err(at - now),
            _ => {
                s.probing = true;
                Ok(Admission::Probe)
            }
        }
    }

    /// `key`'s event failed with a transient error (`error`, for the log);
    /// `probe` when it was the paused handler's probe.
    #[doc(hidden)]
    pub fn failed(&self, key: &str, probe: bool, error: &str) {
        let mut s = self.state();
        s.failing.insert(key.to_owned());
        if probe {
            s.probing = false;
            s.probes_failed += 1;
            let wait = self.retry.transient_backoff(s.probes_failed);
            s.next_probe = Some(Instant::now() + wait);
        }
        if s.paused_since.is_none() && self.threshold > 0 && s.failing.len() >= self.threshold {
            s.paused_since = Some(Instant::now());
            s.probes_failed = 0;
            s.next_probe = Some(Instant::now() + self.retry.transient_backoff(1));
            drop(s);
            tracing::warn!(
                handler = self.handler,
                keys = self.threshold,
                error = %crate::key::Escaped(error),
                "handler paused on this instance: {} keys failed with transient errors at once (a dependency is down, not the events); it probes with one event at a time and resumes when one succeeds",
                self.threshold
            );
            metrics::paused(self.handler, true);
            self.health.paused(self.handler, true);
        }
    }

    /// `key`'s event succeeded (a probe's success resumes the handler).
    #[doc(hidden)]
    pub fn succeeded(&self, key: &str, probe: bool) {
        let mut s = self.state();
        // Most events succeed with no key failing: no hashing then.
        let noted = !s.failing.is_empty() && s.failing.remove(key);
        if probe {
            s.probing = false;
        }
        let Some(since) = s.paused_since else {
            return;
        };
        if !probe && !noted {
            return;
        }
        *s = State::default();
        drop(s);
        let took = since.elapsed();
        tracing::info!(
            handler = self.handler,
            paused_ms = took.as_millis() as u64,
            "handler resumed on this instance: an event succeeded after {:.1} s paused",
            took.as_secs_f64()
        );
        metrics::paused(self.handler, false);
        metrics::paused_for(self.handler, took);
        self.health.paused(self.handler, false);
        self.resumed.notify_waiters();
    }

    /// `key` no longer has an event here (its worker ended): it no longer
    /// counts as failing.
    #[doc(hidden)]
    pub fn forget(&self, key: &str, probe: bool) {
        let mut s = self.state();
        s.failing.remove(key);
        if probe {
            s.probing = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outage(threshold: u32) -> Outage {
        let retry = RetryConfig {
            initial_backoff_ms: 10,
            max_transient_backoff_ms: 40,
            outage_threshold: threshold,
            ..RetryConfig::default()
        };
        Outage::new("h", &retry, Arc::default())
    }

    #[tokio::test]
    async fn threshold_keys_failing_pause_the_handler_and_one_probe_resumes_it() {
        let o = outage(2);
        assert_eq!(o.admit().await, Admission::Run);
        o.failed("a", false, "down");
        assert!(!o.is_paused(), "one key is not an outage");
        o.failed("a", false, "down");
        assert!(!o.is_paused(), "the same key again is still one");
        o.failed("b", false, "down");
        assert!(o.is_paused());
        assert_eq!(o.health.paused_handlers(), ["h"]);
        // One probe at a time.
        assert_eq!(o.admit().await, Admission::Probe);
        let second = tokio::time::timeout(Duration::from_millis(100), o.admit()).await;
        assert!(second.is_err(), "no second event while the probe runs");
        // A failed probe: the next one waits its back-off.
        o.failed("c", true, "still down");
        assert!(o.is_paused());
        assert_eq!(o.admit().await, Admission::Probe);
        // A succeeding probe resumes everyone.
        let waiter = {
            let o = Arc::new(o);
            let w = o.clone();
            let t = tokio::spawn(async move { w.admit().await });
            tokio::time::sleep(Duration::from_millis(20)).await;
            o.succeeded("c", true);
            assert!(!o.is_paused());
            assert!(o.health.paused_handlers().is_empty());
            t
        };
        assert_eq!(waiter.await.expect("join"), Admission::Run);
    }

    #[tokio::test]
    async fn a_success_of_a_key_that_was_not_failing_does_not_resume() {
        let o = outage(1);
        o.failed("a", false, "down");
        assert!(o.is_paused());
        o.succeeded("z", false);
        assert!(
            o.is_paused(),
            "an event started before the pause proves nothing"
        );
        o.succeeded("a", false);
        assert!(!o.is_paused(), "the failing key itself succeeded");
    }

    #[tokio::test]
    async fn threshold_zero_never_pauses() {
        let o = outage(0);
        for k in ["a", "b", "c", "d"] {
            o.failed(k, false, "down");
        }
        assert!(!o.is_paused());
        assert_eq!(o.admit().await, Admission::Run);
    }
}
