//! Reading Redis replies into convoy's types.

use redis::Value;

use convoy_core::envelope::Envelope;
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

fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.as_bytes().to_vec()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

/// Entries as XREADGROUP returns them for one stream: `[[id, [f, v, ...]], ...]`.
pub(crate) fn entries(v: &Value) -> Vec<Entry> {
    let Value::Array(items) = v else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let Value::Array(pair) = item else {
                return None;
            };
            let id = text(pair.first()?)?;
            let fields = match pair.get(1) {
                Some(Value::Array(kv)) => Some(
                    kv.chunks(2)
                        .filter_map(|c| Some((text(c.first()?)?, bytes(c.get(1)?)?)))
                        .collect(),
                ),
                Some(Value::Map(kv)) => Some(
                    kv.iter()
                        .filter_map(|(k, v)| Some((text(k)?, bytes(v)?)))
                        .collect(),
                ),
                _ => None,
            };
            Some(Entry { id, fields })
        })
        .collect()
}

/// The entries of the first stream of an XREAD/XREADGROUP reply
/// (`[[stream, entries]]`, or a map in RESP3).
pub(crate) fn first_stream_entries(v: &Value) -> Vec<(String, Vec<Entry>)> {
    match v {
        Value::Array(streams) => streams
            .iter()
            .filter_map(|s| {
                let Value::Array(pair) = s else { return None };
                Some((text(pair.first()?)?, entries(pair.get(1)?)))
            })
            .collect(),
        Value::Map(streams) => streams
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, entries(v))))
            .collect(),
        _ => Vec::new(),
    }
}
