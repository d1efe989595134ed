//! The envelope: how one event travels from the outbox to a handler.
//!
//! On Redis each stream entry holds these fields (all UTF-8 strings):
//!
//! | field | meaning |
//! | --- | --- |
//! | `meta` | a JSON object: `id` (the message id, unique per raised message), `type` (the wire type name, `OrderPlaced`), `category` (the stream category, `order`), `time` (when it was raised, milliseconds since the Unix epoch), `priority` (`normal` or `low`), and `correlation` (the correlation id) when there is one |
//! | `payload` | the message itself, as JSON |
//! | `key` | the partition key; absent for unpartitioned messages |
//! | `origin` | `{producer}#{seq}`: the outbox that published it and its record there (see [`Origin`]); absent on entries written by an older convoy or by another program |
//! | `replay` | only on an operator's replay of a dead letter: a JSON object, `by` (the handler that dead-lettered it) and `to` (the handlers it is replayed to; see [`Replay`]) |
//!
//! Four fields rather than one per attribute: Redis passes every field of
//! every entry a fenced read delivers through its Lua interpreter, and
//! every field of every published entry through the publish script, so
//! each field costs on every event. Entries with the attributes in fields
//! of their own (`id`, `type`, `category`, `time`, `priority`,
//! `correlation`, as convoy wrote them before, or as another program
//! writes them) are read too.
//!
//! An entry that lacks a required field or has an unreadable one is a
//! processing failure of the handler that reads it (retried, then halted or
//! dead-lettered), never a crash.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::key::Escaped;
use crate::message::Message;

/// The priority of a raised event; low-priority events use the backfill lane
/// when priority lanes are enabled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Production traffic: the primary lane.
    #[default]
    Normal,
    /// Backfill traffic: the backfill lane when lanes are enabled.
    Low,
}

impl Priority {
    /// The wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }
}

/// One message with its metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// Unique message id.
    pub id: String,
    /// Wire type name.
    pub type_name: String,
    /// Stream category.
    pub category: String,
    /// Partition key, validated when the message was raised.
    pub partition_key: Option<String>,
    /// Milliseconds since the Unix epoch when raised.
    pub time_ms: u64,
    /// Priority.
    pub priority: Priority,
    /// Correlation id.
    pub correlation_id: Option<String>,
    /// The message as JSON.
    pub payload: String,
    /// Where it was published from: the producer's record it was
    /// published as ([`Publication::origin`](crate::broker::Publication::origin),
    /// which the broker writes with the entry), as a consumer reads it
    /// back (`None` before it is published, and on entries without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
    /// Set on an operator's replay of a dead letter: which handlers it is
    /// for, and which one dead-lettered it (`None` on every entry a
    /// producer published).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<Replay>,
}

/// An operator's replay of a dead letter, as the replayed entry carries it
/// (its `replay` field). The entry keeps the event's identity (message id
/// and [`Origin`]), so a handler that applied the event before recognises
/// it; only the handlers in [`to`](Replay::to) run it, the others
/// acknowledge it unread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replay {
    /// The handler (consumer group) that dead-lettered the event: for it the
    /// replayed entry is new even though its origin lies behind the events
    /// it handled since (its exactly-once record goes by the entry id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The handlers (consumer groups) the entry is replayed to.
    pub to: Vec<String>,
}

impl Replay {
    /// Whether handler `group` runs the replayed entry.
    pub fn reaches(&self, group: &str) -> bool {
        self.to.iter().any(|g| g == group)
    }

    /// Whether `group` is the handler that dead-lettered the event (it never
    /// applied it).
    pub fn dead_lettered_by(&self, group: &str) -> bool {
        self.by.as_deref() == Some(group)
    }

    /// The wire form (the `replay` field's JSON).
    pub fn to_wire(&self) -> String {
        serde_json::to_string(self).expect("strings always serialize")
    }
}

