//! Outage, not poison: one handler's view, on one instance, of how many of
//! its keys fail at once right now.
//!
//! - A key whose event fails *transiently* is noted ([`Outage::failed`]); a
//!   success clears it ([`Outage::succeeded`]). Transient failures never
//!   count toward `max_retries` and never halt: the worker retries the
//!   same event with capped, jittered back-off.
//! - A key whose event fails with an error of the *default* class is noted
//!   too ([`Outage::failed_default`]), with when its failures began. It is
//!   a witness of a **handler-wide failure** while its failures began
//!   after the handler's last success on this instance and its last one
//!   is within `outage_window_ms`: every event failing, whatever the key (a
//!   dependency down behind an unclassified error, a bad deploy). A key
//!   whose failures began before another key's success fails while others
//!   succeed: it is poison, counted toward `max_retries`, and halts (or is
//!   dead-lettered) alone.
//! - When `outage_threshold` keys fail so at once (transient failures, or
//!   witnesses of a handler-wide failure), the handler **pauses**: no
//!   worker starts a new event ([`Outage::admit`] waits) but one probe at
//!   a time, spaced by a back-off that doubles up to
//!   `max_transient_backoff_ms`. Leases are kept; the heartbeat renews
//!   them. Failures while paused count toward no key's `max_retries`.
//! - The first probe that succeeds resumes the handler: every waiting
//!   worker goes on, in its key's order. A key whose own probe failed
//!   during the pause (while another key's succeeded) is poison from then
//!   on.
//! - One log line when the pause starts and one when it ends (with how
//!   long it lasted), not one per key per attempt; the
//!   `convoy_handler_paused` gauge and `convoy_handler_paused_seconds_total`
//!   counter; the engine's health lists the paused handlers.

use std::collections::{HashMap, HashSet};
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

/// What [`Outage::failed_default`] decided for a default-class failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[doc(hidden)]
pub enum Verdict {
    /// The key's own failure: it counts toward `max_retries`.
    Counted,
    /// A handler-wide failure (the handler is paused): retried in place
    /// like a transient one, counted toward nothing.
    HandlerWide,
}

/// One handler's failing keys on this instance.
#[derive(Debug)]
#[doc(hidden)]
pub struct Outage {
    handler: &'static str,
    threshold: usize,
    window: Duration,
    retry: RetryConfig,
    health: Arc<HealthState>,
    state: Mutex<State>,
    resumed: Notify,
}

/// A key failing with default-class errors.
#[derive(Debug, Clone, Copy)]
struct Streak {
    /// Its first failure since its last success.
    since: Instant,
    /// Its latest failure.
    last: Instant,
    /// It failed while another key succeeded: poison, not a witness.
    poison: bool,
    /// It was a paused handler's probe and failed.
    probe_failed: bool,
}

