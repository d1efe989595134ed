//! Process managers: `#[process_manager(sequential_by = true)]`.
//!
//! A process manager is a serde state struct whose instances are keyed by a
//! correlation value (an order id). Each handled event names, with
//! `correlate = "field"`, the field that carries the correlation value on
//! that event (`order_id` on `OrderPlaced`, `order_ref` on
//! `PaymentCaptured`). `start` creates the instance; `end` completes it.
//!
//! With `sequential_by = true`, each category the process manager
//! subscribes to is partitioned by the field its `correlate` maps there, and
//! one engine instance leases a correlation value and is the sole processor
//! of every subscribed category's partition for that value: no two events
//! of one process-manager instance are ever handled at once. Cross-category
//! order is not promised.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::envelope::Envelope;
use crate::handler::{BoxFuture, Context, Dispatched, HandlerError};
use crate::message::MessageDescriptor;

/// One handled event of a process manager.
#[derive(Debug)]
pub struct PmHandle {
    /// The event type.
    pub message: &'static MessageDescriptor,
    /// The field of that event that carries the correlation value.
    pub correlate: &'static str,
    /// The event starts a new instance.
    pub start: bool,
    /// The event completes the instance; later events are ignored.
    pub end: bool,
}

/// What the runtime knows about a process manager, built at compile time.
#[derive(Debug)]
pub struct ProcessManagerDescriptor {
    /// The process manager's name: its Rust path. Also its consumer group.
    pub name: &'static str,
    /// `sequential_by = true`: serialized per correlation value.
    pub sequential: bool,
    /// The handled events, in declaration order.
    pub handles: &'static [PmHandle],
}

/// An `inventory` entry for one process manager.
#[derive(Debug)]
pub struct ProcessManagerRegistration(pub &'static ProcessManagerDescriptor);

inventory::collect!(ProcessManagerRegistration);

/// A process manager, implemented by `#[process_manager]` on the state
/// struct's `impl` block.
pub trait ProcessManager: Serialize + DeserializeOwned + Default + Send + Sync + 'static {
    /// The compile-time description.
    const DESCRIPTOR: &'static ProcessManagerDescriptor;

    /// The correlation value of `envelope`: the value of the handled event
    /// type's `correlate` field. `Ok(None)` when the type is not handled or
    /// the field holds no value.
    fn correlation(envelope: &Envelope) -> Result<Option<String>, HandlerError>;

    /// Decodes the envelope and runs the matching `#[handle]` method on this
    /// instance's state.
    fn dispatch<'a>(
        &'a mut self,
        envelope: &'a Envelope,
        ctx: &'a Context,
    ) -> BoxFuture<'a, Result<Dispatched, HandlerError>>;
}
