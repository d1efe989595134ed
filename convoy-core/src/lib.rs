//! The core of convoy: its vocabulary, the handler and delivery contracts,
//! and the inline broker.
//!
//! Use convoy through `convoy-runtime`, which re-exports everything public
//! here under the same paths (`convoy_runtime::config`,
//! `convoy_runtime::broker`, ...) and adds the Redis broker, the PostgreSQL
//! outbox and the assembly (`Domain`, `UnitOfWork`, `Engine`). This crate
//! depends on no broker and no store: `convoy-redis` and `convoy-postgres`
//! depend on it, and never on each other.
//!
//! Modules marked hidden (`names`, `raise`, `backoff`, ...) are
//! plumbing shared with convoy's other crates, not an API: they may change
//! in any release.
//!
//! | layer | files | what |
//! | --- | --- | --- |
//! | vocabulary | `error.rs`, `key.rs`, `message.rs`, `envelope.rs`, `config/`, `metrics.rs`, `log/`, `future.rs`, `backoff.rs` | the error type, the key rules, message traits and descriptors, the envelope, `domain.toml`, metric names, the Redis client's log noise rate-limited, `BoxFuture`, the one retry back-off |
//! | handler contracts | `raise.rs`, `handler.rs`, `process_manager.rs`, `registry/` | raising events (key extraction and checks), handler and process-manager traits and descriptors, [`Context`], [`Fence`], the registry and the checks of `Domain::init` |
//! | delivery contracts | `names.rs`, `outbox/`, `broker/mod.rs`, `broker/plan.rs`, `broker/outage.rs` | every stream and key name, the outbox store, its processor and its relay (one publishing loop, an [`Election`](outbox::Election) for a shared outbox), the [`Broker`] trait, the [`ConsumerPlan`](broker::ConsumerPlan) a broker consumes, a handler's outage pause |
//! | the inline broker | `broker/inline.rs` | [`InlineBroker`]: in-process, no services |

#![cfg_attr(docsrs, feature(doc_cfg))]

// vocabulary
#[doc(hidden)]
pub mod backoff;
pub mod config;
pub mod envelope;
#[doc(hidden)]
pub mod error;
#[doc(hidden)]
pub mod future;
pub mod key;
pub mod log;
pub mod message;
pub mod metrics;

// handler contracts
pub mod handler;
pub mod process_manager;
#[doc(hidden)]
pub mod raise;
pub mod registry;

// delivery contracts, and the inline broker (`broker/inline.rs`)
pub mod broker;
#[doc(hidden)]
pub mod names;
pub mod outbox;

// logs under their targets of before the split (`convoy_runtime::...`)
#[doc(hidden)]
pub mod tracing_target;
mod tracing {
    crate::tracing_shim!($ "convoy_core" => "convoy_runtime");
}

pub use broker::{Broker, Capabilities, InlineBroker};
pub use config::Config;
pub use envelope::{Envelope, Origin, Priority, Replay};
pub use error::{Error, Problem, Problems};
pub use future::BoxFuture;
pub use handler::{
    CommandHandler, Context, ErrorClass, ErrorClassifier, EventHandler, Fence, Gap, Handle,
    HandlerError, Position,
};
pub use key::KeyRule;
pub use message::{Aggregate, Command, Event, Message, PartitionKey};
pub use process_manager::ProcessManager;
/// The shutdown token brokers receive (re-exported from `tokio-util`).
pub use tokio_util::sync::CancellationToken;
