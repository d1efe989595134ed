//! Every stream and key name convoy uses, derived in one place (the
//! outbox's routing, both brokers, the operators' tools and the Lua scripts,
//! which receive every name in `KEYS`, all take their names from here).
//!
//! The table of every key, with its type and use, is in the public view of
//! this module, `convoy_runtime::redis::keys`.
//!
//! # Shards
//!
//! A category is spread over a fixed number of *shards*: a partition key
//! (or a process manager's correlation value) belongs to shard
//! `fnv1a(key) mod shards`. Every key a script touches together with a unit
//! (its streams, lease and state, its owner's liveness, the category's
//! index, group set and counters, a publisher's dedup set) starts with the
//! shard's hash tag `{s}`, so each script touches one Redis Cluster hash
//! slot. The tag comes first, so `{` or `}` in a key value cannot move a
//! key's slot. The tag holds the shard only, not the category: the streams
//! of one correlation value in every category of a process manager share a
//! slot, as long as those categories have the same number of shards (the
//! engine refuses to start otherwise). A category's events without a key go
//! to the shard of the category's name.
//!
//! A unit's *scope* is its handler's category, or [`CORRELATION_SCOPE`] for
//! a sequential process manager (its units are correlation values).

use std::fmt::Write as _;

use crate::key::DLQ_TOKEN;
pub use crate::key::OWN_PREFIX;

/// The scope of a sequential process manager's units: a correlation value
/// spans every category it subscribes to.
pub const CORRELATION_SCOPE: &str = "*";

/// The stream operator actions outside any shard are recorded in (the
/// outbox's `retry` and `discard`); actions on a partition are recorded in
/// its shard's [`audit`] stream, atomically with the action.
pub const AUDIT_STREAM: &str = "convoy:audit";

/// Approximate cap of each category's wake stream.
pub const WAKE_MAXLEN: u64 = 100_000;

pub use crate::config::{DEFAULT_SHARDS, MAX_SHARDS};

/// The shard of a partition key or correlation value among `shards`:
/// FNV-1a (64 bit) of its bytes, modulo `shards`. Fixed forever for a
/// category: changing a category's shard count moves its keys' streams.
pub fn shard_of(key: &str, shards: u32) -> u32 {
    let h = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (h % u64::from(shards.max(1))) as u32
}

/// `{s}`: the hash tag of shard `s`, the first characters of every key
/// of the shard.
pub fn tag(shard: u32) -> String {
    tagged(shard, &[])
}

/// `{s}` followed by `parts`, in one allocation of the right size: the
/// names of a unit's keys are made per published event, so without
/// `format!` and a string for the tag (that took about 1,700 instructions
/// for a partition stream's name).
fn tagged(shard: u32, parts: &[&str]) -> String {
    // At most ten digits.
    let len = 12 + parts.iter().map(|p| p.len()).sum::<usize>();
    let mut name = String::with_capacity(len);
    // Writing to a String cannot fail.
    let _ = write!(name, "{{{shard}}}");
    for part in parts {
        name.push_str(part);
    }
    name
}

/// The shard a key's name starts with (`{s}...`), if it has one.
pub fn shard_in(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('{')?;
    let (s, _) = rest.split_once('}')?;
    s.parse().ok()
}

/// The shard of a category's events without a partition key.
pub fn base_shard(category: &str, shards: u32) -> u32 {
    shard_of(category, shards)
}

/// `{s}{category}`: a category's events that carry no partition key.
pub fn base_stream(category: &str, shards: u32) -> String {
    tagged(base_shard(category, shards), &[category])
}

/// `{s}{category}:{suffix}`: the low-priority lane of a category's events
/// without a key.
pub fn base_backfill_stream(category: &str, suffix: &str, shards: u32) -> String {
    tagged(base_shard(category, shards), &[category, ":", suffix])
}

/// `{s}{category}:dlq`: dead letters of ordinary handlers.
pub fn category_dlq(category: &str, shards: u32) -> String {
    tagged(base_shard(category, shards), &[category, ":", DLQ_TOKEN])
}

/// `{s}convoy:groups:{category}:__base__`: consumer groups reading a
/// category's events without a key.
pub fn base_groups(category: &str, shards: u32) -> String {
    tagged(
        base_shard(category, shards),
        &["convoy:groups:", category, ":__base__"],
    )
}

/// `{s}{category}:{key}`: a key's primary lane, in the key's shard `s`.
pub fn partition_stream(shard: u32, category: &str, key: &str) -> String {
    tagged(shard, &[category, ":", key])
}

/// `{s}{category}:{key}:{suffix}`: a key's backfill lane.
pub fn backfill_stream(shard: u32, category: &str, key: &str, suffix: &str) -> String {
    tagged(shard, &[category, ":", key, ":", suffix])
}

/// `{s}{category}:{key}:dlq`: where an operator moves a halted partition's
/// head.
pub fn partition_dlq(shard: u32, category: &str, key: &str) -> String {
    tagged(shard, &[category, ":", key, ":", DLQ_TOKEN])
}

/// `{s}{category}:__partitions__`: the set of a shard's live partition keys
/// of a category.
pub fn partition_index(shard: u32, category: &str) -> String {
    tagged(shard, &[category, ":__partitions__"])
}

/// `{category}:__wake__` (no shard: written by the publish script on one
/// server and after it on a cluster, as a hint, and followed by one
/// blocking read per category).
pub fn wake_stream(category: &str) -> String {
    format!("{category}:__wake__")
}

/// `{s}convoy:groups:{category}`: the consumer groups reading a category's
/// partitions (one copy per shard, read by the shard's scripts).
pub fn groups(shard: u32, category: &str) -> String {
    tagged(shard, &["convoy:groups:", category])
}

