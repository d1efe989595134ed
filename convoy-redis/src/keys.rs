//! Every Redis key convoy uses: the public view of the crate's one naming
//! module (operators' scripts and tests read the same names the engine
//! writes).
//!
//! A category is spread over a fixed number of shards (`[broker] shards`,
//! default 16, or `[broker.category_shards]`); a partition key `k` is in
//! shard `s = shard_of(k, shards)`, and every key a script touches with a
//! unit starts with the shard's hash tag `{s}`, so each script stays in one
//! Redis Cluster hash slot. The tag comes first, so `{` or `}` in a key
//! value cannot move the key's slot. A category's events without a key are
//! in the shard of the category's name, `shard_of(category, shards)`.
//!
//! | key | type | what |
//! | --- | --- | --- |
//! | `{s}{category}` | stream | events of a category that carry no partition key (`s` = the category's shard) |
//! | `{s}{category}:{backfill}` | stream | their low-priority lane |
//! | `{s}{category}:dlq` | stream | dead letters of ordinary handlers |
//! | `{s}convoy:groups:{category}:__base__` | set | consumer groups reading `{s}{category}` |
//! | `{s}{category}:{key}` | stream | one partition: a key's events, in publish order |
//! | `{s}{category}:{key}:{backfill}` | stream | the key's low-priority lane |
//! | `{s}{category}:{key}:dlq` | stream | heads moved aside by an operator |
//! | `{s}{category}:__partitions__` | set | the shard's live partition keys of the category (discovery index) |
//! | `{s}convoy:groups:{category}` | set | consumer groups (handler names) reading the category's partitions (the same in every shard) |
//! | `{s}convoy:lease:{group}:{scope}:{key}` | string | the unit's fence token `{owner}:{generation}`, valid while the owner is alive |
//! | `{s}convoy:unit:{group}:{scope}:{key}` | hash | `gen` (durable), `inc`, `head`/`attempts`/`last_error`, `halted`/`halt_*`, `active` |
//! | `{s}convoy:alive:{group}:{owner}` | string, PX | an instance's liveness in a shard where it owns units: one key per shard, renewed per heartbeat |
//! | `{s}convoy:published:{category}` | counter | partitioned events published to the shard, and dead letters replayed (`convoy_lag` = the sum over shards of this − acked) |
//! | `{s}convoy:acked:{group}:{category}` | counter | partitioned events of the shard a group finished: acknowledged, or skipped or dead-lettered by an operator |
//! | `convoy:key_field:{category}` | string | the field the category's events are partitioned by, recorded by the first engine or publisher that knows it; every other one must use the same (or refuses to start, publish or commit) |
//! | `{s}convoy:producer:{id}:sent` | sorted set, PX (kept for good for an elected relay) | the outbox seqs a producer published to the shard that it may still send again (drops re-sent records; trimmed below the oldest record not settled when an accepted batch was sent, every row below it being settled) |
//! | `{s}convoy:producer:{id}:epoch` | string, PX (kept for good for an elected relay) | the fencing epoch of the producer's newest publisher, as the shard saw it: raised in every shard by a new relay leader before it reads a row (refuses a replaced relay) |
//! | `{s}convoy:producer:{id}:last` | string, PX (kept for good for an elected relay) | the id of the producer's last publish call that ran in the shard: a batch sent behind another one still in flight runs only if that one ran |
//! | `{s}convoy:audit` | stream | operator actions on the shard's partitions (see [`admin`](super::admin)) |
//! | `{category}:__wake__` | stream | entries naming the keys of a partitioned publish or release (`k` = key), capped; wakes owners (a hint: on one server written by the publish script, on a cluster after it) |
//! | `convoy:shards:{category}` | string | the category's shard count, recorded by the first engine or publisher; fixed |
//! | `convoy:categories` | set | categories engines registered handlers for (operators' tools find every shard from it) |
//! | `convoy:scope:{group}` | string | `*` for a sequential process manager, whose units are correlation values spanning categories (leases `{s}convoy:lease:{pm}:*:{value}`); absent for handlers (units named by category) |
//! | `convoy:instances:{group}` | sorted set | live instances of a group, scored by expiry (ms) |
//! | `convoy:paused:{group}:{owner}` | string, PX | while an instance's handler is paused by an outage of its dependency: when the pause started (ms); renewed per heartbeat, deleted once it resumes |
//! | `convoy:pm:{process manager}:{value}` | hash | a process-manager instance: `version`, `state` (JSON), `ended`, `applied` |
//! | `convoy:audit` | stream | operator actions outside any shard (the outbox's `retry` and `discard`) |
//!
//! A unit's scope is its handler's category, or `*` for a sequential
//! process manager (its units are correlation values). The categories of
//! one process manager must have the same shard count: a correlation
//! value's streams in each are then in one shard, and so in one hash slot.

pub use convoy_core::names::{
    AUDIT_STREAM, CATEGORIES, DEFAULT_SHARDS, MAX_SHARDS, acked, alive, audit, backfill_stream,
    base_backfill_stream, base_groups, base_shard, base_stream, category_dlq, groups, instances,
    key_field, lease, partition_dlq, partition_index, partition_stream, paused, pm_state,
    producer_epoch, producer_last, producer_sent, published, scope, shard_in, shard_of, shards,
    tag, unit, wake_stream,
};
