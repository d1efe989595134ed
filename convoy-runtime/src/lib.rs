//! convoy: per-key ordered event handling on Redis Streams.
//!
//! Handlers declared `#[event_handler(part_of = Order, sequential_by = "client_id")]`
//! never handle two events with the same `client_id` at the same time, and
//! their effects land in publish order, while different keys run in
//! parallel across any number of engine processes. Delivery is
//! at-least-once: after a crash or a stall, the one event a key had in
//! flight may run again; it is never skipped.
//!
//! # Example
//!
//! A domain on the inline broker (in-process, no services); the same code
//! runs on Redis with `[broker] url = "redis://..."` in `domain.toml`.
//!
//! ```standalone_crate
//! use std::sync::{Arc, Mutex};
//!
//! use convoy_runtime::{Aggregate, Context, Domain, Event, HandlerError, event_handler};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Aggregate)]
//! #[aggregate(category = "order")]
//! struct Order;
//!
//! #[derive(Event, Serialize, Deserialize)]
//! #[event(part_of = Order)]
//! struct OrderPlaced {
//!     order_id: String,
//!     client_id: String,
//! }
//!
//! struct ClientLedger {
//!     seen: Arc<Mutex<Vec<String>>>,
//! }
//!
//! #[event_handler(part_of = Order, sequential_by = "client_id")]
//! impl ClientLedger {
//!     #[handle]
//!     async fn placed(&self, e: OrderPlaced, ctx: &Context) -> Result<(), HandlerError> {
//!         assert_eq!(ctx.partition_key(), Some(e.client_id.as_str()));
//!         self.seen.lock().unwrap().push(e.order_id);
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), convoy_runtime::Error> {
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let domain = Domain::builder()
//!     .handler(ClientLedger { seen: seen.clone() })
//!     .init()?; // every declaration checked, all problems reported at once
//! let mut uow = domain.unit_of_work();
//! uow.raise(OrderPlaced { order_id: "o-1".into(), client_id: "acme".into() })?;
//! uow.raise(OrderPlaced { order_id: "o-2".into(), client_id: "acme".into() })?;
//! // A key that cannot name a stream fails the caller, and nothing is kept.
//! assert!(uow.raise(OrderPlaced { order_id: "o-3".into(), client_id: "a:b".into() }).is_err());
//! uow.commit().await?;
//! domain.engine().run_until_idle().await?;
//! assert_eq!(*seen.lock().unwrap(), ["o-1", "o-2"]);
//! # Ok(())
//! # }
//! ```
//!
//! # Features
//!
//! | feature | what |
//! | --- | --- |
//! | `testing` | the test kit in [`testing`] (the `convoy-testkit` crate, re-exported): a real `redis-server` (and a PostgreSQL server) started and stopped, frozen, killed or restarted; a fault-injection proxy; engines in child processes; a cross-process recorder of what handlers saw; the per-key order checker |
//! | `postgres` | the PostgreSQL outbox (`postgres::PgOutbox`): events committed in your own sqlx transaction, one fenced relay among replicas, exactly-once handler effects (`postgres::AppliedEvents`) |
//! | `prometheus` | [`metrics::install_prometheus`]: a Prometheus scrape endpoint for convoy's metrics |
//! | `tls` | `rediss://` URLs: rustls (ring, webpki roots, or a CA of your own); without it no TLS crate is compiled and a `rediss://` URL is a configuration error naming the feature |
//!
//! None is on by default.
//!
//! # Guides
//!
//! Beyond the API, in [`docs`] (the same pages as the repository's `docs/`
//! folder): [getting started](docs::getting_started),
//! [configuration](docs::configuration) (every `domain.toml` key),
//! [guarantees and failure model](docs::guarantees),
//! [the PostgreSQL outbox](docs::postgres_outbox),
//! [Redis Cluster](docs::redis_cluster), [operations](docs::operations),
//! [performance](docs::performance) and [internals](docs::internals).
//!
//! # Design
//!
//! convoy is built in layers, and each layer below the assembly is a crate
//! of its own, so the compiler enforces what may import what: a crate sees
//! only the crates it depends on, and the files of a crate import each
//! other without a cycle. This crate, `convoy-runtime`, is the one users
//! add: it holds the assembly and re-exports the others under the paths
//! documented here (`convoy_runtime::config`, `convoy_runtime::redis`, ...).
//!
//! | crate | files | what |
//! | --- | --- | --- |
//! | `convoy-core` | vocabulary: `error.rs`, `key.rs`, `message.rs`, `envelope.rs`, `config/`, `metrics.rs`, `log/`, `future.rs`, `backoff.rs` | the error type, the key rules, message traits and descriptors, the envelope, `domain.toml`, metric names, the Redis client's log noise rate-limited, `BoxFuture`, the one retry back-off |
//! | | handler contracts: `raise.rs`, `handler.rs`, `process_manager.rs`, `registry/` | raising events (key extraction and checks), handler and process-manager traits and descriptors, [`Context`], [`Fence`], the registry and the checks of `Domain::init` |
//! | | delivery contracts: `names.rs`, `outbox/`, `broker/mod.rs`, `broker/plan.rs`, `broker/outage.rs` | every stream and key name, the outbox store, its processor and its relay (one publishing loop, an [`Election`](outbox::Election) for a shared outbox), the [`Broker`] trait, the [`ConsumerPlan`](broker::ConsumerPlan) a broker consumes, a handler's outage pause |
//! | | the inline broker: `broker/inline.rs` | [`InlineBroker`]: in-process, no services |
//! | `convoy-redis` | `src/` (re-exported as [`redis`]) | the Redis broker: connections, units, one typed binding per Lua script, the partitioned and plain consumers, the operators' tools; depends on `convoy-core` only |
//! | `convoy-postgres` | `src/` (re-exported as `postgres`, feature `postgres`) | the PostgreSQL outbox, its relay and the exactly-once helper; depends on `convoy-core` only |
//! | `convoy-runtime` | assembly: `domain.rs`, `uow.rs`, `engine.rs`, `engine_runtime.rs`, `signal.rs`; `private.rs` | [`Domain`] and its builder (it picks the broker and the outbox from the configuration), [`UnitOfWork`] over the outbox, [`Engine`] (with `Domain::engine`), [`shutdown_signal`]; the support of the macros' generated code |
//!
//! A broker never imports the domain, the engine or the unit of work, and
//! `convoy-redis` and `convoy-postgres` never import each other: neither
//! depends on the other crate. Their log lines keep the targets of the
//! modules they come from as paths of this crate
//! (`convoy_runtime::redis::partitioned::worker`, ...), so a filter on
//! `convoy_runtime` selects all of convoy's own lines.
//!
//! Where each rule of the specification is enforced:
//!
//! | rule | where |
//! | --- | --- |
//! | the key field exists, and its type can be a key | at compile time, by the macros (`convoy-macros`) |
//! | every rule of `Domain::init`, one function each (`check_one_key_per_category`, `check_broker_partitions`, ...) | `convoy-core/src/registry/checks.rs` |
//! | a key value's rules (not null or empty, no `:`, not `dlq`, the backfill suffix or `__name__`) | `convoy-core/src/key.rs` (`check_key`), applied at raise in `convoy-core/src/raise.rs` and again at publish in `convoy-core/src/outbox/processor.rs` |
//! | where a published event goes (the broker routes: shards, streams, lanes) | `convoy-redis/src/routing.rs`, with the names of `convoy-core/src/names.rs` |
//! | single active consumer per unit: leases, fences, incarnations, generations | `convoy-redis/src/lua/acquire.lua`, `convoy-redis/src/lua/fence.lua`, and their bindings in `convoy-redis/src/scripts/` |
//! | reclaim, retries in place, halt, reaping, lanes | `convoy-redis/src/partitioned/worker.rs`, its phases (reclaim, pending, new, idle, resting, halted) in `convoy-redis/src/partitioned/phase.rs`, its I/O in `convoy-redis/src/partitioned/unit_io.rs` |
//! | fair sharing, liveness, discovery | `convoy-redis/src/partitioned/ownership.rs` (fair share, taking and giving up units, orphans), `convoy-redis/src/partitioned/membership.rs` (registration, liveness, incarnations, deadlines, heartbeat), `convoy-redis/src/partitioned/discovery.rs`; the coordinator's loop in `convoy-redis/src/partitioned/mod.rs` |
//! | outbox rows of one key commit in id order (a transaction-scoped advisory lock per key) | `convoy-postgres/src/insert.rs` |
//! | one relay publishes a PostgreSQL outbox; a replaced one is fenced by its epoch, raised in every shard before the new leader reads a row | `convoy-core/src/outbox/relay.rs` (the election's [`Term`](outbox::Term)s and the one publishing loop), `convoy-postgres/src/relay.rs` (the advisory-lock election), `convoy-core/src/outbox/processor.rs` (`Broker::take_over`), `convoy-redis/src/lua/publish.lua` |
//! | a category's partition key is the same in every process (declared on the aggregate, recorded in Redis) | `convoy-macros` (compile time), `convoy-core/src/registry/checks.rs`, `convoy-core/src/raise.rs`, `convoy-redis/src/layout.rs`, `convoy-core/src/broker/mod.rs` (`KeyUse`), `convoy-core/src/outbox/processor.rs` |
//! | outage, not poison: transient failures retried without counting; a handler pauses on an outage | `convoy-core/src/handler.rs` (`HandlerError`), `convoy-core/src/broker/outage.rs`, `convoy-redis/src/partitioned/worker.rs` |
//! | a re-sent outbox record never makes a second stream entry (dropped by its own seq) | `convoy-redis/src/lua/publish.lua` |
//! | exactly-once, fenced handler effects in PostgreSQL, by the event's identity (its origin) | `convoy-postgres/src/applied.rs`, `convoy-core/src/envelope.rs` (`Origin`) |
//! | operators' actions, atomic against the owner | `convoy-redis/src/admin/` and `convoy-redis/src/lua/head_action.lua` |

#![cfg_attr(docsrs, feature(doc_cfg))]

#[allow(unused_extern_crates)]
// lets generated `::convoy_runtime` paths resolve in this crate's own tests
extern crate self as convoy_runtime;

// The layers below the assembly, under their paths of before the split.
#[doc(inline)]
pub use convoy_core::{
    broker, config, envelope, handler, key, log, message, metrics, outbox, process_manager,
    registry,
};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[doc(inline)]
pub use convoy_postgres as postgres;
#[doc(inline)]
pub use convoy_redis as redis;

// the assembly
mod domain;
mod engine;
mod engine_runtime;
mod signal;
mod uow;

#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing {
    //! The test kit: everything of the [`convoy_testkit`] crate (its docs
    //! describe the pieces: real Redis, Redis Cluster, Valkey and
    //! PostgreSQL servers, the fault proxy, engines in child processes, the
    //! recorder and the per-key order checker), plus [`script_sha`], which
    //! names convoy's own Lua scripts for the fault proxy's
    //! [`Match::Script`].
    //!
    //! The kit is a crate of its own and depends on nothing of the runtime;
    //! this module is how users of the runtime reach it
    //! (`convoy_runtime::testing::RedisServer`, ...).
    //!
    //! # Example: an engine behind the fault proxy
    //!
    //! An engine whose connection to Redis goes through the proxy, and whose
    //! next fenced read runs in Redis (what it reads becomes pending for this
    //! engine) while its reply never reaches the engine:
    //!
    //! ```no_run
    //! # // Its own names: doc tests are merged into one binary, where every
    //! # // registered type name must be unique.
    //! # use convoy_runtime::{Aggregate, Event, HandlerError, event_handler};
    //! # use serde::{Deserialize, Serialize};
    //! # #[derive(Aggregate)]
    //! # #[aggregate(category = "payment")]
    //! # struct Payment;
    //! # #[derive(Event, Serialize, Deserialize)]
    //! # #[event(part_of = Payment)]
    //! # struct PaymentTaken {
    //! #     client_id: String,
    //! # }
    //! # struct Payments;
    //! # #[event_handler(part_of = Payment, sequential_by = "client_id")]
    //! # impl Payments {
    //! #     #[handle]
    //! #     async fn taken(&self, _e: PaymentTaken) -> Result<(), HandlerError> {
    //! #         Ok(())
    //! #     }
    //! # }
    //! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    //! use std::net::SocketAddr;
    //!
    //! use convoy_runtime::testing::{FaultProxy, Match, RedisServer, script_sha};
    //! use convoy_runtime::{Config, Domain};
    //!
    //! let server = RedisServer::start()?;
    //! let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], server.port())))?;
    //!
    //! // The engine talks to Redis through the proxy.
    //! let mut config = Config::default();
    //! config.broker.url = proxy.url();
    //! let domain = Domain::builder().config(config).handler(Payments).init()?;
    //!
    //! // Swallow the reply of the next read of new entries that Redis runs
    //! // (a plain XREADGROUP, then the check that ends its pipeline).
    //! let check = script_sha("verify").expect("convoy ships verify.lua");
    //! proxy.drop_reply(Match::Script(check), 1);
    //!
    //! let engine = domain.engine().spawn();
    //! let mut uow = domain.unit_of_work();
    //! uow.raise(PaymentTaken { client_id: "acme".into() })?;
    //! uow.commit().await?;
    //! // ... wait until the handler saw the event (a `Recorder` tells) ...
    //! engine.shutdown().await?;
    //!
    //! // The fault really happened, and the engine recovered from it: check
    //! // with `Recorder` and `check_order` that the event was handled, in order.
    //! assert_eq!(proxy.fired(), 1);
    //! # Ok(())
    //! # }
    //! ```

    #[doc(no_inline)]
    pub use convoy_redis::script_sha;
    pub use convoy_testkit::*;
}

