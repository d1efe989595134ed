//! The one error type of the runtime.

use std::fmt;

use crate::key::KeyRule;

/// Everything that can go wrong in convoy's runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `Domain::init` found declarations that cannot work together. Every
    /// problem found is listed, not only the first.
    #[error("incorrect usage: {0}")]
    IncorrectUsage(Problems),

    /// A raised event's partition key value breaks a key rule; nothing was
    /// added to the outbox.
    #[error(
        "invalid partition key {value} in field `{field}` of `{type_name}`: {rule}; use an entity identifier such as a client id or a UUID"
    )]
    InvalidKey {
        /// The event type.
        type_name: String,
        /// The `sequential_by` field.
        field: String,
        /// The rejected value, quoted, or `null`.
        value: String,
        /// The rule it breaks.
        rule: KeyRule,
    },

    /// A configuration file or value is invalid.
    #[error("invalid configuration in {file}: {message}")]
    Config {
        /// The file (or `<code>` for values set in code).
        file: String,
        /// What is wrong and how to fix it.
        message: String,
    },

    /// A message could not be serialized.
    #[error("failed to serialize `{type_name}` as JSON")]
    Encode {
        /// The message type.
        type_name: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },

    /// A message payload could not be read as its type.
    #[error(
        "failed to decode message {id} as `{type_name}`; is the producer's type the same version as the consumer's?"
    )]
    Decode {
        /// The message id.
        id: String,
        /// The type it was read as.
        type_name: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },

    /// A stream entry is not a convoy envelope.
    #[error("malformed stream entry {entry_id} in `{stream}`: {reason}")]
    MalformedEntry {
        /// The stream.
        stream: String,
        /// The entry id.
        entry_id: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A message's type is not registered in this domain.
    #[error(
        "unknown message type `{type_name}` (message {id}); register the type in this engine's binary or remove the message"
    )]
    UnknownType {
        /// The wire type name.
        type_name: String,
        /// The message id.
        id: String,
    },

    /// No command handler handles this command type.
    #[error(
        "no command handler handles `{0}`; add one with #[command_handler] and pass it to Domain::builder().command_handler(..)"
    )]
    NoCommandHandler(String),

    /// A command handler failed. The message says why (the handler's error
    /// text), so `{e}` in a log shows it; the handler's error itself is the
    /// [`source`](std::error::Error::source): downcast it with
    /// `err.source().and_then(|s| s.downcast_ref::<MyError>())`.
    #[error("command handler `{handler}` failed: {source}")]
    CommandFailed {
        /// The handler.
        handler: String,
        /// The handler's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },

    /// A process-manager instance's stored state cannot be read or written
    /// as its type.
    #[error(
        "the state of process manager `{process_manager}` instance `{instance}` does not match its type; was the state struct changed incompatibly?"
    )]
    State {
        /// The process manager.
        process_manager: String,
        /// The instance (correlation value).
        instance: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },

    /// A process-manager instance kept changing under a handler.
    #[error(
        "process manager `{process_manager}` instance `{instance}` was changed concurrently on every attempt; declare it sequential_by = true so one engine owns each instance"
    )]
    StateConflict {
        /// The process manager.
        process_manager: String,
        /// The instance.
        instance: String,
    },

    /// Talking to Redis failed.
    #[error("redis: {context}")]
    Redis {
        /// What was being done.
        context: String,
        /// The client error.
        #[source]
        source: redis::RedisError,
    },

    /// Talking to PostgreSQL failed (feature `postgres`).
    #[cfg(feature = "postgres")]
    #[error("postgres: {context}")]
    Postgres {
        /// What was being done.
        context: String,
        /// The client error.
        #[source]
        source: sqlx::Error,
    },

    /// A handler's exactly-once write was refused: a newer owner of the
    /// partition already applied its effects (this owner stalled past its
    /// lease), so this write rolls back and the worker gives up the unit.
    #[error(
        "handler `{handler}`: the effects of partition {stream:?} were applied by a newer owner (generation {newer} > {generation}); this write rolls back"
    )]
    FencedWrite {
        /// The handler.
        handler: String,
        /// The partition stream.
        stream: String,
        /// This owner's lease generation.
        generation: u64,
        /// The generation that applied effects.
        newer: u64,
    },

    /// Redis answered a script with something this version does not
    /// understand.
    #[error(
        "unexpected reply from redis to the {script} script: {reply}; is the server a Redis 7 or later?"
    )]
    UnexpectedReply {
        /// The script (its file stem in `lua/`).
        script: &'static str,
        /// The reply, rendered.
        reply: String,
    },

    /// The domain's broker cannot do what was asked.
    #[error("{operation} is not supported by the `{broker}` broker; {hint}")]
    Unsupported {
        /// What was asked.
        operation: &'static str,
        /// The broker's name.
        broker: String,
        /// What to do instead.
        hint: &'static str,
    },

    /// A task of the engine ended before it could answer (it panicked, or
    /// stopped).
    #[error("the {task} stopped unexpectedly: {reason}")]
    TaskFailed {
        /// Which task.
        task: &'static str,
        /// Why, as far as is known.
        reason: String,
    },

    /// The metrics exporter could not be installed.
    #[error("cannot serve metrics: {message}")]
    Metrics {
        /// What went wrong.
        message: String,
    },

    /// An outbox publisher was replaced: another process took over
    /// publishing for the same producer at a newer epoch (a relay that
    /// stalled past its leadership timeout). This process stops publishing
    /// for it; its rows are published by the successor.
    #[error(
        "outbox publisher `{producer}` at epoch {epoch} was replaced by one at epoch {newer}; this process stops publishing and stands by"
    )]
    PublisherReplaced {
        /// The producer name.
        producer: String,
        /// This publisher's epoch.
        epoch: u64,
        /// The successor's epoch.
        newer: u64,
    },

    /// `[broker] wait_replicas` is set and fewer replicas acknowledged a
    /// published batch in time: the batch stays in the outbox and is
    /// published again (its copies already written are dropped as
    /// re-sent), so an event leaves the outbox only once replicated.
    #[error(
        "published events reached {acked} of the {wanted} replicas [broker] wait_replicas asks for within wait_timeout_ms; they stay in the outbox and are sent again; check the replicas (INFO replication) or lower wait_replicas"
    )]
    NotReplicated {
        /// Replicas asked for.
        wanted: u32,
        /// Replicas that acknowledged.
        acked: u32,
    },

    /// An outbox batch sent behind another whose reply had not come yet
    /// was not written, because the other one did not run first where this
    /// one would have gone (it failed, or it was sent again after a
    /// redirection). Nothing of it was written there; its records stay in
    /// the outbox and go out again, in order, right away. Not a fault of
    /// its own: the outbox processor handles it.
    #[error(
        "an outbox batch was sent behind one that did not run first, and was not written; its events stay in the outbox and are sent again, in order"
    )]
    PublishedOutOfTurn,

    /// This process would publish or consume a partitioned category
    /// without its recorded partition key, or by another field: its events
    /// would go to (or be read from) other streams than every other
    /// process's. Nothing was published.
    #[error(
        "category `{category}` is partitioned by `{recorded}` (recorded in Redis at {record} by the first process that used it), but this process uses it {this}; its events would go to other streams than the consumers read: declare the key on the aggregate (#[aggregate(partition_key = \"{recorded}\")]) or link a handler with sequential_by = \"{recorded}\"; if the recorded key is wrong, stop every process of the category and delete {record}"
    )]
    KeyFieldMismatch {
        /// The category.
        category: String,
        /// The field Redis records.
        recorded: String,
        /// How this process uses the key (`by \`sku\``, `without a key`).
        this: String,
        /// The Redis key holding the record.
        record: String,
    },

    /// The engine stopped because the shutdown signal fired.
    #[error("the engine is shutting down")]
    Shutdown,
}

