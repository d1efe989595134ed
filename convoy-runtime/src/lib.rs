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
//! ```
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
mod signal;
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
pub use signal::shutdown_signal;
/// The shutdown token brokers receive (re-exported from `tokio-util`).
pub use tokio_util::sync::CancellationToken;
pub use uow::UnitOfWork;

#[doc(inline)]
pub use convoy_macros::{
    Aggregate, Command, Event, command_handler, event_handler, process_manager,
};