/// The identity of a published event: the outbox that published it (its
/// producer name, shared by a PostgreSQL outbox's replicas) and the
/// record's sequence number there. Within one producer a partition key's
/// records are published in increasing `seq` (a PostgreSQL outbox
/// serialises a key's inserts, so its ids follow the key's commit order),
/// so `(producer, seq)` identifies an event and orders it among its key's
/// events, whichever stream entry carries it: a duplicate entry, a stream
/// recreated after a reap or a Redis clock step cannot change it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Origin {
    /// The producer name ([`Producer::name`](crate::broker::Producer::name)).
    pub producer: String,
    /// The record's sequence number in that outbox.
    pub seq: u64,
}

impl Origin {
    /// The wire form, `{producer}#{seq}`.
    pub fn to_wire(&self) -> String {
        Self::wire(&self.producer, self.seq)
    }

    /// The wire form of `producer`'s record `seq`, without an `Origin`.
    pub fn wire(producer: &str, seq: u64) -> String {
        format!("{producer}#{seq}")
    }

    /// Reads the wire form (the last `#` separates the seq, so a producer
    /// name may hold one); `None` if it has another form.
    pub fn parse(wire: &str) -> Option<Origin> {
        let (producer, seq) = wire.rsplit_once('#')?;
        Some(Origin {
            producer: producer.to_owned(),
            seq: seq.parse().ok()?,
        })
    }
}

/// The names of the stream entry fields.
pub mod fields {
    /// The envelope's own attributes, as one JSON object (`id`, `type`,
    /// `category`, `time`, `priority`, `correlation`).
    pub const META: &str = "meta";
    /// Message id (a field of its own only in entries of the older form;
    /// the same name inside [`META`]).
    pub const ID: &str = "id";
    /// Wire type name.
    pub const TYPE: &str = "type";
    /// Stream category.
    pub const CATEGORY: &str = "category";
    /// Partition key.
    pub const KEY: &str = "key";
    /// Raise time in ms.
    pub const TIME: &str = "time";
    /// Priority.
    pub const PRIORITY: &str = "priority";
    /// Correlation id.
    pub const CORRELATION: &str = "correlation";
    /// JSON payload.
    pub const PAYLOAD: &str = "payload";
    /// Producer and outbox seq (`{producer}#{seq}`).
    pub const ORIGIN: &str = "origin";
    /// An operator's replay: the handlers it is for (see [`Replay`](super::Replay)).
    pub const REPLAY: &str = "replay";
}

impl Envelope {
    /// Wraps a message: serializes it and gives it a fresh id.
    pub fn wrap<M: Message>(
        message: &M,
        partition_key: Option<String>,
        priority: Priority,
        correlation_id: Option<String>,
    ) -> Result<Self, Error> {
        let d = M::DESCRIPTOR;
        let payload = message.to_json().map_err(|source| Error::Encode {
            type_name: d.type_name.to_owned(),
            source,
        })?;
        Ok(Envelope {
            id: new_message_id(),
            type_name: d.type_name.to_owned(),
            category: d.category.to_owned(),
            partition_key,
            time_ms: now_ms(),
            priority,
            correlation_id,
            payload,
            origin: None,
            replay: None,
        })
    }

    /// Decodes the payload as `M`.
    pub fn decode<M: Message>(&self) -> Result<M, Error> {
        M::from_json(&self.payload).map_err(|source| Error::Decode {
            id: self.id.clone(),
            type_name: self.type_name.clone(),
            source,
        })
    }

    /// The stream entry fields, in a fixed order.
    pub fn to_fields(&self) -> Vec<(&'static str, String)> {
        self.fields()
            .into_iter()
            .map(|(k, v)| (k, v.into_owned()))
            .collect()
    }

    /// The value of the entry's `meta` field: the envelope's id, type,
    /// category, time, priority and correlation id, as JSON.
    pub fn meta(&self) -> String {
        self.meta_of().to_json()
    }

    /// [`meta`](Self::meta), written at the end of `out` (a publisher
    /// writing many entries into one buffer allocates nothing per entry).
    pub fn write_meta(&self, out: &mut Vec<u8>) {
        serde_json::to_writer(out, &self.meta_of()).expect("strings and integers always serialize");
    }

