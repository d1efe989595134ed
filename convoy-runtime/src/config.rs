//! Configuration: `domain.toml`.
//!
//! ```toml
//! [broker]
//! url = "inline"                   # or "redis://127.0.0.1:6379/0", "rediss://user:pass@host/0"
//! # tls_ca_file = "ca.pem"         # rediss:// with a private CA
//!
//! [server.partitioning]
//! lease_ttl_ms = 15000
//! heartbeat_interval_seconds = 3.0 # default lease_ttl_ms / 5000
//! poll_interval_seconds = 0.25
//! reap_idle_ms = 3600000
//! partition_warning_threshold = 10000
//! max_unacked = 1                  # events handled per fenced ack
//!
//! [server.priority_lanes]
//! enabled = false
//! backfill_suffix = "backfill"
//!
//! [outbox]                         # default: in process memory
//! # postgres_url = "postgres://app@127.0.0.1/app"  # PgOutbox (feature `postgres`)
//! schema = "public"
//! table = "convoy_outbox"          # also {table}_relay, {table}_applied
//! retention_seconds = 0            # keep published rows this long (0: delete)
//! leader_timeout_ms = 5000         # a stalled relay's leadership lapses after this
//! poll_interval_ms = 1000          # fallback poll; commits wake the relay at once
//! migrate = true                   # create/upgrade the tables at engine start
//! max_connections = 8
//!
//! [server.retry]
//! max_retries = 3
//! initial_backoff_ms = 100
//! max_backoff_ms = 10000
//! ```
//!
//! Every key is optional; a missing file means every default. Unknown keys
//! are errors naming the key and the file.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::error::Error;

/// The whole configuration of a domain.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Which broker to use.
    pub broker: BrokerConfig,
    /// Engine settings.
    pub server: ServerConfig,
    /// Where raised events wait to be published.
    pub outbox: OutboxConfig,
}

/// `[outbox]`: where raised events wait to be published. Without
/// `postgres_url` they wait in process memory (lost if the process dies
/// before publishing them).
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutboxConfig {
    /// A `postgres://` URL: keep the outbox in PostgreSQL (`PgOutbox`,
    /// feature `postgres`).
    pub postgres_url: Option<String>,
    /// The schema of the outbox tables.
    pub schema: String,
    /// The outbox table (its relay and applied-events tables are named
    /// after it: `{table}_relay`, `{table}_applied`).
    pub table: String,
    /// How long published rows are kept (0: deleted as they are published).
    pub retention_seconds: u64,
    /// How long a stalled relay keeps its leadership before PostgreSQL ends
    /// its session and another replica takes over.
    pub leader_timeout_ms: u64,
    /// How often the relay looks for rows when no commit notification
    /// arrives (a safety net: commits wake it at once).
    pub poll_interval_ms: u64,
    /// Create or upgrade the tables when the engine starts.
    pub migrate: bool,
    /// Connections of the outbox's pool.
    pub max_connections: u32,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            postgres_url: None,
            schema: "public".to_owned(),
            table: "convoy_outbox".to_owned(),
            retention_seconds: 0,
            leader_timeout_ms: 5_000,
            poll_interval_ms: 1_000,
            migrate: true,
            max_connections: 8,
        }
    }
}

impl std::fmt::Debug for OutboxConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxConfig")
            .field(
                "postgres_url",
                &self.postgres_url.as_deref().map(redact_url),
            )
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("retention_seconds", &self.retention_seconds)
            .field("leader_timeout_ms", &self.leader_timeout_ms)
            .field("poll_interval_ms", &self.poll_interval_ms)
            .field("migrate", &self.migrate)
            .field("max_connections", &self.max_connections)
            .finish()
    }
}

