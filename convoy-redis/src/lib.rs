//! The Redis Streams broker.
//!
//! It advertises `STREAM_PARTITIONING`: the outbox processor routes each
//! partitioned event to `{category}:{key}` and records the key in the
//! category's index, and each handler consumes every partition under an
//! ownership lease with a fencing token, so two events with one key are
//! never handled at once, anywhere. See [`keys`] for the key layout.
//!
//! # Consumers
//!
//! For a handler on a partitioned category, one coordinator per engine
//! instance (module `partitioned`):
//!
//! - discovers partitions from the index (never SCAN/KEYS) every heartbeat
//!   and when a wake-up names an unknown key;
//! - takes leases up to its fair share (partitions / live instances) and
//!   releases the surplus, letting each worker finish its event first;
//! - renews all its leases in one script call per heartbeat;
//! - runs one worker task per owned unit: reclaim earlier generations'
//!   pending entries, then fenced batch reads (primary lane before backfill),
//!   the local lease deadline checked before every event, one fenced ack per
//!   event, retries in place, halt on poison, reaping when idle;
//! - sleeps on wake-ups written by the publisher (`{category}:__wake__`)
//!   rather than polling idle partitions.
//!
//! Events of a category that carry no key, and categories no handler
//! partitions, go through an ordinary consumer group on `{category}`
//! (module `plain`) with retries and then `{category}:dlq`.
//!
//! # Layout
//!
//! | file | what |
//! | --- | --- |
//! | `broker.rs` | [`RedisBroker`]: the `Broker` implementation, publishing |
//! | `chain.rs` | the order of a producer's publish calls sent behind one another |
//! | `connection.rs` | the shared connection and the blocking-read connections |
//! | `unit.rs` | a unit (handler, scope, key) and every name derived from it |
//! | `scripts/` | one typed binding per Lua script of `lua/` |
//! | `partitioned/` | the partitioned consumer: coordinator, unit workers, acks committed in groups |
//! | `plain.rs` | the ordinary consumer group |
//! | `wake.rs` | following the wake streams |
//! | `state.rs` | process-manager instances (the broker's state store) |
//! | `admin/` | [`admin::Admin`]: the operators' tools, one file per operation |
//! | `acl.rs` | [`acl`]: the least-privilege ACL rule for a domain's categories |
//! | `reply.rs` | reading stream entries from replies |
//!
//! A broker implementation sees a [`ConsumerPlan`](convoy_core::broker::ConsumerPlan),
//! never the domain, the engine or a unit of work.

pub mod acl;
pub mod admin;
mod broker;
mod chain;
mod connection;
pub mod keys;
mod layout;
mod loss;
mod partitioned;
pub(crate) mod pause;
mod plain;
mod reply;
mod routing;
pub(crate) mod scripts;
mod state;
mod unit;
mod wake;

// logs under their targets of before the split (`convoy_runtime::redis::...`)
mod tracing {
    convoy_core::tracing_shim!($ "convoy_redis" => "convoy_runtime::redis");
}

pub use broker::RedisBroker;

/// The SHA1 (lowercase hex) of one of convoy's own Lua scripts, by its file
/// stem in `convoy-redis/src/lua/`: `"read"` (the fenced read),
/// `"verify"` (the check in the pipeline of a native read of new entries,
/// right behind its `XREADGROUP`), `"ack"`, `"claim"`, `"fail"`, `"acquire"`, `"release"`, `"reap"`,
/// `"publish"`, `"plain_ack"`, `"dead_letter"`, `"save_state"`,
/// `"head_action"`, `"replay"`. `None` for an unknown name.
///
/// Use it with the test kit's
/// `Match::Script` to hit one step of the
/// engine's protocol through the fault proxy (the kit itself knows nothing
/// of the runtime; it is re-exported as
/// `convoy_runtime::testing::script_sha`).
///
/// The hash is that of the script as the engine sends it (fenced scripts
/// carry the shared fence check in front of the file's code).
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub fn script_sha(name: &str) -> Option<String> {
    scripts::SCRIPTS
        .by_name(name)
        .map(|script| script.get_hash().to_owned())
}
