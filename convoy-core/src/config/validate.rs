//! [`Config::validate`]: the values that parse but cannot work. Every
//! problem is reported at once, each naming its key, so that one edit of
//! the file can fix them all.

use super::url::redact_url;
use super::{Config, MAX_SHARDS, OutboxConfig};
use crate::error::Error;

impl Config {
    /// Checks values that parse but cannot work; the error names `file`
    /// and lists every problem found, each naming its key.
    pub fn validate(&self, file: &str) -> Result<(), Error> {
        let mut problems = Problems::default();
        self.check(&mut problems);
        match problems.message() {
            None => Ok(()),
            Some(message) => Err(Error::Config {
                file: file.to_owned(),
                message,
            }),
        }
    }

    fn check(&self, problems: &mut Problems) {
        const PART: &str = "[server.partitioning]";
        const RETRY: &str = "[server.retry]";
        self.outbox.check(problems);
        let p = &self.server.partitioning;
        problems.add(in_range(
            PART,
            "lease_ttl_ms",
            p.lease_ttl_ms,
            100,
            86_400_000,
            "ms (0.1 s to 24 h)",
        ));
        if let Some(h) = p.heartbeat_interval_seconds {
            let max = p.lease_ttl_ms as f64 / 3000.0;
            let in_range =
                seconds_in_range(PART, "heartbeat_interval_seconds", h, 0.01, f64::INFINITY);
            if in_range.is_err() {
                problems.add(in_range);
            } else if h > max {
                problems.push(format!(
                    "{PART} heartbeat_interval_seconds = {h:?} is not well under lease_ttl_ms = {} (a live owner could let its lease lapse); use at most a third of the TTL ({max:.3} s), the default is lease_ttl_ms / 5000",
                    p.lease_ttl_ms
                ));
            }
        }
        problems.add(seconds_in_range(
            PART,
            "poll_interval_seconds",
            p.poll_interval_seconds,
            0.001,
            60.0,
        ));
        problems.add(in_range(
            PART,
            "reap_idle_ms",
            p.reap_idle_ms,
            100,
            2_592_000_000,
            "ms (0.1 s to 30 days)",
        ));
        problems.add(in_range(
            PART,
            "partition_warning_threshold",
            p.partition_warning_threshold,
            1,
            1_000_000_000,
            "partitions",
        ));
        problems.add(in_range(
            PART,
            "max_unacked",
            p.max_unacked as u64,
            1,
            10_000,
            "events",
        ));
        let suffix = &self.server.priority_lanes.backfill_suffix;
        if suffix.is_empty()
            || suffix.contains(':')
            || suffix == crate::key::DLQ_TOKEN
            || crate::key::is_sentinel(suffix)
        {
            problems.push(format!(
                "[server.priority_lanes] backfill_suffix = {suffix:?} must be a non-empty name without `:`, other than `dlq` and not of the `__name__` form"
            ));
        }
        check_retry(RETRY, &self.server.retry, problems);
        if self.broker.wait_acks && self.broker.wait_replicas == 0 {
            problems.push(
                "[broker] wait_acks = true waits for wait_replicas, which is 0: set [broker] wait_replicas = 1 (or more), or leave wait_acks out".to_owned(),
            );
        }
        if let Some(id) = &self.server.instance_id
            && (id.is_empty() || id.contains(':'))
        {
            problems.push(format!(
                "[server] instance_id = {id:?} must be non-empty and contain no `:`"
            ));
        }
        problems.add(in_range(
            "[server]",
            "engine_threads",
            self.server.engine_threads as u64,
            0,
            1_024,
            "threads (0: the application's runtime)",
        ));
        for (name, h) in &self.handlers {
            let section = format!("[handlers.{name:?}]");
            if h.has_retry() {
                check_retry(&section, &self.retry_for(name), problems);
            }
            if let Some(n) = h.concurrency {
                problems.add(in_range(
                    &section,
                    "concurrency",
                    n as u64,
                    1,
                    10_000,
                    "events",
                ));
            }
        }
        let url = &self.broker.url;
        let schemes = [
            "redis://",
            "rediss://",
            "redis+cluster://",
            "rediss+cluster://",
        ];
        if url != "inline" && !schemes.iter().any(|s| url.starts_with(s)) {
            problems.push(format!(
                "[broker] url = {:?} is not a broker; use \"inline\", a redis:// or rediss:// URL, or redis+cluster://host1:port1,host2:port2/ for a Redis Cluster",
                redact_url(url)
            ));
        }
        let shards = u64::from(MAX_SHARDS);
        problems.add(in_range(
            "[broker]",
            "shards",
            u64::from(self.broker.shards),
            1,
            shards,
            "shards",
        ));
        problems.add(in_range(
            "[broker]",
            "wait_replicas",
            u64::from(self.broker.wait_replicas),
            0,
            16,
            "replicas",
        ));
        problems.add(in_range(
            "[broker]",
            "wait_timeout_ms",
            self.broker.wait_timeout_ms,
            1,
            60_000,
            "ms (1 ms to 60 s)",
        ));
        for (category, n) in &self.broker.category_shards {
            problems.add(in_range(
                "[broker.category_shards]",
                category,
                u64::from(*n),
                1,
                shards,
                "shards",
            ));
        }
    }
}

