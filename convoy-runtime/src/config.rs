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
//! notify = true                    # NOTIFY the relay on commit (false: poll only)
//! max_connections = 8
//!
//! [server.retry]
//! max_retries = 3
//! initial_backoff_ms = 100
//! max_backoff_ms = 10000
//! max_transient_backoff_ms = 30000 # a dependency down: retried until it is back
//! outage_threshold = 3             # keys failing so at once pause the handler
//!
//! [handlers."ledger-projector"]    # by handler name
//! concurrency = 8                  # events in flight at once on this instance
//! on_poison = "halt"               # or "dead_letter": overrides the handler's
//!
//! [server.observability]
//! handle_span_level = "info"       # the per-event `handle` span: trace, debug, info, warn, error
//! ```
//!
//! Every key is optional, but the file itself is not: [`Config::from_file`]
//! and [`Config::load`] fail on a path that does not exist, naming it (run
//! on defaults explicitly with `Config::default()`). Unknown keys are errors
//! naming the key and the file, and so are values out of range.
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

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::error::Error;

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
    /// Wake the relay with `NOTIFY` on every commit that writes outbox rows
    /// (commit-to-publish in milliseconds). PostgreSQL serialises the
    /// commits of notifying transactions on a global lock, which costs
    /// throughput under many concurrent writers: with `false` the relay
    /// relies on `poll_interval_ms` instead.
    pub notify: bool,
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
            notify: true,
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
            .field("notify", &self.notify)
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
    /// replication round trip) per acknowledgement call and shard.
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

/// A URL with its secrets replaced by `***`, for logs and messages: the
/// password of its user info (`redis://user:***@host/`) and the value of a
/// `pass` or `password` query parameter (where redis-rs reads the password
/// of a `unix://` / `redis+unix://` socket URL:
/// `unix:///run/redis.sock?pass=***`). Parsed with a URL parser; text that
/// does not parse as a URL is shown only when it cannot hold a secret (no
/// `@`, no `?`), else as `scheme://<hidden: not a valid URL>`.
pub fn redact_url(url: &str) -> String {
    if let Some(Ok(nodes)) = cluster_nodes(url) {
        // A cluster URL lists several hosts, which no URL parser takes:
        // each node's URL carries the same credentials.
        let scheme = url.split_once("://").map_or("redis+cluster", |(s, _)| s);
        let hosts: Vec<String> = nodes
            .iter()
            .map(|n| {
                let r = redact_url(n);
                let after = r.split_once("://").map_or(r.as_str(), |(_, a)| a);
                after.split(['/']).next().unwrap_or("").to_owned()
            })
            .collect();
        let tail = url
            .split_once("://")
            .and_then(|(_, rest)| rest.find(['/', '?']).map(|i| &rest[i..]))
            .unwrap_or("");
        return format!("{scheme}://{}{}", hosts.join(","), redact_url_query(tail));
    }
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            let mut changed = false;
            if parsed.password().is_some() {
                // Only fails for URLs that cannot have a password, and
                // this one has one.
                changed |= parsed.set_password(Some("***")).is_ok();
            }
            if parsed.query_pairs().any(|(k, _)| is_secret_param(&k)) {
                let pairs: Vec<(String, String)> = parsed
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if is_secret_param(&k) {
                            "***".to_owned()
                        } else {
                            v.into_owned()
                        };
                        (k.into_owned(), v)
                    })
                    .collect();
                parsed.query_pairs_mut().clear().extend_pairs(pairs);
                changed = true;
            }
            if changed {
                parsed.to_string()
            } else {
                url.to_owned()
            }
        }
        Err(_) if !url.contains('@') && !url.contains('?') => url.to_owned(),
        Err(_) => match url.split_once("://") {
            Some((scheme, _))
                if scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
            {
                format!("{scheme}://<hidden: not a valid URL>")
            }
            _ => "<hidden: not a valid URL>".to_owned(),
        },
    }
}

