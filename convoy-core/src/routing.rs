//! Where a published event goes: the one routing function of the outbox
//! processor (the "publish" column of the README's rule table). The names
//! themselves come from [`names`](crate::names).

use crate::broker::Capabilities;
use crate::config::PriorityLanesConfig;
use crate::envelope::Priority;
use crate::names;

/// The physical destination of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Route {
    /// The stream to append to.
    pub(crate) stream: String,
    /// The partition key when it was applied (the stream is a partition and
    /// the key must be added to the category's partition index).
    pub(crate) partition: Option<String>,
}

/// Routes an event of `category` with an (already validated) `key`.
///
/// - partitioned, broker with `STREAM_PARTITIONING`: `{s}{category}:{key}`
///   in the key's shard `s` of the category's `shards`, or
///   `{s}{category}:{key}:{backfill}` for a low-priority event with lanes on;
/// - otherwise (no key, or the broker lacks the capability: the key is
///   carried on the envelope but not applied): `{s}{category}` in the
///   category's own shard, or `{s}{category}:{backfill}` for a low-priority
///   event with lanes on.
pub(crate) fn route(
    category: &str,
    key: Option<&str>,
    priority: Priority,
    caps: Capabilities,
    lanes: &PriorityLanesConfig,
    shards: u32,
) -> Route {
    let backfill = lanes.enabled && priority == Priority::Low;
    let key = key.filter(|_| caps.contains(Capabilities::STREAM_PARTITIONING));
    let suffix = &lanes.backfill_suffix;
    let stream = match (key, backfill) {
        (Some(k), false) => names::partition_stream(names::shard_of(k, shards), category, k),
        (Some(k), true) => names::backfill_stream(names::shard_of(k, shards), category, k, suffix),
        (None, false) => names::base_stream(category, shards),
        (None, true) => names::base_backfill_stream(category, suffix, shards),
    };
    Route {
        stream,
        partition: key.map(str::to_owned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lanes(enabled: bool) -> PriorityLanesConfig {
        PriorityLanesConfig {
            enabled,
            backfill_suffix: "backfill".into(),
        }
    }

    const P: Capabilities = Capabilities::STREAM_PARTITIONING;
    const NONE: Capabilities = Capabilities::NONE;

    #[test]
    fn table() {
        let r = |key, prio, caps, on| route("order", key, prio, caps, &lanes(on), 16).stream;
        let k = names::tag(names::shard_of("c1", 16));
        let base = names::tag(names::shard_of("order", 16));
        assert_eq!(
            r(Some("c1"), Priority::Normal, P, false),
            format!("{k}order:c1")
        );
        assert_eq!(
            r(Some("c1"), Priority::Low, P, false),
            format!("{k}order:c1")
        );
        assert_eq!(
            r(Some("c1"), Priority::Low, P, true),
            format!("{k}order:c1:backfill")
        );
        assert_eq!(
            r(Some("c1"), Priority::Normal, P, true),
            format!("{k}order:c1")
        );
        assert_eq!(
            r(Some("c1"), Priority::Normal, NONE, true),
            format!("{base}order")
        );
        assert_eq!(
            r(Some("c1"), Priority::Low, NONE, true),
            format!("{base}order:backfill")
        );
        assert_eq!(r(None, Priority::Normal, P, true), format!("{base}order"));
        assert_eq!(
            r(None, Priority::Low, P, true),
            format!("{base}order:backfill")
        );
        assert_eq!(
            route("order", Some("c1"), Priority::Normal, P, &lanes(false), 16)
                .partition
                .as_deref(),
            Some("c1")
        );
        assert_eq!(
            route(
                "order",
                Some("c1"),
                Priority::Normal,
                NONE,
                &lanes(false),
                16
            )
            .partition,
            None
        );
    }

    #[test]
    fn custom_suffix() {
        let l = PriorityLanesConfig {
            enabled: true,
            backfill_suffix: "slow".into(),
        };
        assert_eq!(
            route("order", Some("c1"), Priority::Low, P, &l, 1).stream,
            "{0}order:c1:slow"
        );
    }
}