impl Error {
    /// Wraps a Redis error with what was being done.
    pub fn redis(context: impl Into<String>, source: redis::RedisError) -> Self {
        Error::Redis {
            context: context.into(),
            source,
        }
    }

    /// Whether retrying the same operation later may succeed (connection
    /// loss, timeouts, Redis loading or restarting).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Redis { source, .. } => redis_outage(source),
            #[cfg(feature = "postgres")]
            Error::Postgres { source, .. } => sqlx_outage(source),
            _ => false,
        }
    }

    /// The problems of an [`Error::IncorrectUsage`], empty otherwise.
    pub fn problems(&self) -> &[Problem] {
        match self {
            Error::IncorrectUsage(p) => &p.0,
            _ => &[],
        }
    }
}

/// The type of a handler named by its Rust path (`ClientLedger` of
/// `orders::ClientLedger`), for suggestions; `..` for an explicit name,
/// which does not say the type.
fn short_name(name: &str) -> &str {
    match name.rsplit_once("::") {
        Some((_, ty)) => ty,
        None => "..",
    }
}

/// Renders an error with its chain of causes (`outer: cause: root`), for
/// logs: escaped (see [`Escaped`](crate::key::Escaped)), since errors quote
/// keys and entries, which are user data.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        // A message that already ends with its source's (a command
        // handler's failure) is not repeated.
        let text = s.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    crate::key::Escaped(&out).to_string()
}

