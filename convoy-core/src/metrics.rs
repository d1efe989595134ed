//! Metrics, through the [`metrics`] facade: install any recorder (for
//! example the Prometheus one with `install_prometheus`, feature
//! `prometheus`) and convoy's figures appear there.
//!
//! | name | kind | labels | meaning |
//! | --- | --- | --- | --- |
//! | `convoy_events_handled_total` | counter | `handler` | events a handler finished successfully |
//! | `convoy_events_failed_total` | counter | `handler` | failed attempts (each retry counts) |
//! | `convoy_handle_seconds` | histogram | `handler` | time spent in the handler per attempt (the Prometheus endpoint exports it as a histogram, buckets [`HANDLE_SECONDS_BUCKETS`] or your own) |
//! | `convoy_partitions_owned` | gauge | `handler` | partitions this instance owns |
//! | `convoy_partitions` | gauge | `category` | live partitions in the category's index |
//! | `convoy_partitions_halted_total` | counter | `handler` | partitions halted on a poison event |
//! | `convoy_lease_acquired_total` | counter | `handler` | leases taken |
//! | `convoy_lease_lost_total` | counter | `handler` | units given up because the fence refused this instance or its liveness lapsed |
//! | `convoy_reclaimed_entries_total` | counter | `handler` | pending entries of earlier owners reclaimed on takeover |
//! | `convoy_lag` | gauge | `handler`, `category` | events published to the category's partitions that the handler has not finished (finished: handled and acknowledged, skipped or dead-lettered by an operator), refreshed every heartbeat: the sum of `convoy partitions`' LAG (pending + undelivered) over the category's partitions; a halted partition counts its head and everything behind it |
//! | `convoy_partition_warning` | gauge | `category` | 1 while the category has more live partitions than `partition_warning_threshold` |
//! | `convoy_missing_entries_total` | counter | `handler` | entries that were pending for a unit but no longer exist in its stream when it came to handle them (deleted by hand, or lost with Redis state): never handled, always logged as an error |
//! | `convoy_outbox_pending` | gauge | | outbox records waiting to be published (the store's backlog, all replicas) |
//! | `convoy_outbox_oldest_pending_seconds` | gauge | | age of the oldest pending outbox record (0 when none) |
//! | `convoy_outbox_abandoned` | gauge | | outbox records abandoned, waiting for an operator (`convoy outbox`) |
//! | `convoy_outbox_published_total` | counter | | outbox records this process published |
//! | `convoy_outbox_publish_failures_total` | counter | | failed publish calls of this process's outbox relay |
//! | `convoy_state_lost_total` | counter | `handler` | times this instance saw Redis lose convoy's state (its liveness key vanished before its TTL): events published before may be lost |
//! | `convoy_replication_lost_total` | counter | `category`, `shard`, `what`, `seen_by` | events (`what="published"`) or acknowledgements (`what="acked"`) a shard's master had and lost: it failed over to a replica, or restarted, without them; each loss is also logged as an ERROR naming the shard and the range (`wait_replicas` and `wait_acks` prevent it). Each observer (`seen_by`: `publisher`, or a handler's engine) counts what it saw: read the largest over `seen_by` |
//! | `convoy_redis_reconnects_total` | counter | | times this process rebuilt its Redis Cluster connection because it kept failing while the cluster answered a new one |
//! | `convoy_gaps_total` | counter | `handler` | poisoned heads moved to their key's dead letters with a recorded gap (`on_poison = "dead_letter"`) |
//! | `convoy_handler_paused` | gauge | `handler` | 1 while the handler is paused on this instance: `outage_threshold` of its keys failed with transient errors at once (a dependency is down); it probes with one event at a time |
//! | `convoy_handler_paused_seconds_total` | counter | `handler` | time the handler spent paused on this instance |
//! | `convoy_keys_paused` | gauge | `handler` | keys this instance holds with an event waiting while an operator's pause holds them (`convoy pause`) |

use std::time::Duration;

