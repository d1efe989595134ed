//! The Redis broker: publishing through the publish script, consuming with
//! one partitioned coordinator and/or one ordinary consumer group per
//! subscription.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::chain::{Calls, InFlight};
use super::connection::{Client, Conn, Connection, query_each_slot};
use super::layout;
use super::loss::PublishMarks;
use super::partitioned::Coordinator;
use super::plain::PlainConsumer;
use super::routing::{Routed, Routing};
use super::scripts::Replicated;
use super::scripts::publish::Publish;
use super::state::RedisStateStore;
use super::wake;
use crate::tracing;
use convoy_core::broker::{
    Broker, Capabilities, ConsumerPlan, KeyUse, Producer, Publication, PublishError,
};
use convoy_core::config::Config;
use convoy_core::error::{Error, chain};
use convoy_core::future::BoxFuture;
use convoy_core::names;
use convoy_core::process_manager::StateStore;

/// How long a recheck of the published counts waits for each shard.
const RECHECK_WITHIN: Duration = Duration::from_secs(1);

/// The Redis Streams broker. Cheap to share; connects on first use.
pub struct RedisBroker {
    redis: Arc<Connection>,
    /// The domain's shard counts and lanes, given once by
    /// [`Broker::configure`] (the defaults until then).
    routing: Arc<OnceLock<Routing>>,
    /// Categories whose shard count this process checked against Redis.
    checked: Arc<Mutex<HashSet<String>>>,
    /// Key uses this process checked against Redis's record, as
    /// `(category, use)`, and when: a field use holds for good, an unkeyed
    /// one for [`UNKEYED_RECHECK`] (a consumer may record a key meanwhile).
    keys_checked: Arc<Mutex<HashMap<(String, String), Instant>>>,
    /// What this process's publishes left in each shard's counts, to tell
    /// when a shard lost them.
    marks: Arc<PublishMarks>,
    /// Publish calls in flight, per producer and shard (a batch sent
    /// behind another runs only after it).
    calls: Arc<Calls>,
}

/// How long an unkeyed use of a category stays checked.
const UNKEYED_RECHECK: Duration = Duration::from_secs(10);

impl std::fmt::Debug for RedisBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBroker")
            .field("url", &self.redis.url())
            .finish_non_exhaustive()
    }
}

impl RedisBroker {
    /// A broker for a `redis://` or `rediss://` URL (user, password and
    /// database in the URL work), or for a Redis Cluster named by one or
    /// more of its nodes: `redis+cluster://[user:password@]h1:p1,h2:p2/`
    /// (`rediss+cluster://` for TLS). Nothing is connected yet.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        Self::open(url, None)
    }

    /// A broker for a `rediss://` URL whose server certificate is signed by
    /// the CA in `ca_pem` (PEM) rather than one in the system trust store.
    pub fn from_url_with_ca(url: &str, ca_pem: Vec<u8>) -> Result<Self, Error> {
        Self::open(url, Some(ca_pem))
    }

    fn open(url: &str, ca_pem: Option<Vec<u8>>) -> Result<Self, Error> {
        let client = Client::open(url, ca_pem, "[broker] url ")?;
        Ok(RedisBroker {
            redis: Arc::new(Connection::new(client, url)),
            routing: Arc::default(),
            checked: Arc::default(),
            keys_checked: Arc::default(),
            marks: Arc::default(),
            calls: Arc::default(),
        })
    }

    /// How long one command may take before it fails (default 5 s).
    pub fn response_timeout(self, timeout: Duration) -> Self {
        RedisBroker {
            redis: Arc::new(self.redis.with_response_timeout(timeout)),
            routing: self.routing,
            checked: Arc::default(),
            keys_checked: Arc::default(),
            marks: Arc::default(),
            calls: Arc::default(),
        }
    }

    /// The URL with its password hidden.
    pub fn url(&self) -> String {
        self.redis.url()
    }

    /// The connections.
    pub(crate) fn connection(&self) -> &Arc<Connection> {
        &self.redis
    }

    /// The layout routing uses: the one [`Broker::configure`] gave, else
    /// the defaults (a broker used without a domain).
    fn routing(&self) -> &Routing {
        static DEFAULT: std::sync::LazyLock<Routing> = std::sync::LazyLock::new(Routing::default);
        self.routing.get().unwrap_or(&DEFAULT)
    }

    /// Checks, once per category and process, that the batch's categories
    /// have the shard count Redis recorded (recording it if none is).
    async fn check_shards(&self, conn: &mut Conn, batch: &[Publication]) -> Result<(), Error> {
        for p in batch {
            let category = &p.envelope.category;
            let known = match self.checked.lock() {
                Ok(g) => g.contains(category),
                Err(poisoned) => poisoned.into_inner().contains(category),
            };
            if known {
                continue;
            }
            layout::check_shards(conn, category, self.routing().shards().shards_of(category))
                .await?;
            match self.checked.lock() {
                Ok(mut g) => g.insert(category.clone()),
                Err(poisoned) => poisoned.into_inner().insert(category.clone()),
            };
        }
        Ok(())
    }
}

