//! The domain: configuration, broker, outbox and handlers, validated
//! together by [`DomainBuilder::init`] (the checks themselves are in
//! `registry/checks.rs`). [`Domain::engine`] lives with the engine.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::engine_runtime::EngineRuntimeSlot;
use crate::uow::UnitOfWork;
use convoy_core::broker::{Broker, Capabilities, InlineBroker, RaisedCheck};
use convoy_core::config::Config;
use convoy_core::envelope::{Envelope, Priority};
use convoy_core::error::{Error, Problems};
use convoy_core::handler::{
    CommandHandler, Context, Dispatch, Dispatched, ErrorClass, ErrorClassifier, EventHandler,
    HandlerDescriptor,
};
use convoy_core::key::KeyPolicy;
use convoy_core::message::{Command, Message, MessageDescriptor};
use convoy_core::outbox::{MemoryOutbox, OutboxHandle, OutboxStore};
use convoy_core::process_manager::{
    MemoryStateStore, PmDispatch, ProcessManager, ProcessManagerDescriptor, StateStore,
};
use convoy_core::registry::{self, BrokerFacts, Registry};
use convoy_redis::RedisBroker;

/// An event handler as the domain keeps it: its descriptor, and what the
/// consumers call.
pub(crate) type HandlerEntry = (&'static HandlerDescriptor, Arc<dyn Dispatch>);

/// A process manager as the domain keeps it.
pub(crate) type PmEntry = (&'static ProcessManagerDescriptor, Arc<dyn Dispatch>);

/// A validated domain. Cheap to clone.
#[derive(Clone)]
pub struct Domain {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    registry: Arc<Registry>,
    policy: Arc<KeyPolicy>,
    broker: Arc<dyn Broker>,
    /// Raised events' categories against the broker's records.
    raised_check: RaisedCheck,
    outbox: OutboxHandle,
    event_handlers: Vec<HandlerEntry>,
    command_handlers: BTreeMap<&'static str, Arc<dyn CommandHandler>>,
    process_managers: Vec<PmEntry>,
    instance_id: String,
    /// Each handler's own rule for its errors, by handler name.
    classifiers: BTreeMap<&'static str, ErrorClassifier>,
    /// Where this domain's engines run their consumers (see
    /// [`crate::engine_runtime`]).
    engine_runtime: EngineRuntimeSlot,
}

impl std::fmt::Debug for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Domain")
            .field("instance_id", &self.inner.instance_id)
            .field("broker", &self.inner.broker.name())
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl Domain {
    /// Starts building a domain.
    pub fn builder() -> DomainBuilder {
        DomainBuilder::default()
    }

    /// A new unit of work.
    pub fn unit_of_work(&self) -> UnitOfWork {
        UnitOfWork::new(
            self.inner.outbox.clone(),
            self.inner.raised_check.clone(),
            self.inner.policy.clone(),
        )
    }

    /// Dispatches a command synchronously to its command handler and returns
    /// what the handler returned: the command's
    /// [`Reply`](Command::Reply) (`()` unless the command is declared with
    /// `#[command(reply = T)]`). Events the handler raises through its
    /// [`Context`] are committed to the outbox when it succeeds.
    /// (`sequential_by` on a command handler is checked at init but has no
    /// effect: commands never reach the outbox.)
    ///
    /// A failing handler gives [`Error::CommandFailed`], whose
    /// [`source`](std::error::Error::source) is the handler's own error
    /// (downcast it with `downcast_ref`).
    pub async fn process<C: Command>(&self, command: C) -> Result<C::Reply, Error> {
        let d = <C as Message>::DESCRIPTOR;
        let handler = self
            .inner
            .command_handlers
            .get(d.type_name)
            .ok_or_else(|| Error::NoCommandHandler(d.type_name.to_owned()))?;
        let envelope = Envelope::wrap(&command, None, Priority::Normal, None)?;
        let ctx = Context::of(
            handler.descriptor().name,
            envelope,
            1,
            self.inner.policy.clone(),
        )
        .with_outbox(self.inner.outbox.transactional());
        match handler.dispatch(ctx.envelope(), &ctx).await {
            Ok(Dispatched::Handled) => {
                let reply = ctx
                    .take_reply()
                    .and_then(|r| r.downcast::<C::Reply>().ok())
                    .ok_or_else(|| Error::TaskFailed {
                        task: "command handler",
                        reason: format!(
                            "`{}` returned no reply of the type `{}` declares (a convoy bug)",
                            handler.descriptor().name,
                            d.type_name
                        ),
                    })?;
                let raised = ctx.take_raised();
                self.inner
                    .raised_check
                    .check(raised.key_fields().to_vec())
                    .await?;
                self.inner.outbox.append(raised.into_envelopes()).await?;
                Ok(*reply)
            }
            Ok(Dispatched::NotHandled) => Err(Error::NoCommandHandler(d.type_name.to_owned())),
            Err(e) => Err(Error::CommandFailed {
                handler: handler.descriptor().name.to_owned(),
                source: e.into_inner(),
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The validated registry.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.inner.registry
    }

    /// The broker.
    pub fn broker(&self) -> &Arc<dyn Broker> {
        &self.inner.broker
    }

    /// The outbox.
    pub fn outbox(&self) -> &Arc<dyn OutboxStore> {
        self.inner.outbox.store()
    }

    /// This engine instance's id (the owner id in leases and fences).
    pub fn instance_id(&self) -> &str {
        &self.inner.instance_id
    }

    /// The process managers this domain runs, with their dispatchers.
    pub(crate) fn process_managers(&self) -> &[PmEntry] {
        &self.inner.process_managers
    }

    /// The event handlers this domain runs.
    pub(crate) fn event_handlers(&self) -> &[HandlerEntry] {
        &self.inner.event_handlers
    }

    /// Handler `name`'s own rule for its errors, if it was given one.
    pub(crate) fn classifier(&self, name: &str) -> Option<ErrorClassifier> {
        self.inner.classifiers.get(name).cloned()
    }

    pub(crate) fn key_policy(&self) -> &Arc<KeyPolicy> {
        &self.inner.policy
    }

    /// Where this domain's engines run their consumers.
    pub(crate) fn engine_runtime(&self) -> &EngineRuntimeSlot {
        &self.inner.engine_runtime
    }

    /// The outbox with the wake-up of its processor.
    pub(crate) fn outbox_handle(&self) -> &OutboxHandle {
        &self.inner.outbox
    }
}

/// Builds a [`Domain`]; [`DomainBuilder::init`] validates everything.
#[derive(Default)]
pub struct DomainBuilder {
    config: Option<Config>,
    error: Option<Error>,
    broker: Option<Arc<dyn Broker>>,
    outbox: Option<Arc<dyn OutboxStore>>,
    event_handlers: Vec<HandlerEntry>,
    command_handlers: Vec<Arc<dyn CommandHandler>>,
    process_managers: Vec<PmFactory>,
    state_store: Option<Arc<dyn StateStore>>,
    descriptors: Vec<&'static HandlerDescriptor>,
    messages: Vec<&'static MessageDescriptor>,
    skip_discovery: bool,
    require_all_handlers: bool,
    instance_id: Option<String>,
    classifiers: Vec<(String, ErrorClassifier)>,
}

impl std::fmt::Debug for DomainBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DomainBuilder")
            .field("config", &self.config)
            .field("handlers", &self.event_handlers.len())
            .finish_non_exhaustive()
    }
}

impl DomainBuilder {
    /// Uses this configuration.
    pub fn config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self
    }

    /// Reads the configuration from a `domain.toml` and applies the
    /// environment overrides (`CONVOY_BROKER_URL`, `CONVOY_INSTANCE_ID`,
    /// `CONVOY__SECTION__KEY`; see [`Config::load`]). A path that does not
    /// exist, or a bad file, makes [`DomainBuilder::init`] fail naming it;
    /// to run on defaults, say so with `.config(Config::default())`.
    pub fn config_file(mut self, path: impl AsRef<Path>) -> Self {
        match Config::load(path) {
            Ok(c) => self.config = Some(c),
            Err(e) => self.error = Some(e),
        }
        self
    }

    /// Uses this broker instead of the one named in the configuration.
    pub fn broker(mut self, broker: impl Broker) -> Self {
        self.broker = Some(Arc::new(broker));
        self
    }

    /// Uses this broker (shared).
    pub fn broker_arc(mut self, broker: Arc<dyn Broker>) -> Self {
        self.broker = Some(broker);
        self
    }

    /// Uses this outbox store instead of the one the configuration names
    /// (`[outbox] postgres_url`, else the in-memory one).
    pub fn outbox(mut self, outbox: impl OutboxStore) -> Self {
        self.outbox = Some(Arc::new(outbox));
        self
    }

    /// Runs this event handler.
    pub fn handler(mut self, handler: impl EventHandler) -> Self {
        let handler = Arc::new(handler);
        self.event_handlers.push((handler.descriptor(), handler));
        self
    }

    /// Uses this command handler for the commands it handles.
    pub fn command_handler(mut self, handler: impl CommandHandler) -> Self {
        self.command_handlers.push(Arc::new(handler));
        self
    }

    /// Runs process manager `P` (declared with `#[process_manager]`). Its
    /// instances live in the broker's state store (Redis under the Redis
    /// broker, memory under the inline one) unless one is given with
    /// [`DomainBuilder::state_store`].
    pub fn process_manager<P: ProcessManager>(mut self) -> Self {
        self.process_managers.push(PmFactory {
            descriptor: P::DESCRIPTOR,
            make: |store| Arc::new(PmDispatch::<P>::new(store)),
        });
        self
    }

    /// Keeps process-manager instances in this store.
    pub fn state_store(mut self, store: impl StateStore) -> Self {
        self.state_store = Some(Arc::new(store));
        self
    }

    /// Keeps process-manager instances in this store (shared).
    pub fn state_store_arc(mut self, store: Arc<dyn StateStore>) -> Self {
        self.state_store = Some(store);
        self
    }

    /// Adds a handler declaration by hand (validated like the ones the
    /// macros register).
    pub fn register(mut self, descriptor: &'static HandlerDescriptor) -> Self {
        self.descriptors.push(descriptor);
        self
    }

    /// Adds a message declaration by hand.
    pub fn register_message(mut self, descriptor: &'static MessageDescriptor) -> Self {
        self.messages.push(descriptor);
        self
    }

    /// Validates only what was given to this builder, not every declaration
    /// linked into the binary (useful when one binary holds several
    /// domains).
    ///
    /// What it changes: handlers, process managers and message types
    /// linked into the binary but not passed to this builder are neither
    /// checked nor reported as not run, and their partition keys are not
    /// known to the domain from them. Raising an event still routes it by
    /// the key its aggregate declares (`#[aggregate(partition_key = ..)]`),
    /// so a writer built this way cannot send a partitioned category's
    /// events unkeyed; a category partitioned only by a handler's
    /// `sequential_by` is then unkeyed here, and the broker refuses such a
    /// commit where it records the category's key.
    pub fn without_discovery(mut self) -> Self {
        self.skip_discovery = true;
        self
    }

    /// Makes [`DomainBuilder::init`] fail when an event handler or process
    /// manager declared in the binary is not run by this domain (not passed
    /// to [`DomainBuilder::handler`] or [`DomainBuilder::process_manager`]).
    /// Without it, init logs a warning for each.
    pub fn require_all_handlers(mut self) -> Self {
        self.require_all_handlers = true;
        self
    }

    /// Gives handler (or process manager) `name` (its full name, or the
    /// last `::` segments of it) a rule for the errors it returns with the
    /// default class: `classify` sees the error and each error of its
    /// source chain in turn, outermost first, and the first class it names
    /// is the error's (see [`HandlerError`](convoy_core::handler::HandlerError)'s
    /// error classes). For an error
    /// type of your own, or a client's, that says "the dependency is down"
    /// (transient: retried while it lasts, never halting) or "this event
    /// can never succeed" (permanent). A name that matches no handler given
    /// to this builder fails [`init`](Self::init).
    ///
    /// ```
    /// # use convoy_runtime::{Domain, ErrorClass};
    /// # #[derive(Debug)] struct PartnerDown;
    /// # impl std::fmt::Display for PartnerDown {
    /// #     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str("down") }
    /// # }
    /// # impl std::error::Error for PartnerDown {}
    /// let builder = Domain::builder().classify_errors("Shipping", |e| {
    ///     e.downcast_ref::<PartnerDown>().map(|_| ErrorClass::Transient)
    /// });
    /// ```
    pub fn classify_errors<F>(mut self, name: impl Into<String>, classify: F) -> Self
    where
        F: Fn(&(dyn std::error::Error + 'static)) -> Option<ErrorClass> + Send + Sync + 'static,
    {
        self.classifiers.push((name.into(), Arc::new(classify)));
        self
    }

    /// Sets this instance's id, over `[server] instance_id` and
    /// `CONVOY_INSTANCE_ID` (default: `{hostname}-{pid}-{random}`). It must
    /// not contain `:`.
    pub fn instance_id(mut self, id: impl Into<String>) -> Self {
        self.instance_id = Some(id.into());
        self
    }

    /// Validates every declaration against the broker and builds the domain.
    ///
    /// Checks, reporting every problem found at once: the `sequential_by`
    /// field exists on every handled type, one key per category, handled
    /// types belong to the handler's category and kind, and the broker
    /// advertises `STREAM_PARTITIONING` (the inline broker is the accepted
    /// no-op exception). Event handlers and process managers declared in the
    /// binary but not given to this builder are logged as warnings (errors
    /// with [`DomainBuilder::require_all_handlers`]).
    ///
    /// Without [`DomainBuilder::config`] or [`DomainBuilder::config_file`],
    /// the configuration is the defaults with the environment overrides
    /// ([`Config::from_env`]): the inline broker unless `CONVOY_BROKER_URL`
    /// says otherwise.
    pub fn init(self) -> Result<Domain, Error> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let config = match self.config {
            Some(c) => {
                c.validate(c.origin())?;
                c
            }
            None => Config::from_env()?,
        };
        let broker: Arc<dyn Broker> = match self.broker {
            Some(b) => b,
            None => broker_from_config(&config)?,
        };
        // The broker routes by the domain's shard counts and lanes, named
        // in the configuration or given to the builder alike.
        broker.configure(&config)?;
        let mut handlers: Vec<&'static HandlerDescriptor> = self.descriptors;
        handlers.extend(self.event_handlers.iter().map(|(d, _)| *d));
        handlers.extend(self.command_handlers.iter().map(|h| h.descriptor()));
        let mut messages = self.messages;
        let mut pms: Vec<&'static ProcessManagerDescriptor> =
            self.process_managers.iter().map(|p| p.descriptor).collect();
        if !self.skip_discovery {
            handlers.extend(registry::registered_handlers());
            messages.extend(registry::registered_messages());
            pms.extend(registry::registered_process_managers());
        }
        let caps = broker.capabilities();
        let facts = BrokerFacts {
            name: broker.name(),
            stream_partitioning: caps.contains(Capabilities::STREAM_PARTITIONING),
            serial_delivery: caps.contains(Capabilities::SERIAL_DELIVERY),
        };
        let registry = Registry::build(messages, handlers, pms, facts)?;
        let run: Vec<&str> = self
            .event_handlers
            .iter()
            .map(|(d, _)| d.name)
            .chain(self.process_managers.iter().map(|p| p.descriptor.name))
            .collect();
        let not_run = registry::check_every_declared_handler_runs(
            registry.handlers(),
            registry.process_managers(),
            &run,
        );
        if self.require_all_handlers && !not_run.is_empty() {
            return Err(Error::IncorrectUsage(Problems(not_run)));
        }
        for p in &not_run {
            tracing::warn!("{p}");
        }
        check_handler_settings(&config, &run);
        let classifiers = resolve_classifiers(self.classifiers, &run)?;
        if facts.stream_partitioning {
            check_process_manager_shards(&config, registry.process_managers())?;
        }
        let store: Arc<dyn StateStore> = match self.state_store {
            Some(s) => s,
            None => broker
                .state_store()
                .unwrap_or_else(|| Arc::new(MemoryStateStore::new())),
        };
        let process_managers = self
            .process_managers
            .iter()
            .map(|p| (p.descriptor, (p.make)(store.clone())))
            .collect();
        let policy = registry.key_policy(&config.server.priority_lanes.backfill_suffix);
        let mut command_handlers = BTreeMap::new();
        for h in self.command_handlers {
            for m in h.descriptor().handles {
                command_handlers.insert(m.type_name, h.clone());
            }
        }
        let instance_id = match self.instance_id {
            Some(id) if id.is_empty() || id.contains(':') => {
                return Err(Error::Config {
                    file: "<code>".into(),
                    message: format!(
                        "DomainBuilder::instance_id({id:?}): an instance id must be non-empty and contain no `:`"
                    ),
                });
            }
            Some(id) => id,
            None => match &config.server.instance_id {
                Some(id) => id.clone(),
                None => default_instance_id(),
            },
        };
        let outbox = match self.outbox {
            Some(o) => o,
            None => outbox_from_config(&config)?,
        };
        Ok(Domain {
            inner: Arc::new(Inner {
                config,
                registry: Arc::new(registry),
                policy: Arc::new(policy),
                raised_check: RaisedCheck::new(broker.clone()),
                broker,
                outbox: OutboxHandle::new(outbox),
                event_handlers: self.event_handlers,
                command_handlers,
                process_managers,
                instance_id,
                classifiers,
                engine_runtime: EngineRuntimeSlot::default(),
            }),
        })
    }
}

/// Each classifier's handler name, resolved among the handlers and process
/// managers this process runs (the full name, or its last `::` segments);
/// one that names none, or more than one, is a configuration error.
fn resolve_classifiers(
    given: Vec<(String, ErrorClassifier)>,
    run: &[&'static str],
) -> Result<BTreeMap<&'static str, ErrorClassifier>, Error> {
    let mut out = BTreeMap::new();
    for (name, classify) in given {
        let suffix = format!("::{name}");
        let mut found: Vec<&'static str> = run
            .iter()
            .copied()
            .filter(|r| *r == name || r.ends_with(&suffix))
            .collect();
        found.sort_unstable();
        found.dedup();
        match found[..] {
            [one] => {
                out.insert(one, classify);
            }
            _ => {
                return Err(Error::Config {
                    file: "<code>".into(),
                    message: format!(
                        "DomainBuilder::classify_errors({name:?}): {}; this process runs: {}",
                        if found.is_empty() {
                            "names no handler or process manager given to this builder".to_owned()
                        } else {
                            format!("names several ({}): give the full name", found.join(", "))
                        },
                        if run.is_empty() {
                            "none".to_owned()
                        } else {
                            run.join(", ")
                        }
                    ),
                });
            }
        }
    }
    Ok(out)
}

/// A process manager given to the builder.
struct PmFactory {
    descriptor: &'static ProcessManagerDescriptor,
    make: fn(Arc<dyn StateStore>) -> Arc<dyn Dispatch>,
}

/// Each `[handlers."name"]` that names no handler or process manager this
/// process runs is reported as a warning, not an error: one `domain.toml`
/// serves every binary of a service (a writer that runs no handler, and
/// consumers that run some), and the settings apply where the handler
/// runs.
fn check_handler_settings(config: &Config, run: &[&str]) {
    let mut known: Vec<&str> = run.to_vec();
    known.sort_unstable();
    known.dedup();
    for name in config.handlers.keys() {
        if run.is_empty() {
            // A writer sharing the engines' file: nothing to check here.
            tracing::debug!(
                "{}: [handlers.{name:?}] applies where that handler runs; this process runs no handler",
                config.origin()
            );
        } else if !run.contains(&name.as_str()) {
            tracing::warn!(
                "{}: [handlers.{name:?}] names no handler or process manager this process runs, so its settings apply only where it runs (check the name if it should run here); this process runs: {}",
                config.origin(),
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            );
        }
    }
}

/// The categories of a sequential process manager must have one shard
/// count: a correlation value's streams in each are then in one shard (one
/// hash slot of a cluster), which its unit's scripts need.
fn check_process_manager_shards(
    config: &Config,
    pms: &[&'static ProcessManagerDescriptor],
) -> Result<(), Error> {
    for pm in pms.iter().filter(|p| p.sequential) {
        let mut counts: BTreeMap<u32, Vec<&str>> = BTreeMap::new();
        for h in pm.handles {
            let c = h.message.category;
            let cats = counts.entry(config.broker.shards_of(c)).or_default();
            if !cats.contains(&c) {
                cats.push(c);
            }
        }
        if counts.len() > 1 {
            let shown: Vec<String> = counts
                .iter()
                .map(|(n, cats)| format!("{} with {n}", cats.join(", ")))
                .collect();
            return Err(Error::Config {
                file: config.origin().to_owned(),
                message: format!(
                    "process manager {} reads categories with different shard counts ({}); a correlation value's streams must share a hash slot: give them one count in [broker.category_shards]",
                    pm.name,
                    shown.join("; ")
                ),
            });
        }
    }
    Ok(())
}

fn broker_from_config(config: &Config) -> Result<Arc<dyn Broker>, Error> {
    let url = &config.broker.url;
    if url == "inline" {
        return Ok(Arc::new(InlineBroker::new()));
    }
    let in_config = |e: Error| match e {
        Error::Config { message, .. } => Error::Config {
            file: config.origin().to_owned(),
            message,
        },
        other => other,
    };
    let broker = match &config.broker.tls_ca_file {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| Error::Config {
                file: config.origin().to_owned(),
                message: format!(
                    "[broker] tls_ca_file = {path:?}: cannot read the CA certificate file {path:?}: {e}; give the path of a PEM file (relative paths are read from the working directory)"
                ),
            })?;
            RedisBroker::from_url_with_ca(url, pem).map_err(in_config)?
        }
        None => RedisBroker::from_url(url).map_err(in_config)?,
    };
    Ok(Arc::new(broker))
}

fn outbox_from_config(config: &Config) -> Result<Arc<dyn OutboxStore>, Error> {
    match &config.outbox.postgres_url {
        None => Ok(Arc::new(MemoryOutbox::new())),
        #[cfg(feature = "postgres")]
        Some(_) => Ok(Arc::new(convoy_postgres::PgOutbox::from_config(
            &config.outbox,
        )?)),
        #[cfg(not(feature = "postgres"))]
        Some(_) => Err(Error::Config {
            file: "<code>".into(),
            message: "[outbox] postgres_url needs convoy-runtime's `postgres` feature".into(),
        }),
    }
}

fn default_instance_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().replace(':', "-"))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_owned());
    let rand = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &rand[..8])
}