/// Counter: events handled.
pub const EVENTS_HANDLED: &str = "convoy_events_handled_total";
/// Counter: failed attempts.
pub const EVENTS_FAILED: &str = "convoy_events_failed_total";
/// Histogram: handler time in seconds.
pub const HANDLE_SECONDS: &str = "convoy_handle_seconds";
/// Gauge: partitions owned by this instance.
pub const PARTITIONS_OWNED: &str = "convoy_partitions_owned";
/// Gauge: live partitions of a category.
pub const PARTITIONS: &str = "convoy_partitions";
/// Counter: partitions halted.
pub const PARTITIONS_HALTED: &str = "convoy_partitions_halted_total";
/// Counter: leases acquired.
pub const LEASE_ACQUIRED: &str = "convoy_lease_acquired_total";
/// Counter: leases lost.
pub const LEASE_LOST: &str = "convoy_lease_lost_total";
/// Counter: reclaimed entries.
pub const RECLAIMED: &str = "convoy_reclaimed_entries_total";
/// Gauge: lag per handler and category.
pub const LAG: &str = "convoy_lag";
/// Gauge: 1 while a category is over the partition warning threshold.
pub const PARTITION_WARNING: &str = "convoy_partition_warning";
/// Counter: pending entries found deleted when their unit came to them.
pub const MISSING_ENTRIES: &str = "convoy_missing_entries_total";
/// Counter: times Redis was seen to have lost convoy's state.
pub const STATE_LOST: &str = "convoy_state_lost_total";
/// `convoy_replication_lost_total`.
pub const REPLICATION_LOST: &str = "convoy_replication_lost_total";
/// `convoy_redis_reconnects_total`.
pub const REDIS_RECONNECTS: &str = "convoy_redis_reconnects_total";
/// `convoy_gaps_total`.
pub const GAPS: &str = "convoy_gaps_total";
/// `convoy_handler_paused`.
pub const HANDLER_PAUSED: &str = "convoy_handler_paused";
/// Gauge: keys held by an operator's pause, with an event waiting.
pub const KEYS_PAUSED: &str = "convoy_keys_paused";
/// `convoy_handler_paused_seconds_total`.
pub const HANDLER_PAUSED_SECONDS: &str = "convoy_handler_paused_seconds_total";

/// Gauge: outbox backlog.
pub const OUTBOX_PENDING: &str = "convoy_outbox_pending";
/// Gauge: age of the oldest pending outbox record, in seconds.
pub const OUTBOX_OLDEST_PENDING: &str = "convoy_outbox_oldest_pending_seconds";
/// Gauge: abandoned outbox records.
pub const OUTBOX_ABANDONED: &str = "convoy_outbox_abandoned";
/// Counter: outbox records published.
pub const OUTBOX_PUBLISHED: &str = "convoy_outbox_published_total";
/// Counter: failed outbox publish calls.
pub const OUTBOX_PUBLISH_FAILURES: &str = "convoy_outbox_publish_failures_total";

/// One handler's per-event metrics, registered once (when the engine
/// starts, so install the recorder before that).
#[derive(Clone)]
#[doc(hidden)]
pub struct HandlerMetrics {
    handled: ::metrics::Counter,
    failed: ::metrics::Counter,
    seconds: ::metrics::Histogram,
}

impl std::fmt::Debug for HandlerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerMetrics").finish_non_exhaustive()
    }
}

impl HandlerMetrics {
    /// `handler`'s metrics, registered now.
    pub fn new(handler: &'static str) -> Self {
        HandlerMetrics {
            handled: ::metrics::counter!(EVENTS_HANDLED, "handler" => handler),
            failed: ::metrics::counter!(EVENTS_FAILED, "handler" => handler),
            seconds: ::metrics::histogram!(HANDLE_SECONDS, "handler" => handler),
        }
    }

    pub(crate) fn handled(&self, took: Duration) {
        self.handled.increment(1);
        self.seconds.record(took.as_secs_f64());
    }

    pub(crate) fn failed(&self, took: Duration) {
        self.failed.increment(1);
        self.seconds.record(took.as_secs_f64());
    }
}

pub(crate) fn outbox_published(n: usize) {
    if n > 0 {
        ::metrics::counter!(OUTBOX_PUBLISHED).increment(n as u64);
    }
}

pub(crate) fn outbox_publish_failed() {
    ::metrics::counter!(OUTBOX_PUBLISH_FAILURES).increment(1);
}

