//! Reading Redis replies into convoy's types.

use redis::Value;

use convoy_core::envelope::{Envelope, Replay, fields};
use convoy_core::error::Error;

/// One stream entry as read: its id and its fields, or `None` when the
/// entry was deleted while pending.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) fields: Option<Vec<(String, Vec<u8>)>>,
}

impl Entry {
    /// Reads the envelope, or says why it is not one.
    pub(crate) fn envelope(&self, stream: &str) -> Result<Envelope, Error> {
        match &self.fields {
            None => Err(Error::MalformedEntry {
                stream: stream.to_owned(),
                entry_id: self.id.clone(),
                reason: "the entry was deleted".into(),
            }),
            Some(f) => Envelope::from_fields(
                stream,
                &self.id,
                f.iter().map(|(k, v)| (k.as_str(), v.as_slice())),
            ),
        }
    }

    /// Whether the entry is an operator's replay of a dead letter to
    /// handlers other than `group` (which acknowledges it without running
    /// it). A `replay` field that cannot be read is not one: the entry then
    /// fails as malformed where it is decoded.
    pub(crate) fn replayed_elsewhere(&self, group: &str) -> bool {
        self.fields
            .iter()
            .flatten()
            .find(|(k, _)| k == fields::REPLAY)
            .and_then(|(_, v)| serde_json::from_slice::<Replay>(v).ok())
            .is_some_and(|r| !r.reaches(group))
    }

    /// The raw fields, flattened, for copying the entry elsewhere.
    pub(crate) fn flat_fields(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        if let Some(f) = &self.fields {
            for (k, v) in f {
                out.push(k.as_bytes().to_vec());
                out.push(v.clone());
            }
        }
        out
    }
}

pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}

pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// `text`, taking the reply's bytes rather than copying them.
pub(crate) fn into_text(v: Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        other => text(&other),
    }
}

/// A field's value, taken from the reply rather than copied.
fn into_bytes(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

/// Entries as XREADGROUP returns them for one stream: `[[id, [f, v, ...]],
/// ...]`. Takes the reply, so each entry's fields move into it rather than
/// being copied (the consumer's hot path reads every event this way).
pub(crate) fn entries(v: Value) -> Vec<Entry> {
    let Value::Array(items) = v else {
        return Vec::new();
    };
    items
        .into_iter()
        .filter_map(|item| {
            let Value::Array(pair) = item else {
                return None;
            };
            let mut pair = pair.into_iter();
            let id = into_text(pair.next()?)?;
            let fields = match pair.next() {
                Some(Value::Array(kv)) => {
                    let mut out = Vec::with_capacity(kv.len() / 2);
                    let mut kv = kv.into_iter();
                    while let (Some(k), Some(v)) = (kv.next(), kv.next()) {
                        if let (Some(k), Some(v)) = (into_text(k), into_bytes(v)) {
                            out.push((k, v));
                        }
                    }
                    Some(out)
                }
                Some(Value::Map(kv)) => Some(
                    kv.into_iter()
                        .filter_map(|(k, v)| Some((into_text(k)?, into_bytes(v)?)))
                        .collect(),
                ),
                _ => None,
            };
            Some(Entry { id, fields })
        })
        .collect()
}

/// The entries of each stream of an XREAD/XREADGROUP reply (`[[stream,
/// entries]]`, or a map in RESP3), taken from the reply.
pub(crate) fn first_stream_entries(v: Value) -> Vec<(String, Vec<Entry>)> {
    match v {
        Value::Array(streams) => streams
            .into_iter()
            .filter_map(|s| {
                let Value::Array(pair) = s else { return None };
                let mut pair = pair.into_iter();
                let stream = into_text(pair.next()?)?;
                Some((stream, entries(pair.next()?)))
            })
            .collect(),
        Value::Map(streams) => streams
            .into_iter()
            .filter_map(|(k, v)| Some((into_text(k)?, entries(v))))
            .collect(),
        _ => Vec::new(),
    }
}
