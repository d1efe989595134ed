//! Why an operator action did not happen.

use convoy_core::error::Error;

/// Why an [`Admin`](super::Admin) operation did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// Talking to Redis (or an outbox's database) failed (see
    /// [`AdminError::is_unreachable`]).
    #[error(transparent)]
    Runtime(#[from] Error),

    /// Skip or dead-letter of a partition that is not halted, without force.
    #[error(
        "partition {category}:{key} is not halted for handler {group}; pass --force to act on a running partition (its owner is fenced out and the event it has in flight may still take effect)"
    )]
    NotHalted {
        /// The category.
        category: String,
        /// The partition key.
        key: String,
        /// The consumer group (handler).
        group: String,
    },

    /// The unit is halted, but on another entry than its current head.
    #[error(
        "partition {category}:{key} is halted for handler {group} on entry {halt_entry:?}, but its head is {head}; run `convoy inspect` again, or pass --force to act on the head anyway"
    )]
    HeadMoved {
        /// The category.
        category: String,
        /// The partition key.
        key: String,
        /// The consumer group (handler).
        group: String,
        /// The entry the unit halted on.
        halt_entry: String,
        /// The current head.
        head: String,
    },

    /// The head is not the entry the operator confirmed.
    #[error(
        "the head of partition {category}:{key} for handler {group} is now {head}, not {expected}; nothing was changed: run `convoy inspect` again and retry"
    )]
    HeadChanged {
        /// The category.
        category: String,
        /// The partition key.
        key: String,
        /// The consumer group (handler).
        group: String,
        /// The entry the caller expected.
        expected: String,
        /// The current head.
        head: String,
    },

    /// The unit changed hands (or another operator acted) since the
    /// operator looked at it.
    #[error(
        "partition {category}:{key} for handler {group} is at generation {generation} now, not {expected} as confirmed (another owner took it, or another operator acted); nothing was changed: look at it again and retry"
    )]
    GenerationMoved {
        /// The category.
        category: String,
        /// The partition key.
        key: String,
        /// The consumer group (handler).
        group: String,
        /// The generation the caller confirmed.
        expected: u64,
        /// The unit's durable generation now.
        generation: u64,
    },

    /// The partition has no entry for this group.
    #[error(
        "partition {category}:{key} has no event to act on for handler {group}; check the key with `convoy partitions {category}`"
    )]
    NothingToDo {
        /// The category.
        category: String,
        /// The partition key.
        key: String,
        /// The consumer group (handler).
        group: String,
    },

    /// A lane's key holds something other than a stream.
    #[error(
        "partition {category}:{key}'s key {stream} holds a {kind}, not a stream; delete or rename that key, then run the command again to clear the halt"
    )]
    NotAStream {
        /// The category.
        category: String,
        /// The partition key.
        key: String,
        /// The key that should be a stream.
        stream: String,
        /// What it holds (`TYPE`).
        kind: String,
    },

    /// Dead-letter of a head whose stream entry was deleted.
    #[error(
        "entry {entry} of partition {category}:{key} was deleted from the stream, so there is nothing to dead-letter; use `convoy skip` to acknowledge it"
    )]
    EntryDeleted {
        /// The category.
        category: String,
        /// The partition key.
        key: String,
        /// The entry id.
        entry: String,
    },

    /// Replay of a dead letter that does not exist.
    #[error("no dead letter {id} in {stream}; list them with `convoy dlq {category} {key}`")]
    NoSuchDeadLetter {
        /// The category.
        category: String,
        /// The partition key.
        key: String,
        /// The dead letter stream.
        stream: String,
        /// The id asked for.
        id: String,
    },

    /// Replay of a dead letter that is not an event of this partition.
    #[error(
        "dead letter {id} in {stream} {problem}; it cannot be replayed into partition {category}:{key}"
    )]
    NotReplayable {
        /// The category.
        category: String,
        /// The partition key.
        key: String,
        /// The dead letter stream.
        stream: String,
        /// The dead letter id.
        id: String,
        /// What is wrong with it.
        problem: String,
    },

    /// Pausing what is paused already (for that handler).
    #[error(
        "{} of category {category} is paused already for {}, by {} since {} ({}); resume it first to pause it anew",
        pause.target,
        pause.handler.as_deref().unwrap_or("every handler"),
        pause.operator,
        super::utc(pause.since_ms),
        pause.reason
    )]
    AlreadyPaused {
        /// The category.
        category: String,
        /// The pause in force.
        pause: Box<crate::pause::KeyPause>,
    },

    /// A category no engine or publisher ever used here (a typo?).
    #[error(
        "no category {category:?} here: no engine ever ran a handler of it (a typo?); known categories: {}",
        if known.is_empty() { "none".to_owned() } else { known.join(", ") }
    )]
    UnknownCategory {
        /// The name given.
        category: String,
        /// The categories convoy knows here.
        known: Vec<String>,
    },

    /// A key the category never had: no stream, no state, not in its index.
    #[error(
        "category {category} has no partition {key:?}: no event of it was published and no handler holds state for it (check the key; `convoy partitions {category}` lists them)"
    )]
    UnknownKey {
        /// The category.
        category: String,
        /// The key given.
        key: String,
    },

    /// A pause of an empty key or prefix.
    #[error(
        "an empty key or prefix pauses nothing in category {category}: name a key, or the prefix its tenant's keys start with"
    )]
    EmptyPause {
        /// The category.
        category: String,
    },

    /// Resuming what is not paused (for that handler).
    #[error(
        "{target} of category {category} is not paused for {}; `convoy pauses {category}` lists the pauses",
        handler.as_deref().unwrap_or("every handler")
    )]
    NotPaused {
        /// The category.
        category: String,
        /// The handler named (`None`: every handler).
        handler: Option<String>,
        /// The key or prefix.
        target: crate::pause::PauseTarget,
    },

    /// No consumer group is registered for the category.
    #[error(
        "no handler is registered for category {category} (the set {} is empty); start an engine with a sequential_by handler on it, or check the category name",
        convoy_core::names::groups(0, category)
    )]
    NoHandlers {
        /// The category.
        category: String,
    },

    /// The named handler is not registered for the category.
    #[error(
        "handler {name} is not registered for category {category}; registered: {}",
        registered.join(", ")
    )]
    UnknownHandler {
        /// The category.
        category: String,
        /// The name given.
        name: String,
        /// The registered groups.
        registered: Vec<String>,
    },

    /// Several handlers could be meant.
    #[error(
        "category {category} has {} handlers ({}) and {} of them halted for key {key}; pass --handler with one of them",
        registered.len(),
        registered.join(", "),
        if halted.is_empty() { "none".to_owned() } else { halted.join(", ") }
    )]
    AmbiguousHandler {
        /// The category.
        category: String,
        /// The partition key (or `*` when none was given).
        key: String,
        /// The registered groups.
        registered: Vec<String>,
        /// The groups halted for the key.
        halted: Vec<String>,
    },

    /// The category named cannot be a category: operating on it would
    /// reach another category's keys or convoy's own (a skip in
    /// "category" `convoy` would delete audit records).
    #[error("{category:?} is not a category: {rule}")]
    BadCategory {
        /// The name given.
        category: String,
        /// The rule it breaks.
        rule: convoy_core::key::CategoryRule,
    },

    /// An outbox retry or discard of a record that is not abandoned.
    #[error(
        "outbox row {id} of {outbox} is not abandoned: {state}; nothing was changed (`convoy outbox` lists the abandoned rows)"
    )]
    NotAbandoned {
        /// The outbox (a `PgOutbox`'s qualified table).
        outbox: String,
        /// The record's id.
        id: u64,
        /// Where it stands instead.
        state: String,
    },

    /// The action was done, but its audit record could not be written.
    #[error(
        "{done}, but its audit record could not be written to {}",
        convoy_core::names::AUDIT_STREAM
    )]
    NotAudited {
        /// What was done.
        done: String,
        /// Why the audit record was not written.
        #[source]
        source: Error,
    },

    /// Redis answered something this version does not understand.
    #[error("unexpected reply from redis to {what}: {reply}; is the server a Redis 7 or later?")]
    UnexpectedReply {
        /// The operation.
        what: String,
        /// The reply, rendered.
        reply: String,
    },
}

