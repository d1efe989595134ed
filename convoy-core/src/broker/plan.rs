//! The consumer plan: what a broker consumes for a domain, built by the
//! engine from the domain's parts (handlers, process managers, registry,
//! configuration, outbox), so that a broker never sees the domain itself.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tracing::Instrument;

use crate::config::Config;
use crate::envelope::Envelope;
use crate::error::Error;
use crate::handler::{
    Context, Dispatch, Dispatched, ErrorClassifier, Fence, Gap, HandlerDescriptor, HandlerError,
    Position,
};
use crate::key::Escaped;
use crate::key::KeyPolicy;
use crate::message::MessageDescriptor;
use crate::metrics::HandlerMetrics;
use crate::names::CORRELATION_SCOPE;
use crate::outbox::OutboxHandle;
use crate::process_manager::{PmHandle, ProcessManagerDescriptor};
use crate::registry::Registry;
use crate::tracing;

/// One handler's (or process manager's) subscription: what it consumes.
pub struct Subscription {
    /// The handler (or process manager).
    #[doc(hidden)]
    pub handler: Arc<dyn Dispatch>,
    /// The handler's name (its consumer group).
    #[doc(hidden)]
    pub name: &'static str,
    /// The category it consumes (the first, for a process manager spanning
    /// several).
    #[doc(hidden)]
    pub category: &'static str,
    /// Every category one of its units spans: `[category]` for a handler;
    /// each subscribed category for a sequential process manager, whose
    /// unit is a correlation value.
    #[doc(hidden)]
    pub categories: Vec<&'static str>,
    /// What units are named after: the category for a handler,
    /// [`CORRELATION_SCOPE`] for a process manager's correlation values.
    #[doc(hidden)]
    pub scope: &'static str,
    /// The category's partition key field, when the category is partitioned
    /// (then the handler consumes partition streams under leases).
    #[doc(hidden)]
    pub key_field: Option<&'static str>,
    /// Whether some handled type carries the key field: those events live
    /// in partition streams.
    #[doc(hidden)]
    pub reads_partitions: bool,
    /// Whether some handled type does not carry the key field (or the
    /// category is not partitioned): those events live in `{category}`.
    #[doc(hidden)]
    pub reads_base: bool,
    /// The handled types read from `{category}` (without a key).
    #[doc(hidden)]
    pub unkeyed: Vec<&'static MessageDescriptor>,
    /// The handler's `on_poison = "dead_letter"` (false for process
    /// managers: they always halt).
    #[doc(hidden)]
    pub dead_letter_poison: bool,
    /// A process manager's subscription (its poisoned heads always halt,
    /// whatever the configuration says).
    #[doc(hidden)]
    pub process_manager: bool,
    /// The handler's own rule for its errors of the default class
    /// (`DomainBuilder::classify_errors`).
    #[doc(hidden)]
    pub classify: Option<ErrorClassifier>,
    #[doc(hidden)]
    pub metrics: HandlerMetrics,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("name", &self.name)
            .field("categories", &self.categories)
            .field("key_field", &self.key_field)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// The handler's name: also the name of its consumer group.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The categories whose events it handles.
    pub fn categories(&self) -> &[&'static str] {
        &self.categories
    }

