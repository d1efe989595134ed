//! Every stream and key name convoy uses, derived in one place (the
//! outbox's routing, both brokers, the operators' tools and the Lua scripts,
//! which receive every name in `KEYS`, all take their names from here).
//!
//! The table of every key, with its type and use, is in the public view of
//! this module, `convoy_runtime::redis::keys`.
//!
//! A unit's *scope* is its handler's category, or [`CORRELATION_SCOPE`] for
//! a sequential process manager (its units are correlation values).

use crate::key::DLQ_TOKEN;
pub(crate) use crate::key::OWN_PREFIX;

/// The scope of a sequential process manager's units: a correlation value
/// spans every category it subscribes to.
pub(crate) const CORRELATION_SCOPE: &str = "*";

/// The stream operator actions are recorded in.
pub const AUDIT_STREAM: &str = "convoy:audit";

/// Approximate cap of each category's wake stream.
pub(crate) const WAKE_MAXLEN: u64 = 100_000;

/// `{category}:{suffix}`: the low-priority lane of a category's events
/// without a key.
pub fn base_backfill_stream(category: &str, suffix: &str) -> String {
    format!("{category}:{suffix}")
}

/// `{category}:{key}`: a key's primary lane.
pub fn partition_stream(category: &str, key: &str) -> String {
    format!("{category}:{key}")
}

/// `{category}:{key}:{suffix}`: a key's backfill lane.
pub fn backfill_stream(category: &str, key: &str, suffix: &str) -> String {
    format!("{category}:{key}:{suffix}")
}

/// `{category}:__partitions__`: the set of a category's live partition keys.
pub fn partition_index(category: &str) -> String {
    format!("{category}:__partitions__")
}

/// `{category}:__wake__`.
pub fn wake_stream(category: &str) -> String {
    format!("{category}:__wake__")
}

/// `{category}:dlq`: dead letters of ordinary handlers.
pub fn category_dlq(category: &str) -> String {
    format!("{category}:{DLQ_TOKEN}")
}

/// `{category}:{key}:dlq`: where an operator moves a halted partition's head.
pub fn partition_dlq(category: &str, key: &str) -> String {
    format!("{category}:{key}:{DLQ_TOKEN}")
}

/// `convoy:groups:{category}`.
pub fn groups(category: &str) -> String {
    format!("convoy:groups:{category}")
}

/// `convoy:groups:{category}:__base__`.
pub fn base_groups(category: &str) -> String {
    format!("convoy:groups:{category}:__base__")
}

/// `convoy:lease:{group}:{scope}:{key}`.
pub fn lease(group: &str, scope: &str, key: &str) -> String {
    format!("convoy:lease:{group}:{scope}:{key}")
}

/// `convoy:alive:{group}:{owner}`.
pub fn alive(group: &str, owner: &str) -> String {
    format!("convoy:alive:{group}:{owner}")
}

/// `convoy:unit:{group}:{scope}:{key}`.
pub fn unit(group: &str, scope: &str, key: &str) -> String {
    format!("convoy:unit:{group}:{scope}:{key}")
}

/// `convoy:scope:{group}`.
pub fn scope(group: &str) -> String {
    format!("convoy:scope:{group}")
}

/// `convoy:instances:{group}`.
pub fn instances(group: &str) -> String {
    format!("convoy:instances:{group}")
}

/// `convoy:published:{category}`.
pub fn published(category: &str) -> String {
    format!("convoy:published:{category}")
}

/// `convoy:acked:{group}:{category}`.
pub fn acked(group: &str, category: &str) -> String {
    format!("convoy:acked:{group}:{category}")
}

/// `convoy:pm:{process manager}:{correlation value}`.
pub fn pm_state(pm: &str, id: &str) -> String {
    format!("convoy:pm:{pm}:{id}")
}

/// `convoy:producer:{id}:sent`: the outbox seqs a producer published that
/// it may still send again (drops re-sent records).
pub fn producer_sent(id: &str) -> String {
    format!("convoy:producer:{id}:sent")
}

/// `convoy:producer:{id}:epoch`: the fencing epoch of a producer's newest
/// publisher (refuses a replaced relay).
pub fn producer_epoch(id: &str) -> String {
    format!("convoy:producer:{id}:epoch")
}