impl AdminError {
    /// Whether Redis (or an outbox's database) could not be reached
    /// (connection refused or dropped, a timeout, the server loading):
    /// retrying later may work.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, AdminError::Runtime(e) if e.is_transient())
    }

    /// Whether the operation was refused by a safety check (nothing was
    /// changed).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            AdminError::NotHalted { .. }
                | AdminError::BadCategory { .. }
                | AdminError::HeadMoved { .. }
                | AdminError::HeadChanged { .. }
                | AdminError::GenerationMoved { .. }
                | AdminError::NothingToDo { .. }
                | AdminError::NotAStream { .. }
                | AdminError::EntryDeleted { .. }
                | AdminError::NotAbandoned { .. }
                | AdminError::AlreadyPaused { .. }
                | AdminError::UnknownCategory { .. }
                | AdminError::UnknownKey { .. }
                | AdminError::EmptyPause { .. }
                | AdminError::NotPaused { .. }
        )
    }
}

impl AdminError {
    /// A script's error, with an unexpected reply reported as such for
    /// `what`.
    pub(super) fn from_script(what: &str, e: Error) -> AdminError {
        match e {
            Error::UnexpectedReply { reply, .. } => AdminError::UnexpectedReply {
                what: what.to_owned(),
                reply,
            },
            e => AdminError::Runtime(e),
        }
    }
}
