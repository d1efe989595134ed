//! Handlers: what `#[event_handler]` and `#[command_handler]` generate, the
//! [`Context`] a handler receives, and [`HandlerError`].

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::envelope::{Envelope, Origin, Priority, Replay};
use crate::error::Error;
pub use crate::future::BoxFuture;
use crate::key::KeyPolicy;
use crate::message::{Event, MessageDescriptor};
use crate::raise::PendingEvents;

/// What kind of handler a descriptor describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HandlerKind {
    /// `#[event_handler]`: consumes events from the broker.
    Event,
    /// `#[command_handler]`: called synchronously; `sequential_by` is checked
    /// but inert because commands never reach the outbox.
    Command,
}

impl fmt::Display for HandlerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HandlerKind::Event => "event handler",
            HandlerKind::Command => "command handler",
        })
    }
}

/// What the runtime knows about a handler type, built at compile time by the
/// handler macros and registered with `inventory`.
#[derive(Debug)]
pub struct HandlerDescriptor {
    /// The handler's name: `name = "..."` of its attribute, else its Rust
    /// path (`orders::ClientLedger`). Also the name of its consumer group
    /// and of its leases: renaming a handler (or, without `name = "..."`,
    /// moving it to another module) starts a new consumer group with no
    /// progress, which reads each partition from its first retained entry.
    pub name: &'static str,
    /// Event or command handler.
    pub kind: HandlerKind,
    /// The stream category the handler is `part_of`.
    pub category: &'static str,
    /// The partition key field, when declared with `sequential_by`.
    pub sequential_by: Option<&'static str>,
    /// The message types the handler handles, in declaration order.
    pub handles: &'static [&'static MessageDescriptor],
    /// `on_poison = "dead_letter"`: after its retries (or a permanent
    /// error) a partition's head goes to the key's dead letters with a
    /// recorded gap and the key goes on; `false` (`"halt"`, the default):
    /// the key halts. `[handlers."name"] on_poison` overrides it.
    pub dead_letter_poison: bool,
}

impl HandlerDescriptor {
    /// Whether the handler handles the message type with this wire name.
    pub fn handles_type(&self, type_name: &str) -> bool {
        self.handles.iter().any(|m| m.type_name == type_name)
    }
}

/// The outcome of dispatching one message to a handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dispatched {
    /// A handler method ran and succeeded.
    Handled,
    /// The handler does not handle this message type; nothing ran.
    NotHandled,
}

/// An event handler, implemented by `#[event_handler]`.
pub trait EventHandler: Send + Sync + 'static {
    /// The handler's compile-time description.
    fn descriptor(&self) -> &'static HandlerDescriptor;

    /// Decodes the envelope and runs the matching `#[handle]` method.
    fn dispatch<'a>(
        &'a self,
        envelope: &'a Envelope,
        ctx: &'a Context,
    ) -> BoxFuture<'a, Result<Dispatched, HandlerError>>;
}

/// What a consumer calls for each message: an event handler as it is, or a
/// process manager with its state loading and saving around the handler.
#[doc(hidden)]
pub trait Dispatch: Send + Sync + 'static {
    /// Runs the message through the handler.
    fn dispatch<'a>(
        &'a self,
        envelope: &'a Envelope,
        ctx: &'a Context,
    ) -> BoxFuture<'a, Result<Dispatched, HandlerError>>;
}

impl<H: EventHandler> Dispatch for H {
    fn dispatch<'a>(
        &'a self,
        envelope: &'a Envelope,
        ctx: &'a Context,
    ) -> BoxFuture<'a, Result<Dispatched, HandlerError>> {
        EventHandler::dispatch(self, envelope, ctx)
    }
}

/// A command handler, implemented by `#[command_handler]`.
pub trait CommandHandler: Send + Sync + 'static {
    /// The handler's compile-time description.
    fn descriptor(&self) -> &'static HandlerDescriptor;

    /// Decodes the envelope and runs the matching `#[handle]` method.
    fn dispatch<'a>(
        &'a self,
        envelope: &'a Envelope,
        ctx: &'a Context,
    ) -> BoxFuture<'a, Result<Dispatched, HandlerError>>;
}