impl OutboxConfig {
    fn validate(&self) -> Result<(), String> {
        for (key, name) in [("schema", &self.schema), ("table", &self.table)] {
            if !is_sql_identifier(name) {
                return Err(format!(
                    "[outbox] {key} = {name:?} must be a lower-case SQL identifier (a-z, 0-9, _; not starting with a digit; at most 48 characters)"
                ));
            }
        }
        if !(100..=600_000).contains(&self.leader_timeout_ms) {
            return Err(format!(
                "[outbox] leader_timeout_ms = {} must be between 100 and 600000",
                self.leader_timeout_ms
            ));
        }
        if !(10..=600_000).contains(&self.poll_interval_ms) {
            return Err(format!(
                "[outbox] poll_interval_ms = {} must be between 10 and 600000",
                self.poll_interval_ms
            ));
        }
        if !(2..=1_000).contains(&self.max_connections) {
            return Err(format!(
                "[outbox] max_connections = {} must be between 2 and 1000",
                self.max_connections
            ));
        }
        if self.retention_seconds > 10 * 365 * 24 * 3600 {
            return Err(format!(
                "[outbox] retention_seconds = {} must be at most ten years",
                self.retention_seconds
            ));
        }
        if let Some(url) = &self.postgres_url
            && !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
        {
            return Err(format!(
                "[outbox] postgres_url = {:?} must be a postgres:// or postgresql:// URL",
                redact_url(url)
            ));
        }
        Ok(())
    }
}

/// Whether `name` is an identifier convoy can put in SQL unquoted-safe form:
/// lower-case ASCII letters, digits and `_`, not starting with a digit, at
/// most 48 characters (room for the `_relay` and `_applied` suffixes).
pub(crate) fn is_sql_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 48
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// `[broker]`.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// `inline`, or a `redis://` / `rediss://` URL.
    pub url: String,
    /// For `rediss://`: a PEM file with the CA that signed the server's
    /// certificate, when it is not in the system trust store.
    pub tls_ca_file: Option<String>,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            url: "inline".to_owned(),
            tls_ca_file: None,
        }
    }
}

impl std::fmt::Debug for BrokerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerConfig")
            .field("url", &redact_url(&self.url))
            .field("tls_ca_file", &self.tls_ca_file)
            .finish()
    }
}

/// A URL with its password replaced by `***`, for logs.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// `[server]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// `[server.partitioning]`.
    pub partitioning: PartitioningConfig,
    /// `[server.priority_lanes]`.
    pub priority_lanes: PriorityLanesConfig,
    /// `[server.retry]`.
    pub retry: RetryConfig,
}

/// `[server.partitioning]`: timing of the partitioned consumer.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PartitioningConfig {
    /// How long an ownership lease is held before it must be renewed.
    pub lease_ttl_ms: u64,
    /// How often the owner renews its leases; default `lease_ttl_ms / 5000`.
    pub heartbeat_interval_seconds: Option<f64>,
    /// How long a partition worker waits between reads when its partition is
    /// empty and no wake-up arrives (a safety net; new events wake workers at
    /// once).
    pub poll_interval_seconds: f64,
    /// How long a drained partition sits idle before its owner retires it.
    pub reap_idle_ms: u64,
    /// Warn when a category has more live partitions than this.
    pub partition_warning_threshold: u64,
    /// How many handled events a partition worker may hold before it
    /// acknowledges them in one fenced call. `1` (the default) acknowledges
    /// each event before the next starts, so after a crash at most the one
    /// event in flight runs again; a larger value trades that bound (up to
    /// this many events may run again) for far fewer Redis round trips.
    pub max_unacked: usize,
}

impl Default for PartitioningConfig {
    fn default() -> Self {
        PartitioningConfig {
            lease_ttl_ms: 15_000,
            heartbeat_interval_seconds: None,
            poll_interval_seconds: 0.25,
            reap_idle_ms: 3_600_000,
            partition_warning_threshold: 10_000,
            max_unacked: 1,
        }
    }
}

impl PartitioningConfig {
    /// The lease TTL.
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms)
    }

    /// The heartbeat interval (explicit or `lease_ttl_ms / 5000` seconds).
    pub fn heartbeat_interval(&self) -> Duration {
        match self.heartbeat_interval_seconds {
            Some(s) => Duration::from_secs_f64(s),
            None => Duration::from_millis(self.lease_ttl_ms / 5),
        }
    }

    /// The poll interval.
    pub fn poll_interval(&self) -> Duration {
        Duration::from_secs_f64(self.poll_interval_seconds)
    }

    /// The idle time after which a drained partition is retired.
    pub fn reap_idle(&self) -> Duration {
        Duration::from_millis(self.reap_idle_ms)
    }
}

