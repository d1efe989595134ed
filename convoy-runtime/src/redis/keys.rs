//! Every Redis key convoy uses, derived in one place.
//!
//! | key | type | what |
//! | --- | --- | --- |
//! | `{category}` | stream | events of a category that carry no partition key |
//! | `{category}:{backfill}` | stream | their low-priority lane |
//! | `{category}:{key}` | stream | one partition: a key's events, in publish order |
//! | `{category}:{key}:{backfill}` | stream | the key's low-priority lane |
//! | `{category}:__partitions__` | set | the category's live partition keys (discovery index) |
//! | `{category}:__wake__` | stream | one entry per partitioned publish (`k` = key), capped; wakes owners |
//! | `{category}:dlq` | stream | dead letters of ordinary handlers |
//! | `{category}:{key}:dlq` | stream | heads moved aside by an operator |
//! | `convoy:groups:{category}` | set | consumer groups (handler names) reading the category's partitions |
//! | `convoy:groups:{category}:__base__` | set | consumer groups reading `{category}` itself |
//! | `convoy:lease:{group}:{category}:{key}` | string | the unit's fence token `{owner}:{generation}`, valid while the owner is alive |
//! | `convoy:alive:{group}:{owner}` | string, PX | an instance's liveness: one key renewed per heartbeat for all its units |
//! | `convoy:unit:{group}:{category}:{key}` | hash | `gen` (durable), `head`/`attempts`/`last_error`, `halted`/`halt_*`, `active` |
//! | `convoy:scope:{group}` | string | `*` for a sequential process manager, whose units are correlation values spanning categories (leases `convoy:lease:{pm}:*:{value}`); absent for handlers (units named by category) |
//! | `convoy:instances:{group}` | sorted set | live instances of a group, scored by expiry (ms) |
//! | `convoy:published:{category}` | counter | partitioned events published (lag = this − acked) |
//! | `convoy:acked:{group}:{category}` | counter | partitioned events a group acknowledged |
//! | `convoy:pm:{process manager}:{value}` | hash | a process-manager instance: `version`, `state` (JSON), `ended` |
//! | `convoy:lease:{pm}:*:{value}` | string | a sequential process manager's lease on a correlation value (all its categories) |
//! | `convoy:producer:{id}` | string, PX | the last outbox seq a producer (`{instance id}/{outbox store identity}`) published (drops re-sent records) |

/// `{category}:__wake__`.
pub fn wake_stream(category: &str) -> String {
    format!("{category}:__wake__")
}

/// `convoy:groups:{category}`.
pub fn groups(category: &str) -> String {
    format!("convoy:groups:{category}")
}

/// `convoy:groups:{category}:__base__`.
pub fn base_groups(category: &str) -> String {
    format!("convoy:groups:{category}:__base__")
}

/// `convoy:lease:{group}:{category}:{key}`.
pub fn lease(group: &str, category: &str, key: &str) -> String {
    format!("convoy:lease:{group}:{category}:{key}")
}

/// `convoy:alive:{group}:{owner}` (acquire.lua builds the same name).
pub fn alive(group: &str, owner: &str) -> String {
    format!("convoy:alive:{group}:{owner}")
}

/// `convoy:unit:{group}:{category}:{key}`.
pub fn unit(group: &str, category: &str, key: &str) -> String {
    format!("convoy:unit:{group}:{category}:{key}")
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

/// `convoy:producer:{id}`.
pub fn producer(id: &str) -> String {
    format!("convoy:producer:{id}")
}

pub use crate::routing::{
    backfill_stream, category_dlq, partition_dlq, partition_index, partition_stream,
};