/// Locks a set, poisoned or not (a set of checked names stays valid).
fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl RedisBroker {
    /// Checks how this process uses `category`'s key against Redis's
    /// record, once per category and use.
    async fn check_key_use(&self, category: &str, used: KeyUse<'_>) -> Result<(), Error> {
        self.check_key_use_on(&self.redis, category, used).await
    }

    /// [`Self::check_key_use`] over `redis`.
    async fn check_key_use_on(
        &self,
        redis: &Connection,
        category: &str,
        used: KeyUse<'_>,
    ) -> Result<(), Error> {
        let id = (category.to_owned(), format!("{used:?}"));
        let fresh =
            |at: &Instant| matches!(used, KeyUse::Field(_)) || at.elapsed() < UNKEYED_RECHECK;
        if locked(&self.keys_checked).get(&id).is_some_and(fresh) {
            return Ok(());
        }
        let mut conn = redis.shared().await?;
        layout::check_key_field(&mut conn, category, used).await?;
        locked(&self.keys_checked).insert(id, Instant::now());
        Ok(())
    }

    /// The replicas a publish waits for (`[broker] wait_replicas`).
    fn replicated(&self) -> Option<Replicated> {
        Replicated::publishing(self.routing().shards())
    }

    /// Checks every subscribed category's shard count against Redis's
    /// record (recording it where none is), over the consumers' connection
    /// `redis` (the broker's own is the publisher's: it is not to be
    /// connected from the engine's runtime).
    async fn check_subscribed_shards(
        &self,
        plan: &ConsumerPlan,
        redis: &Connection,
    ) -> Result<(), Error> {
        // Every category this process knows a key for (it may publish
        // them without consuming them), then every subscribed one.
        for (c, field) in plan.key_fields() {
            self.check_key_use_on(redis, c, KeyUse::Field(field))
                .await?;
        }
        let mut conn = redis.shared().await?;
        for sub in &plan.subscriptions {
            for c in &sub.categories {
                match plan.key_field(c) {
                    Some(field) => {
                        self.check_key_use_on(redis, c, KeyUse::Field(field))
                            .await?
                    }
                    None => {
                        for fields in sub.unkeyed_fields() {
                            self.check_key_use_on(redis, c, KeyUse::Unkeyed(fields))
                                .await?;
                        }
                    }
                }
                let configured = plan.config.broker.shards_of(c);
                layout::check_shards(&mut conn, c, configured)
                    .await
                    .map_err(|e| match e {
                        Error::Config { message, .. } => Error::Config {
                            file: plan.config.origin().to_owned(),
                            message,
                        },
                        other => other,
                    })?;
            }
        }
        Ok(())
    }
}

impl Broker for RedisBroker {
    fn name(&self) -> &str {
        "redis"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::STREAM_PARTITIONING
    }

    fn state_store(&self) -> Option<Arc<dyn StateStore>> {
        Some(Arc::new(RedisStateStore::new(self.redis.clone())))
    }

    fn describe(&self) -> String {
        format!("redis at {}", self.redis.url())
    }