/// The secrets of a URL as they may appear in text quoting it: the
/// password of its user info and the values of `pass` / `password` query
/// parameters, each as written and percent-decoded (for a cluster URL,
/// those of its nodes' URLs, which carry its credentials and query). Empty
/// when the URL does not parse or has none.
pub fn url_secrets(url: &str) -> Vec<String> {
    if let Some(Ok(nodes)) = cluster_nodes(url) {
        let mut out: Vec<String> = nodes.iter().flat_map(|n| url_secrets(n)).collect();
        out.sort();
        out.dedup();
        return out;
    }
    let Ok(parsed) = url::Url::parse(url) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(pw) = parsed.password() {
        out.push(pw.to_owned());
        if let Ok(decoded) = percent_decoded(pw) {
            out.push(decoded);
        }
    }
    for (k, v) in parsed.query_pairs() {
        if is_secret_param(&k) {
            out.push(v.into_owned());
        }
    }
    if let Some(q) = parsed.query() {
        for pair in q.split('&') {
            if let Some((k, v)) = pair.split_once('=')
                && is_secret_param(k)
            {
                out.push(v.to_owned());
            }
        }
    }
    out.retain(|s| !s.is_empty());
    out.sort();
    out.dedup();
    out
}

fn is_secret_param(name: &str) -> bool {
    matches!(name.to_ascii_lowercase().as_str(), "pass" | "password")
}

fn percent_decoded(s: &str) -> Result<String, std::str::Utf8Error> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|e| e.utf8_error())
}

/// The nodes of a `redis+cluster://[user:password@]h1:p1,h2:p2/[?..]` (or
/// `rediss+cluster://`) URL, each as a single-node URL with the same
/// credentials, TLS and query; `None` for a URL of one server.
pub(crate) fn cluster_nodes(url: &str) -> Option<Result<Vec<String>, String>> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = match scheme {
        "redis+cluster" => "redis",
        "rediss+cluster" => "rediss",
        _ => return None,
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let query = tail
        .split_once('?')
        .map(|(_, q)| format!("?{q}"))
        .unwrap_or_default();
    let path = tail.split('?').next().unwrap_or("").trim_matches('/');
    if !path.is_empty() && path != "0" {
        return Some(Err(format!(
            "names database {path}; a Redis Cluster has only database 0: drop the path"
        )));
    }
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("{scheme}://{userinfo}{h}/{query}"))
        .collect();
    if nodes.is_empty() {
        return Some(Err(
            "names no node; list one or more, for example redis+cluster://10.0.0.1:6379,10.0.0.2:6379/".into(),
        ));
    }
    Some(Ok(nodes))
}

/// The query of a URL's tail (`/path?k=v`) with its secrets hidden.
fn redact_url_query(tail: &str) -> String {
    if !tail.contains('?') {
        return tail.to_owned();
    }
    let r = redact_url(&format!("redis://h{tail}"));
    r.strip_prefix("redis://h")
        .unwrap_or("?<hidden>")
        .to_owned()
}