/// Implemented for a handler struct once per event or command it handles,
/// when the handler is declared on the struct with `handles = [..]` rather
/// than on an `impl` block with `#[handle]` methods.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not implement `convoy_runtime::Handle<{M}>`",
    label = "named in `handles = [..]` but not handled",
    note = "implement `convoy_runtime::Handle<{M}>` for `{Self}`, or put the handler attribute on an `impl` block with `#[handle]` methods"
)]
pub trait Handle<M>: Send + Sync {
    /// Handles one message.
    fn handle(
        &self,
        message: M,
        ctx: &Context,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// A partition fence: who owns the partition and at which generation.
///
/// A handler can condition its own database writes on it (for example store
/// the generation beside the row and refuse a write with an older one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The owning engine instance.
    pub owner: String,
    /// The ownership generation; it increases every time the partition
    /// changes hands.
    pub generation: u64,
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.owner, self.generation)
    }
}

/// Where the message being handled sits in its partition stream: the
/// stream and the entry id. Entry ids grow within a stream, so a handler
/// that records the last one it applied can tell a re-run from a new event
/// (what `postgres::AppliedEvents` does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The partition stream (`order:c-1`).
    pub stream: String,
    /// The entry id (`1718000000000-0`: milliseconds, then a sequence).
    pub entry_id: String,
}

impl Position {
    /// The entry id as its two numbers, `None` if it has another form.
    pub fn entry(&self) -> Option<(u64, u64)> {
        let (ms, seq) = self.entry_id.split_once('-')?;
        Some((ms.parse().ok()?, seq.parse().ok()?))
    }
}

/// A gap before the event being handled: the key's previous head failed
/// past its retries under `on_poison = "dead_letter"` and went to the
/// key's dead letters instead of halting the key ([`Context::gap`]).
/// Reconciliation code can act on it; `convoy gaps` lists the gaps still
/// recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Gap {
    /// The skipped head's stream entry id.
    pub entry_id: String,
    /// The skipped event's message id.
    pub message_id: String,
    /// Why it failed (its last error).
    pub reason: String,
    /// Its id in the key's dead letter stream.
    pub dead_letter_id: String,
}

impl Gap {
    /// A gap record (made by the consumers).
    #[doc(hidden)]
    pub fn new(
        entry_id: String,
        message_id: String,
        reason: String,
        dead_letter_id: String,
    ) -> Self {
        Gap {
            entry_id,
            message_id,
            reason,
            dead_letter_id,
        }
    }
}

/// What `commit_in` needs of the domain's outbox: writing records in the
/// caller's own PostgreSQL transaction (`PgOutbox` can; the memory outbox
/// cannot). An outbox store offers it through
/// [`OutboxStore::transactional`](crate::outbox::OutboxStore::transactional).
pub trait TransactionalOutbox: Send + Sync + 'static {
    /// Writes `envelopes` in the transaction open on `tx`: they commit or
    /// roll back with it.
    #[cfg(feature = "postgres")]
    fn insert_in<'a>(
        &'a self,
        tx: &'a mut sqlx::PgConnection,
        envelopes: &'a [crate::envelope::Envelope],
    ) -> crate::future::BoxFuture<'a, Result<(), Error>>;
}

