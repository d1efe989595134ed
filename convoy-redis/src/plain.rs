//! The ordinary consumer: one consumer group per handler on `{category}`
//! (and its backfill lane), for events that carry no partition key. No
//! ordering beyond the stream's; retries in place, then `{category}:dlq`.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio_util::sync::CancellationToken;

use super::connection::{BLOCK, Conn, Connection};
use super::reply::{Entry, entries, first_stream_entries};
use super::scripts::dead_letter::DeadLetter;
use super::scripts::plain_ack::PlainAck;
use crate::tracing;
use convoy_core::backoff::{Backoff, sleep_or_stop};
use convoy_core::broker::{Attempt, ConsumerPlan, Subscription};
use convoy_core::config::{PriorityLanesConfig, RetryConfig};
use convoy_core::envelope::now_ms;
use convoy_core::error::{Error, chain};
use convoy_core::handler::HandlerError;
use convoy_core::key::Escaped;
use convoy_core::names;

/// Entries per read.
const BATCH: usize = 100;

pub(crate) struct PlainConsumer {
    redis: Arc<Connection>,
    plan: Arc<ConsumerPlan>,
    index: usize,
    /// `[server.partitioning] lease_ttl_ms`: entries of a consumer idle
    /// this long are taken over.
    min_idle_ms: u64,
    /// `[server.partitioning]`: how often entries of dead consumers are
    /// looked for.
    heartbeat: Duration,
    /// `[server.retry]` with the handler's own values over it, read once.
    retry: RetryConfig,
    /// `[server.priority_lanes]`.
    lanes: PriorityLanesConfig,
    /// The category's shard count (its base streams are in the category's
    /// own shard).
    shards: u32,
}

impl PlainConsumer {
    pub(crate) fn new(redis: Arc<Connection>, plan: Arc<ConsumerPlan>, index: usize) -> Self {
        // What it reads of the configuration, read once.
        let config = &plan.config;
        let min_idle_ms = config.server.partitioning.lease_ttl_ms;
        let heartbeat = config.server.partitioning.heartbeat_interval();
        let retry = config.retry_for(plan.subscriptions[index].name);
        let lanes = config.server.priority_lanes.clone();
        let shards = config.broker.shards_of(plan.subscriptions[index].category);
        PlainConsumer {
            redis,
            plan,
            index,
            min_idle_ms,
            heartbeat,
            retry,
            lanes,
            shards,
        }
    }

    fn sub(&self) -> &Subscription {
        &self.plan.subscriptions[self.index]
    }

