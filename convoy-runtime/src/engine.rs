//! The engine: publishes the outbox and runs every event handler on the
//! domain's broker until told to stop.
//!
//! # Lifecycle
//!
//! 1. [`Engine::run_until`] starts the outbox processor and the broker's
//!    consumers (one per handler). The consumers run on a tokio runtime of
//!    the engine's own (`[server] engine_threads` threads named
//!    `convoy-engine`, 1 by default; 0 runs them on the caller's), which
//!    lives as long as the caller's runtime.
//! 2. When the signal fires, consumers stop taking new events, finish the
//!    ones in flight, acknowledge them and release their leases.
//! 3. Events raised by those last handlers are published, then the outbox
//!    processor stops.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::domain::Domain;
use convoy_core::broker::{Broker, ConsumerPlan, HealthState, Subscription};
use convoy_core::error::Error;
use convoy_core::outbox::OutboxProcessor;

impl Domain {
    /// The engine that publishes the outbox and runs the event handlers.
    pub fn engine(&self) -> Engine {
        Engine::new(self.clone())
    }
}

/// Runs a domain: outbox processor plus consumers.
#[derive(Debug)]
pub struct Engine {
    domain: Domain,
    shutdown_timeout: Duration,
    health: Arc<HealthState>,
    checks: Vec<ReadinessCheck>,
}

/// A user's readiness check: its name and what runs it.
#[derive(Clone)]
struct ReadinessCheck {
    name: &'static str,
    run: Arc<dyn Fn() -> convoy_core::future::BoxFuture<'static, Result<(), String>> + Send + Sync>,
}