/// `{s}convoy:lease:{group}:{scope}:{key}`.
pub fn lease(shard: u32, group: &str, scope: &str, key: &str) -> String {
    tagged(shard, &["convoy:lease:", group, ":", scope, ":", key])
}

/// `{s}convoy:alive:{group}:{owner}`: an instance's liveness in one shard.
pub fn alive(shard: u32, group: &str, owner: &str) -> String {
    tagged(shard, &["convoy:alive:", group, ":", owner])
}

/// `convoy:paused:{group}:{owner}`: set (to the pause's start, ms since the
/// Unix epoch, expiring with the liveness) while `owner`'s handler `group`
/// is paused by an outage of its dependency; the operators' tools show its
/// partitions as paused.
pub fn paused(group: &str, owner: &str) -> String {
    format!("convoy:paused:{group}:{owner}")
}

/// `{s}convoy:unit:{group}:{scope}:{key}`.
pub fn unit(shard: u32, group: &str, scope: &str, key: &str) -> String {
    tagged(shard, &["convoy:unit:", group, ":", scope, ":", key])
}

/// `{s}convoy:audit`: operator actions on the partitions of shard `s`.
pub fn audit(shard: u32) -> String {
    tagged(shard, &["convoy:audit"])
}

/// `convoy:categories`: every category an engine registered a handler for
/// (so operators' tools can find every shard).
pub const CATEGORIES: &str = "convoy:categories";

/// `convoy:scope:{group}`.
pub fn scope(group: &str) -> String {
    format!("convoy:scope:{group}")
}

/// `convoy:instances:{group}`.
pub fn instances(group: &str) -> String {
    format!("convoy:instances:{group}")
}

/// `convoy:shards:{category}`: a category's shard count, recorded by the
/// first engine or publisher and checked by every other one.
pub fn shards(category: &str) -> String {
    format!("convoy:shards:{category}")
}

/// `convoy:pauses:{category}`: operators' pauses of the category's keys and
/// key prefixes (a hash outside the shards).
pub fn pauses(category: &str) -> String {
    format!("convoy:pauses:{category}")
}

/// `convoy:key_field:{category}`: the field a category's events are
/// partitioned by, recorded by the first engine or publisher that knows it
/// and checked by every other one.
pub fn key_field(category: &str) -> String {
    format!("convoy:key_field:{category}")
}

/// `{s}convoy:published:{category}`: partitioned events published in a
/// shard.
pub fn published(shard: u32, category: &str) -> String {
    tagged(shard, &["convoy:published:", category])
}

/// `{s}convoy:acked:{group}:{category}`: partitioned events of a shard a
/// group finished.
pub fn acked(shard: u32, group: &str, category: &str) -> String {
    tagged(shard, &["convoy:acked:", group, ":", category])
}

/// `convoy:pm:{process manager}:{correlation value}` (in no shard: its
/// script touches this one key).
pub fn pm_state(pm: &str, id: &str) -> String {
    format!("convoy:pm:{pm}:{id}")
}

/// `{s}convoy:producer:{id}:sent`: the outbox seqs a producer published to
/// a shard that it may still send again (drops re-sent records).
pub fn producer_sent(shard: u32, id: &str) -> String {
    tagged(shard, &["convoy:producer:", id, ":sent"])
}

/// `{s}convoy:producer:{id}:epoch`: the fencing epoch of a producer's newest
/// publisher, as a shard saw it (refuses a replaced relay).
pub fn producer_epoch(shard: u32, id: &str) -> String {
    tagged(shard, &["convoy:producer:", id, ":epoch"])
}

/// `{s}convoy:producer:{id}:last`: the id of a producer's last publish
/// call that ran in a shard (a call sent behind another runs only after
/// it).
pub fn producer_last(shard: u32, id: &str) -> String {
    tagged(shard, &["convoy:producer:", id, ":last"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_comes_first_and_braces_in_a_key_cannot_move_it() {
        let s = partition_stream(3, "order", "{evil}");
        assert_eq!(s, "{3}order:{evil}");
        assert_eq!(shard_in(&s), Some(3));
        assert_eq!(
            redis::cluster_routing::Slot::for_key(s.as_bytes()),
            redis::cluster_routing::Slot::for_key(b"{3}")
        );
        assert_eq!(shard_in("order:k"), None);
    }

    #[test]
    fn names_are_pinned() {
        // Every deployed key has these names.
        for shard in [0, 7, 10, 99, 100, u32::MAX] {
            assert_eq!(tag(shard), format!("{{{shard}}}"));
        }
        assert_eq!(partition_stream(12, "order", "c-1"), "{12}order:c-1");
        assert_eq!(
            backfill_stream(0, "order", "c-1", "low"),
            "{0}order:c-1:low"
        );
        assert_eq!(partition_dlq(5, "order", ""), "{5}order::dlq");
        assert_eq!(
            lease(3, "app::H", "order", "k"),
            "{3}convoy:lease:app::H:order:k"
        );
        assert_eq!(base_groups("order", 1), "{0}convoy:groups:order:__base__");
        assert_eq!(producer_last(1, "p"), "{1}convoy:producer:p:last");
    }

    #[test]
    fn shards_are_stable_and_in_range() {
        // Pinned: a changed hash would move every deployed key's streams.
        assert_eq!(shard_of("c1", 16), shard_of("c1", 16));
        assert_eq!(shard_of("", 16), (0xcbf2_9ce4_8422_2325_u64 % 16) as u32);
        assert_eq!(
            shard_of("a", 1_000_000),
            (0xaf63_dc4c_8601_ec8c_u64 % 1_000_000) as u32
        );
        for k in ["a", "b", "order-17", "ü"] {
            assert!(shard_of(k, 7) < 7);
        }
        assert_eq!(shard_of("x", 0), 0);
    }
}