/// What a handler knows about the message it handles.
pub struct Context {
    handler: &'static str,
    /// The message being handled (owned: its id, type, key and origin are
    /// read from it, never copied per attempt).
    envelope: Envelope,
    fence: Option<Fence>,
    gap: Option<Gap>,
    attempt: u32,
    dispatched_at: SystemTime,
    policy: Arc<KeyPolicy>,
    pending: Mutex<PendingEvents>,
    position: Option<Position>,
    /// The domain's outbox, when it can write in the handler's own
    /// transaction (for `commit_in`).
    outbox: Option<Arc<dyn TransactionalOutbox>>,
    /// What a command handler returned, for `Domain::process`.
    reply: Mutex<Option<Box<dyn Any + Send>>>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("handler", &self.handler)
            .field("message_id", &self.envelope.id)
            .field("message_type", &self.envelope.type_name)
            .field("partition_key", &self.envelope.partition_key)
            .field("fence", &self.fence)
            .field("position", &self.position)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// A context for handling `envelope` in `handler` (made by the
    /// consumers; public to drive a handler by hand in a test).
    #[doc(hidden)]
    pub fn new(
        handler: &'static str,
        envelope: &Envelope,
        attempt: u32,
        policy: Arc<KeyPolicy>,
    ) -> Self {
        Self::of(handler, envelope.clone(), attempt, policy)
    }

    /// A context for handling `envelope`, which it keeps (what the
    /// consumers use: nothing of the envelope is copied).
    #[doc(hidden)]
    pub fn of(
        handler: &'static str,
        envelope: Envelope,
        attempt: u32,
        policy: Arc<KeyPolicy>,
    ) -> Self {
        Context {
            handler,
            envelope,
            fence: None,
            gap: None,
            attempt,
            dispatched_at: SystemTime::now(),
            policy,
            pending: Mutex::new(PendingEvents::default()),
            position: None,
            outbox: None,
            reply: Mutex::new(None),
        }
    }

    /// The message being handled, as its envelope.
    #[doc(hidden)]
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// Sets where the message sits in its partition stream.
    #[doc(hidden)]
    pub fn with_position(mut self, position: Position) -> Self {
        self.position = Some(position);
        self
    }

    /// Sets the outbox that `commit_in` writes to (the domain's, when it
    /// can write in the caller's transaction).
    #[doc(hidden)]
    pub fn with_outbox(mut self, outbox: Option<Arc<dyn TransactionalOutbox>>) -> Self {
        self.outbox = outbox;
        self
    }