impl std::fmt::Debug for ReadinessCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadinessCheck")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Engine {
    pub(crate) fn new(domain: Domain) -> Self {
        Engine {
            domain,
            shutdown_timeout: Duration::from_secs(30),
            health: Arc::default(),
            checks: Vec::new(),
        }
    }

    /// Adds a readiness check of the handlers' own dependencies (a
    /// database pool, a service): [`EngineHandle::health`] runs it (at
    /// most 2 s) and [`Health::is_ready`] is false while it fails, so a
    /// readiness probe stops sending work to an instance whose handlers
    /// cannot reach what they need.
    ///
    /// ```no_run
    /// # async fn ping() -> Result<(), std::io::Error> { Ok(()) }
    /// # async fn run(domain: convoy_runtime::Domain) {
    /// // With sqlx: `let pool = pool.clone(); async move {
    /// // sqlx::query("SELECT 1").execute(&pool).await.map(|_| ()) }`
    /// let engine = domain
    ///     .engine()
    ///     .readiness_check("database", || async { ping().await })
    ///     .spawn();
    /// # }
    /// ```
    pub fn readiness_check<F, Fut, E>(mut self, name: &'static str, check: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display,
    {
        self.checks.push(ReadinessCheck {
            name,
            run: Arc::new(move || {
                let fut = check();
                Box::pin(async move { fut.await.map_err(|e| e.to_string()) })
            }),
        });
        self
    }

    /// How long a graceful shutdown may take before in-flight work is
    /// abandoned (default 30 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    fn processor(&self) -> OutboxProcessor {
        let outbox = self.domain.outbox_handle();
        OutboxProcessor::new(
            outbox.store().clone(),
            self.domain.broker().clone(),
            self.domain.config().server.priority_lanes.clone(),
            self.domain.instance_id(),
            outbox.wake().clone(),
        )
        .batch_size(self.domain.config().outbox.batch)
        .message_types(self.domain.registry().messages())
    }

    /// What the broker consumes: the domain's handlers and process
    /// managers as subscriptions, with the parts a consumer needs.
    fn plan(&self) -> ConsumerPlan {
        let d = &self.domain;
        let registry = d.registry().clone();
        let mut subscriptions: Vec<Subscription> = d
            .event_handlers()
            .iter()
            .map(|(descriptor, handler)| {
                Subscription::for_handler(descriptor, handler.clone(), &registry)
            })
            .collect();
        for (descriptor, dispatch) in d.process_managers() {
            subscriptions.extend(Subscription::for_process_manager(
                descriptor, dispatch, &registry,
            ));
        }
        for sub in &mut subscriptions {
            sub.classify = d.classifier(sub.name);
        }
        ConsumerPlan::new(
            subscriptions,
            registry,
            d.config().clone(),
            d.instance_id().to_owned(),
            d.key_policy().clone(),
            d.outbox_handle().clone(),
            self.health.clone(),
        )
    }

    /// Runs until `signal` completes, then shuts down gracefully. Returns
    /// at once with the error when the consumers cannot run at all (a
    /// category's shard count differs from the one Redis recorded).
    pub async fn run_until<F>(self, signal: F) -> Result<(), Error>
    where
        F: Future<Output = ()> + Send,
    {
        let token = CancellationToken::new();
        let mut handle = self.spawn_with(token.clone());
        let mut signal = std::pin::pin!(signal);
        tokio::select! {
            _ = signal.as_mut() => handle.shutdown().await,
            ended = &mut handle.consumer_task => match ended {
                // Consumers that could not start: stop, with their error.
                Ok(Err(e)) => {
                    handle.token.cancel();
                    let _ = handle.finish(Ok(Ok(Ok(())))).await;
                    Err(e)
                }
                // Nothing to consume (a publisher only): the relay runs on
                // until the signal.
                ended => {
                    signal.await;
                    handle.token.cancel();
                    handle.finish(Ok(ended)).await
                }
            },
        }
    }

    /// Starts the engine in the background: the outbox relay on the
    /// current runtime, the consumers (and the handlers they run) on the
    /// engine's own runtime (`[server] engine_threads`, see the module's
    /// lifecycle). Must be called within a tokio runtime.
    pub fn spawn(self) -> EngineHandle {
        self.spawn_with(CancellationToken::new())
    }

    fn spawn_with(self, token: CancellationToken) -> EngineHandle {
        let processor = Arc::new(self.processor());
        let outbox_token = CancellationToken::new();
        let relay = processor.relay(outbox_token.clone());
        let outbox_task = tokio::spawn(relay);
        let plan = Arc::new(self.plan());
        let broker = self.domain.broker().clone();
        let mut handlers: Vec<&str> = plan.subscriptions().iter().map(|s| s.name()).collect();
        handlers.dedup();
        tracing::info!(
            broker = %broker.describe(),
            instance_id = %self.domain.instance_id(),
            handlers = %if handlers.is_empty() { "none".to_owned() } else { handlers.join(", ") },
            "engine starting"
        );
        let threads = self.domain.config().server.engine_threads;
        let consumer_task = self
            .domain
            .engine_runtime()
            .spawn(threads, broker.clone().run(plan, token.clone()));
        EngineHandle {
            token,
            outbox_token,
            outbox_task,
            consumer_task,
            timeout: self.shutdown_timeout,
            broker,
            health: self.health,
            checks: self.checks,
        }
    }

    /// Inline broker only: publishes and handles until nothing is left to
    /// do (events raised by handlers included).
    pub async fn run_until_idle(&self) -> Result<(), Error> {
        let broker = self.domain.broker();
        let unsupported = || Error::Unsupported {
            operation: "Engine::run_until_idle",
            broker: broker.name().to_owned(),
            hint: "it needs a broker that delivers in this process (the inline broker); use run_until with other brokers",
        };
        let processor = self.processor();
        let plan = self.plan();
        loop {
            processor.drain().await?;
            let delivered = broker
                .deliver_published(&plan)
                .ok_or_else(unsupported)?
                .await;
            if delivered == 0 {
                return Ok(());
            }
        }
    }
}

/// A running engine.
pub struct EngineHandle {
    token: CancellationToken,
    outbox_token: CancellationToken,
    outbox_task: tokio::task::JoinHandle<()>,
    consumer_task: tokio::task::JoinHandle<Result<(), Error>>,
    timeout: Duration,
    broker: Arc<dyn Broker>,
    health: Arc<HealthState>,
    checks: Vec<ReadinessCheck>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("broker", &self.broker.describe())
            .field("stopping", &self.token.is_cancelled())
            .finish_non_exhaustive()
    }
}