impl OutboxConfig {
    fn check(&self, problems: &mut Problems) {
        for (key, name) in [("schema", &self.schema), ("table", &self.table)] {
            if !is_sql_identifier(name) {
                problems.push(format!(
                    "[outbox] {key} = {name:?} must be a lower-case SQL identifier (a-z, 0-9, _; not starting with a digit; at most 48 characters)"
                ));
            }
        }
        if !(100..=600_000).contains(&self.leader_timeout_ms) {
            problems.push(format!(
                "[outbox] leader_timeout_ms = {} must be between 100 and 600000",
                self.leader_timeout_ms
            ));
        }
        if !(10..=600_000).contains(&self.poll_interval_ms) {
            problems.push(format!(
                "[outbox] poll_interval_ms = {} must be between 10 and 600000",
                self.poll_interval_ms
            ));
        }
        if !(1..=10_000).contains(&self.batch) {
            problems.push(format!(
                "[outbox] batch = {} must be between 1 and 10000",
                self.batch
            ));
        }
        if !(2..=1_000).contains(&self.max_connections) {
            problems.push(format!(
                "[outbox] max_connections = {} must be between 2 and 1000",
                self.max_connections
            ));
        }
        if self.retention_seconds > 10 * 365 * 24 * 3600 {
            problems.push(format!(
                "[outbox] retention_seconds = {} must be at most ten years",
                self.retention_seconds
            ));
        }
        if let Some(url) = &self.postgres_url
            && !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
        {
            problems.push(format!(
                "[outbox] postgres_url = {:?} must be a postgres:// or postgresql:// URL",
                redact_url(url)
            ));
        }
    }
}

/// The problems found so far, in the order of the checks.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn push(&mut self, problem: String) {
        self.0.push(problem);
    }

    /// Records the problem of a check, if any.
    fn add(&mut self, check: Result<(), String>) {
        if let Err(problem) = check {
            self.push(problem);
        }
    }

    /// One problem as it is; several numbered on one line (a message is
    /// one line: the command line and the logs escape line breaks).
    fn message(self) -> Option<String> {
        match self.0.len() {
            0 => None,
            1 => self.0.into_iter().next(),
            n => {
                let listed: Vec<String> = self
                    .0
                    .iter()
                    .enumerate()
                    .map(|(i, p)| format!("({}) {p}", i + 1))
                    .collect();
                Some(format!("{n} problems: {}", listed.join("; ")))
            }
        }
    }
}

/// Whether `name` is an identifier convoy can put in SQL unquoted-safe form:
/// lower-case ASCII letters, digits and `_`, not starting with a digit, at
/// most 48 characters (room for the `_relay` and `_applied` suffixes).
#[doc(hidden)]
pub fn is_sql_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 48
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// `section key = value` must lie in `min..=max` (`unit` says in what).
fn in_range(
    section: &str,
    key: &str,
    value: u64,
    min: u64,
    max: u64,
    unit: &str,
) -> Result<(), String> {
    if (min..=max).contains(&value) {
        return Ok(());
    }
    Err(format!(
        "{section} {key} = {value} is out of range; use {min} to {max} {unit}"
    ))
}

/// `section key = value` (seconds) must be a number in `min..=max`.
fn seconds_in_range(
    section: &str,
    key: &str,
    value: f64,
    min: f64,
    max: f64,
) -> Result<(), String> {
    if value.is_finite() && value >= min && value <= max {
        return Ok(());
    }
    let upper = if max.is_finite() {
        format!("{max}")
    } else {
        "a third of lease_ttl_ms".to_owned()
    };
    Err(format!(
        "{section} {key} = {value:?} is out of range; use {min} to {upper} seconds"
    ))
}

/// The retry policy's values (`[server.retry]`, or a handler's with it
/// under them), named under `section`.
fn check_retry(section: &str, r: &super::RetryConfig, problems: &mut Problems) {
    problems.add(in_range(
        section,
        "max_retries",
        u64::from(r.max_retries),
        0,
        1_000,
        "retries",
    ));
    problems.add(in_range(
        section,
        "initial_backoff_ms",
        r.initial_backoff_ms,
        1,
        3_600_000,
        "ms (1 ms to 1 h)",
    ));
    problems.add(in_range(
        section,
        "max_backoff_ms",
        r.max_backoff_ms,
        1,
        3_600_000,
        "ms (1 ms to 1 h)",
    ));
    problems.add(in_range(
        section,
        "max_transient_backoff_ms",
        r.max_transient_backoff_ms,
        1,
        3_600_000,
        "ms (1 ms to 1 h)",
    ));
    problems.add(in_range(
        section,
        "outage_threshold",
        u64::from(r.outage_threshold),
        0,
        100_000,
        "keys (0: never pause)",
    ));
    if r.initial_backoff_ms > r.max_backoff_ms {
        problems.push(format!(
            "{section} initial_backoff_ms = {} is above max_backoff_ms = {}",
            r.initial_backoff_ms, r.max_backoff_ms
        ));
    }
    problems.add(in_range(
        section,
        "outage_window_ms",
        r.outage_window_ms,
        1,
        3_600_000,
        "ms (1 ms to 1 h)",
    ));
}
