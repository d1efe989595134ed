//! The engine: publishes the outbox and runs every event handler on the
//! domain's broker until told to stop.
//!
//! # Lifecycle
//!
//! 1. [`Engine::run_until`] starts the outbox processor and the broker's
//!    consumers (one per handler).
//! 2. When the signal fires, consumers stop taking new events, finish the
//!    ones in flight, acknowledge them and release their leases.
//! 3. Events raised by those last handlers are published, then the outbox
//!    processor stops.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::Config;
use crate::domain::Domain;
use crate::envelope::Envelope;
use crate::error::Error;
use crate::handler::{Context, Dispatch, Dispatched, Fence, HandlerDispatch, HandlerError};
use crate::key::KeyPolicy;
use crate::outbox::{OutboxProcessor, OutboxStore};
use crate::process_manager::ProcessManagerDescriptor;
use crate::registry::Registry;

/// One event handler's subscription.
pub struct Subscription {
    /// The handler (or process manager).
    pub handler: Arc<dyn Dispatch>,
    /// The handler's name (its consumer group).
    pub name: &'static str,
    /// The category it consumes (the first, for a process manager spanning
    /// several).
    pub category: &'static str,
    /// Every category one of its units spans: `[category]` for a handler;
    /// each subscribed category for a sequential process manager, whose
    /// unit is a correlation value.
    pub categories: Vec<&'static str>,
    /// What leases are named after: the category for a handler, `*` for a
    /// process manager's correlation values.
    pub scope: &'static str,
    /// The category's partition key field, when the category is partitioned
    /// (then the handler consumes partition streams under leases).
    pub key_field: Option<&'static str>,
    /// Whether some handled type carries the key field: those events live
    /// in partition streams.
    pub reads_partitions: bool,
    /// Whether some handled type does not carry the key field (or the
    /// category is not partitioned): those events live in `{category}`.
    pub reads_base: bool,
    pub(crate) metrics: crate::metrics::HandlerMetrics,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("name", &self.name)
            .field("category", &self.category)
            .field("key_field", &self.key_field)
            .finish()
    }
}

/// Everything a broker needs to consume for a domain.
pub struct ConsumerPlan {
    /// One per event handler.
    pub subscriptions: Vec<Subscription>,
    /// The validated registry.
    pub registry: Arc<Registry>,
    /// The configuration.
    pub config: Config,
    /// This instance's id.
    pub instance_id: String,
    policy: Arc<KeyPolicy>,
    outbox: Arc<dyn OutboxStore>,
    outbox_wake: Arc<Notify>,
}

impl std::fmt::Debug for ConsumerPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerPlan")
            .field("subscriptions", &self.subscriptions)
            .field("instance_id", &self.instance_id)
            .finish_non_exhaustive()
    }
}

impl ConsumerPlan {
    /// The plan of `domain`.
    pub fn new(domain: &Domain) -> Self {
        let registry = domain.registry().clone();
        let subscriptions = domain
            .event_handlers()
            .iter()
            .map(|h| {
                let d = h.descriptor();
                let key_field = registry.key_field(d.category);
                let keyed = |m: &&crate::message::MessageDescriptor| {
                    key_field.is_some_and(|f| m.has_field(f))
                };
                Subscription {
                    handler: Arc::new(HandlerDispatch(h.clone())),
                    name: d.name,
                    category: d.category,
                    categories: vec![d.category],
                    scope: d.category,
                    key_field,
                    reads_partitions: d.handles.iter().any(keyed),
                    reads_base: d.handles.iter().any(|m| !keyed(m)),
                    metrics: crate::metrics::HandlerMetrics::new(d.name),
                }
            })
            .collect();
        let mut subscriptions: Vec<Subscription> = subscriptions;
        for (d, dispatch) in domain.process_managers() {
            subscriptions.extend(pm_subscriptions(&registry, d, dispatch));
        }
        ConsumerPlan {
            subscriptions,
            registry,
            config: domain.config().clone(),
            instance_id: domain.instance_id().to_owned(),
            policy: domain.key_policy().clone(),
            outbox: domain.outbox().clone(),
            outbox_wake: domain.outbox_wake().clone(),
        }
    }

    /// Runs `sub`'s handler on `envelope` (attempt numbers start at 1).
    ///
    /// An unknown message type is a failure; a known type the handler does
    /// not handle is [`Dispatched::NotHandled`]. Events the handler raised
    /// are committed to the outbox when it succeeds.
    pub async fn invoke(
        &self,
        sub: &Subscription,
        envelope: &Envelope,
        attempt: u32,
        fence: Option<Fence>,
    ) -> Result<Dispatched, HandlerError> {
        let span = tracing::debug_span!(
            "handle",
            handler = sub.name,
            category = sub.category,
            key = envelope.partition_key.as_deref().unwrap_or(""),
            generation = fence.as_ref().map(|f| f.generation).unwrap_or(0),
            attempt,
            id = %envelope.id,
            r#type = %envelope.type_name,
        );
        async {
            if self.registry.message(&envelope.type_name).is_none() {
                return Err(HandlerError::from(Error::UnknownType {
                    type_name: envelope.type_name.clone(),
                    id: envelope.id.clone(),
                }));
            }
            let mut ctx = Context::new(sub.name, envelope, attempt, self.policy.clone());
            if let Some(f) = fence {
                ctx = ctx.with_fence(f);
            }
            let started = std::time::Instant::now();
            let out = match sub.handler.dispatch(envelope, &ctx).await {
                Ok(out) => out,
                Err(e) => {
                    sub.metrics.failed(started.elapsed());
                    return Err(e);
                }
            };
            if out == Dispatched::Handled {
                sub.metrics.handled(started.elapsed());
            }
            let raised = ctx.take_raised().into_envelopes();
            if !raised.is_empty() {
                self.outbox.append(raised).await?;
                self.outbox_wake.notify_one();
            }
            Ok(out)
        }
        .instrument(span)
        .await
    }
}