    fn configure(&self, config: &Config) -> Result<(), Error> {
        let wanted = Routing::of(config);
        let bound = self.routing.get_or_init(|| wanted.clone());
        if *bound == wanted {
            return Ok(());
        }
        Err(Error::Config {
            file: config.origin().to_owned(),
            message: "this RedisBroker already serves a domain with other [broker] shard counts or [server.priority_lanes]; give each domain a broker of its own (RedisBroker::from_url)".to_owned(),
        })
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            let mut conn = self.redis.shared().await?;
            let _: String = redis::cmd("PING")
                .query_async(&mut conn)
                .await
                .map_err(|e| Error::redis("PING failed", e))?;
            Ok(())
        })
    }

    fn check_category<'a>(
        &'a self,
        category: &'a str,
        key: KeyUse<'a>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(self.check_key_use(category, key))
    }

    fn take_over<'a>(&'a self, producer: &'a Producer) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            // An empty batch in every shard a publication can go to: the
            // script raises the stored epoch (or refuses a replaced one)
            // and trims nothing (floor 0).
            let conn = self.redis.shared().await?;
            let wait = self.replicated();
            let runs = (0..self.routing().shards().max_shards()).map(|shard| {
                let mut c = conn.clone();
                async move {
                    Publish {
                        producer,
                        shard,
                        floor: 0,
                        call: "take-over",
                        behind: None,
                        batch: &[],
                        wakes: false,
                    }
                    .run(&mut c, wait)
                    .await
                }
            });
            for r in futures::future::join_all(runs).await {
                r?;
            }
            Ok(())
        })
    }

    fn recheck_published(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let due = self.marks.to_recheck();
            if due.is_empty() {
                return;
            }
            let Ok(mut conn) = self.redis.shared().await else {
                return;
            };
            let cmds = due
                .iter()
                .map(|(shard, category)| {
                    let key = names::published(*shard, category);
                    let mut cmd = redis::cmd("GET");
                    cmd.arg(&key);
                    (key, cmd)
                })
                .collect();
            let read_at = std::time::Instant::now();
            let replies = query_each_slot(&mut conn, cmds, RECHECK_WITHIN).await;
            for ((shard, category), answer) in due.iter().zip(replies) {
                // A shard that does not answer is looked at next time.
                if let Ok(v) = answer {
                    self.marks
                        .rechecked(*shard, category, super::reply::int(&v), read_at);
                }
            }
        })
    }

    fn publish<'a>(
        &'a self,
        producer: &'a Producer,
        batch: &'a [Publication],
    ) -> BoxFuture<'a, Result<(), PublishError>> {
        self.publish_behind(producer, batch, batch.first().map_or(0, |p| p.seq))
    }

    fn pipelines_publishes(&self) -> bool {
        true
    }

    fn publish_behind<'a>(
        &'a self,
        producer: &'a Producer,
        batch: &'a [Publication],
        floor: u64,
    ) -> BoxFuture<'a, Result<(), PublishError>> {
        if batch.is_empty() {
            return Box::pin(async { Ok(()) });
        }
        // Each shard's call is registered now, before anything is sent: a
        // call sent while an earlier batch's call to its shard is still in
        // flight names that one, and runs only after it (see chain.rs).
        let by_shard = self.routing().by_shard(batch);
        let calls: Vec<InFlight> = by_shard
            .keys()
            .map(|shard| self.calls.register(&producer.name, producer.epoch, *shard))
            .collect();
        Box::pin(async move {
            // Each shard's script writes its records or none. A shard that
            // fails (its master failing over) holds up no other: the shards
            // that wrote (and whose wake-ups went out) are reported so only
            // the failed shard's records are sent again, and those that did
            // go out before are dropped by its dedup set.
            let fail = PublishError::nothing;
            let mut conn = self.redis.shared().await.map_err(fail)?;
            self.check_shards(&mut conn, batch).await.map_err(fail)?;
            let wait = self.replicated();
            // On one server each shard's script writes its wake-ups, atomic
            // with its records; on a cluster they are written below.
            let wakes = !self.redis.is_cluster();
            let runs = by_shard.iter().zip(&calls).map(|((shard, records), call)| {
                let mut c = conn.clone();
                async move {
                    Publish {
                        producer,
                        shard: *shard,
                        floor,
                        call: &call.id,
                        behind: call.behind.as_deref(),
                        batch: records,
                        wakes,
                    }
                    .run(&mut c, wait)
                    .await
                }
            });
            let mut failed = None;
            let mut written: Vec<&Routed<'_>> = Vec::with_capacity(batch.len());
            let results = futures::future::join_all(runs).await;
            for (((shard, records), r), call) in by_shard.iter().zip(results).zip(&calls) {
                tracing::debug!(
                    producer = %producer.name,
                    epoch = producer.epoch,
                    shard,
                    call = %call.id,
                    behind = call.behind.as_deref().unwrap_or(""),
                    floor,
                    first = records.first().map_or(0, |r| r.publication.seq),
                    last = records.last().map_or(0, |r| r.publication.seq),
                    records = records.len(),
                    outcome = %match &r {
                        Ok(p) => format!("wrote {}", p.written),
                        Err(e) => e.to_string(),
                    },
                    "publish call"
                );
                match r {
                    Ok(published) => {
                        if published.wake_failures > 0 {
                            tracing::warn!(
                                shard,
                                failed = published.wake_failures,
                                "the publish script could not write wake-ups (a wake stream key holds something other than a stream?); the events are published; their owners, whose reads of that stream fail too, wake every unit they own"
                            );
                        }
                        self.marks
                            .published(*shard, &published.counts, records, published.written);
                        written.extend(records.iter());
                    }
                    // A shard's own failure is told before one that only
                    // followed another's.
                    Err(e) => {
                        if failed
                            .as_ref()
                            .is_none_or(|f| matches!(f, Error::PublishedOutOfTurn))
                        {
                            failed = Some(e);
                        }
                    }
                }
            }
            // An idle owner waits for its wake-up: without it, a new event
            // would wait for the owner's next reap check. The batch is
            // reported published (and its records leave the outbox) only
            // once its wake-ups are written: a publisher killed in between
            // would leave events on their streams that nobody is woken
            // for. On one server the scripts wrote them with the records;
            // on a cluster they are written now. (A batch sent behind this
            // one is not held up: the processor prepares the next while
            // both are in flight.)
            if !wakes {
                hint_written(&mut conn, &written).await;
            }
            // The calls leave the calls in flight only now that the publish
            // is over: a batch handed over meanwhile (while these wake-ups
            // were written) is sent behind them, so it is refused where one
            // of them was (the processor sees this batch's failure only
            // once the publish is over, and hands nothing over behind a
            // failed batch from then on).
            drop(calls);
            match failed {
                None => Ok(()),
                Some(error) => Err(PublishError {
                    published: 0,
                    also_written: written.iter().map(|r| r.publication.seq).collect(),
                    error,
                }),
            }
        })
    }

    fn run(
        self: Arc<Self>,
        plan: Arc<ConsumerPlan>,
        shutdown: CancellationToken,
    ) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(async move {
            // The consumers' connection of their own, connected from the
            // runtime they run on (the engine's, `[server] engine_threads`):
            // its reader task runs beside the workers it answers, rather
            // than on the application's runtime; and the broker's own (the
            // publisher's) is never first connected from the engine's.
            let redis = Arc::new(self.redis.separate());
            // A category whose shard count differs from the one Redis
            // recorded would read other streams than its publishers write:
            // the engine fails to start (Redis being down is waited out).
            let mut backoff = convoy_core::backoff::Backoff::reconnect();
            loop {
                match self.check_subscribed_shards(&plan, &redis).await {
                    Ok(()) => break,
                    Err(e @ (Error::Config { .. } | Error::KeyFieldMismatch { .. })) => {
                        return Err(e);
                    }
                    Err(e) => {
                        tracing::warn!(error = %chain(&e), "cannot check the categories' shard counts; retrying");
                        if !backoff.wait_or_stop(&shutdown).await {
                            return Ok(());
                        }
                    }
                }
            }
            let mut tasks = tokio::task::JoinSet::new();
            for index in 0..plan.subscriptions.len() {
                let sub = &plan.subscriptions[index];
                if sub.reads_partitions {
                    let c = Coordinator::new(redis.clone(), plan.clone(), index);
                    tasks.spawn(c.run(shutdown.clone()));
                }
                if sub.reads_base {
                    let p = PlainConsumer::new(redis.clone(), plan.clone(), index);
                    tasks.spawn(p.run(shutdown.clone()));
                }
            }
            while let Some(r) = tasks.join_next().await {
                if let Err(e) = r {
                    tracing::error!(error = %chain(&e), "a consumer task failed");
                }
            }
            Ok(())
        })
    }
}

/// Writes the wake-ups of the keys `written` to, on a cluster (one server
/// has its publish scripts write them). The wake stream is one key per
/// category, in one slot: a failure to write it (its master failing over)
/// does not hold the batch, whose events are in Redis; its wake-ups are
/// written again in the background, and the owners, whose reads of that
/// stream fail too, wake every unit they own.
async fn hint_written(conn: &mut Conn, written: &[&Routed<'_>]) {
    let mut woken = HashSet::new();
    let keys: Vec<(&str, &str)> = written
        .iter()
        .filter_map(|r| {
            let at = (r.publication.envelope.category.as_str(), r.partition?);
            woken.insert(at).then_some(at)
        })
        .collect();
    if let Err(e) = wake::hint(conn, keys.iter().copied(), false).await {
        tracing::warn!(error = %chain(&e), "writing wake-ups failed; the batch is published, its wake-ups are sent again in the background");
        let owned = keys.iter().map(|(c, k)| ((*c).to_owned(), (*k).to_owned()));
        tokio::spawn(wake::hint_later(conn.clone(), owned.collect()));
    }
}