    fn meta_of(&self) -> Meta<'_> {
        Meta {
            id: Cow::Borrowed(&self.id),
            type_name: Cow::Borrowed(&self.type_name),
            category: Cow::Borrowed(&self.category),
            time: self.time_ms,
            priority: self.priority,
            correlation: self.correlation_id.as_deref().map(Cow::Borrowed),
        }
    }

    /// The stream entry fields, in the order of [`to_fields`](Self::to_fields),
    /// borrowed from the envelope where they are held as text (only `meta`
    /// and the origin are written out).
    pub fn fields(&self) -> Vec<(&'static str, Cow<'_, str>)> {
        let mut out = Vec::with_capacity(4);
        out.push((fields::META, Cow::Owned(self.meta())));
        out.push((fields::PAYLOAD, Cow::Borrowed(self.payload.as_str())));
        if let Some(k) = &self.partition_key {
            out.push((fields::KEY, Cow::Borrowed(k.as_str())));
        }
        if let Some(o) = &self.origin {
            out.push((fields::ORIGIN, Cow::Owned(o.to_wire())));
        }
        if let Some(r) = &self.replay {
            out.push((fields::REPLAY, Cow::Owned(r.to_wire())));
        }
        out
    }

    /// Checks that the envelope belongs where it was read: its `category`
    /// field is `category` and its `key` field is `key` (a partition's key,
    /// or none for a category's own stream). An entry written where it does
    /// not belong (by hand, by another program, or copied between streams)
    /// is a processing failure with this reason, never handled as if it
    /// were the partition's.
    pub fn check_origin(
        &self,
        stream: &str,
        entry_id: &str,
        category: &str,
        key: Option<&str>,
    ) -> Result<(), Error> {
        let misplaced = |reason: String| Error::MalformedEntry {
            stream: stream.to_owned(),
            entry_id: entry_id.to_owned(),
            reason,
        };
        if self.category != category {
            return Err(misplaced(format!(
                "its category is {:?} but it was read from a stream of category {:?}; it was written where it does not belong: move it to its own category's stream, or skip it",
                Escaped(&self.category),
                Escaped(category)
            )));
        }
        if self.partition_key.as_deref() != key {
            let found = match &self.partition_key {
                Some(k) => format!("{:?}", Escaped(k)),
                None => "missing".to_owned(),
            };
            let want = match key {
                Some(k) => format!("partition {:?}", Escaped(k)),
                None => "the category's stream of events without a key".to_owned(),
            };
            return Err(misplaced(format!(
                "its `key` field is {found} but it was read from {want}; it was written where it does not belong: move it to its own partition, or skip it"
            )));
        }
        Ok(())
    }

    /// Reads an envelope back from stream entry fields; `entry_id` and
    /// `stream` only serve the error message.
    pub fn from_fields<'a, I>(stream: &str, entry_id: &str, entries: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = (&'a str, &'a [u8])>,
    {
        let malformed = |reason: String| Error::MalformedEntry {
            stream: stream.to_owned(),
            entry_id: entry_id.to_owned(),
            reason,
        };
        let mut id = None;
        let mut type_name = None;
        let mut category = None;
        let mut key = None;
        let mut time = None;
        let mut priority = Priority::Normal;
        let mut correlation = None;
        let mut payload = None;
        let mut origin = None;
        let mut replay = None;
        for (name, value) in entries {
            // Only the fields kept as text are copied; the others are parsed
            // from the entry's bytes.
            let text = std::str::from_utf8(value)
                .map_err(|_| malformed(format!("field `{name}` is not UTF-8")))?;
            match name {
                fields::META => {
                    let m: Meta<'_> = serde_json::from_str(text).map_err(|e| {
                        malformed(format!(
                            "field `meta` is not the envelope's attributes: {e}"
                        ))
                    })?;
                    id = Some(m.id.into_owned());
                    type_name = Some(m.type_name.into_owned());
                    category = Some(m.category.into_owned());
                    time = Some(m.time);
                    priority = m.priority;
                    correlation = m.correlation.map(Cow::into_owned);
                }
                fields::ID => id = Some(text.to_owned()),
                fields::TYPE => type_name = Some(text.to_owned()),
                fields::CATEGORY => category = Some(text.to_owned()),
                fields::KEY => key = Some(text.to_owned()),
                fields::TIME => {
                    time = Some(text.parse::<u64>().map_err(|_| {
                        malformed(format!("field `time` is not a number: {text:?}"))
                    })?)
                }
                fields::PRIORITY => {
                    priority = match text {
                        "normal" => Priority::Normal,
                        "low" => Priority::Low,
                        other => return Err(malformed(format!("unknown priority {other:?}"))),
                    }
                }
                fields::CORRELATION => correlation = Some(text.to_owned()),
                fields::PAYLOAD => payload = Some(text.to_owned()),
                fields::ORIGIN => {
                    origin = Some(Origin::parse(text).ok_or_else(|| {
                        malformed(format!(
                            "field `origin` is not `{{producer}}#{{seq}}`: {text:?}"
                        ))
                    })?)
                }
                fields::REPLAY => {
                    replay = Some(serde_json::from_str(text).map_err(|e| {
                        malformed(format!(
                            "field `replay` is not an operator's replay ({{\"by\", \"to\"}}): {e}"
                        ))
                    })?)
                }
                _ => {}
            }
        }
        let missing = |f: &str| malformed(format!("required field `{f}` is missing"));
        Ok(Envelope {
            id: id.ok_or_else(|| missing(fields::ID))?,
            type_name: type_name.ok_or_else(|| missing(fields::TYPE))?,
            category: category.ok_or_else(|| missing(fields::CATEGORY))?,
            partition_key: key,
            time_ms: time.ok_or_else(|| missing(fields::TIME))?,
            priority,
            correlation_id: correlation,
            payload: payload.ok_or_else(|| missing(fields::PAYLOAD))?,
            origin,
            replay,
        })
    }
}