/// The outbox's backlog, the raise time of its oldest pending record (ms
/// since the Unix epoch) and its abandoned count.
pub(crate) fn outbox_stats(pending: u64, oldest_pending_ms: Option<u64>, abandoned: u64) {
    ::metrics::gauge!(OUTBOX_PENDING).set(pending as f64);
    let age = oldest_pending_ms
        .map(|ms| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            now.saturating_sub(ms) as f64 / 1000.0
        })
        .unwrap_or(0.0);
    ::metrics::gauge!(OUTBOX_OLDEST_PENDING).set(age);
    ::metrics::gauge!(OUTBOX_ABANDONED).set(abandoned as f64);
}

/// Records how many units `handler` owns in this process.
#[doc(hidden)]
pub fn owned(handler: &'static str, n: usize) {
    ::metrics::gauge!(PARTITIONS_OWNED, "handler" => handler).set(n as f64);
}

/// Records how many partitions `category` has, and whether that is over the warning threshold.
#[doc(hidden)]
pub fn partitions(category: &'static str, n: usize, over_threshold: bool) {
    ::metrics::gauge!(PARTITIONS, "category" => category).set(n as f64);
    ::metrics::gauge!(PARTITION_WARNING, "category" => category).set(if over_threshold {
        1.0
    } else {
        0.0
    });
}

/// Counts a gap `handler` saw before an event (a dead-lettered predecessor).
#[doc(hidden)]
pub fn gap(handler: &'static str) {
    ::metrics::counter!(GAPS, "handler" => handler).increment(1);
}

pub(crate) fn paused(handler: &'static str, on: bool) {
    ::metrics::gauge!(HANDLER_PAUSED, "handler" => handler).set(if on { 1.0 } else { 0.0 });
}

/// One more (`on`) or one fewer key of `handler` waits on an operator's
/// pause on this instance.
#[doc(hidden)]
pub fn key_paused(handler: &'static str, on: bool) {
    let g = ::metrics::gauge!(KEYS_PAUSED, "handler" => handler);
    if on {
        g.increment(1.0);
    } else {
        g.decrement(1.0);
    }
}

pub(crate) fn paused_for(handler: &'static str, took: Duration) {
    ::metrics::counter!(HANDLER_PAUSED_SECONDS, "handler" => handler)
        .increment(took.as_secs_f64().round() as u64);
}

/// Counts a partition of `handler` halted on a poison head.
#[doc(hidden)]
pub fn halted(handler: &'static str) {
    ::metrics::counter!(PARTITIONS_HALTED, "handler" => handler).increment(1);
}

/// Counts `n` leases `handler` took.
#[doc(hidden)]
pub fn acquired(handler: &'static str, n: usize) {
    ::metrics::counter!(LEASE_ACQUIRED, "handler" => handler).increment(n as u64);
}

/// Counts `n` leases `handler` lost.
#[doc(hidden)]
pub fn lost(handler: &'static str, n: usize) {
    ::metrics::counter!(LEASE_LOST, "handler" => handler).increment(n as u64);
}

/// Counts `n` pending entries `handler` reclaimed from earlier generations.
#[doc(hidden)]
pub fn reclaimed(handler: &'static str, n: u64) {
    ::metrics::counter!(RECLAIMED, "handler" => handler).increment(n);
}

/// Counts `n` pending entries of `handler` whose stream entries were gone.
#[doc(hidden)]
pub fn missing(handler: &'static str, n: usize) {
    ::metrics::counter!(MISSING_ENTRIES, "handler" => handler).increment(n as u64);
}

/// Counts a process-manager instance of `handler` whose state was lost.
#[doc(hidden)]
pub fn state_lost(handler: &'static str) {
    ::metrics::counter!(STATE_LOST, "handler" => handler).increment(1);
}

/// Counts `n` writes the broker found lost by a failover (`what`, in `category`'s `shard`, seen by `seen_by`).
#[doc(hidden)]
pub fn replication_lost(category: &str, shard: u32, what: &'static str, seen_by: &str, n: u64) {
    ::metrics::counter!(REPLICATION_LOST, "category" => category.to_owned(), "shard" => shard.to_string(), "what" => what, "seen_by" => seen_by.to_owned()).increment(n);
}