    /// The domain's outbox, if it can write in the handler's transaction.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn outbox(&self) -> Option<&dyn TransactionalOutbox> {
        self.outbox.as_deref()
    }

    /// Sets when the engine dispatched this attempt.
    #[doc(hidden)]
    pub fn with_dispatched_at(mut self, at: SystemTime) -> Self {
        self.dispatched_at = at;
        self
    }

    /// Sets the fence of the partition being consumed.
    #[doc(hidden)]
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = Some(fence);
        self
    }

    /// Sets the gap that precedes this event.
    #[doc(hidden)]
    pub fn with_gap(mut self, gap: Option<Gap>) -> Self {
        self.gap = gap;
        self
    }

    /// The gap that precedes this event in its key, when the key's
    /// previous head was dead-lettered by `on_poison = "dead_letter"` (its
    /// entry, message id, reason and dead letter id); `None` otherwise.
    /// Only the event right after the gap sees it.
    pub fn gap(&self) -> Option<&Gap> {
        self.gap.as_ref()
    }

    /// The handler's name.
    pub fn handler(&self) -> &'static str {
        self.handler
    }

    /// The id of the message being handled.
    pub fn message_id(&self) -> &str {
        &self.envelope.id
    }

    /// The wire type name of the message being handled.
    pub fn message_type(&self) -> &str {
        &self.envelope.type_name
    }

    /// The correlation id carried by the message, if any.
    pub fn correlation_id(&self) -> Option<&str> {
        self.envelope.correlation_id.as_deref()
    }

    /// The partition key of the message (`None` for unpartitioned messages).
    pub fn partition_key(&self) -> Option<&str> {
        self.envelope.partition_key.as_deref()
    }

    /// The event's identity: the outbox that published it and its record
    /// there (`None` for an entry written by an older convoy or by another
    /// program). `AppliedEvents` (feature `postgres`) recognises a re-run by
    /// it; an operator's replay of a dead letter keeps it.
    pub fn origin(&self) -> Option<&Origin> {
        self.envelope.origin.as_ref()
    }

    /// Set when the event is an operator's replay of a dead letter: the
    /// handlers it was replayed to and the one that dead-lettered it.
    pub fn replay(&self) -> Option<&Replay> {
        self.envelope.replay.as_ref()
    }

    /// The fence of the partition being consumed, when consumed from a
    /// partition owned under a lease (the Redis broker).
    pub fn fence(&self) -> Option<&Fence> {
        self.fence.as_ref()
    }

    /// Where the message sits in its partition stream, when it is consumed
    /// one at a time per key (a `sequential_by` handler or process manager
    /// on Redis, any handler on the inline broker); `None` for ordinary
    /// handlers, which run events of a stream concurrently.
    pub fn position(&self) -> Option<&Position> {
        self.position.as_ref()
    }

    /// Which attempt this is, starting at 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the engine dispatched this attempt to the handler, read just
    /// before the worker's last lease check. A process stalled (stopped,
    /// swapped out) right after that check runs the handler only when it
    /// resumes, possibly after its lease lapsed and another owner moved on:
    /// that is the one event a stalled owner may still finish, and this
    /// time tells it apart from an event started after the stall (which the
    /// lease check prevents). Recorders of handler windows use it as the
    /// window's start.
    pub fn dispatched_at(&self) -> SystemTime {
        self.dispatched_at
    }

    /// Raises a follow-up event. It is added to the outbox, with its key
    /// validated, only if the handler succeeds; the correlation id of the
    /// message being handled is carried over.
    pub fn raise<E: Event>(&self, event: E) -> Result<(), Error> {
        self.raise_with_priority(event, Priority::Normal)
    }

    /// Raises a follow-up event with a priority (see [`Context::raise`]).
    pub fn raise_with_priority<E: Event>(&self, event: E, priority: Priority) -> Result<(), Error> {
        let mut pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        pending.push(
            &event,
            &self.policy,
            priority,
            self.envelope.correlation_id.clone(),
        )
    }

    /// Keeps what a command handler returned (generated code calls it).
    #[doc(hidden)]
    pub fn set_reply(&self, reply: Box<dyn Any + Send>) {
        *self
            .reply
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(reply);
    }

    /// Takes what a command handler returned.
    #[doc(hidden)]
    pub fn take_reply(&self) -> Option<Box<dyn Any + Send>> {
        self.reply
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// Takes the events raised while handling.
    #[doc(hidden)]
    pub fn take_raised(&self) -> PendingEvents {
        let mut pending = self
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        std::mem::take(&mut *pending)
    }
}

/// The error a handler returns. Any error type converts into it with `?`.
///
/// # Error classes
///
/// - **Default**: the event is retried in place with back-off
///   (`[server.retry]`) up to `max_retries` times, then a partitioned
///   handler halts the partition and an ordinary handler dead-letters the
///   event.
/// - **Transient** ([`HandlerError::transient`]): a dependency of the
///   handler is down (its database, a service), not the event at fault.
///   The event is retried with capped exponential back-off and jitter
///   (`max_transient_backoff_ms`) for as long as it lasts, never counted
///   toward `max_retries` and never halting. When `outage_threshold` keys
///   of one handler fail so at once, the handler *pauses* on that instance
///   (see the engine's health) and probes with one event at a time until
///   one succeeds. An error converted with `?` is transient by itself when
///   it, or any error in its [`source`](std::error::Error::source) chain,
///   is a dependency's outage (see [`is_outage`]): a connection-level
///   error of `sqlx` (pool timed out or closed, I/O, TLS, SQLSTATE class
///   08, `57P01`-`57P03`: the server shutting down or not yet accepting),
///   a serialization failure or deadlock (`40001`, `40P01`: retried without
///   counting), a `redis` one (I/O, connection refused or dropped, timeout,
///   cluster down, loading) or one of convoy's own errors that says so
///   ([`Error::is_transient`]): what `AppliedEvents::claim` and
///   `Context::commit_in` return in an outage. A handler classifies its
///   own error types with `DomainBuilder::classify_errors`.
/// - **Permanent** ([`HandlerError::permanent`]): no retry can succeed (a
///   malformed event, a rule the event breaks): a partitioned handler halts
///   the partition at once, an ordinary handler dead-letters the event at
///   once.
///
/// Like `anyhow::Error`, it deliberately does not implement
/// `std::error::Error` itself so that the blanket conversion is possible.
pub struct HandlerError {
    inner: Box<dyn std::error::Error + Send + Sync + 'static>,
    class: ErrorClass,
}