/// Every URL in `text` (a `scheme://` up to the closing quote, or the end
/// of the word when unquoted) redacted with [`redact_url`]: for messages
/// that quote configuration text, such as a TOML syntax error's snippet
/// of the `url` line.
pub(crate) fn redact_urls_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let start = rest[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || "+-.".contains(c)))
            .map_or(0, |i| i + 1);
        let quote = rest[..start]
            .chars()
            .next_back()
            .filter(|c| *c == '"' || *c == '\'');
        let after = &rest[at..];
        let len = match quote {
            Some(q) => after.find([q, '\n']),
            None => after.find(|c: char| c.is_whitespace() || c == '"' || c == '\''),
        }
        .unwrap_or(after.len());
        let end = at + len;
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
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
    /// This engine instance's id: the owner id in leases and fences, unique
    /// among the engines sharing a Redis and stable across restarts of one
    /// replica (a pod name, not a random value). Default: generated at
    /// start, `{hostname}-{pid}-{random}`. `DomainBuilder::instance_id` in
    /// code takes precedence.
    pub instance_id: Option<String>,
    /// `[server.observability]`.
    pub observability: ObservabilityConfig,
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
    /// How many keys of one handler failing transiently at once make the
    /// handler pause on this instance (an outage): it then starts no new
    /// event for any of its keys but one probe at a time, until a probe
    /// succeeds. `0` never pauses.
    pub outage_threshold: u32,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_retries: 3,
            initial_backoff_ms: 100,
            max_backoff_ms: 10_000,
            max_transient_backoff_ms: 30_000,
            outage_threshold: 3,
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

    /// Checks values that parse but cannot work; errors name `file` and the
    /// key.
    pub fn validate(&self, file: &str) -> Result<(), Error> {
        self.check().map_err(|message| Error::Config {
            file: file.to_owned(),
            message,
        })
    }

    fn check(&self) -> Result<(), String> {
        const PART: &str = "[server.partitioning]";
        const RETRY: &str = "[server.retry]";
        self.outbox.validate()?;
        let p = &self.server.partitioning;
        in_range(
            PART,
            "lease_ttl_ms",
            p.lease_ttl_ms,
            100,
            86_400_000,
            "ms (0.1 s to 24 h)",
        )?;
        if let Some(h) = p.heartbeat_interval_seconds {
            let max = p.lease_ttl_ms as f64 / 3000.0;
            seconds_in_range(PART, "heartbeat_interval_seconds", h, 0.01, f64::INFINITY)?;
            if h > max {
                return Err(format!(
                    "{PART} heartbeat_interval_seconds = {h:?} is not well under lease_ttl_ms = {} (a live owner could let its lease lapse); use at most a third of the TTL ({max:.3} s), the default is lease_ttl_ms / 5000",
                    p.lease_ttl_ms
                ));
            }
        }
        seconds_in_range(
            PART,
            "poll_interval_seconds",
            p.poll_interval_seconds,
            0.001,
            60.0,
        )?;
        in_range(
            PART,
            "reap_idle_ms",
            p.reap_idle_ms,
            100,
            2_592_000_000,
            "ms (0.1 s to 30 days)",
        )?;
        in_range(
            PART,
            "partition_warning_threshold",
            p.partition_warning_threshold,
            1,
            1_000_000_000,
            "partitions",
        )?;
        in_range(
            PART,
            "max_unacked",
            p.max_unacked as u64,
            1,
            10_000,
            "events",
        )?;
        let suffix = &self.server.priority_lanes.backfill_suffix;
        if suffix.is_empty()
            || suffix.contains(':')
            || suffix == crate::key::DLQ_TOKEN
            || crate::key::is_sentinel(suffix)
        {
            return Err(format!(
                "[server.priority_lanes] backfill_suffix = {suffix:?} must be a non-empty name without `:`, other than `dlq` and not of the `__name__` form"
            ));
        }
        let r = &self.server.retry;
        in_range(
            RETRY,
            "max_retries",
            u64::from(r.max_retries),
            0,
            1_000,
            "retries",
        )?;
        in_range(
            RETRY,
            "initial_backoff_ms",
            r.initial_backoff_ms,
            1,
            3_600_000,
            "ms (1 ms to 1 h)",
        )?;
        in_range(
            RETRY,
            "max_backoff_ms",
            r.max_backoff_ms,
            1,
            3_600_000,
            "ms (1 ms to 1 h)",
        )?;
        in_range(
            RETRY,
            "max_transient_backoff_ms",
            r.max_transient_backoff_ms,
            1,
            3_600_000,
            "ms (1 ms to 1 h)",
        )?;
        in_range(
            RETRY,
            "outage_threshold",
            u64::from(r.outage_threshold),
            0,
            100_000,
            "keys (0: never pause)",
        )?;
        if r.initial_backoff_ms > r.max_backoff_ms {
            return Err(format!(
                "{RETRY} initial_backoff_ms = {} is above max_backoff_ms = {}",
                r.initial_backoff_ms, r.max_backoff_ms
            ));
        }
        if self.broker.wait_acks && self.broker.wait_replicas == 0 {
            return Err(
                "[broker] wait_acks = true waits for wait_replicas, which is 0: set [broker] wait_replicas = 1 (or more), or leave wait_acks out".to_owned(),
            );
        }
        if let Some(id) = &self.server.instance_id
            && (id.is_empty() || id.contains(':'))
        {
            return Err(format!(
                "[server] instance_id = {id:?} must be non-empty and contain no `:`"
            ));
        }
        for (name, h) in &self.handlers {
            if let Some(n) = h.concurrency {
                let section = format!("[handlers.{name:?}]");
                in_range(&section, "concurrency", n as u64, 1, 10_000, "events")?;
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
            return Err(format!(
                "[broker] url = {:?} is not a broker; use \"inline\", a redis:// or rediss:// URL, or redis+cluster://host1:port1,host2:port2/ for a Redis Cluster",
                redact_url(url)
            ));
        }
        let shards = u64::from(MAX_SHARDS);
        in_range(
            "[broker]",
            "shards",
            u64::from(self.broker.shards),
            1,
            shards,
            "shards",
        )?;
        in_range(
            "[broker]",
            "wait_replicas",
            u64::from(self.broker.wait_replicas),
            0,
            16,
            "replicas",
        )?;
        in_range(
            "[broker]",
            "wait_timeout_ms",
            self.broker.wait_timeout_ms,
            1,
            60_000,
            "ms (1 ms to 60 s)",
        )?;
        for (category, n) in &self.broker.category_shards {
            in_range(
                "[broker.category_shards]",
                category,
                u64::from(*n),
                1,
                shards,
                "shards",
            )?;
        }
        Ok(())
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

/// The process's environment variables that start with `CONVOY_`.
fn convoy_vars() -> Vec<(OsString, OsString)> {
    std::env::vars_os()
        .filter(|(k, _)| k.to_str().is_some_and(|k| k.starts_with("CONVOY_")))
        .collect()
}

/// The general form's prefix: `CONVOY__SECTION__KEY`.
const ENV_PREFIX: &str = "CONVOY__";
/// `[broker] url`.
pub const ENV_BROKER_URL: &str = "CONVOY_BROKER_URL";
/// `[server] instance_id`.
pub const ENV_INSTANCE_ID: &str = "CONVOY_INSTANCE_ID";

/// Writes the overrides of `vars` into `table`; returns the names of the
/// variables applied, in the order applied.
fn apply_env(
    table: &mut toml::Table,
    vars: &[(OsString, OsString)],
    file: &str,
) -> Result<Vec<String>, Error> {
    let mut general: Vec<(String, Vec<String>, String)> = Vec::new();
    let mut aliases: Vec<(String, Vec<String>, String)> = Vec::new();
    for (name, value) in vars {
        let Some(name) = name.to_str() else { continue };
        let path: Vec<String> = if let Some(rest) = name.strip_prefix(ENV_PREFIX) {
            rest.split("__")
                .enumerate()
                .map(|(i, seg)| {
                    // A handler's name keeps its case: `[handlers."Name"]`.
                    let handler_name =
                        i == 1 && rest.to_ascii_lowercase().starts_with("handlers__");
                    if handler_name {
                        seg.to_owned()
                    } else {
                        seg.to_ascii_lowercase()
                    }
                })
                .collect()
        } else if name == ENV_BROKER_URL {
            vec!["broker".into(), "url".into()]
        } else if name == ENV_INSTANCE_ID {
            vec!["server".into(), "instance_id".into()]
        } else {
            continue;
        };
        let env_error = |message: String| Error::Config {
            file: format!("{file} (environment variable {name})"),
            message,
        };
        if path.iter().any(String::is_empty) {
            return Err(env_error(format!(
                "`{name}` does not name a key; use CONVOY__SECTION__KEY, for example CONVOY__SERVER__PARTITIONING__LEASE_TTL_MS"
            )));
        }
        let Some(value) = value.to_str() else {
            return Err(env_error(format!("the value of {name} is not UTF-8")));
        };
        let entry = (name.to_owned(), path, value.to_owned());
        if name.starts_with(ENV_PREFIX) {
            general.push(entry);
        } else {
            aliases.push(entry);
        }
    }
    general.sort();
    let mut applied = Vec::new();
    for (name, path, value) in general.into_iter().chain(aliases) {
        set_path(table, &path, env_value(&value)).map_err(|message| Error::Config {
            file: format!("{file} (environment variable {name})"),
            message,
        })?;
        applied.push(name);
    }
    Ok(applied)
}

/// An environment value as TOML: a number, boolean, quoted string or
/// array when it reads as one, else the text as a string.
fn env_value(text: &str) -> toml::Value {
    let probe = format!("v = {text}");
    match probe.parse::<toml::Table>() {
        Ok(mut t) => match t.remove("v") {
            Some(
                v @ (toml::Value::Integer(_)
                | toml::Value::Float(_)
                | toml::Value::Boolean(_)
                | toml::Value::String(_)
                | toml::Value::Array(_)),
            ) => v,
            _ => toml::Value::String(text.to_owned()),
        },
        Err(_) => toml::Value::String(text.to_owned()),
    }
}

fn set_path(table: &mut toml::Table, path: &[String], value: toml::Value) -> Result<(), String> {
    let Some((last, parents)) = path.split_last() else {
        return Err("no key named".to_owned());
    };
    let mut here = table;
    let mut walked = Vec::new();
    for seg in parents {
        walked.push(seg.as_str());
        let next = here
            .entry(seg.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        here = match next {
            toml::Value::Table(t) => t,
            _ => {
                return Err(format!(
                    "`{}` is a value, not a section, so it has no key `{last}`",
                    walked.join(".")
                ));
            }
        };
    }
    here.insert(last.clone(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls_are_redacted_node_by_node() {
        assert_eq!(
            redact_url("redis+cluster://u:pw@h1:1,h2:2/?password=x&protocol=3"),
            "redis+cluster://u:***@h1:1,u:***@h2:2/?password=***&protocol=3"
        );
        assert_eq!(
            redact_url("redis+cluster://h1:1,h2:2"),
            "redis+cluster://h1:1,h2:2"
        );
    }

    #[test]
    fn cluster_urls_list_their_nodes_with_the_credentials() {
        let nodes = cluster_nodes("redis+cluster://u:pw@h1:1,h2:2/?protocol=3")
            .expect("a cluster URL")
            .expect("valid");
        assert_eq!(
            nodes,
            [
                "redis://u:pw@h1:1/?protocol=3",
                "redis://u:pw@h2:2/?protocol=3"
            ]
        );
        assert_eq!(
            cluster_nodes("rediss+cluster://h:1")
                .expect("cluster")
                .expect("valid"),
            ["rediss://h:1/"]
        );
        assert!(cluster_nodes("redis://h:1/").is_none());
        let e = cluster_nodes("redis+cluster://h:1/3")
            .expect("cluster")
            .expect_err("db 3");
        assert!(e.contains("database 3"), "{e}");
        let e = cluster_nodes("redis+cluster:///")
            .expect("cluster")
            .expect_err("no node");
        assert!(e.contains("no node"), "{e}");
    }

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
    fn handle_span_level() {
        let c = Config::from_toml("").expect("defaults");
        assert_eq!(c.server.observability.handle_span_level, SpanLevel::Info);
        let c = Config::from_toml("[server.observability]\nhandle_span_level = \"debug\"\n")
            .expect("debug");
        assert_eq!(
            c.server.observability.handle_span_level.level(),
            tracing::Level::DEBUG
        );
        let e = Config::from_toml("[server.observability]\nhandle_span_level = \"loud\"\n")
            .expect_err("not a level")
            .to_string();
        assert!(e.contains("handle_span_level") || e.contains("loud"), "{e}");
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
    fn missing_file_is_an_error_naming_it() {
        for e in [
            Config::from_file("/nonexistent/convoy/domain.toml"),
            Config::load("/nonexistent/convoy/domain.toml"),
        ] {
            let e = e.expect_err("missing file");
            assert!(matches!(e, Error::Config { .. }), "{e:?}");
            let e = e.to_string();
            assert!(e.contains("/nonexistent/convoy/domain.toml"), "{e}");
            assert!(e.contains("does not exist"), "{e}");
            assert!(e.contains("Config::default()"), "{e}");
        }
    }

    #[test]
    fn environment_overrides_the_file() {
        let file = "[broker]\nurl = \"inline\"\n[server.partitioning]\nlease_ttl_ms = 6000\nreap_idle_ms = 5000\n";
        let c = Config::from_toml_with_env(
            file,
            "domain.toml",
            [
                ("CONVOY_BROKER_URL", "redis://:pw@127.0.0.1:6379/0"),
                ("CONVOY_INSTANCE_ID", "replica-0"),
                ("CONVOY__SERVER__PARTITIONING__LEASE_TTL_MS", "9000"),
                ("CONVOY__server__retry__MAX_RETRIES", "7"),
                ("CONVOY__SERVER__PRIORITY_LANES__ENABLED", "true"),
                ("CONVOY__SERVER__PRIORITY_LANES__BACKFILL_SUFFIX", "\"7\""),
                ("CONVOY__HANDLERS__ledger-Projector__CONCURRENCY", "8"),
                ("CONVOY_REDIS_URL", "redis://ignored/"),
                ("PATH", "/bin"),
            ],
        )
        .expect("valid");
        assert_eq!(c.broker.url, "redis://:pw@127.0.0.1:6379/0");
        assert_eq!(c.server.instance_id.as_deref(), Some("replica-0"));
        let p = &c.server.partitioning;
        assert_eq!(p.lease_ttl_ms, 9000, "env over file");
        assert_eq!(p.reap_idle_ms, 5000, "file over defaults");
        assert_eq!(p.poll_interval_seconds, 0.25, "defaults");
        assert_eq!(c.server.retry.max_retries, 7);
        assert!(c.server.priority_lanes.enabled);
        assert_eq!(c.server.priority_lanes.backfill_suffix, "7");
        assert_eq!(c.concurrency("ledger-Projector"), 8);
        assert_eq!(c.concurrency("other"), DEFAULT_CONCURRENCY);
        assert!(
            c.origin()
                .starts_with("domain.toml with environment overrides"),
            "{}",
            c.origin()
        );
        assert!(c.origin().contains("CONVOY_BROKER_URL"), "{}", c.origin());
        assert!(!c.origin().contains("CONVOY_REDIS_URL"), "{}", c.origin());
        // The short alias is applied after the general form.
        let c = Config::from_toml_with_env(
            "",
            "x",
            [
                ("CONVOY_BROKER_URL", "redis://a/"),
                ("CONVOY__BROKER__URL", "redis://b/"),
            ],
        )
        .expect("valid");
        assert_eq!(c.broker.url, "redis://a/");
    }

    #[test]
    fn environment_errors_name_the_variable() {
        let e = Config::from_toml_with_env(
            "",
            "domain.toml",
            [("CONVOY__SERVER__PARTITIONING__LEASE_TLL_MS", "9000")],
        )
        .expect_err("unknown key")
        .to_string();
        assert!(e.contains("lease_tll_ms"), "{e}");
        assert!(
            e.contains("CONVOY__SERVER__PARTITIONING__LEASE_TLL_MS"),
            "{e}"
        );
        let e = Config::from_toml_with_env(
            "",
            "domain.toml",
            [("CONVOY__SERVER__PARTITIONING__LEASE_TTL_MS", "soon")],
        )
        .expect_err("not a number")
        .to_string();
        assert!(e.contains("lease_ttl_ms"), "{e}");
        let e = Config::from_toml_with_env("", "domain.toml", [("CONVOY__", "1")])
            .expect_err("no key")
            .to_string();
        assert!(e.contains("does not name a key"), "{e}");
        let e = Config::from_toml_with_env(
            "",
            "domain.toml",
            [("CONVOY__SERVER__PARTITIONING__LEASE_TTL_MS", "1")],
        )
        .expect_err("out of range")
        .to_string();
        assert!(
            e.contains("CONVOY__SERVER__PARTITIONING__LEASE_TTL_MS"),
            "{e}"
        );
        assert!(e.contains("lease_ttl_ms = 1 is out of range"), "{e}");
    }

    #[test]
    fn out_of_range_values_name_the_key() {
        for (bad, key) in [
            (
                "[server.partitioning]\npoll_interval_seconds = 1e300\n",
                "poll_interval_seconds",
            ),
            (
                "[server.partitioning]\npoll_interval_seconds = nan\n",
                "poll_interval_seconds",
            ),
            (
                "[server.partitioning]\npoll_interval_seconds = 0\n",
                "poll_interval_seconds",
            ),
            (
                "[server.partitioning]\nheartbeat_interval_seconds = 0.000001\n",
                "heartbeat_interval_seconds",
            ),
            (
                "[server.partitioning]\nheartbeat_interval_seconds = -1\n",
                "heartbeat_interval_seconds",
            ),
            (
                "[server.partitioning]\nlease_ttl_ms = 9223372036854775807\n",
                "lease_ttl_ms",
            ),
            ("[server.partitioning]\nlease_ttl_ms = 99\n", "lease_ttl_ms"),
            (
                "[server.partitioning]\nreap_idle_ms = 9223372036854775807\n",
                "reap_idle_ms",
            ),
            ("[server.partitioning]\nreap_idle_ms = 0\n", "reap_idle_ms"),
            (
                "[server.partitioning]\npartition_warning_threshold = 0\n",
                "partition_warning_threshold",
            ),
            ("[server.partitioning]\nmax_unacked = 0\n", "max_unacked"),
            (
                "[server.partitioning]\nmax_unacked = 10001\n",
                "max_unacked",
            ),
            ("[server.retry]\nmax_retries = 1000000\n", "max_retries"),
            (
                "[server.retry]\ninitial_backoff_ms = 0\n",
                "initial_backoff_ms",
            ),
            (
                "[server.retry]\nmax_backoff_ms = 9223372036854775807\n",
                "max_backoff_ms",
            ),
            ("[handlers.\"a\"]\nconcurrency = 0\n", "concurrency"),
            ("[handlers.\"a\"]\nconcurrency = 100000\n", "concurrency"),
            ("[server]\ninstance_id = \"a:b\"\n", "instance_id"),
        ] {
            let e = Config::from_toml(bad).expect_err(bad).to_string();
            assert!(e.contains(key), "{bad}: {e}");
            assert!(e.contains("<string>"), "{bad}: {e}");
        }
        // The bounds themselves are accepted.
        Config::from_toml(
            "[server.partitioning]\nlease_ttl_ms = 86400000\nheartbeat_interval_seconds = 0.01\npoll_interval_seconds = 60\nreap_idle_ms = 100\npartition_warning_threshold = 1\nmax_unacked = 10000\n[server.retry]\nmax_retries = 0\ninitial_backoff_ms = 1\nmax_backoff_ms = 3600000\n[handlers.\"a\"]\nconcurrency = 10000\n",
        )
        .expect("bounds are in range");
        // Values set in code are checked the same way.
        let mut c = Config::default();
        c.server.partitioning.lease_ttl_ms = u64::MAX;
        let e = c.validate("<code>").expect_err("too long").to_string();
        assert!(e.contains("lease_ttl_ms"), "{e}");
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
        assert_eq!(redact_url("redis://:secret@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact_url("redis://u:p@ss@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact_url("redis://h:1/0"), "redis://h:1/0");
        assert_eq!(redact_url("rediss://:p%40ss@h/0"), "rediss://:***@h/0");
        // An `@` in the password, written raw: the parser takes the last one.
        assert_eq!(redact_url("redis://u:a@b@h:1/"), "redis://u:***@h:1/");
        assert_eq!(
            redact_url("unix:///run/redis.sock?db=1&pass=hunter2"),
            "unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(
            redact_url("redis+unix:///s.sock?user=app&password=hunter2"),
            "redis+unix:///s.sock?user=app&password=***"
        );
        assert_eq!(
            redact_url("redis://u:hunter2@h:99999/"),
            "redis://<hidden: not a valid URL>"
        );
        assert_eq!(redact_url("inline"), "inline");
        let c = Config::from_toml("[broker]\nurl = \"rediss://:pw@h/0\"\n").expect("ok");
        assert!(!format!("{c:?}").contains("pw"));
    }

    #[test]
    fn url_secrets_as_written_and_decoded() {
        assert_eq!(url_secrets("redis://u:p%40ss@h/"), ["p%40ss", "p@ss"]);
        assert_eq!(url_secrets("unix:///s?pass=x%2By"), ["x%2By", "x+y"]);
        assert!(url_secrets("redis://h/").is_empty());
        assert_eq!(
            url_secrets("redis+cluster://u:p%40ss@h1:1,h2:2/?password=q"),
            ["p%40ss", "p@ss", "q"]
        );
    }

    #[test]
    fn a_syntax_error_on_the_url_line_hides_the_password() {
        for text in [
            "[broker]\nurl = \"redis://app:hunter2@h:6379/0\n",
            "[broker]\nurl = redis://app:hunter2@h:6379/0\n",
            "[broker]\nurl = \"redis://app:hunter2@h:6379/0\" x\n",
            "[broker]\nurl = \"unix:///run/r.sock?pass=hunter2\" = 1\n",
        ] {
            let e = Config::from_toml(text)
                .expect_err("syntax error")
                .to_string();
            assert!(!e.contains("hunter2"), "{e}");
            assert!(e.contains("***") || e.contains("<hidden"), "{e}");
        }
        let e = Config::from_toml("[broker]\nurl = \"redis://a:b@h/\" x\n")
            .expect_err("syntax error")
            .to_string();
        assert!(e.contains("redis://a:***@h/"), "{e}");
    }

    #[test]
    fn backoff_doubles_to_max() {
        let r = RetryConfig {
            max_retries: 5,
            initial_backoff_ms: 100,
            max_backoff_ms: 350,
            max_transient_backoff_ms: 500,
            ..RetryConfig::default()
        };
        assert_eq!(r.transient_backoff(4), Duration::from_millis(500));
        assert_eq!(r.backoff(1), Duration::from_millis(100));
        assert_eq!(r.backoff(2), Duration::from_millis(200));
        assert_eq!(r.backoff(3), Duration::from_millis(350));
    }
}