    /// The partition key field of its category, when partitioned.
    pub fn key_field(&self) -> Option<&'static str> {
        self.key_field
    }

    /// The fields of each handled type it reads without a key.
    #[doc(hidden)]
    pub fn unkeyed_fields(&self) -> impl Iterator<Item = &'static [&'static str]> + '_ {
        self.unkeyed.iter().map(|m| m.fields)
    }

    /// An event handler's subscription to its category.
    #[doc(hidden)]
    pub fn for_handler(
        d: &'static HandlerDescriptor,
        handler: Arc<dyn Dispatch>,
        registry: &Registry,
    ) -> Subscription {
        let key_field = registry.key_field(d.category);
        let keyed = |m: &&MessageDescriptor| key_field.is_some_and(|f| m.has_field(f));
        Subscription {
            handler,
            name: d.name,
            category: d.category,
            categories: vec![d.category],
            scope: d.category,
            key_field,
            reads_partitions: d.handles.iter().any(keyed),
            reads_base: d.handles.iter().any(|m| !keyed(m)),
            unkeyed: d.handles.iter().filter(|m| !keyed(m)).copied().collect(),
            dead_letter_poison: d.dead_letter_poison,
            process_manager: false,
            classify: None,
            metrics: HandlerMetrics::new(d.name),
        }
    }

    /// The subscriptions of one process manager: one spanning every
    /// subscribed category (units are correlation values) when it is
    /// sequential, else one per category, consumed like an event
    /// handler's.
    #[doc(hidden)]
    pub fn for_process_manager(
        d: &'static ProcessManagerDescriptor,
        dispatch: &Arc<dyn Dispatch>,
        registry: &Registry,
    ) -> Vec<Subscription> {
        let mut categories: Vec<&'static str> =
            d.handles.iter().map(|h| h.message.category).collect();
        categories.sort_unstable();
        categories.dedup();
        if d.sequential {
            return vec![Subscription {
                handler: dispatch.clone(),
                name: d.name,
                category: categories.first().copied().unwrap_or(""),
                categories,
                scope: CORRELATION_SCOPE,
                key_field: None,
                reads_partitions: true,
                reads_base: false,
                unkeyed: Vec::new(),
                dead_letter_poison: false,
                process_manager: true,
                classify: None,
                metrics: HandlerMetrics::new(d.name),
            }];
        }
        categories
            .into_iter()
            .map(|c| {
                let key_field = registry.key_field(c);
                let here = d.handles.iter().filter(|h| h.message.category == c);
                let keyed = |h: &PmHandle| key_field.is_some_and(|f| h.message.has_field(f));
                Subscription {
                    handler: dispatch.clone(),
                    name: d.name,
                    category: c,
                    categories: vec![c],
                    scope: c,
                    key_field,
                    reads_partitions: here.clone().any(keyed),
                    reads_base: here.clone().any(|h| !keyed(h)),
                    unkeyed: here.filter(|h| !keyed(h)).map(|h| h.message).collect(),
                    dead_letter_poison: false,
                    process_manager: true,
                    classify: None,
                    metrics: HandlerMetrics::new(d.name),
                }
            })
            .collect()
    }
}

/// What the consumers of one engine report about themselves, read by
/// `EngineHandle::health`: the units (leased partitions or correlation
/// values) they own and how many of those are halted.
#[derive(Debug, Default)]
#[doc(hidden)]
pub struct HealthState {
    owned: AtomicUsize,
    halted: AtomicUsize,
    /// Handlers paused on this instance by an outage of a dependency.
    paused: std::sync::Mutex<std::collections::BTreeSet<&'static str>>,
}

impl HealthState {
    /// A worker started on a unit it owns.
    #[doc(hidden)]
    pub fn unit_started(&self) {
        self.owned.fetch_add(1, Ordering::SeqCst);
    }

    /// A worker ended (its unit is no longer owned).
    #[doc(hidden)]
    pub fn unit_stopped(&self) {
        let _ = self
            .owned
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    /// An owned unit became halted (`true`) or resumed (`false`).
    #[doc(hidden)]
    pub fn halted(&self, on: bool) {
        if on {
            self.halted.fetch_add(1, Ordering::SeqCst);
        } else {
            let _ = self
                .halted
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        }
    }

    /// A handler paused (`true`) or resumed (`false`) on this instance.
    #[doc(hidden)]
    pub fn paused(&self, handler: &'static str, on: bool) {
        let mut p = self
            .paused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if on {
            p.insert(handler);
        } else {
            p.remove(handler);
        }
    }

    /// The handlers paused now, sorted.
    #[doc(hidden)]
    pub fn paused_handlers(&self) -> Vec<String> {
        self.paused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|h| (*h).to_owned())
            .collect()
    }

    /// Units owned now.
    #[doc(hidden)]
    pub fn owned(&self) -> usize {
        self.owned.load(Ordering::SeqCst)
    }

    /// Owned units halted now.
    #[doc(hidden)]
    pub fn halted_units(&self) -> usize {
        self.halted.load(Ordering::SeqCst)
    }
}

/// One attempt of an event, as its handler's [`Context`] describes it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Attempt {
    /// Which attempt, from 1.
    pub number: u32,
    /// The fence of the partition being consumed (a leased unit).
    pub fence: Option<Fence>,
    /// Where the event sits, when a key's events are delivered one at a
    /// time.
    pub position: Option<Position>,
    /// When the engine dispatched it.
    pub dispatched_at: std::time::SystemTime,
    /// The gap before it (`on_poison = "dead_letter"`).
    pub gap: Option<Gap>,
}

impl Attempt {
    /// Attempt `number`, dispatched now, with nothing else known.
    pub fn new(number: u32) -> Self {
        Self::dispatched(number, std::time::SystemTime::now())
    }

    /// Attempt `number`, dispatched at `at` (read by the caller, before
    /// its last check that it may still run the event), with nothing else
    /// known.
    pub fn dispatched(number: u32, at: std::time::SystemTime) -> Self {
        Attempt {
            number,
            fence: None,
            position: None,
            dispatched_at: at,
            gap: None,
        }
    }
}