/// How a failure is retried (see [the error classes](HandlerError#error-classes)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The default class: counted toward `max_retries`, then the partition
    /// halts (or the event is dead-lettered); unless many keys of the
    /// handler fail so at once (a handler-wide failure).
    Counted,
    /// A dependency is down: retried for as long as it lasts, never
    /// halting.
    Transient,
    /// No retry can succeed: halted (or dead-lettered) at once.
    Permanent,
}

/// A handler's own rule for the errors it returns: called on an error of
/// the default class and on each error of its
/// [`source`](std::error::Error::source) chain in turn, outermost first;
/// the first class it names is the error's. Given to
/// `DomainBuilder::classify_errors`.
pub type ErrorClassifier =
    Arc<dyn Fn(&(dyn std::error::Error + 'static)) -> Option<ErrorClass> + Send + Sync>;

impl HandlerError {
    /// A handler error with a message (of the default class).
    pub fn msg(message: impl fmt::Display) -> Self {
        HandlerError {
            inner: message.to_string().into(),
            class: ErrorClass::Counted,
        }
    }

    /// A permanent error: retrying cannot help, so a partitioned handler
    /// halts its partition at once and an ordinary handler dead-letters the
    /// event at once (see [the error classes](HandlerError#error-classes)).
    pub fn permanent(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        HandlerError {
            inner: error.into(),
            class: ErrorClass::Permanent,
        }
    }

    /// A transient error: a dependency is down, not the event at fault; it
    /// is retried for as long as the outage lasts and never halts (see
    /// [the error classes](HandlerError#error-classes)).
    pub fn transient(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        HandlerError {
            inner: error.into(),
            class: ErrorClass::Transient,
        }
    }

    /// The error's class.
    pub fn class(&self) -> ErrorClass {
        self.class
    }

    /// The error with `class` instead of its own.
    pub fn with_class(mut self, class: ErrorClass) -> Self {
        self.class = class;
        self
    }

    /// Applies a handler's own classifier to an error of the default class
    /// (see [`ErrorClassifier`]); other classes stay as they are.
    #[doc(hidden)]
    pub fn classified_by(mut self, classify: &ErrorClassifier) -> Self {
        if self.class != ErrorClass::Counted {
            return self;
        }
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&*self.inner);
        while let Some(e) = next {
            if let Some(class) = classify(e) {
                self.class = class;
                break;
            }
            next = e.source();
        }
        self
    }

    /// Whether the error was made with [`HandlerError::permanent`].
    pub fn is_permanent(&self) -> bool {
        self.class == ErrorClass::Permanent
    }

    /// Whether the error is transient: made with
    /// [`HandlerError::transient`], or converted from a connection-level
    /// `sqlx` or `redis` error.
    pub fn is_transient(&self) -> bool {
        self.class == ErrorClass::Transient
    }

    /// The underlying error (downcast it to the handler's own error type
    /// with `downcast_ref`).
    pub fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.inner
    }

    /// The underlying error, owned.
    pub fn into_inner(self) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self.inner
    }
}

impl<E> From<E> for HandlerError
where
    E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    fn from(error: E) -> Self {
        let inner = error.into();
        let class = if is_outage(&*inner) {
            ErrorClass::Transient
        } else {
            ErrorClass::Counted
        };
        HandlerError { inner, class }
    }
}