#[derive(Debug, Default)]
struct State {
    /// Keys whose current event failed transiently.
    failing: HashSet<String>,
    /// Keys whose current event failed with a default-class error.
    streaks: HashMap<String, Streak>,
    /// The handler's last success on this instance.
    last_success: Option<Instant>,
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
            window: Duration::from_millis(retry.outage_window_ms),
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
            self.probe_failed(&mut s);
        }
        if s.failing.len() >= self.threshold {
            self.pause(
                s,
                error,
                "failed with transient errors at once (a dependency is down, not the events)",
            );
        }
    }

    /// `key`'s event failed with an error of the default class (`error`,
    /// for the log); `probe` when it was the paused handler's probe.
    /// Whether the failure counts toward the key's `max_retries`, or is a
    /// handler-wide failure (see the module's documentation).
    #[doc(hidden)]
    pub fn failed_default(&self, key: &str, probe: bool, error: &str) -> Verdict {
        let now = Instant::now();
        let mut s = self.state();
        let streak = s.streaks.entry(key.to_owned()).or_insert(Streak {
            since: now,
            last: now,
            poison: false,
            probe_failed: false,
        });
        streak.last = now;
        streak.probe_failed |= probe;
        let poison = streak.poison;
        if probe {
            self.probe_failed(&mut s);
        }
        if s.paused_since.is_some() {
            return if poison {
                Verdict::Counted
            } else {
                Verdict::HandlerWide
            };
        }
        if poison {
            return Verdict::Counted;
        }
        let witnesses = s
            .streaks
            .values()
            .filter(|k| {
                !k.poison
                    && s.last_success.is_none_or(|ok| k.since > ok)
                    && now.duration_since(k.last) <= self.window
            })
            .count();
        if witnesses >= self.threshold {
            self.pause(
                s,
                error,
                "failed at once since its last success, with errors of the default class (a handler-wide failure: a dependency down behind an unclassified error, or a bad deploy; not poisoned events)",
            );
            return Verdict::HandlerWide;
        }
        // Failures that began before another key's success: this key fails
        // while others succeed.
        if let (Some(ok), Some(k)) = (s.last_success, s.streaks.get_mut(key))
            && k.since < ok
        {
            k.poison = true;
        }
        Verdict::Counted
    }

    /// A failed probe: the next one waits its back-off.
    fn probe_failed(&self, s: &mut State) {
        s.probing = false;
        s.probes_failed += 1;
        let wait = self.retry.transient_backoff(s.probes_failed);
        s.next_probe = Some(Instant::now() + wait);
    }

    /// Pauses the handler (unless paused, or pausing is off), with one
    /// WARN line: `threshold` keys `what`.
    fn pause(&self, mut s: std::sync::MutexGuard<'_, State>, error: &str, what: &str) {
        if s.paused_since.is_some() || self.threshold == 0 {
            return;
        }
        s.paused_since = Some(Instant::now());
        s.probes_failed = 0;
        s.next_probe = Some(Instant::now() + self.retry.transient_backoff(1));
        drop(s);
        tracing::warn!(
            handler = self.handler,
            keys = self.threshold,
            error = %crate::key::Escaped(error),
            "handler paused on this instance: {} keys {what}; it probes with one event at a time, counts no failure toward any key's max_retries meanwhile, and resumes when one succeeds",
            self.threshold
        );
        metrics::paused(self.handler, true);
        self.health.paused(self.handler, true);
    }

    /// `key`'s event succeeded (a probe's success resumes the handler).
    #[doc(hidden)]
    pub fn succeeded(&self, key: &str, probe: bool) {
        let mut s = self.state();
        // Most events succeed with no key failing: no hashing then.
        let noted = !s.failing.is_empty() && s.failing.remove(key);
        let streak = !s.streaks.is_empty() && s.streaks.remove(key).is_some();
        if !s.streaks.is_empty() {
            // Only a success beside failing keys tells them apart.
            s.last_success = Some(Instant::now());
        }
        if probe {
            s.probing = false;
        }
        let Some(since) = s.paused_since else {
            return;
        };
        if !probe && !noted && !streak {
            return;
        }
        // Resumed. A key whose own probe failed while this one succeeded is
        // poison; the others begin afresh.
        let now = Instant::now();
        let mut streaks = std::mem::take(&mut s.streaks);
        for k in streaks.values_mut() {
            if k.probe_failed {
                k.poison = true;
            } else {
                k.since = now;
            }
            k.probe_failed = false;
        }
        *s = State {
            streaks,
            last_success: Some(now),
            ..State::default()
        };
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
        s.streaks.remove(key);
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

    #[tokio::test]
    async fn default_class_failures_of_many_keys_since_the_last_success_pause() {
        let o = outage(3);
        o.succeeded("x", false);
        assert_eq!(o.failed_default("a", false, "bug"), Verdict::Counted);
        assert_eq!(o.failed_default("b", false, "bug"), Verdict::Counted);
        assert!(!o.is_paused(), "two keys are not three");
        assert_eq!(
            o.failed_default("c", false, "connection refused"),
            Verdict::HandlerWide
        );
        assert!(o.is_paused(), "three keys failing since the last success");
        assert_eq!(
            o.failed_default("a", false, "bug"),
            Verdict::HandlerWide,
            "counted toward nothing while paused"
        );
        // The dependency (or the fix) is back: a probe succeeds.
        assert_eq!(o.admit().await, Admission::Probe);
        o.succeeded("b", true);
        assert!(!o.is_paused());
        assert_eq!(o.admit().await, Admission::Run);
    }

    #[tokio::test]
    async fn a_key_failing_while_others_succeed_is_poison_and_never_pauses() {
        let o = outage(2);
        for round in 0..5 {
            assert_eq!(o.failed_default("poison", false, "bug"), Verdict::Counted);
            o.succeeded(&format!("ok-{round}"), false);
        }
        assert_eq!(o.failed_default("other", false, "bug"), Verdict::Counted);
        assert!(
            !o.is_paused(),
            "the poisoned key failed while others succeeded: not a witness"
        );
    }

    #[tokio::test]
    async fn a_key_whose_probe_failed_while_another_succeeded_is_poison_after_the_pause() {
        let o = outage(2);
        o.failed_default("a", false, "bug");
        assert_eq!(o.failed_default("b", false, "bug"), Verdict::HandlerWide);
        assert_eq!(o.admit().await, Admission::Probe);
        assert_eq!(o.failed_default("a", true, "bug"), Verdict::HandlerWide);
        assert_eq!(o.admit().await, Admission::Probe);
        o.succeeded("b", true);
        assert!(!o.is_paused());
        assert_eq!(
            o.failed_default("a", false, "bug"),
            Verdict::Counted,
            "its probe failed while b's succeeded"
        );
        assert_eq!(o.failed_default("c", false, "bug"), Verdict::Counted);
        assert!(!o.is_paused(), "a poisoned key is no witness");
    }

    #[tokio::test]
    async fn old_failures_are_no_witnesses() {
        let retry = RetryConfig {
            outage_threshold: 2,
            outage_window_ms: 20,
            ..RetryConfig::default()
        };
        let o = Outage::new("h", &retry, Arc::default());
        o.failed_default("a", false, "bug");
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert_eq!(o.failed_default("b", false, "bug"), Verdict::Counted);
        assert!(!o.is_paused(), "a's failure is outside the window");
    }
}
