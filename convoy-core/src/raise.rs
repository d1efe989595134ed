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
pub struct PendingEvents {
    envelopes: Vec<Envelope>,
    /// Each category raised, with the key field it was routed by (`None`:
    /// unkeyed) and the raised type's fields, once.
    key_fields: Vec<RaisedKey>,
}

/// A raised category, the key field its event was routed by (`None`:
/// without a key) and the event type's fields.
pub(crate) type RaisedKey = (&'static str, Option<&'static str>, &'static [&'static str]);

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
        let d = E::DESCRIPTOR;
        let field = key_field_of::<E>(policy).filter(|f| d.has_field(f));
        let used = (d.category, field, d.fields);
        if !self.key_fields.contains(&used) {
            self.key_fields.push(used);
        }
        Ok(())
    }

    /// Each category raised, with the key field its events were routed by
    /// (`None`: without a key).
    pub fn key_fields(&self) -> &[RaisedKey] {
        &self.key_fields
    }

    /// How many events are pending.
    pub fn len(&self) -> usize {
        self.envelopes.len()
    }

    /// Whether no event is pending.
    pub fn is_empty(&self) -> bool {
        self.envelopes.is_empty()
    }

    /// The events, in the order they were raised.
    pub fn into_envelopes(self) -> Vec<Envelope> {
        self.envelopes
    }
}

/// The key field `E`'s category is partitioned by: the domain's (from its
/// handlers and declarations), else the one `E`'s aggregate declares.
fn key_field_of<E: Message>(policy: &KeyPolicy) -> Option<&'static str> {
    let d = E::DESCRIPTOR;
    policy.key_field(d.category).or(d.partition_key)
}

/// The validated partition key of `event` under `policy`: `None` when its
/// category is not partitioned (or the type does not carry the key field).
/// The key its aggregate declares applies even where the domain knows no
/// handler of the category (a writer built without discovery): `init`
/// made the policy agree with it wherever both are known.
pub(crate) fn extract_key<E: Message>(
    event: &E,
    policy: &KeyPolicy,
) -> Result<Option<String>, Error> {
    let d = E::DESCRIPTOR;
    let Some(field) = key_field_of::<E>(policy) else {
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