/// Whether `e` or any error of its [`source`](std::error::Error::source)
/// chain says a dependency is out (the database or Redis cannot be reached
/// now, or the database asks for the transaction to be tried again): the
/// event is not at fault. What a `?` conversion into [`HandlerError`]
/// takes as transient.
pub fn is_outage(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(own) = e.downcast_ref::<Error>() {
            if own.is_transient() {
                return true;
            }
        } else if let Some(r) = e.downcast_ref::<redis::RedisError>() {
            if crate::error::redis_outage(r) {
                return true;
            }
        } else if postgres_outage(e) {
            return true;
        }
        next = e.source();
    }
    false
}

#[cfg(feature = "postgres")]
fn postgres_outage(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<sqlx::Error>()
        .is_some_and(crate::error::sqlx_outage)
}

#[cfg(not(feature = "postgres"))]
fn postgres_outage(_: &(dyn std::error::Error + 'static)) -> bool {
    false
}

// `Context::commit_in` of the PostgreSQL outbox: an inherent method, so it
// lives beside its type (convoy-postgres cannot add one).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl Context {
    /// Writes the events raised so far in the transaction open on `tx`
    /// (feature `postgres`, with a `PgOutbox` as the domain's outbox):
    /// they commit or roll back with the handler's own writes. Events
    /// raised after this call are committed after the handler returns, as
    /// usual. Returns how many were written.
    pub async fn commit_in(&self, tx: &mut sqlx::PgConnection) -> Result<usize, Error> {
        let outbox = self.outbox().ok_or(Error::Unsupported {
                operation: "Context::commit_in",
                broker: "memory outbox".into(),
                hint: "it needs a PgOutbox as the domain's outbox: set [outbox] postgres_url or call .outbox(PgOutbox::...)",
            })?;
        let envelopes = self.take_raised().into_envelopes();
        outbox.insert_in(tx, &envelopes).await?;
        Ok(envelopes.len())
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.inner, f)
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)?;
        let mut source = self.inner.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error of the user's own that wraps another (as `anyhow`'s
    /// context or a `thiserror` `#[source]` does).
    #[derive(Debug)]
    struct Wrapped(Box<dyn std::error::Error + Send + Sync>);

    impl fmt::Display for Wrapped {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("projecting the balance")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&*self.0)
        }
    }

    #[derive(Debug)]
    struct PartnerDown;

    impl fmt::Display for PartnerDown {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("partner API unreachable")
        }
    }

    impl std::error::Error for PartnerDown {}

    fn refused() -> Error {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        Error::redis("reading", redis::RedisError::from(io))
    }

    #[test]
    fn an_outage_anywhere_in_the_chain_is_transient() {
        assert!(HandlerError::from(refused()).is_transient(), "convoy's own");
        assert!(
            HandlerError::from(Wrapped(Box::new(refused()))).is_transient(),
            "wrapped in the user's error"
        );
        let not = Error::UnknownType {
            type_name: "X".into(),
            id: "1".into(),
        };
        assert_eq!(
            HandlerError::from(Wrapped(Box::new(not))).class(),
            ErrorClass::Counted
        );
        assert_eq!(HandlerError::msg("bug").class(), ErrorClass::Counted);
    }

    #[test]
    fn a_handlers_classifier_sees_the_chain_and_leaves_other_classes() {
        let classify: ErrorClassifier = Arc::new(|e| {
            e.downcast_ref::<PartnerDown>()
                .map(|_| ErrorClass::Transient)
        });
        let e = HandlerError::from(Wrapped(Box::new(PartnerDown))).classified_by(&classify);
        assert!(e.is_transient(), "found in the source chain");
        let e = HandlerError::permanent(PartnerDown).classified_by(&classify);
        assert!(e.is_permanent(), "an explicit class stays");
        let e = HandlerError::msg("bug").classified_by(&classify);
        assert_eq!(e.class(), ErrorClass::Counted, "nothing named");
    }
}
