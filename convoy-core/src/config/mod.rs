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
//! notify = true                    # NOTIFY an idle relay on commit (false: poll only)
//! max_connections = 8
//!
//! [server.retry]
//! max_retries = 3
//! initial_backoff_ms = 100
//! max_backoff_ms = 10000
//! max_transient_backoff_ms = 30000 # a dependency down: retried until it is back
//! outage_threshold = 3             # keys failing so at once pause the handler
//! outage_window_ms = 10000         # ... within this, for errors of the default class
//!
//! [handlers."ledger-projector"]    # by handler name
//! concurrency = 8                  # events in flight at once on this instance
//! on_poison = "halt"               # or "dead_letter": overrides the handler's
//! max_retries = 5                  # any [server.retry] value, for this handler
//!
//! [server.observability]
//! handle_span_level = "info"       # the per-event `handle` span: trace, debug, info, warn, error
//! ```
//!
//! Every key is optional, but the file itself is not: [`Config::from_file`]
//! and [`Config::load`] fail on a path that does not exist, naming it (run
//! on defaults explicitly with `Config::default()`). Unknown keys are errors
//! naming the key and the file, and so are values out of range: every
//! such value at once, each naming its key.
//!
//! # Environment overrides
//!
//! [`Config::load`] (what `DomainBuilder::config_file` uses) and
//! [`Config::from_env`] apply, over the file (or the defaults):
//!
//! - `CONVOY__SECTION__KEY=value` for any key: the name after `CONVOY__` is
//!   the key's path, segments separated by `__`, case-insensitive
//!   (`CONVOY__SERVER__PARTITIONING__LEASE_TTL_MS=5000`,
//!   `CONVOY__HANDLERS__ledger-projector__CONCURRENCY=8`, where the handler
//!   name keeps its case). The value is read as a TOML value when it is one
//!   (`5000`, `0.5`, `true`, `"quoted"`), else as a string;
//! - `CONVOY_BROKER_URL` for `[broker] url` and `CONVOY_INSTANCE_ID` for
//!   `[server] instance_id`, applied last.
//!
//! Precedence: environment, then the file, then the defaults. A `Config`
//! built in code and given to `DomainBuilder::config` is used as it is.
//!
//! # Files
//!
//! This file holds the types and the loading; `validate.rs`
//! [`Config::validate`], which reports every value that cannot work at
//! once; `env.rs` the environment overrides; `url.rs` the URLs in messages
//! ([`redact_url`], [`url_secrets`], and the nodes of a cluster URL, which
//! the Redis connection reads too); `tests.rs` the tests.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::error::Error;

mod env;
#[cfg(test)]
mod tests;
mod url;
#[doc(hidden)]
pub mod validate;

pub use env::{ENV_BROKER_URL, ENV_INSTANCE_ID};
use env::{apply_env, convoy_vars};
#[doc(hidden)]
pub use url::cluster_nodes;
pub(crate) use url::redact_urls_in;
pub use url::{redact_url, url_secrets};

/// The whole configuration of a domain.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Which broker to use.
    pub broker: BrokerConfig,
    /// Engine settings.
    pub server: ServerConfig,
    /// Where raised events wait to be published.
    pub outbox: OutboxConfig,
    /// `[handlers."name"]`: settings of one handler (or process manager),
    /// by its name.
    pub handlers: BTreeMap<String, HandlerConfig>,
    /// Where the values came from, for errors found after loading.
    #[serde(skip)]
    origin: Option<Arc<str>>,
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
    /// Wake an idle relay with `NOTIFY` when a commit writes outbox rows
    /// (commit-to-publish in milliseconds); while the relay is busy,
    /// commits skip it, since PostgreSQL serialises the commits of
    /// notifying transactions on a global lock. With `false` no commit
    /// notifies and the relay relies on `poll_interval_ms` instead.
    pub notify: bool,
    /// Connections of the outbox's pool.
    pub max_connections: u32,
    /// Records per publish batch (the memory outbox's and PostgreSQL's
    /// alike): a backlog goes out in batches this large, one script call
    /// per shard a batch spans, two batches in flight at a time.
    pub batch: usize,
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
            notify: true,
            max_connections: 8,
            batch: 2_048,
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
            .field("notify", &self.notify)
            .field("max_connections", &self.max_connections)
            .field("batch", &self.batch)
            .finish()
    }
}