/// The envelope's own attributes, as the `meta` field holds them.
#[derive(Serialize, Deserialize)]
struct Meta<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(rename = "type", borrow)]
    type_name: Cow<'a, str>,
    #[serde(borrow)]
    category: Cow<'a, str>,
    time: u64,
    priority: Priority,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    correlation: Option<Cow<'a, str>>,
}

impl Meta<'_> {
    /// The JSON text. Strings and integers only: serializing cannot fail.
    fn to_json(&self) -> String {
        serde_json::to_string(self).expect("strings and integers always serialize")
    }
}

/// Milliseconds since the Unix epoch.
#[doc(hidden)]
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A new message id: 128 random bits as 32 hex digits.
pub(crate) fn new_message_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Envelope {
        Envelope {
            id: "abc".into(),
            type_name: "OrderPlaced".into(),
            category: "order".into(),
            partition_key: Some("c-1".into()),
            time_ms: 17,
            priority: Priority::Low,
            correlation_id: None,
            payload: "{}".into(),
            origin: None,
            replay: None,
        }
    }

    #[test]
    fn fields_round_trip() {
        let e = Envelope {
            origin: Some(Origin {
                producer: "pg/a#b".into(),
                seq: 42,
            }),
            ..sample()
        };
        assert_eq!(
            e.to_fields().last(),
            Some(&(fields::ORIGIN, "pg/a#b#42".to_owned()))
        );
        let f = e.to_fields();
        let back = Envelope::from_fields("s", "1-0", f.iter().map(|(k, v)| (*k, v.as_bytes())))
            .expect("round trip");
        assert_eq!(back, e);
    }

    /// `write_meta` appends what `meta` returns, leaving what the buffer
    /// held before it.
    #[test]
    fn meta_is_written_at_the_end_of_the_buffer() {
        let e = Envelope {
            correlation_id: Some("c\"1".into()),
            ..sample()
        };
        let mut out = b"before".to_vec();
        e.write_meta(&mut out);
        assert_eq!(out, [b"before".as_slice(), e.meta().as_bytes()].concat());
    }

    fn read(f: &[(&str, &str)]) -> Result<Envelope, Error> {
        Envelope::from_fields(
            "order:c-1",
            "1-0",
            f.iter().map(|(k, v)| (*k, v.as_bytes())),
        )
    }

    #[test]
    fn an_entry_has_four_fields_at_most() {
        let e = Envelope {
            correlation_id: Some("o-\"1\"".into()),
            origin: Some(Origin {
                producer: "p".into(),
                seq: 1,
            }),
            ..sample()
        };
        let f = e.to_fields();
        let names: Vec<&str> = f.iter().map(|(k, _)| *k).collect();
        assert_eq!(names, ["meta", "payload", "key", "origin"]);
        assert_eq!(
            f[0].1,
            r#"{"id":"abc","type":"OrderPlaced","category":"order","time":17,"priority":"low","correlation":"o-\"1\""}"#
        );
        let f: Vec<_> = f.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(read(&f).expect("round trip"), e);
    }

    #[test]
    fn an_entry_with_a_field_per_attribute_is_read() {
        let f = [
            ("id", "abc"),
            ("type", "OrderPlaced"),
            ("category", "order"),
            ("time", "17"),
            ("priority", "low"),
            ("payload", "{}"),
            ("key", "c-1"),
        ];
        assert_eq!(read(&f).expect("the older form"), sample());
    }

    #[test]
    fn missing_and_bad_fields_are_errors() {
        let meta = r#"{"id":"abc","category":"order","time":17,"priority":"low"}"#;
        let err = read(&[("meta", meta), ("payload", "{}")]).expect_err("missing type");
        assert!(err.to_string().contains("`type`"), "{err}");
        let meta = r#"{"id":"abc","type":"T","category":"order","time":17,"priority":"urgent"}"#;
        let err = read(&[("meta", meta), ("payload", "{}")]).expect_err("bad priority");
        assert!(err.to_string().contains("urgent"), "{err}");
        let err = read(&[("meta", "[1]"), ("payload", "{}")]).expect_err("not an object");
        assert!(err.to_string().contains("field `meta`"), "{err}");
        let meta = r#"{"id":"abc","type":"T","category":"order","time":17,"priority":"low"}"#;
        let err = read(&[("meta", meta)]).expect_err("no payload");
        assert!(err.to_string().contains("`payload` is missing"), "{err}");
        let err = read(&[("time", "x")]).expect_err("bad time");
        assert!(err.to_string().contains("not a number"), "{err}");
        let err = read(&[("id", "abc"), ("time", "17")]).expect_err("missing type");
        assert!(err.to_string().contains("`type`"), "{err}");
    }

    #[test]
    fn an_entry_must_belong_where_it_was_read() {
        let e = sample();
        e.check_origin("order:c-1", "1-0", "order", Some("c-1"))
            .expect("its own partition");
        let err = e
            .check_origin("order:c-2", "1-0", "order", Some("c-2"))
            .expect_err("another key")
            .to_string();
        assert!(
            err.contains("its `key` field is \"c-1\" but it was read from partition \"c-2\""),
            "{err}"
        );
        let err = e
            .check_origin("pay:c-1", "1-0", "pay", Some("c-1"))
            .expect_err("another category")
            .to_string();
        assert!(err.contains("its category is \"order\""), "{err}");
        let err = e
            .check_origin("order", "1-0", "order", None)
            .expect_err("a key in the category's own stream")
            .to_string();
        assert!(err.contains("events without a key"), "{err}");
        let unkeyed = Envelope {
            partition_key: None,
            ..sample()
        };
        let err = unkeyed
            .check_origin("order:c-1", "1-0", "order", Some("c-1"))
            .expect_err("no key in a partition")
            .to_string();
        assert!(err.contains("`key` field is missing"), "{err}");
    }
}
