//! The scenarios. Each one measures convoy and the baseline on the same
//! server, one case at a time, with the database flushed before each side
//! of each case so nothing carries over (`pg-outbox` also gives each side a
//! fresh PostgreSQL database).

pub mod balance;
pub mod cluster;
pub mod failover;
pub mod idle;
pub mod latency;
pub mod pg_outbox;
pub mod throughput;

use anyhow::{Context as _, Result};
use redis::aio::MultiplexedConnection;

use crate::stats::CommandStats;

/// The Redis a run measures against, and the benchmark's own connection
/// to it (for flushing and reading counters).
#[derive(Debug)]
pub struct Env {
    /// The URL every engine, publisher and consumer connects to.
    pub url: String,
    /// A client for new baseline connections.
    pub client: redis::Client,
    /// The benchmark's measuring connection.
    pub admin: MultiplexedConnection,
    /// The consumer group (handler name) of the benchmark's handler.
    pub group: &'static str,
}

impl Env {
    /// Connects to `url`.
    pub async fn connect(url: &str) -> Result<Self> {
        let client = redis::Client::open(url).context("invalid Redis URL")?;
        let admin = client
            .get_multiplexed_async_connection_with_config(&admin_config())
            .await
            .with_context(|| format!("cannot connect to {url}"))?;
        let group = crate::harness::probe_group(&crate::harness::publisher(url)?)?;
        Ok(Env {
            url: url.to_owned(),
            client,
            admin,
            group,
        })
    }

    /// Empties the database (`FLUSHDB`) before a case.
    pub async fn reset(&mut self) -> Result<()> {
        let () = redis::cmd("FLUSHDB")
            .query_async(&mut self.admin)
            .await
            .context("FLUSHDB failed")?;
        Ok(())
    }

    /// The current `INFO commandstats` counters.
    pub async fn stats(&mut self) -> Result<CommandStats> {
        CommandStats::read(&mut self.admin).await
    }
}

/// The measuring connections' settings: `FLUSHDB` of millions of keys and
/// `MEMORY USAGE` of a large set take longer than redis-rs's default
/// response timeout (500 ms).
pub fn admin_config() -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(std::time::Duration::from_secs(120)))
}

/// Prints progress on stderr (stdout carries the results).
pub fn progress(scenario: &str, what: impl std::fmt::Display) {
    eprintln!("[{scenario}] {what}");
}