impl PartialEq for Config {
    fn eq(&self, other: &Self) -> bool {
        // Where two configurations came from does not make them different.
        self.broker == other.broker
            && self.server == other.server
            && self.handlers == other.handlers
            && self.outbox == other.outbox
    }
}

/// `[handlers."name"]`: settings of one handler on this instance.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HandlerConfig {
    /// How many of the handler's events may be in flight at once on this
    /// instance (each partition still runs one at a time); default
    /// [`DEFAULT_CONCURRENCY`]. Set it to the size of the pool the handler
    /// uses, so that events wait in Redis rather than in front of the pool.
    pub concurrency: Option<usize>,
    /// What a poisoned head does to its key, overriding the handler's
    /// `on_poison`: `halt` (wait for an operator) or `dead_letter` (move it
    /// to the key's dead letters with a recorded gap and go on). Process
    /// managers always halt.
    pub on_poison: Option<PoisonPolicy>,
    /// This handler's `max_retries`, over `[server.retry]`'s.
    pub max_retries: Option<u32>,
    /// This handler's `initial_backoff_ms`, over `[server.retry]`'s.
    pub initial_backoff_ms: Option<u64>,
    /// This handler's `max_backoff_ms`, over `[server.retry]`'s.
    pub max_backoff_ms: Option<u64>,
    /// This handler's `max_transient_backoff_ms`, over `[server.retry]`'s.
    pub max_transient_backoff_ms: Option<u64>,
    /// This handler's `outage_threshold`, over `[server.retry]`'s.
    pub outage_threshold: Option<u32>,
    /// This handler's `outage_window_ms`, over `[server.retry]`'s.
    pub outage_window_ms: Option<u64>,
}

/// `on_poison`: what a head that failed past its retries (or with a
/// permanent error) does to its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoisonPolicy {
    /// The key halts: the head stays pending and nothing behind it runs
    /// until an operator acts (`convoy retry`, `skip`, `dead-letter`).
    Halt,
    /// The head goes to the key's dead letters with a recorded gap, and the
    /// key goes on with its next event (which sees the gap:
    /// `Context::gap`).
    DeadLetter,
}

/// Shards per category unless configured (`[broker] shards`).
pub const DEFAULT_SHARDS: u32 = 16;

/// The most shards a category may have (Redis Cluster's slot count).
pub const MAX_SHARDS: u32 = 16_384;

/// Events of one handler in flight at once on one instance, unless
/// `[handlers."name"] concurrency` says otherwise.
pub const DEFAULT_CONCURRENCY: usize = 256;