/// The list of problems found by `Domain::init`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problems(pub Vec<Problem>);

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(f, "{n} problem{} found", if n == 1 { "" } else { "s" })?;
        for p in &self.0 {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

/// One problem found by `Domain::init`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// A handled type lacks the `sequential_by` field.
    MissingKeyField {
        /// The handler.
        handler: String,
        /// The handled type.
        type_name: String,
        /// The missing field.
        field: String,
        /// The fields the type has.
        available: Vec<String>,
    },
    /// A process manager's `correlate` field is missing on a handled event.
    MissingCorrelateField {
        /// The process manager.
        process_manager: String,
        /// The handled type.
        type_name: String,
        /// The `correlate` field.
        field: String,
        /// The fields the type has.
        available: Vec<String>,
    },
    /// Two handlers partition one category by different keys.
    KeyConflict {
        /// The category.
        category: String,
        /// First handler and its key.
        first: (String, String),
        /// Second handler and its key.
        second: (String, String),
    },
    /// The broker cannot partition streams and is not the inline broker.
    BrokerCapability {
        /// The handler declaring `sequential_by`.
        handler: String,
        /// The broker's name.
        broker: String,
    },
    /// A handled type belongs to another category than the handler.
    CategoryMismatch {
        /// The handler.
        handler: String,
        /// The handler's category.
        category: String,
        /// The handled type.
        type_name: String,
        /// The type's category.
        type_category: String,
    },
    /// A handled type is of the wrong kind (an event in a command handler or
    /// the reverse).
    KindMismatch {
        /// The handler.
        handler: String,
        /// The handled type.
        type_name: String,
    },
    /// Two handlers share a name.
    DuplicateHandler(String),
    /// Two message types share a wire name.
    DuplicateTypeName {
        /// The wire name.
        type_name: String,
        /// The Rust paths declaring it.
        paths: (String, String),
    },
    /// Two command handlers handle one command.
    DuplicateCommandHandler {
        /// The command.
        type_name: String,
        /// The handlers.
        handlers: (String, String),
    },
    /// An event handler or process manager is declared in the binary but
    /// the domain does not run it (reported by `Domain::init` as a warning,
    /// or as an error under `DomainBuilder::require_all_handlers`).
    HandlerNotRun {
        /// The handler.
        handler: String,
        /// `event handler` or `process manager`.
        kind: &'static str,
    },
    /// A category name cannot be used (an aggregate implemented by hand:
    /// the derive rejects these at compile time).
    BadCategory {
        /// The category.
        category: String,
        /// The first message type or handler naming it.
        declared_by: String,
        /// The rule it breaks.
        rule: crate::key::CategoryRule,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::MissingKeyField {
                handler,
                type_name,
                field,
                available,
            } => {
                write!(
                    f,
                    "`{handler}` declares sequential_by = \"{field}\" but `{type_name}` has no field `{field}`"
                )?;
                if available.is_empty() {
                    write!(f, " (it has no fields)")
                } else {
                    write!(f, " (available fields: {})", available.join(", "))
                }
            }
            Problem::MissingCorrelateField {
                process_manager,
                type_name,
                field,
                available,
            } => write!(
                f,
                "`{process_manager}` correlates `{type_name}` by `{field}` but `{type_name}` has no field `{field}` (available fields: {})",
                available.join(", ")
            ),
            Problem::KeyConflict {
                category,
                first,
                second,
            } => write!(
                f,
                "category `{category}` is partitioned by `{}` in `{}` but by `{}` in `{}`; a partition key belongs to the category, so every handler on it must use one key or none",
                first.1, first.0, second.1, second.0
            ),
            Problem::BrokerCapability { handler, broker } => write!(
                f,
                "`{handler}` declares sequential_by but the broker `{broker}` does not advertise STREAM_PARTITIONING; use the Redis broker (or the inline broker, where it is a no-op)"
            ),
            Problem::CategoryMismatch {
                handler,
                category,
                type_name,
                type_category,
            } => write!(
                f,
                "`{handler}` is part of `{category}` but handles `{type_name}` of category `{type_category}`, which never reaches it"
            ),
            Problem::KindMismatch { handler, type_name } => write!(
                f,
                "`{handler}` handles `{type_name}`, which is not a message of the kind this handler takes"
            ),
            Problem::DuplicateHandler(name) => {
                write!(
                    f,
                    "two handlers are named `{name}`; handler names must be unique"
                )
            }
            Problem::DuplicateTypeName { type_name, paths } => write!(
                f,
                "`{}` and `{}` share the wire name `{type_name}`; rename one with #[event(name = \"...\")]",
                paths.0, paths.1
            ),
            Problem::DuplicateCommandHandler {
                type_name,
                handlers,
            } => write!(
                f,
                "command `{type_name}` is handled by both `{}` and `{}`; a command has one handler",
                handlers.0, handlers.1
            ),
            Problem::HandlerNotRun { handler, kind } => {
                let call = if *kind == "process manager" {
                    format!(
                        "Domain::builder().process_manager::<{}>()",
                        short_name(handler)
                    )
                } else {
                    match short_name(handler) {
                        ".." => "Domain::builder().handler(..)".to_owned(),
                        ty => format!("Domain::builder().handler({ty} {{ .. }})"),
                    }
                };
                write!(
                    f,
                    "{kind} `{handler}` is declared but this domain does not run it, so it never handles anything; pass it with {call}; if another binary runs it (a writer that only raises events), this warning is expected; build the domain with without_discovery() only if this binary holds several domains (it then also stops learning partition keys from the handlers it does not run: declare them on the aggregates)"
                )
            }
            Problem::BadCategory {
                category,
                declared_by,
                rule,
            } => write!(
                f,
                "`{declared_by}` is in category {category:?}, which cannot be used: {rule}"
            ),
        }
    }
}

/// Whether a Redis error says the server cannot be reached or used now
/// (I/O, refused or dropped connections, timeouts, a cluster that is down
/// or moving, a server loading or without its master), not that the
/// command was wrong.
pub(crate) fn redis_outage(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading)
                | redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain)
                | redis::ErrorKind::Server(redis::ServerErrorKind::MasterDown)
        )
}

/// Whether a PostgreSQL error says the server cannot be reached or used now,
/// or asks for the transaction to be tried again: I/O, TLS, a pool timed
/// out or closed, SQLSTATE class 08 (connection exceptions), `57P01`
/// (admin shutdown), `57P02` (crash shutdown), `57P03` (cannot connect
/// now), `40001` (serialization failure) and `40P01` (deadlock).
#[cfg(feature = "postgres")]
pub(crate) fn sqlx_outage(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08")
                || matches!(&*code, "57P01" | "57P02" | "57P03" | "40001" | "40P01")
        }),
        _ => false,
    }
}
