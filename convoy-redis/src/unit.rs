//! A unit: what one lease covers, for one handler (consumer group). For a
//! handler, one partition key of its category; for a sequential process
//! manager, one correlation value across every category it subscribes to.
//!
//! A unit is named by its handler, its scope (the handler's category, or
//! `*` for a process manager) and its key; every Redis name it uses is
//! derived from those once, here. Every one of them starts with the hash
//! tag of the key's shard, so each script on a unit touches one hash slot.

use convoy_core::names;

/// One category's streams of a unit, and the category's names it touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lane {
    pub(crate) category: String,
    /// `{s}{category}:{key}`.
    pub(crate) primary: String,
    /// `{s}{category}:{key}:{backfill}`, or `""` when lanes are off.
    pub(crate) backfill: String,
    /// The backfill stream's name even when lanes are off (reaping and the
    /// operators' tools cover it).
    pub(crate) backfill_always: String,
    /// `{s}{category}:__partitions__`.
    pub(crate) index: String,
    /// `{category}:__wake__` (outside the shard: written on its own).
    pub(crate) wake: String,
    /// `{s}convoy:groups:{category}`.
    pub(crate) groups: String,
    /// `{s}convoy:acked:{group}:{category}`.
    pub(crate) acked: String,
}

/// Which stream of a unit: a lane, primary or backfill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct At {
    /// The lane (category), by position.
    pub(crate) lane: usize,
    /// The backfill stream rather than the primary one.
    pub(crate) backfill: bool,
}

/// A unit and its names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unit {
    /// The handler (consumer group).
    pub(crate) group: String,
    /// The partition key, or the correlation value.
    pub(crate) key: String,
    /// The key's shard.
    pub(crate) shard: u32,
    /// `{s}convoy:lease:{group}:{scope}:{key}`.
    pub(crate) lease: String,
    /// `{s}convoy:unit:{group}:{scope}:{key}`.
    pub(crate) state: String,
    /// One per category the unit spans.
    pub(crate) lanes: Vec<Lane>,
}

impl Unit {
    /// The unit `key` of `group` under `scope`, spanning `categories` (of
    /// `shards` shards each), with the backfill lane suffix `suffix` (its
    /// streams are read only when `lanes_on`).
    pub(crate) fn new<'c>(
        group: &str,
        scope: &str,
        key: &str,
        categories: impl IntoIterator<Item = &'c str>,
        suffix: &str,
        lanes_on: bool,
        shards: u32,
    ) -> Unit {
        let shard = names::shard_of(key, shards);
        let lanes = categories
            .into_iter()
            .map(|c| {
                let backfill_always = names::backfill_stream(shard, c, key, suffix);
                Lane {
                    category: c.to_owned(),
                    primary: names::partition_stream(shard, c, key),
                    backfill: if lanes_on {
                        backfill_always.clone()
                    } else {
                        String::new()
                    },
                    backfill_always,
                    index: names::partition_index(shard, c),
                    wake: names::wake_stream(c),
                    groups: names::groups(shard, c),
                    acked: names::acked(shard, group, c),
                }
            })
            .collect();
        Unit {
            group: group.to_owned(),
            key: key.to_owned(),
            shard,
            lease: names::lease(shard, group, scope, key),
            state: names::unit(shard, group, scope, key),
            lanes,
        }
    }

    /// The lane of `at`.
    pub(crate) fn lane(&self, at: At) -> &Lane {
        &self.lanes[at.lane]
    }

    /// Whether the unit's backfill lanes are read (priority lanes on).
    pub(crate) fn backfill_on(&self) -> bool {
        !self.lanes.is_empty() && self.lanes.iter().all(|l| !l.backfill.is_empty())
    }

    /// Whether the unit reads one stream only: one category, priority lanes
    /// off (a short batch then means drained, and new entries are read
    /// natively, see `scripts::read`).
    pub(crate) fn one_stream(&self) -> bool {
        self.lanes.len() == 1 && !self.backfill_on()
    }

    /// The stream of `at`.
    pub(crate) fn stream(&self, at: At) -> &str {
        let l = self.lane(at);
        if at.backfill { &l.backfill } else { &l.primary }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_of_a_unit_is_in_its_key_s_shard() {
        let u = Unit::new("g", "order", "k{x}", ["order"], "slow", true, 16);
        let tag = names::tag(names::shard_of("k{x}", 16));
        for n in [
            &u.lease,
            &u.state,
            &u.lanes[0].primary,
            &u.lanes[0].backfill,
            &u.lanes[0].index,
            &u.lanes[0].groups,
            &u.lanes[0].acked,
        ] {
            assert!(n.starts_with(&tag), "{n}");
        }
    }

    #[test]
    fn names_derive_from_handler_scope_and_key() {
        let u = Unit::new(
            "app::Pm",
            "*",
            "o-1",
            ["order", "payment"],
            "slow",
            false,
            1,
        );
        assert_eq!(u.shard, 0);
        assert_eq!(u.lease, "{0}convoy:lease:app::Pm:*:o-1");
        assert_eq!(u.state, "{0}convoy:unit:app::Pm:*:o-1");
        assert_eq!(u.lanes[1].primary, "{0}payment:o-1");
        assert_eq!(u.lanes[1].backfill, "");
        assert_eq!(u.lanes[1].backfill_always, "{0}payment:o-1:slow");
        assert_eq!(u.lanes[1].acked, "{0}convoy:acked:app::Pm:payment");
        let at = At {
            lane: 0,
            backfill: false,
        };
        assert_eq!(u.stream(at), "{0}order:o-1");
    }
}