/// `[broker]`.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// `inline`, a `redis://` / `rediss://` URL, or a Redis Cluster:
    /// `redis+cluster://host1:port1,host2:port2/` (`rediss+cluster://`).
    pub url: String,
    /// For `rediss://`: a PEM file with the CA that signed the server's
    /// certificate, when it is not in the system trust store.
    pub tls_ca_file: Option<String>,
    /// Shards per category (default [`DEFAULT_SHARDS`]): a category's
    /// partitions are spread over this many hash slots of a cluster.
    /// Fixed for a category once it is used: Redis records it
    /// (`convoy:shards:{category}`) and an engine or publisher configured
    /// otherwise refuses to start, since a key's streams would move.
    pub shards: u32,
    /// Shards of single categories, overriding `shards`
    /// (`[broker.category_shards] order = 64`). The categories of one
    /// process manager must have the same count.
    pub category_shards: BTreeMap<String, u32>,
    /// Replicas that must acknowledge a published batch (Redis `WAIT`)
    /// before its events leave the outbox; default 0 (Redis's asynchronous
    /// replication: a master that crashes right after a publish can lose
    /// it). With 1 or more, an event the outbox marked published survives
    /// a master crash with a failover to a replica that acknowledged it.
    /// Costs one more round trip per batch and shard.
    pub wait_replicas: u32,
    /// How long a publish waits for `wait_replicas` (ms, default 1000);
    /// fewer replicas in time fails the publish, which is retried.
    pub wait_timeout_ms: u64,
    /// Whether fenced acknowledgements wait for `wait_replicas` too
    /// (default `false`). A failover to a replica that missed an
    /// acknowledgement re-runs that event, possibly after later events of
    /// its key that were lost with the master; with `wait_acks = true`
    /// and `wait_replicas = 1`, an event acknowledged on the master is
    /// acknowledged on a replica as well, so a failover re-runs at most
    /// `max_unacked` events again, in order. Costs one `WAIT` (a
    /// replication round trip) per acknowledgement call and shard. Taking
    /// leases waits too (one `WAIT` per lease-taking call, not per event),
    /// so a lease and its generation survive a failover.
    pub wait_acks: bool,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            url: "inline".to_owned(),
            tls_ca_file: None,
            shards: DEFAULT_SHARDS,
            category_shards: BTreeMap::new(),
            wait_replicas: 0,
            wait_timeout_ms: 1000,
            wait_acks: false,
        }
    }
}

impl BrokerConfig {
    /// How many shards `category` has.
    pub fn shards_of(&self, category: &str) -> u32 {
        self.category_shards
            .get(category)
            .copied()
            .unwrap_or(self.shards)
    }

    /// The largest shard count of any category: every shard a publication
    /// can go to is below it.
    pub fn max_shards(&self) -> u32 {
        self.category_shards
            .values()
            .copied()
            .fold(self.shards, u32::max)
    }
}

impl std::fmt::Debug for BrokerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerConfig")
            .field("url", &redact_url(&self.url))
            .field("tls_ca_file", &self.tls_ca_file)
            .field("shards", &self.shards)
            .field("category_shards", &self.category_shards)
            .field("wait_replicas", &self.wait_replicas)
            .field("wait_acks", &self.wait_acks)
            .field("wait_timeout_ms", &self.wait_timeout_ms)
            .finish()
    }
}

/// `[server]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// `[server.partitioning]`.
    pub partitioning: PartitioningConfig,
    /// `[server.priority_lanes]`.
    pub priority_lanes: PriorityLanesConfig,
    /// `[server.retry]`.
    pub retry: RetryConfig,
    /// This engine instance's id: the owner id in leases and fences, unique
    /// among the engines sharing a Redis and stable across restarts of one
    /// replica (a pod name, not a random value). Default: generated at
    /// start, `{hostname}-{pid}-{random}`. `DomainBuilder::instance_id` in
    /// code takes precedence.
    pub instance_id: Option<String>,
    /// `[server.observability]`.
    pub observability: ObservabilityConfig,
    /// Worker threads of the tokio runtime the engine runs its consumers
    /// on (their partition workers, handlers and Redis connection), a
    /// runtime of its own beside the application's. `1`, the default:
    /// one thread. A consumer's many small tasks wake each other at every
    /// Redis reply; spread over the threads of a shared multi-threaded
    /// runtime, those wake-ups cost about as much CPU as everything else
    /// the engine does per event. Raise it for handlers that burn CPU
    /// between their awaits; `0` runs the consumers on the application's
    /// runtime (the one `Engine::spawn` is called on).
    pub engine_threads: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            partitioning: PartitioningConfig::default(),
            priority_lanes: PriorityLanesConfig::default(),
            retry: RetryConfig::default(),
            instance_id: None,
            observability: ObservabilityConfig::default(),
            engine_threads: 1,
        }
    }
}

/// `[server.observability]`: logs (metrics are set up where the recorder
/// is installed, see [`metrics`](crate::metrics)).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ObservabilityConfig {
    /// The level of the `handle` span each event runs in (fields: handler,
    /// category, key, generation, attempt, id, type). At `info`, the
    /// default, a handler's own log lines carry them at `RUST_LOG=info`;
    /// a span below the subscriber's level is not created at all.
    pub handle_span_level: SpanLevel,
}

