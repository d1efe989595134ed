//! Every Redis key convoy uses: the public view of the crate's one naming
//! module (operators' scripts and tests read the same names the engine
//! writes).
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
//! | `convoy:lease:{group}:{scope}:{key}` | string | the unit's fence token `{owner}:{generation}`, valid while the owner is alive |
//! | `convoy:alive:{group}:{owner}` | string, PX | an instance's liveness: one key renewed per heartbeat for all its units |
//! | `convoy:unit:{group}:{scope}:{key}` | hash | `gen` (durable), `inc`, `head`/`attempts`/`last_error`, `halted`/`halt_*`, `active` |
//! | `convoy:scope:{group}` | string | `*` for a sequential process manager, whose units are correlation values spanning categories (leases `convoy:lease:{pm}:*:{value}`); absent for handlers (units named by category) |
//! | `convoy:instances:{group}` | sorted set | live instances of a group, scored by expiry (ms) |
//! | `convoy:published:{category}` | counter | partitioned events published, and dead letters replayed (`convoy_lag` = this − acked) |
//! | `convoy:acked:{group}:{category}` | counter | partitioned events a group finished: acknowledged, or skipped or dead-lettered by an operator |
//! | `convoy:pm:{process manager}:{value}` | hash | a process-manager instance: `version`, `state` (JSON), `ended`, `applied` |
//! | `convoy:producer:{id}:sent` | sorted set, PX | the outbox seqs a producer published that it may still send again (drops re-sent records; about one batch) |
//! | `convoy:producer:{id}:epoch` | string, PX | the fencing epoch of the producer's newest publisher (refuses a replaced relay) |
//! | `convoy:audit` | stream | operator actions (see [`admin`](super::admin)) |
//!
//! A unit's scope is its handler's category, or `*` for a sequential
//! process manager (its units are correlation values).

pub use crate::names::{
    AUDIT_STREAM, acked, alive, backfill_stream, base_backfill_stream, base_groups, category_dlq,
    groups, instances, lease, partition_dlq, partition_index, partition_stream, pm_state,
    producer_epoch, producer_sent, published, scope, unit, wake_stream,
};