/// The subscriptions of one process manager: one spanning every subscribed
/// category (units are correlation values) when it is sequential, else one
/// per category, consumed like an event handler's.
fn pm_subscriptions(
    registry: &Registry,
    d: &'static ProcessManagerDescriptor,
    dispatch: &Arc<dyn Dispatch>,
) -> Vec<Subscription> {
    let mut categories: Vec<&'static str> = d.handles.iter().map(|h| h.message.category).collect();
    categories.sort_unstable();
    categories.dedup();
    if d.sequential {
        return vec![Subscription {
            handler: dispatch.clone(),
            name: d.name,
            category: categories.first().copied().unwrap_or(""),
            categories,
            scope: "*",
            key_field: None,
            reads_partitions: true,
            reads_base: false,
            metrics: crate::metrics::HandlerMetrics::new(d.name),
        }];
    }
    categories
        .into_iter()
        .map(|c| {
            let key_field = registry.key_field(c);
            let here = d.handles.iter().filter(|h| h.message.category == c);
            let keyed = |h: &crate::process_manager::PmHandle| {
                key_field.is_some_and(|f| h.message.has_field(f))
            };
            Subscription {
                handler: dispatch.clone(),
                name: d.name,
                category: c,
                categories: vec![c],
                scope: c,
                key_field,
                reads_partitions: here.clone().any(keyed),
                reads_base: here.clone().any(|h| !keyed(h)),
                metrics: crate::metrics::HandlerMetrics::new(d.name),
            }
        })
        .collect()
}

/// Runs a domain: outbox processor plus consumers.
#[derive(Debug)]
pub struct Engine {
    domain: Domain,
    shutdown_timeout: Duration,
}

impl Engine {
    pub(crate) fn new(domain: Domain) -> Self {
        Engine {
            domain,
            shutdown_timeout: Duration::from_secs(30),
        }
    }

    /// How long a graceful shutdown may take before in-flight work is
    /// abandoned (default 30 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    fn processor(&self) -> OutboxProcessor {
        OutboxProcessor::new(
            self.domain.outbox().clone(),
            self.domain.broker().clone(),
            self.domain.config().server.priority_lanes.clone(),
            self.domain.instance_id().to_owned(),
            self.domain.outbox_wake().clone(),
        )
    }

    /// Runs until `signal` completes, then shuts down gracefully.
    pub async fn run_until<F>(self, signal: F) -> Result<(), Error>
    where
        F: Future<Output = ()> + Send,
    {
        let token = CancellationToken::new();
        let handle = self.spawn_with(token.clone());
        signal.await;
        handle.shutdown().await
    }

    /// Starts the engine in the background.
    pub fn spawn(self) -> EngineHandle {
        self.spawn_with(CancellationToken::new())
    }

    fn spawn_with(self, token: CancellationToken) -> EngineHandle {
        let processor = Arc::new(self.processor());
        let outbox_token = CancellationToken::new();
        let p = processor.clone();
        let ot = outbox_token.clone();
        let outbox_task = tokio::spawn(async move { p.run(ot).await });
        let plan = Arc::new(ConsumerPlan::new(&self.domain));
        let broker = self.domain.broker().clone();
        let consumer_task = tokio::spawn(broker.run(plan, token.clone()));
        EngineHandle {
            token,
            outbox_token,
            processor,
            outbox_task,
            consumer_task,
            timeout: self.shutdown_timeout,
        }
    }

    /// Inline broker only: publishes and handles until nothing is left to
    /// do (events raised by handlers included).
    pub async fn run_until_idle(&self) -> Result<(), Error> {
        let inline = self.domain.broker().as_inline().ok_or_else(|| Error::Config {
            file: "<code>".into(),
            message: "Engine::run_until_idle needs the inline broker; use run_until with other brokers".into(),
        })?;
        let processor = self.processor();
        let plan = ConsumerPlan::new(&self.domain);
        loop {
            processor.drain().await?;
            if inline.drain(&plan).await == 0 {
                return Ok(());
            }
        }
    }
}

/// A running engine.
#[derive(Debug)]
pub struct EngineHandle {
    token: CancellationToken,
    outbox_token: CancellationToken,
    processor: Arc<OutboxProcessor>,
    outbox_task: tokio::task::JoinHandle<()>,
    consumer_task: tokio::task::JoinHandle<Result<(), Error>>,
    timeout: Duration,
}

impl EngineHandle {
    /// A token that stops the engine when cancelled.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Stops gracefully: consumers finish and acknowledge the events in
    /// flight and release their leases, then pending outbox records are
    /// published.
    pub async fn shutdown(self) -> Result<(), Error> {
        self.token.cancel();
        let consumers = tokio::time::timeout(self.timeout, self.consumer_task).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.processor.drain()).await;
        self.outbox_token.cancel();
        let _ = self.outbox_task.await;
        match consumers {
            Ok(Ok(r)) => r,
            Ok(Err(join)) => Err(Error::Config {
                file: "<engine>".into(),
                message: format!("a consumer task panicked: {join}"),
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