/// A `tracing` level, as written in `domain.toml`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpanLevel {
    /// `trace`.
    Trace,
    /// `debug`.
    Debug,
    /// `info` (the default).
    #[default]
    Info,
    /// `warn`.
    Warn,
    /// `error`.
    Error,
}

impl SpanLevel {
    /// The `tracing` level.
    pub fn level(self) -> tracing::Level {
        match self {
            SpanLevel::Trace => tracing::Level::TRACE,
            SpanLevel::Debug => tracing::Level::DEBUG,
            SpanLevel::Info => tracing::Level::INFO,
            SpanLevel::Warn => tracing::Level::WARN,
            SpanLevel::Error => tracing::Level::ERROR,
        }
    }
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
    /// The longest back-off of a *transient* failure (a dependency of the
    /// handler is down): such an event is retried for as long as it
    /// fails, never counted toward `max_retries`, the wait doubling from
    /// `initial_backoff_ms` up to this, jittered.
    pub max_transient_backoff_ms: u64,
    /// How many keys of one handler failing at once make the handler pause
    /// on this instance (an outage): it then starts no new event for any of
    /// its keys but one probe at a time, until a probe succeeds. Keys
    /// failing with *transient* errors count as they fail; keys failing
    /// with errors of the default class count when each began failing since
    /// the handler's last success and failed within `outage_window_ms` (a
    /// handler-wide failure: a dependency down behind an unclassified error,
    /// or a bad deploy), and their failures then count toward no key's
    /// `max_retries`. `0` never pauses.
    pub outage_threshold: u32,
    /// How recent a default-class failure must be to count toward a
    /// handler-wide failure (see `outage_threshold`).
    pub outage_window_ms: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_retries: 3,
            initial_backoff_ms: 100,
            max_backoff_ms: 10_000,
            max_transient_backoff_ms: 30_000,
            outage_threshold: 3,
            outage_window_ms: 10_000,
        }
    }
}

