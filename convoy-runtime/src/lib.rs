//! convoy: per-key ordered event handling on Redis Streams.
//!
//! Handlers declared `#[event_handler(part_of = Order, sequential_by = "client_id")]`
//! never handle two events with the same `client_id` at the same time, and
//! their effects land in publish order, while different keys run in
//! parallel across any number of engine processes.

#[allow(unused_extern_crates)]
// lets generated `::convoy_runtime` paths resolve in this crate's own tests
extern crate self as convoy_runtime;

pub mod broker;
pub mod config;
pub mod domain;
pub mod engine;
pub mod envelope;
mod error;
pub mod handler;
pub mod key;
pub mod message;
pub mod metrics;
pub mod outbox;
pub mod process_manager;
pub mod redis;
pub mod registry;
pub mod routing;
pub mod uow;

#[cfg(feature = "testing")]
pub mod testing;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

pub use broker::{Broker, Capabilities, InlineBroker};
pub use config::Config;
pub use domain::{Domain, DomainBuilder};
pub use engine::{Engine, EngineHandle};
pub use envelope::{Envelope, Priority};
pub use error::{Error, Problem, Problems};
pub use handler::{CommandHandler, Context, EventHandler, Fence, Handle, HandlerError};
pub use key::KeyRule;
pub use message::{Aggregate, Command, Event, Message, PartitionKey};
pub use process_manager::ProcessManager;
/// The shutdown token brokers receive (re-exported from `tokio-util`).
pub use tokio_util::sync::CancellationToken;
pub use uow::UnitOfWork;

#[doc(inline)]
pub use convoy_macros::{
    Aggregate, Command, Event, command_handler, event_handler, process_manager,
};
