//! Where a published event goes on Redis: the one routing function, owned
//! by the broker. The outbox hands the broker records (the envelope holds
//! the category, the partition key and the priority); only this module
//! turns them into shards and stream names (from [`names`]), with the
//! domain's layout that [`Broker::configure`](convoy_core::broker::Broker::configure)
//! gave the broker. No stream name is built elsewhere and parsed here.

use std::collections::BTreeMap;

use convoy_core::broker::Publication;
use convoy_core::config::{BrokerConfig, Config, PriorityLanesConfig};
use convoy_core::envelope::Priority;
use convoy_core::names;

/// What routing needs of a domain's configuration: the shard counts
/// (`[broker] shards`, `[broker.category_shards]`) and the priority lanes
/// (`[server.priority_lanes]`).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Routing {
    shards: BrokerConfig,
    lanes: PriorityLanesConfig,
}

/// One record's destination.
#[derive(Debug)]
pub(crate) struct Routed<'a> {
    /// The record.
    pub(crate) publication: &'a Publication,
    /// The stream to append to.
    pub(crate) stream: String,
    /// The partition key, when the stream is a partition (the key is added
    /// to the shard's partition index).
    pub(crate) partition: Option<&'a str>,
}

impl Routing {
    /// The layout of `config`.
    pub(crate) fn of(config: &Config) -> Routing {
        Routing {
            shards: config.broker.clone(),
            lanes: config.server.priority_lanes.clone(),
        }
    }

    /// The shard counts.
    pub(crate) fn shards(&self) -> &BrokerConfig {
        &self.shards
    }

    /// Where one record goes:
    ///
    /// - with a partition key: `{s}{category}:{key}` in the key's shard `s`
    ///   of the category's shard count, or `{s}{category}:{key}:{backfill}`
    ///   for a low-priority event with lanes on;
    /// - without: `{s}{category}` in the category's own shard, or
    ///   `{s}{category}:{backfill}` for a low-priority event with lanes on.
    pub(crate) fn route<'a>(&self, p: &'a Publication) -> (u32, Routed<'a>) {
        let e = &p.envelope;
        let category = e.category.as_str();
        let n = self.shards.shards_of(category);
        let backfill = self.lanes.enabled && e.priority == Priority::Low;
        let suffix = &self.lanes.backfill_suffix;
        let key = e.partition_key.as_deref();
        let (shard, stream) = match (key, backfill) {
            (Some(k), false) => {
                let s = names::shard_of(k, n);
                (s, names::partition_stream(s, category, k))
            }
            (Some(k), true) => {
                let s = names::shard_of(k, n);
                (s, names::backfill_stream(s, category, k, suffix))
            }
            (None, false) => (
                names::base_shard(category, n),
                names::base_stream(category, n),
            ),
            (None, true) => (
                names::base_shard(category, n),
                names::base_backfill_stream(category, suffix, n),
            ),
        };
        let routed = Routed {
            publication: p,
            stream,
            partition: key,
        };
        (shard, routed)
    }

    /// A batch's records by shard, each shard's in the batch's order.
    pub(crate) fn by_shard<'a>(&self, batch: &'a [Publication]) -> BTreeMap<u32, Vec<Routed<'a>>> {
        let mut out: BTreeMap<u32, Vec<Routed<'a>>> = BTreeMap::new();
        for p in batch {
            let (shard, routed) = self.route(p);
            out.entry(shard).or_default().push(routed);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use convoy_core::envelope::Envelope;

    fn routing(enabled: bool, suffix: &str, shards: u32) -> Routing {
        let mut config = Config::default();
        config.broker.shards = shards;
        config.server.priority_lanes = PriorityLanesConfig {
            enabled,
            backfill_suffix: suffix.into(),
        };
        Routing::of(&config)
    }

    fn publication(key: Option<&str>, priority: Priority) -> Publication {
        Publication {
            seq: 1,
            envelope: std::sync::Arc::new(Envelope {
                id: "m".into(),
                type_name: "T".into(),
                category: "order".into(),
                partition_key: key.map(str::to_owned),
                time_ms: 0,
                priority,
                correlation_id: None,
                payload: "{}".into(),
                origin: None,
                replay: None,
            }),
        }
    }

    #[test]
    fn table() {
        let r = |key, prio, on| {
            let p = publication(key, prio);
            let (shard, routed) = routing(on, "backfill", 16).route(&p);
            assert_eq!(names::shard_in(&routed.stream), Some(shard));
            (routed.stream, routed.partition.map(str::to_owned))
        };
        let k = names::tag(names::shard_of("c1", 16));
        let base = names::tag(names::shard_of("order", 16));
        let c1 = Some("c1".to_owned());
        assert_eq!(
            r(Some("c1"), Priority::Normal, false),
            (format!("{k}order:c1"), c1.clone())
        );
        assert_eq!(
            r(Some("c1"), Priority::Low, false),
            (format!("{k}order:c1"), c1.clone())
        );
        assert_eq!(
            r(Some("c1"), Priority::Low, true),
            (format!("{k}order:c1:backfill"), c1.clone())
        );
        assert_eq!(
            r(Some("c1"), Priority::Normal, true),
            (format!("{k}order:c1"), c1)
        );
        assert_eq!(
            r(None, Priority::Normal, true),
            (format!("{base}order"), None)
        );
        assert_eq!(
            r(None, Priority::Low, true),
            (format!("{base}order:backfill"), None)
        );
    }

    #[test]
    fn custom_suffix() {
        let p = publication(Some("c1"), Priority::Low);
        assert_eq!(
            routing(true, "slow", 1).route(&p).1.stream,
            "{0}order:c1:slow"
        );
    }

    #[test]
    fn a_category_of_its_own_shard_count_is_routed_with_it() {
        let mut config = Config::default();
        config.broker.category_shards.insert("order".into(), 64);
        let routing = Routing::of(&config);
        let p = publication(Some("b"), Priority::Normal);
        let (shard, routed) = routing.route(&p);
        assert_eq!(shard, names::shard_of("b", 64));
        assert_eq!(
            routed.stream,
            names::partition_stream(names::shard_of("b", 64), "order", "b")
        );
        let batch = [p.clone(), publication(None, Priority::Normal)];
        let by_shard = routing.by_shard(&batch);
        assert_eq!(by_shard.values().map(Vec::len).sum::<usize>(), 2);
        assert!(by_shard.contains_key(&names::base_shard("order", 64)));
    }
}