/// `[server.priority_lanes]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PriorityLanesConfig {
    /// Route low-priority events to the backfill lane.
    pub enabled: bool,
    /// The backfill lane suffix; also a reserved key value.
    pub backfill_suffix: String,
}

impl Default for PriorityLanesConfig {
    fn default() -> Self {
        PriorityLanesConfig {
            enabled: false,
            backfill_suffix: "backfill".to_owned(),
        }
    }
}

/// `[server.retry]`: how a failing event is retried.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Retries after the first attempt; then a partition halts and an
    /// ordinary handler dead-letters.
    pub max_retries: u32,
    /// The first back-off.
    pub initial_backoff_ms: u64,
    /// The longest back-off (back-off doubles up to it).
    pub max_backoff_ms: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_retries: 3,
            initial_backoff_ms: 100,
            max_backoff_ms: 10_000,
        }
    }
}

impl RetryConfig {
    /// The back-off before attempt `attempt + 1`, after `attempt` failures.
    pub fn backoff(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(30);
        let ms = self
            .initial_backoff_ms
            .saturating_mul(1u64 << exp)
            .min(self.max_backoff_ms);
        Duration::from_millis(ms)
    }
}

impl Config {
    /// Reads `path`; a missing file means every default.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, Error> {
        let path = path.as_ref();
        let file = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(text) => Config::from_toml_in(&text, &file),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let c = Config::default();
                c.validate(&file)?;
                Ok(c)
            }
            Err(e) => Err(Error::Config {
                file,
                message: format!("cannot read the file: {e}"),
            }),
        }
    }

    /// Parses TOML text (errors name the file as `<string>`).
    pub fn from_toml(text: &str) -> Result<Config, Error> {
        Config::from_toml_in(text, "<string>")
    }

    fn from_toml_in(text: &str, file: &str) -> Result<Config, Error> {
        let c: Config = toml::from_str(text).map_err(|e| Error::Config {
            file: file.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        c.validate(file)?;
        Ok(c)
    }

    /// Checks values that parse but cannot work.
    pub fn validate(&self, file: &str) -> Result<(), Error> {
        let err = |message: String| {
            Err(Error::Config {
                file: file.to_owned(),
                message,
            })
        };
        self.outbox.validate().or_else(err)?;
        let p = &self.server.partitioning;
        if p.lease_ttl_ms < 100 {
            return err(format!(
                "[server.partitioning] lease_ttl_ms = {} is too short; use at least 100",
                p.lease_ttl_ms
            ));
        }
        if let Some(h) = p.heartbeat_interval_seconds {
            if !h.is_finite() || h <= 0.0 {
                return err(format!(
                    "[server.partitioning] heartbeat_interval_seconds = {h} must be a positive number of seconds"
                ));
            }
            let max = p.lease_ttl_ms as f64 / 3000.0;
            if h > max {
                return err(format!(
                    "[server.partitioning] heartbeat_interval_seconds = {h} is not well under lease_ttl_ms = {} (a live owner could let its lease lapse); use at most a third of the TTL ({max:.3} s), the default is lease_ttl_ms / 5000",
                    p.lease_ttl_ms
                ));
            }
        }
        if p.max_unacked == 0 || p.max_unacked > 10_000 {
            return err(format!(
                "[server.partitioning] max_unacked = {} must be between 1 and 10000",
                p.max_unacked
            ));
        }
        if !p.poll_interval_seconds.is_finite() || p.poll_interval_seconds <= 0.0 {
            return err(format!(
                "[server.partitioning] poll_interval_seconds = {} must be a positive number of seconds",
                p.poll_interval_seconds
            ));
        }
        let suffix = &self.server.priority_lanes.backfill_suffix;
        if suffix.is_empty()
            || suffix.contains(':')
            || suffix == crate::key::DLQ_TOKEN
            || crate::key::is_sentinel(suffix)
        {
            return err(format!(
                "[server.priority_lanes] backfill_suffix = {suffix:?} must be a non-empty name without `:`, other than `dlq` and not of the `__name__` form"
            ));
        }
        let r = &self.server.retry;
        if r.initial_backoff_ms > r.max_backoff_ms {
            return err(format!(
                "[server.retry] initial_backoff_ms = {} is above max_backoff_ms = {}",
                r.initial_backoff_ms, r.max_backoff_ms
            ));
        }
        let url = &self.broker.url;
        if url != "inline" && !url.starts_with("redis://") && !url.starts_with("rediss://") {
            return err(format!(
                "[broker] url = {:?} is not a broker; use \"inline\" or a redis:// or rediss:// URL",
                redact_url(url)
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let c = Config::from_toml("").expect("empty is fine");
        assert_eq!(c, Config::default());
        let p = &c.server.partitioning;
        assert_eq!(p.lease_ttl_ms, 15_000);
        assert_eq!(p.heartbeat_interval(), Duration::from_secs(3));
        assert_eq!(p.poll_interval(), Duration::from_millis(250));
        assert_eq!(p.reap_idle_ms, 3_600_000);
        assert!(!c.server.priority_lanes.enabled);
        assert_eq!(c.server.priority_lanes.backfill_suffix, "backfill");
        assert_eq!(c.broker.url, "inline");
    }

    #[test]
    fn heartbeat_follows_ttl() {
        let c = Config::from_toml("[server.partitioning]\nlease_ttl_ms = 5000\n").expect("ok");
        assert_eq!(
            c.server.partitioning.heartbeat_interval(),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn unknown_key_names_key_and_file() {
        let dir = std::env::temp_dir().join(format!("convoy-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("domain.toml");
        std::fs::write(&f, "[server.partitioning]\nlease_tll_ms = 1000\n").expect("write");
        let e = Config::from_file(&f).expect_err("unknown key").to_string();
        assert!(e.contains("lease_tll_ms"), "{e}");
        assert!(e.contains("domain.toml"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn missing_file_is_defaults() {
        let c = Config::from_file("/nonexistent/convoy/domain.toml").expect("defaults");
        assert_eq!(c, Config::default());
    }

    #[test]
    fn heartbeat_must_be_well_under_ttl() {
        let e = Config::from_toml(
            "[server.partitioning]\nlease_ttl_ms = 3000\nheartbeat_interval_seconds = 2.5\n",
        )
        .expect_err("too slow")
        .to_string();
        assert!(e.contains("not well under"), "{e}");
        Config::from_toml(
            "[server.partitioning]\nlease_ttl_ms = 3000\nheartbeat_interval_seconds = 0.5\n",
        )
        .expect("fine");
    }

    #[test]
    fn bad_values() {
        for bad in [
            "[broker]\nurl = \"kafka://x\"\n",
            "[server.priority_lanes]\nbackfill_suffix = \"a:b\"\n",
            "[server.priority_lanes]\nbackfill_suffix = \"dlq\"\n",
            "[server.partitioning]\npoll_interval_seconds = 0\n",
            "[server.retry]\ninitial_backoff_ms = 10\nmax_backoff_ms = 1\n",
            "[server.partitioning]\nlease_ttl_ms = \"x\"\n",
        ] {
            assert!(Config::from_toml(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact_url("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact_url("redis://h:1/0"), "redis://h:1/0");
        let c = Config::from_toml("[broker]\nurl = \"rediss://:pw@h/0\"\n").expect("ok");
        assert!(!format!("{c:?}").contains("pw"));
    }

    #[test]
    fn backoff_doubles_to_max() {
        let r = RetryConfig {
            max_retries: 5,
            initial_backoff_ms: 100,
            max_backoff_ms: 350,
        };
        assert_eq!(r.backoff(1), Duration::from_millis(100));
        assert_eq!(r.backoff(2), Duration::from_millis(200));
        assert_eq!(r.backoff(3), Duration::from_millis(350));
    }
}