    fn streams(&self) -> Vec<String> {
        let c = self.sub().category;
        let lanes = &self.lanes;
        let shards = self.shards;
        let mut v = vec![names::base_stream(c, shards)];
        if lanes.enabled {
            v.push(names::base_backfill_stream(
                c,
                &lanes.backfill_suffix,
                shards,
            ));
        }
        v
    }

    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut backoff = Backoff::reconnect();
        while !shutdown.is_cancelled() {
            match self.session(&shutdown).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(handler = self.sub().name, error = %chain(&e), "consumer lost Redis; reconnecting");
                    if !backoff.wait_or_stop(&shutdown).await {
                        return;
                    }
                }
            }
        }
    }

    /// One connected session; returns Ok on shutdown.
    async fn session(&self, shutdown: &CancellationToken) -> Result<(), Error> {
        let mut conn = self.redis.blocking().await?;
        let group = self.sub().name;
        let me = self.plan.instance_id.clone();
        let streams = self.streams();
        self.ensure_groups(&mut conn, &streams).await?;
        let heartbeat = self.heartbeat;
        let mut next_claim = tokio::time::Instant::now();
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            // Entries of consumers that died: take them over after a lease TTL.
            if tokio::time::Instant::now() >= next_claim {
                next_claim = tokio::time::Instant::now() + heartbeat;
                for s in &streams {
                    let claimed = self.autoclaim(&mut conn, s, &me).await?;
                    for e in claimed {
                        if !self.handle(s, &e, shutdown).await? {
                            return Ok(());
                        }
                    }
                }
                // Own pending entries (after a reconnect).
                for s in &streams {
                    loop {
                        let v: Value = redis::cmd("XREADGROUP")
                            .arg("GROUP")
                            .arg(group)
                            .arg(&me)
                            .arg("COUNT")
                            .arg(BATCH)
                            .arg("STREAMS")
                            .arg(s)
                            .arg("0")
                            .query_async(&mut conn)
                            .await
                            .map_err(|e| Error::redis("read of pending entries failed", e))?;
                        let batch: Vec<Entry> = first_stream_entries(v)
                            .into_iter()
                            .flat_map(|(_, e)| e)
                            .collect();
                        if batch.is_empty() {
                            break;
                        }
                        for e in &batch {
                            if !self.handle(s, e, shutdown).await? {
                                return Ok(());
                            }
                        }
                    }
                }
            }
            let mut cmd = redis::cmd("XREADGROUP");
            cmd.arg("GROUP")
                .arg(group)
                .arg(&me)
                .arg("COUNT")
                .arg(BATCH)
                .arg("BLOCK")
                .arg(BLOCK.as_millis() as u64)
                .arg("STREAMS");
            for s in &streams {
                cmd.arg(s);
            }
            for _ in &streams {
                cmd.arg(">");
            }
            let read = cmd.query_async::<Value>(&mut conn);
            let v = tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                v = read => v,
            };
            let v = match v {
                Ok(v) => v,
                Err(e) if e.code() == Some("NOGROUP") => {
                    self.ensure_groups(&mut conn, &streams).await?;
                    continue;
                }
                Err(e) => return Err(Error::redis("read failed", e)),
            };
            let mut by_stream = first_stream_entries(v);
            // Primary lane first.
            by_stream
                .sort_by_key(|(s, _)| streams.iter().position(|x| x == s).unwrap_or(usize::MAX));
            for (s, batch) in by_stream {
                for e in &batch {
                    if !self.handle(&s, e, shutdown).await? {
                        return Ok(());
                    }
                }
            }
        }
    }

    async fn ensure_groups(&self, conn: &mut Conn, streams: &[String]) -> Result<(), Error> {
        let group = self.sub().name;
        super::layout::check_shards(conn, self.sub().category, self.shards).await?;
        let _: i64 = redis::cmd("SADD")
            .arg(names::base_groups(self.sub().category, self.shards))
            .arg(group)
            .query_async(conn)
            .await
            .map_err(|e| Error::redis("failed to register the consumer group", e))?;
        for s in streams {
            let r: Result<Value, _> = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(s)
                .arg(group)
                .arg("0")
                .arg("MKSTREAM")
                .query_async(conn)
                .await;
            match r {
                Ok(_) => {}
                Err(e) if e.code() == Some("BUSYGROUP") => {}
                Err(e) => return Err(Error::redis("failed to create the consumer group", e)),
            }
        }
        Ok(())
    }

    async fn autoclaim(
        &self,
        conn: &mut Conn,
        stream: &str,
        me: &str,
    ) -> Result<Vec<Entry>, Error> {
        let min_idle = self.min_idle_ms;
        let v: Value = redis::cmd("XAUTOCLAIM")
            .arg(stream)
            .arg(self.sub().name)
            .arg(me)
            .arg(min_idle)
            .arg("0-0")
            .arg("COUNT")
            .arg(BATCH)
            .query_async(conn)
            .await
            .map_err(|e| Error::redis("failed to claim entries of dead consumers", e))?;
        let Value::Array(parts) = v else {
            return Ok(Vec::new());
        };
        let claimed = parts.into_iter().nth(1).map(entries).unwrap_or_default();
        if !claimed.is_empty() {
            tracing::info!(
                handler = self.sub().name,
                stream,
                claimed = claimed.len(),
                "claimed entries of a dead consumer"
            );
        }
        Ok(claimed)
    }

    /// Runs one entry with retries; false when shutdown interrupted it (the
    /// entry stays pending).
    async fn handle(
        &self,
        stream: &str,
        entry: &Entry,
        shutdown: &CancellationToken,
    ) -> Result<bool, Error> {
        let retry = &self.retry;
        let mut attempt = 1;
        loop {
            let category = self.sub().category;
            let result = match entry.envelope(stream).and_then(|env| {
                env.check_origin(stream, &entry.id, category, None)
                    .map(|()| env)
            }) {
                Ok(env) => {
                    self.plan
                        .invoke(self.sub(), env, Attempt::new(attempt))
                        .await
                }
                Err(e) => Err(HandlerError::from(e)),
            };
            match result {
                Ok(_) => {
                    self.ack(stream, &entry.id).await?;
                    return Ok(true);
                }
                Err(e) if e.is_transient() => {
                    // A dependency is down, not the event at fault: retried
                    // for as long as it lasts, never dead-lettered.
                    let wait = convoy_core::backoff::jitter(retry.transient_backoff(attempt));
                    tracing::debug!(handler = self.sub().name, stream, entry = %entry.id, attempt, error = %Escaped(&e.to_string()), "transient failure; retrying");
                    if sleep_or_stop(wait, shutdown).await {
                        return Ok(false);
                    }
                    attempt = attempt.saturating_add(1);
                }
                Err(e) if attempt > retry.max_retries || e.is_permanent() => {
                    let why = if e.is_permanent() {
                        "handler returned a permanent error"
                    } else {
                        "handler failed after retries"
                    };
                    tracing::error!(handler = self.sub().name, stream, entry = %entry.id, attempt, error = %Escaped(&e.to_string()), "{why}; entry moved to the dead letter stream");
                    self.dead_letter(stream, entry, &e.to_string()).await?;
                    return Ok(true);
                }
                Err(e) => {
                    let wait = retry.backoff(attempt);
                    tracing::warn!(handler = self.sub().name, stream, entry = %entry.id, attempt, error = %Escaped(&e.to_string()), "handler failed; retrying");
                    if sleep_or_stop(wait, shutdown).await {
                        return Ok(false);
                    }
                    attempt += 1;
                }
            }
        }
    }

    async fn ack(&self, stream: &str, id: &str) -> Result<(), Error> {
        let mut c = self.redis.shared().await?;
        PlainAck {
            stream,
            category: self.sub().category,
            shards: self.shards,
            group: self.sub().name,
            ids: &[id],
        }
        .run(&mut c)
        .await?;
        Ok(())
    }

    async fn dead_letter(&self, stream: &str, entry: &Entry, error: &str) -> Result<(), Error> {
        let mut c = self.redis.shared().await?;
        let dlq_id = DeadLetter {
            stream,
            category: self.sub().category,
            shards: self.shards,
            group: self.sub().name,
            entry,
            error,
            now_ms: now_ms(),
        }
        .run(&mut c)
        .await?;
        tracing::debug!(dlq_id, "dead letter written");
        Ok(())
    }
}