/// The README's Rust snippets, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

/// The guides: the repository's `docs/*.md`, one module each. They hold no
/// code; their Rust snippets are compiled (and most of them run) as doc
/// tests.
pub mod docs {
    /// One guide from `docs/`. The pages link to each other by reference
    /// labels, defined at the end of each page as `.md` files for readers
    /// of the repository; defined first here, the same labels point at the
    /// modules (the first definition of a label wins). The docs test of
    /// the workspace checks that both agree.
    macro_rules! guide {
        ($(#[$attr:meta])* pub mod $name:ident {}) => {
            #[doc = "[getting-started]: crate::docs::getting_started"]
            #[doc = "[configuration]: crate::docs::configuration"]
            #[doc = "[guarantees]: crate::docs::guarantees"]
            #[doc = "[handler-failures]: crate::docs::guarantees#when-a-handler-fails"]
            #[doc = "[postgres-outbox]: crate::docs::postgres_outbox"]
            #[doc = "[redis-cluster]: crate::docs::redis_cluster"]
            #[doc = "[cluster-loss]: crate::docs::redis_cluster#what-a-master-crash-can-lose"]
            #[doc = "[operations]: crate::docs::operations"]
            #[doc = "[acl]: crate::docs::operations#least-privilege-redis-user"]
            #[doc = "[performance]: crate::docs::performance"]
            #[doc = "[cluster-cost]: crate::docs::performance#redis-cluster"]
            #[doc = "[internals]: crate::docs::internals"]
            #[doc = ""]
            $(#[$attr])*
            pub mod $name {}
        };
    }

    guide! {
        #[doc = include_str!("../../docs/getting-started.md")]
        pub mod getting_started {}
    }
    guide! {
        #[doc = include_str!("../../docs/configuration.md")]
        pub mod configuration {}
    }
    guide! {
        #[doc = include_str!("../../docs/guarantees.md")]
        pub mod guarantees {}
    }
    guide! {
        // Its snippets use sqlx and the `postgres` module.
        #[cfg_attr(feature = "postgres", doc = include_str!("../../docs/postgres-outbox.md"))]
        #[cfg_attr(
            not(feature = "postgres"),
            doc = "# The PostgreSQL outbox\n\nThis guide needs the `postgres` feature: \
                   build the documentation with it, or read `docs/postgres-outbox.md`."
        )]
        pub mod postgres_outbox {}
    }
    guide! {
        #[doc = include_str!("../../docs/redis-cluster.md")]
        pub mod redis_cluster {}
    }
    guide! {
        #[doc = include_str!("../../docs/operations.md")]
        pub mod operations {}
    }
    guide! {
        #[doc = include_str!("../../docs/performance.md")]
        pub mod performance {}
    }
    guide! {
        #[doc = include_str!("../../docs/internals.md")]
        pub mod internals {}
    }
}

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

// Listed as re-exports, as they were when the modules were this crate's.
#[doc(no_inline)]
pub use convoy_core::{
    Aggregate, BoxFuture, Broker, Capabilities, Command, CommandHandler, Config, Context, Envelope,
    Error, ErrorClass, ErrorClassifier, Event, EventHandler, Fence, Gap, Handle, HandlerError,
    InlineBroker, KeyRule, Message, Origin, PartitionKey, Position, Priority, Problem, Problems,
    ProcessManager, Replay,
};
pub use domain::{Domain, DomainBuilder};
pub use engine::{Engine, EngineHandle, Health};
pub use signal::shutdown_signal;
/// The shutdown token brokers receive (re-exported from `tokio-util`).
pub use tokio_util::sync::CancellationToken;
pub use uow::UnitOfWork;

#[doc(inline)]
pub use convoy_macros::{
    Aggregate, Command, Event, command_handler, event_handler, process_manager,
};
