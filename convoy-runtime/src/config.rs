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
//! [server.retry]
//! max_retries = 3
//! initial_backoff_ms = 100
//! max_backoff_ms = 10000
//!
//! [server.observability]
//! handle_span_level = "info"       # the per-event `handle` span: trace, debug, info, warn, error
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

/// A URL with its secrets replaced by `***`, for logs and messages: the
/// password of its user info (`redis://user:***@host/`) and the value of a
/// `pass` or `password` query parameter (where redis-rs reads the password
/// of a `unix://` / `redis+unix://` socket URL:
/// `unix:///run/redis.sock?pass=***`). Parsed with a URL parser; text that
/// does not parse as a URL is shown only when it cannot hold a secret (no
/// `@`, no `?`), else as `scheme://<hidden: not a valid URL>`.
pub fn redact_url(url: &str) -> String {
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
/// parameters, each as written and percent-decoded. Empty when the URL
/// does not parse or has none.
pub fn url_secrets(url: &str) -> Vec<String> {
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
        // The error quotes the offending line: hide any URL's password.
        let c: Config = toml::from_str(text).map_err(|e| Error::Config {
            file: file.to_owned(),
            message: redact_urls_in(e.to_string().trim_end()),
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
        };
        assert_eq!(r.backoff(1), Duration::from_millis(100));
        assert_eq!(r.backoff(2), Duration::from_millis(200));
        assert_eq!(r.backoff(3), Duration::from_millis(350));
    }
}
