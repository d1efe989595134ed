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

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::envelope::Envelope;
use crate::error::Error;
use crate::future::BoxFuture;
use crate::handler::{Context, Dispatch, Dispatched, HandlerError};
use crate::key::Escaped;
use crate::message::MessageDescriptor;
use crate::tracing;

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

/// An `inventory` entry for one process manager (submitted by the macro).
#[doc(hidden)]
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

/// A process-manager instance as stored: its state (JSON), its version
/// (for optimistic concurrency) and whether it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredState {
    /// Increases by one on every save.
    pub version: u64,
    /// The state struct as JSON.
    pub state: String,
    /// The instance handled its `end` event; later events are ignored.
    pub ended: bool,
    /// The ids of the latest events applied to the state (at most
    /// [`APPLIED_KEPT`]): a redelivered event (after a crash, at-least-once)
    /// is recognised and not applied twice.
    pub applied: Vec<String>,
}

/// How many applied event ids an instance remembers.
pub const APPLIED_KEPT: usize = 64;

/// Where process-manager instances live: in memory under the inline
/// broker, in Redis under the Redis broker.
pub trait StateStore: Send + Sync + 'static {
    /// The instance `id` of process manager `pm`, if it exists.
    fn load<'a>(
        &'a self,
        pm: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredState>, Error>>;

    /// Saves the instance if its stored version is still `expected` (0 for a
    /// new instance); returns false when someone saved it in between.
    fn save<'a>(
        &'a self,
        pm: &'a str,
        id: &'a str,
        expected: u64,
        state: StoredState,
    ) -> BoxFuture<'a, Result<bool, Error>>;
}

/// Process-manager state in memory.
#[derive(Debug, Default)]
pub struct MemoryStateStore {
    map: Mutex<HashMap<(String, String), StoredState>>,
}

impl MemoryStateStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl StateStore for MemoryStateStore {
    fn load<'a>(
        &'a self,
        pm: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredState>, Error>> {
        let v = self
            .map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&(pm.to_owned(), id.to_owned()))
            .cloned();
        Box::pin(async { Ok(v) })
    }

    fn save<'a>(
        &'a self,
        pm: &'a str,
        id: &'a str,
        expected: u64,
        state: StoredState,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let mut map = self
            .map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = (pm.to_owned(), id.to_owned());
        let current = map.get(&key).map(|s| s.version).unwrap_or(0);
        let saved = current == expected;
        if saved {
            map.insert(
                key,
                StoredState {
                    version: expected + 1,
                    ..state
                },
            );
        }
        Box::pin(async move { Ok(saved) })
    }
}

/// How many times a handler re-runs on a version conflict before the
/// attempt fails (and is retried like any failure).
const CONFLICT_RETRIES: usize = 5;

/// A process manager as a consumer sees it: load the instance, run the
/// handler on its state, save it with a version check.
#[doc(hidden)]
pub struct PmDispatch<P> {
    store: Arc<dyn StateStore>,
    _pm: PhantomData<fn() -> P>,
}

impl<P> std::fmt::Debug for PmDispatch<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PmDispatch").finish_non_exhaustive()
    }
}

impl<P: ProcessManager> PmDispatch<P> {
    /// The dispatch of `P`, its instances kept in `store`.
    #[doc(hidden)]
    pub fn new(store: Arc<dyn StateStore>) -> Self {
        PmDispatch {
            store,
            _pm: PhantomData,
        }
    }
}

impl<P: ProcessManager> Dispatch for PmDispatch<P> {
    fn dispatch<'a>(
        &'a self,
        envelope: &'a Envelope,
        ctx: &'a Context,
    ) -> BoxFuture<'a, Result<Dispatched, HandlerError>> {
        Box::pin(async move {
            let d = P::DESCRIPTOR;
            let Some(h) = d
                .handles
                .iter()
                .find(|h| h.message.type_name == envelope.type_name)
            else {
                return Ok(Dispatched::NotHandled);
            };
            let Some(id) = P::correlation(envelope)? else {
                tracing::warn!(process_manager = d.name, id = %Escaped(&envelope.id), field = h.correlate, "event carries no correlation value; skipped");
                return Ok(Dispatched::NotHandled);
            };
            for _ in 0..CONFLICT_RETRIES {
                let loaded = self.store.load(d.name, &id).await?;
                if let Some(s) = &loaded
                    && s.applied.contains(&envelope.id)
                {
                    tracing::info!(process_manager = d.name, instance = ?Escaped(&id), id = %Escaped(&envelope.id), "event already applied to the instance (redelivered); not applied again");
                    return Ok(Dispatched::Handled);
                }
                let mut applied = loaded
                    .as_ref()
                    .map(|s| s.applied.clone())
                    .unwrap_or_default();
                let (mut state, version) = match loaded {
                    None if !h.start => {
                        tracing::info!(process_manager = d.name, instance = ?Escaped(&id), r#type = %Escaped(&envelope.type_name), "event for an instance that was never started; skipped");
                        return Ok(Dispatched::NotHandled);
                    }
                    None => (P::default(), 0),
                    Some(s) if s.ended => {
                        tracing::debug!(process_manager = d.name, instance = ?Escaped(&id), "instance already ended; event ignored");
                        return Ok(Dispatched::NotHandled);
                    }
                    Some(s) => {
                        let state: P =
                            serde_json::from_str(&s.state).map_err(|source| Error::State {
                                process_manager: d.name.to_owned(),
                                instance: id.clone(),
                                source,
                            })?;
                        (state, s.version)
                    }
                };
                let out = state.dispatch(envelope, ctx).await?;
                let json = serde_json::to_string(&state).map_err(|source| Error::State {
                    process_manager: d.name.to_owned(),
                    instance: id.clone(),
                    source,
                })?;
                applied.push(envelope.id.clone());
                if applied.len() > APPLIED_KEPT {
                    applied.remove(0);
                }
                let stored = StoredState {
                    version,
                    state: json,
                    ended: h.end,
                    applied,
                };
                if self.store.save(d.name, &id, version, stored).await? {
                    return Ok(out);
                }
                tracing::warn!(process_manager = d.name, instance = ?Escaped(&id), "instance changed concurrently; running the handler again on the new state");
            }
            Err(HandlerError::from(Error::StateConflict {
                process_manager: d.name.to_owned(),
                instance: id,
            }))
        })
    }
}