/// How long [`EngineHandle::health`] waits for the broker to answer.
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// A running engine's health, from [`EngineHandle::health`]: what a
/// readiness probe needs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// The broker answered a ping just now (within 2 s); always true for
    /// the inline broker.
    pub connected: bool,
    /// The consumers are running: not stopped, not shutting down.
    pub running: bool,
    /// Units (partitions, or a sequential process manager's correlation
    /// values) this instance owns under a lease now, over all its handlers.
    pub owned_units: usize,
    /// How many of those are halted (a head failed after its retries, or
    /// with a permanent error) and wait for an operator
    /// (`convoy retry`, `convoy skip` / `convoy dead-letter`).
    pub halted_units: usize,
    /// Handlers paused on this instance because `outage_threshold` of their
    /// keys failed with transient errors at once (a dependency is down);
    /// they resume by themselves when a probe succeeds.
    pub paused_handlers: Vec<String>,
    /// The readiness checks ([`Engine::readiness_check`]) that failed, with
    /// why.
    pub failed_checks: Vec<(String, String)>,
}

impl Health {
    /// Ready to work: connected and running, no handler paused by an
    /// outage, every readiness check passing. A halted unit does not make
    /// an instance unready (restarting it would not help); alert on
    /// [`Health::any_halted`] instead.
    pub fn is_ready(&self) -> bool {
        self.connected
            && self.running
            && self.paused_handlers.is_empty()
            && self.failed_checks.is_empty()
    }

    /// Whether any owned unit is halted.
    pub fn any_halted(&self) -> bool {
        self.halted_units > 0
    }
}

impl EngineHandle {
    /// The engine's health now: whether the broker answers (one ping, at
    /// most 2 s), whether the consumers run, how many units this instance
    /// owns and how many of them are halted, which handlers an outage
    /// paused, and which readiness checks fail (each at most 2 s). Serve
    /// it as a readiness probe:
    ///
    /// ```no_run
    /// # async fn probe(engine: &convoy_runtime::EngineHandle) -> u16 {
    /// let health = engine.health().await;
    /// if health.is_ready() { 200 } else { 503 }
    /// # }
    /// ```
    pub async fn health(&self) -> Health {
        let connected = matches!(
            tokio::time::timeout(PING_TIMEOUT, self.broker.ping()).await,
            Ok(Ok(()))
        );
        let mut failed_checks = Vec::new();
        for c in &self.checks {
            match tokio::time::timeout(PING_TIMEOUT, (c.run)()).await {
                Ok(Ok(())) => {}
                Ok(Err(why)) => failed_checks.push((c.name.to_owned(), why)),
                Err(_) => failed_checks.push((
                    c.name.to_owned(),
                    format!("no answer within {PING_TIMEOUT:?}"),
                )),
            }
        }
        Health {
            connected,
            running: !self.token.is_cancelled() && !self.consumer_task.is_finished(),
            owned_units: self.health.owned(),
            halted_units: self.health.halted_units(),
            paused_handlers: self.health.paused_handlers(),
            failed_checks,
        }
    }

    /// A token that stops the engine when cancelled.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Stops gracefully: consumers finish and acknowledge the events in
    /// flight and release their leases, then pending outbox records are
    /// published.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        self.token.cancel();
        let consumers = tokio::time::timeout(self.timeout, &mut self.consumer_task).await;
        self.finish(consumers).await
    }

    /// The rest of a shutdown once the consumers ended (or ran out of
    /// time): the relay publishes what is pending once more before it
    /// returns (the events the last handlers raised).
    async fn finish(
        self,
        consumers: Result<
            Result<Result<(), Error>, tokio::task::JoinError>,
            tokio::time::error::Elapsed,
        >,
    ) -> Result<(), Error> {
        self.outbox_token.cancel();
        let _ = self.outbox_task.await;
        match consumers {
            Ok(Ok(r)) => r,
            Ok(Err(join)) => Err(Error::TaskFailed {
                task: "consumer task",
                reason: join.to_string(),
            }),
            Err(_) => {
                tracing::warn!(
                    "graceful shutdown timed out; in-flight events stay pending and are reclaimed by the next owner"
                );
                Ok(())
            }
        }
    }
}