/// Counts a reconnection to Redis.
#[doc(hidden)]
pub fn reconnected() {
    ::metrics::counter!(REDIS_RECONNECTS).increment(1);
}

/// Records the lag of `handler` on `category` (published minus acknowledged).
#[doc(hidden)]
pub fn lag(handler: &'static str, category: &'static str, n: i64) {
    ::metrics::gauge!(LAG, "handler" => handler, "category" => category).set(n.max(0) as f64);
}

/// The default buckets of the `convoy_handle_seconds` histogram, in
/// seconds: from 1 ms to a minute.
pub const HANDLE_SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Serves every metric in the Prometheus text format at
/// `http://{addr}/metrics`, `convoy_handle_seconds` as a histogram with
/// [`HANDLE_SECONDS_BUCKETS`] (a histogram, unlike a summary, sums across
/// instances). Call it once, inside the tokio runtime, before the engine
/// starts.
#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub fn install_prometheus(addr: std::net::SocketAddr) -> Result<(), crate::error::Error> {
    install_prometheus_with_buckets(addr, HANDLE_SECONDS_BUCKETS)
}

/// [`install_prometheus`] with the histogram buckets of
/// `convoy_handle_seconds` (upper bounds in seconds, increasing; `+Inf` is
/// always added).
#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub fn install_prometheus_with_buckets(
    addr: std::net::SocketAddr,
    handle_seconds_buckets: &[f64],
) -> Result<(), crate::error::Error> {
    prometheus_builder(handle_seconds_buckets)?
        .with_http_listener(addr)
        .install()
        .map_err(|e| crate::error::Error::Metrics {
            message: format!("cannot serve Prometheus metrics on {addr}: {e}"),
        })
}

/// The exporter's builder: convoy's histograms with buckets.
#[cfg(feature = "prometheus")]
fn prometheus_builder(
    buckets: &[f64],
) -> Result<::metrics_exporter_prometheus::PrometheusBuilder, crate::error::Error> {
    let bad = |why: &str| crate::error::Error::Metrics {
        message: format!(
            "the buckets of {HANDLE_SECONDS} ({buckets:?}) {why}; give increasing upper bounds in seconds, such as metrics::HANDLE_SECONDS_BUCKETS"
        ),
    };
    if buckets.is_empty() {
        return Err(bad("are empty"));
    }
    if buckets.iter().any(|b| !b.is_finite() || *b <= 0.0) {
        return Err(bad("must be positive numbers"));
    }
    if buckets.windows(2).any(|w| w[0] >= w[1]) {
        return Err(bad("are not increasing"));
    }
    ::metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            ::metrics_exporter_prometheus::Matcher::Full(HANDLE_SECONDS.to_owned()),
            buckets,
        )
        .map_err(|e| bad(&e.to_string()))
}

#[cfg(all(test, feature = "prometheus"))]
mod tests {
    use super::*;

    #[test]
    fn handle_seconds_is_a_histogram_with_buckets() {
        let recorder = prometheus_builder(&[0.01, 0.1, 1.0])
            .expect("buckets")
            .build_recorder();
        let handle = recorder.handle();
        ::metrics::with_local_recorder(&recorder, || {
            let m = HandlerMetrics::new("app::Ledger");
            m.handled(Duration::from_millis(50));
            m.failed(Duration::from_millis(5));
        });
        let text = handle.render();
        assert!(
            text.contains("# TYPE convoy_handle_seconds histogram"),
            "{text}"
        );
        assert!(
            text.contains("convoy_handle_seconds_bucket{handler=\"app::Ledger\",le=\"0.01\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("convoy_handle_seconds_bucket{handler=\"app::Ledger\",le=\"0.1\"} 2"),
            "{text}"
        );
        assert!(!text.contains("quantile"), "not a summary: {text}");
        for bad in [&[][..], &[0.1, 0.1], &[1.0, 0.5], &[f64::NAN], &[-1.0]] {
            assert!(prometheus_builder(bad).is_err(), "{bad:?}");
        }
        assert!(prometheus_builder(HANDLE_SECONDS_BUCKETS).is_ok());
    }
}
