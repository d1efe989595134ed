//! Raising events: each raised event's partition key is extracted and
//! checked against the key rules at once, before anything is kept (the
//! "raise" column of the README's rule table). Used by the unit of work and
//! by a handler's [`Context`](crate::handler::Context).

use crate::envelope::{Envelope, Priority};
use crate::error::Error;
use crate::key::{KeyPolicy, check_key};
use crate::message::{Event, Message};

/// Events raised but not yet committed.
#[derive(Debug, Default)]
pub(crate) struct PendingEvents {
    envelopes: Vec<Envelope>,
}

impl PendingEvents {
    /// Validates `event`'s partition key and keeps it.
    ///
    /// The key is the value of the category's `sequential_by` field; a value
    /// that breaks a key rule fails here and nothing is kept.
    pub(crate) fn push<E: Event>(
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
    pub(crate) fn len(&self) -> usize {
        self.envelopes.len()
    }

    /// Whether no event is pending.
    pub(crate) fn is_empty(&self) -> bool {
        self.envelopes.is_empty()
    }

    pub(crate) fn into_envelopes(self) -> Vec<Envelope> {
        self.envelopes
    }
}

/// The validated partition key of `event` under `policy`: `None` when its
/// category is not partitioned (or the type does not carry the key field).
pub(crate) fn extract_key<E: Message>(
    event: &E,
    policy: &KeyPolicy,
) -> Result<Option<String>, Error> {
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