impl RetryConfig {
    /// The nominal back-off after `failures` transient failures in a row
    /// (doubling from `initial_backoff_ms` up to
    /// `max_transient_backoff_ms`; callers jitter it).
    pub fn transient_backoff(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(30);
        let ms = self
            .initial_backoff_ms
            .saturating_mul(1u64 << exp)
            .min(self.max_transient_backoff_ms);
        Duration::from_millis(ms)
    }

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
    /// Reads `path` **without** the environment overrides: the file as it
    /// is. Engines and the `convoy` CLI read it with [`Config::load`], which
    /// applies `CONVOY__SECTION__KEY`, `CONVOY_BROKER_URL` and
    /// `CONVOY_INSTANCE_ID`; use that unless you mean to ignore them. A
    /// path that does not exist is an error naming it: run on defaults
    /// explicitly with `Config::default()`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, Error> {
        let path = path.as_ref();
        let table = read_table(path)?;
        Config::build(table, path.display().to_string(), &[])
    }

    /// Reads `path` (which must exist, as for [`Config::from_file`]) and
    /// applies the environment overrides (see the module docs): environment,
    /// then the file, then the defaults.
    pub fn load(path: impl AsRef<Path>) -> Result<Config, Error> {
        let path = path.as_ref();
        let table = read_table(path)?;
        Config::build(table, path.display().to_string(), &convoy_vars())
    }

    /// The defaults with the environment overrides applied (see the module
    /// docs).
    pub fn from_env() -> Result<Config, Error> {
        Config::build(
            toml::Table::new(),
            "the defaults".to_owned(),
            &convoy_vars(),
        )
    }

    /// Parses TOML text (errors name the file as `<string>`), without
    /// environment overrides.
    pub fn from_toml(text: &str) -> Result<Config, Error> {
        Config::build(parse_table(text, "<string>")?, "<string>".to_owned(), &[])
    }

    /// Parses TOML text named `origin` in errors and applies the overrides
    /// of `vars` (name, value), as [`Config::load`] does with the process's
    /// environment.
    pub fn from_toml_with_env<I, K, V>(text: &str, origin: &str, vars: I) -> Result<Config, Error>
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<OsString>,
        V: Into<OsString>,
    {
        let vars: Vec<(OsString, OsString)> = vars
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        Config::build(parse_table(text, origin)?, origin.to_owned(), &vars)
    }

    /// Where the values came from (the file, with the environment variables
    /// that overrode it), as errors name it; `<code>` for a configuration
    /// built in code.
    pub fn origin(&self) -> &str {
        self.origin.as_deref().unwrap_or("<code>")
    }

    fn build(
        mut table: toml::Table,
        file: String,
        vars: &[(OsString, OsString)],
    ) -> Result<Config, Error> {
        let applied = apply_env(&mut table, vars, &file)?;
        let origin = if applied.is_empty() {
            file
        } else {
            format!("{file} with environment overrides {}", applied.join(", "))
        };
        let mut c: Config =
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| Error::Config {
                    file: origin.clone(),
                    message: redact_urls_in(e.to_string().trim_end()),
                })?;
        c.validate(&origin)?;
        c.origin = Some(Arc::from(origin));
        Ok(c)
    }
    /// How many events of the handler `name` may be in flight at once on
    /// this instance.
    pub fn concurrency(&self, name: &str) -> usize {
        self.handlers
            .get(name)
            .and_then(|h| h.concurrency)
            .unwrap_or(DEFAULT_CONCURRENCY)
    }

    /// The `[handlers."name"] on_poison` override, if set.
    pub fn on_poison(&self, name: &str) -> Option<PoisonPolicy> {
        self.handlers.get(name).and_then(|h| h.on_poison)
    }

    /// Handler `name`'s retry policy: `[server.retry]` with the handler's
    /// own values from `[handlers."name"]` over it.
    pub fn retry_for(&self, name: &str) -> RetryConfig {
        let mut r = self.server.retry.clone();
        if let Some(h) = self.handlers.get(name) {
            h.retry_over(&mut r);
        }
        r
    }
}

impl HandlerConfig {
    /// Whether it sets any retry value of its own.
    pub(crate) fn has_retry(&self) -> bool {
        self.max_retries.is_some()
            || self.initial_backoff_ms.is_some()
            || self.max_backoff_ms.is_some()
            || self.max_transient_backoff_ms.is_some()
            || self.outage_threshold.is_some()
            || self.outage_window_ms.is_some()
    }

    /// Writes this handler's retry values over `r`.
    fn retry_over(&self, r: &mut RetryConfig) {
        if let Some(v) = self.max_retries {
            r.max_retries = v;
        }
        if let Some(v) = self.initial_backoff_ms {
            r.initial_backoff_ms = v;
        }
        if let Some(v) = self.max_backoff_ms {
            r.max_backoff_ms = v;
        }
        if let Some(v) = self.max_transient_backoff_ms {
            r.max_transient_backoff_ms = v;
        }
        if let Some(v) = self.outage_threshold {
            r.outage_threshold = v;
        }
        if let Some(v) = self.outage_window_ms {
            r.outage_window_ms = v;
        }
    }
}

/// The file at `path` as a TOML table; a path that does not exist is an
/// error naming it.
fn read_table(path: &Path) -> Result<toml::Table, Error> {
    let file = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => parse_table(&text, &file),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::Config {
            file,
            message: "the file does not exist; check the path (relative paths are read from the working directory), or run on defaults explicitly with DomainBuilder::config(Config::default())".to_owned(),
        }),
        Err(e) => Err(Error::Config {
            file,
            message: format!("cannot read the file: {e}"),
        }),
    }
}

fn parse_table(text: &str, file: &str) -> Result<toml::Table, Error> {
    // The error quotes the offending line: hide any URL's password.
    text.parse::<toml::Table>().map_err(|e| Error::Config {
        file: file.to_owned(),
        message: redact_urls_in(e.to_string().trim_end()),
    })
}
