//! The convoy side of a run: configuration, engine instances (in-process
//! [`Domain`]s with distinct instance ids), and publishing through the
//! outbox so the events are real convoy envelopes in partition streams.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use convoy_runtime::outbox::OutboxProcessor;
use convoy_runtime::{Config, Domain, EngineHandle};
use serde::Serialize;

use crate::model::{Probe, ProbeState, Tick};

/// The engine settings a scenario runs with.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Tuning {
    /// `lease_ttl_ms`.
    pub ttl_ms: u64,
    /// `heartbeat_interval_seconds`.
    pub heartbeat_s: f64,
    /// `max_unacked`: handled events acknowledged per fenced call.
    pub max_unacked: usize,
    /// `[broker] wait_replicas`: replicas a publish (and with `wait_acks`
    /// an acknowledgement) waits for.
    pub wait_replicas: u32,
    /// `[broker] wait_acks`.
    pub wait_acks: bool,
}

impl Tuning {
    /// convoy's defaults (`lease_ttl_ms` 15000, heartbeat TTL / 5,
    /// `max_unacked` 1).
    pub fn defaults() -> Self {
        let p = Config::default().server.partitioning;
        Tuning {
            ttl_ms: p.lease_ttl_ms,
            heartbeat_s: p.heartbeat_interval().as_secs_f64(),
            max_unacked: p.max_unacked,
            wait_replicas: 0,
            wait_acks: false,
        }
    }

    /// The defaults with a short lease (failover and balance).
    pub fn short_lease(ttl_ms: u64, heartbeat_s: f64) -> Self {
        Tuning {
            ttl_ms,
            heartbeat_s,
            ..Self::defaults()
        }
    }

    /// The same with another `max_unacked`.
    pub fn with_max_unacked(self, max_unacked: usize) -> Self {
        Tuning {
            max_unacked,
            ..self
        }
    }

    /// The same waiting for `replicas` on every publish and, with `acks`,
    /// on every acknowledgement.
    pub fn with_wait(self, replicas: u32, acks: bool) -> Self {
        Tuning {
            wait_replicas: replicas,
            wait_acks: acks,
            ..self
        }
    }

    /// As a parameter string.
    pub fn describe(&self) -> String {
        format!(
            "lease_ttl_ms={} heartbeat={}s max_unacked={}",
            self.ttl_ms,
            trim_float(self.heartbeat_s),
            self.max_unacked
        )
    }

    /// The lease part only, as a parameter string.
    pub fn describe_lease(&self) -> String {
        format!(
            "lease_ttl_ms={} heartbeat={}s",
            self.ttl_ms,
            trim_float(self.heartbeat_s)
        )
    }
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// The configuration of every domain of a run.
pub fn config(url: &str, tuning: Tuning) -> Config {
    let mut c = Config::default();
    c.broker.url = url.to_owned();
    c.server.partitioning.lease_ttl_ms = tuning.ttl_ms;
    c.server.partitioning.heartbeat_interval_seconds = Some(tuning.heartbeat_s);
    c.server.partitioning.max_unacked = tuning.max_unacked;
    c.broker.wait_replicas = tuning.wait_replicas;
    c.broker.wait_acks = tuning.wait_acks;
    c
}

/// The benchmark category's shard count (`[broker] shards`, convoy's
/// default: [`config`] leaves it as it is).
pub fn shards() -> u32 {
    Config::default().broker.shards_of(crate::model::CATEGORY)
}

static PUBLISHERS: AtomicU64 = AtomicU64::new(0);

/// A domain that only publishes (it runs no handler). Each gets a new
/// instance id, so its outbox sequence starts fresh under a producer mark
/// of its own.
pub fn publisher(url: &str) -> Result<Domain> {
    publisher_tuned(url, Tuning::defaults())
}

/// [`publisher`] with `tuning`'s broker settings (`wait_replicas`).
pub fn publisher_tuned(url: &str, tuning: Tuning) -> Result<Domain> {
    let n = PUBLISHERS.fetch_add(1, Ordering::Relaxed);
    Domain::builder()
        .config(config(url, tuning))
        .instance_id(format!("publisher-{}-{n}", std::process::id()))
        .init()
        .map_err(|e| anyhow!("publisher domain init failed: {e}"))
}

/// An engine domain running [`Probe`] as instance `instance`.
pub fn engine_domain(
    url: &str,
    tuning: Tuning,
    instance: &str,
    state: Arc<ProbeState>,
) -> Result<Domain> {
    Domain::builder()
        .config(config(url, tuning))
        .instance_id(instance)
        .handler(Probe { state })
        .init()
        .map_err(|e| anyhow!("engine domain init failed: {e}"))
}

/// Starts `n` engine instances named `{prefix}1..{prefix}n`.
pub fn start_engines(
    url: &str,
    tuning: Tuning,
    prefix: &str,
    n: usize,
    state: &Arc<ProbeState>,
) -> Result<Vec<EngineHandle>> {
    (1..=n)
        .map(|i| {
            engine_domain(url, tuning, &format!("{prefix}{i}"), state.clone())
                .map(|d| d.engine().spawn())
        })
        .collect()
}

/// Stops engines gracefully (in-flight events finish, leases are released).
pub async fn stop_engines(engines: Vec<EngineHandle>) -> Result<()> {
    for e in engines {
        e.shutdown()
            .await
            .map_err(|e| anyhow!("engine shutdown failed: {e}"))?;
    }
    Ok(())
}

/// The consumer group name of [`Probe`] (the handler's registered name).
pub fn probe_group(domain: &Domain) -> Result<&'static str> {
    domain
        .registry()
        .handlers()
        .iter()
        .find(|h| h.name.ends_with("::Probe"))
        .map(|h| h.name)
        .ok_or_else(|| anyhow!("the Probe handler is not registered"))
}