/// Everything a broker needs to consume for a domain: the subscriptions,
/// the configuration, this instance's id, and [`ConsumerPlan::invoke`] to
/// run one event through a subscription's handler.
pub struct ConsumerPlan {
    /// One per handler and process manager to consume for.
    #[doc(hidden)]
    pub subscriptions: Vec<Subscription>,
    /// The domain's configuration.
    #[doc(hidden)]
    pub config: Config,
    /// This engine instance's id.
    #[doc(hidden)]
    pub instance_id: String,
    /// What the consumers report for the engine's health.
    #[doc(hidden)]
    pub health: Arc<HealthState>,
    registry: Arc<Registry>,
    policy: Arc<KeyPolicy>,
    outbox: OutboxHandle,
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
    /// The partition key field of `category` in this domain, if any.
    #[doc(hidden)]
    pub fn key_field(&self, category: &str) -> Option<&'static str> {
        self.policy.key_field(category)
    }

    /// Every category this domain knows a partition key for, with it.
    #[doc(hidden)]
    pub fn key_fields(&self) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
        self.policy.key_fields()
    }

    /// A plan from its parts; events the handlers raise go to `outbox`.
    #[doc(hidden)]
    pub fn new(
        subscriptions: Vec<Subscription>,
        registry: Arc<Registry>,
        config: Config,
        instance_id: String,
        policy: Arc<KeyPolicy>,
        outbox: OutboxHandle,
        health: Arc<HealthState>,
    ) -> Self {
        ConsumerPlan {
            subscriptions,
            config,
            instance_id,
            health,
            registry,
            policy,
            outbox,
        }
    }

    /// One per event handler, and one or more per process manager.
    pub fn subscriptions(&self) -> &[Subscription] {
        &self.subscriptions
    }

    /// The domain's configuration (retries, partitioning, lanes).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// This engine instance's id (the owner id in leases and fences).
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// Runs `sub`'s handler on `envelope` (attempt numbers start at 1).
    ///
    /// An unknown message type is a failure; a known type the handler does
    /// not handle is [`Dispatched::NotHandled`]. Events the handler raised
    /// are committed to the outbox when it succeeds.
    pub async fn invoke(
        &self,
        sub: &Subscription,
        envelope: Envelope,
        attempt: Attempt,
    ) -> Result<Dispatched, HandlerError> {
        let Attempt {
            number: attempt,
            fence,
            position,
            dispatched_at,
            gap,
        } = attempt;
        let span = handle_span(
            self.config.server.observability.handle_span_level.level(),
            sub,
            &envelope,
            attempt,
            fence.as_ref().map(|f| f.generation).unwrap_or(0),
        );
        async move {
            if self.registry.message(&envelope.type_name).is_none() {
                return Err(HandlerError::from(Error::UnknownType {
                    type_name: envelope.type_name.clone(),
                    id: envelope.id.clone(),
                }));
            }
            let mut ctx = Context::of(sub.name, envelope, attempt, self.policy.clone())
                .with_dispatched_at(dispatched_at)
                .with_outbox(self.outbox.transactional())
                .with_gap(gap);
            if let Some(f) = fence {
                ctx = ctx.with_fence(f);
            }
            if let Some(p) = position {
                ctx = ctx.with_position(p);
            }
            let started = std::time::Instant::now();
            let out = match sub.handler.dispatch(ctx.envelope(), &ctx).await {
                Ok(out) => out,
                Err(e) => {
                    sub.metrics.failed(started.elapsed());
                    return Err(match &sub.classify {
                        Some(classify) => e.classified_by(classify),
                        None => e,
                    });
                }
            };
            if out == Dispatched::Handled {
                sub.metrics.handled(started.elapsed());
            }
            self.outbox
                .append(ctx.take_raised().into_envelopes())
                .await?;
            Ok(out)
        }
        .instrument(span)
        .await
    }
}

/// The `handle` span of one attempt, at `level` (a span's level is part of
/// its call site, so one call site per level). Keys, ids and type names
/// come from the stream entry: they are escaped.
fn handle_span(
    level: tracing::Level,
    sub: &Subscription,
    envelope: &Envelope,
    attempt: u32,
    generation: u64,
) -> tracing::Span {
    macro_rules! span {
        ($level:expr) => {
            tracing::span!(
                $level,
                "handle",
                handler = sub.name,
                category = sub.category,
                key = ?Escaped(envelope.partition_key.as_deref().unwrap_or("")),
                generation,
                attempt,
                id = %Escaped(&envelope.id),
                r#type = %Escaped(&envelope.type_name),
            )
        };
    }
    match level {
        tracing::Level::TRACE => span!(tracing::Level::TRACE),
        tracing::Level::DEBUG => span!(tracing::Level::DEBUG),
        tracing::Level::INFO => span!(tracing::Level::INFO),
        tracing::Level::WARN => span!(tracing::Level::WARN),
        _ => span!(tracing::Level::ERROR),
    }
}
