//! The unit of work: events raised by an operation, validated as they are
//! raised and added to the outbox together on commit.

use crate::domain::Domain;
use crate::envelope::{Envelope, Priority};
use crate::error::Error;
use crate::key::{KeyPolicy, check_key};
use crate::message::{Event, Message};

/// Events raised but not yet committed.
#[derive(Debug, Default)]
pub struct PendingEvents {
    envelopes: Vec<Envelope>,
}

impl PendingEvents {
    /// Validates `event`'s partition key and keeps it.
    ///
    /// The key is the value of the category's `sequential_by` field; a value
    /// that breaks a key rule fails here and nothing is kept.
    pub fn push<E: Event>(
        &mut self,
        event: &E,
        policy: &KeyPolicy,
        priority: Priority,
        correlation_id: Option<String>,
    ) -> Result<(), Error> {
        let key = extract_key(event, policy)?;
        self.envelopes
            .push(Envelope::wrap(event, key, priority, correlation_id)?);
        Ok(())
    }

    /// How many events are pending.
    pub fn len(&self) -> usize {
        self.envelopes.len()
    }

    /// Whether no event is pending.
    pub fn is_empty(&self) -> bool {
        self.envelopes.is_empty()
    }

    pub(crate) fn into_envelopes(self) -> Vec<Envelope> {
        self.envelopes
    }
}

/// The validated partition key of `event` under `policy`: `None` when its
/// category is not partitioned (or the type does not carry the key field).
pub fn extract_key<E: Message>(event: &E, policy: &KeyPolicy) -> Result<Option<String>, Error> {
    let d = E::DESCRIPTOR;
    let Some(field) = policy.key_field(d.category) else {
        return Ok(None);
    };
    let Some(value) = event.partition_key(field) else {
        return Ok(None);
    };
    match check_key(value.as_deref(), policy.backfill_suffix()) {
        Ok(()) => Ok(value),
        Err(rule) => Err(Error::InvalidKey {
            type_name: d.type_name.to_owned(),
            field: field.to_owned(),
            value: match &value {
                Some(v) => format!("{v:?}"),
                None => "null".to_owned(),
            },
            rule,
        }),
    }
}

/// A unit of work: raise events, then commit them to the outbox at once.
///
/// Dropping it without `commit` discards the events.
#[derive(Debug)]
pub struct UnitOfWork {
    domain: Domain,
    pending: PendingEvents,
    correlation_id: Option<String>,
}

impl UnitOfWork {
    pub(crate) fn new(domain: Domain) -> Self {
        UnitOfWork {
            domain,
            pending: PendingEvents::default(),
            correlation_id: None,
        }
    }

    /// Sets the correlation id carried by every event raised from now on.
    pub fn with_correlation_id(mut self, id: impl Into<String>) -> Self {
        self.correlation_id = Some(id.into());
        self
    }

    /// Raises an event. Its partition key is extracted and validated now; a
    /// rejected key fails this call, naming the field, the value and the
    /// rule, and the event is not kept.
    pub fn raise<E: Event>(&mut self, event: E) -> Result<(), Error> {
        self.raise_with_priority(event, Priority::Normal)
    }

    /// Raises an event with a priority: low-priority events go to the
    /// backfill lane when `[server.priority_lanes]` is enabled.
    pub fn raise_with_priority<E: Event>(
        &mut self,
        event: E,
        priority: Priority,
    ) -> Result<(), Error> {
        let policy = self.domain.key_policy();
        self.pending
            .push(&event, policy, priority, self.correlation_id.clone())
    }

    /// How many events are waiting for commit.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether nothing was raised.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Adds every raised event to the outbox, all or none, and wakes the
    /// outbox processor. Returns how many events were committed.
    pub async fn commit(self) -> Result<usize, Error> {
        let envelopes = self.pending.into_envelopes();
        let n = envelopes.len();
        self.domain.append_to_outbox(envelopes).await?;
        Ok(n)
    }
}