/// Raises `events` on `domain` (in units of work of up to 10,000 events)
/// and publishes its outbox until it is empty.
pub async fn publish(domain: &Domain, events: &[Tick]) -> Result<()> {
    for chunk in events.chunks(10_000) {
        let mut uow = domain.unit_of_work();
        for e in chunk {
            uow.raise(e.clone())
                .map_err(|err| anyhow!("raise failed: {err}"))?;
        }
        uow.commit()
            .await
            .map_err(|err| anyhow!("commit failed: {err}"))?;
        drain_outbox(domain).await?;
    }
    Ok(())
}

/// Publishes everything in `domain`'s outbox now.
pub async fn drain_outbox(domain: &Domain) -> Result<()> {
    let processor = OutboxProcessor::new(
        domain.outbox().clone(),
        domain.broker().clone(),
        domain.config().server.priority_lanes.clone(),
        domain.instance_id(),
        Arc::new(tokio::sync::Notify::new()),
    );
    processor
        .drain()
        .await
        .map_err(|e| anyhow!("publishing the outbox failed: {e}"))?;
    Ok(())
}

/// Raises one event and commits it (a running engine of `domain` publishes
/// it).
pub async fn commit_one(domain: &Domain, event: Tick) -> Result<()> {
    let mut uow = domain.unit_of_work();
    uow.raise(event)
        .map_err(|err| anyhow!("raise failed: {err}"))?;
    uow.commit()
        .await
        .map_err(|err| anyhow!("commit failed: {err}"))?;
    Ok(())
}

/// Waits until `done` holds, checking every `every`; false on timeout.
pub async fn wait_for(timeout: Duration, every: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if done() {
            return true;
        }
        if start.elapsed() >= timeout {
            return false;
        }
        tokio::time::sleep(every).await;
    }
}

/// Waits until `state` has handled `n` events; fails with `what` on
/// timeout.
pub async fn wait_handled(state: &ProbeState, n: u64, timeout: Duration, what: &str) -> Result<()> {
    if wait_for(timeout, Duration::from_millis(2), || state.handled() >= n).await {
        Ok(())
    } else {
        bail!(
            "timed out after {timeout:?} waiting for {what}: {} of {n} handled",
            state.handled()
        )
    }
}

/// The current number of keys in the selected database.
pub async fn dbsize(conn: &mut redis::aio::MultiplexedConnection) -> Result<u64> {
    redis::cmd("DBSIZE")
        .query_async(conn)
        .await
        .context("DBSIZE failed")
}
