//! `publish.lua`: the records of a batch in one shard, in order, in one
//! atomic script (each record's stream entry, index entry and count
//! together).

use std::borrow::Cow;
use std::collections::HashMap;

use redis::aio::ConnectionLike;

use super::{Invocation, Refusal, Replicated, SCRIPTS, Status, call_replicated};
use crate::reply::{int, text};
use crate::routing::Routed;
use convoy_core::broker::Producer;
use convoy_core::envelope::fields::{KEY, META, ORIGIN, PAYLOAD};
use convoy_core::error::Error;
use convoy_core::names;

/// How long a single publisher's published set and epoch are kept after
/// its last publish (7 days). An elected publisher's (epoch above 0) are
/// kept for good: one key pair per shard and outbox table, and a
/// predecessor must be refused however late it wakes.
const PRODUCER_TTL_MS: u64 = 7 * 24 * 3600 * 1000;

/// What a shard's publish did.
#[derive(Debug, Default)]
pub(crate) struct Published {
    /// Records written (the others were published before).
    pub(crate) written: u64,
    /// Per category count the batch added to: its key
    /// (`{s}convoy:published:{category}`), its value after, what the batch
    /// added.
    pub(crate) counts: Vec<(String, i64, i64)>,
}

/// Publishes the records of a batch that are in `shard`, for `producer`.
#[derive(Debug)]
pub(crate) struct Publish<'a> {
    /// Who publishes: its published set drops re-sent records, its epoch
    /// refuses a replaced publisher.
    pub(crate) producer: &'a Producer,
    /// The shard every record's stream is in.
    pub(crate) shard: u32,
    /// The producer's oldest record not settled yet (every seq below it
    /// is): the batch's first, or an earlier one of a batch in flight.
    pub(crate) floor: u64,
    /// This call's id, unique per publisher process.
    pub(crate) call: &'a str,
    /// The call this one is sent behind while that one's reply has not
    /// come: this one runs only after it ran.
    pub(crate) behind: Option<&'a str>,
    /// The shard's routed records, in the batch's order.
    pub(crate) batch: &'a [Routed<'a>],
}

impl Publish<'_> {
    /// Returns how many records were written (the others were published
    /// before) and the shard's counts after. With `wait`, the batch counts as published only once that
    /// many replicas have it (see [`call_replicated`]); if the call is sent
    /// again on a new connection, the script writes again (its expiry at
    /// least), so the `WAIT` still covers the batch.
    pub(crate) async fn run(
        &self,
        conn: &mut (impl ConnectionLike + Send),
        wait: Option<Replicated>,
    ) -> Result<Published, Error> {
        let inv = self.invocation();
        let reply = call_replicated(
            "publish",
            &inv,
            conn,
            "failed to publish outbox records",
            wait,
        )
        .await?;
        match reply.status {
            Status::Done => {
                let counts = reply
                    .values()
                    .get(1..)
                    .unwrap_or_default()
                    .chunks_exact(3)
                    .filter_map(|c| Some((text(&c[0])?, int(&c[1])?, int(&c[2])?)))
                    .collect();
                Ok(Published {
                    written: reply.int(0).max(0) as u64,
                    counts,
                })
            }
            Status::NotDone => Err(Error::PublishedOutOfTurn),
            Status::Refused(Refusal::FencedOut) => Err(Error::PublisherReplaced {
                producer: self.producer.name.clone(),
                epoch: self.producer.epoch,
                newer: reply.int(0).max(0) as u64,
            }),
            _ => Err(reply.unexpected()),
        }
    }

    /// The script's invocation: every key and value of the shard's records,
    /// as runs of records of one stream and shape (see `publish.lua`).
    /// Each category's index and count are named once, and each run gives
    /// its category's number.
    fn invocation(&self) -> Invocation {
        let mut inv = Invocation::new(&SCRIPTS.publish);
        let shard = self.shard;
        let producer = self.producer.name.as_str();
        let mut categories: Vec<&str> = Vec::new();
        for r in self.batch {
            let category = r.publication.envelope.category.as_str();
            if !categories.contains(&category) {
                categories.push(category);
            }
        }
        inv.key(names::producer_sent(shard, producer))
            .key(names::producer_epoch(shard, producer))
            .key(names::producer_last(shard, producer))
            .arg(if self.producer.epoch > 0 {
                0
            } else {
                PRODUCER_TTL_MS
            })
            .arg(self.floor)
            .arg(self.producer.epoch)
            .arg(categories.len())
            .arg(self.call)
            .arg(self.behind.unwrap_or(""))
            .arg(producer);
        for category in &categories {
            inv.key(names::partition_index(shard, category))
                .key(names::published(shard, category));
        }
        // The records in runs: by stream, in the order streams first
        // appear, each stream's records in the batch's order (a stable
        // sort), cut where the shape changes.
        let mut rank: HashMap<&str, usize> = HashMap::new();
        let mut order: Vec<(usize, usize)> = self
            .batch
            .iter()
            .enumerate()
            .map(|(at, r)| {
                let next = rank.len();
                (*rank.entry(r.stream.as_str()).or_insert(next), at)
            })
            .collect();
        order.sort_by_key(|(stream, _)| *stream);
        let records: Vec<Record<'_, '_>> = order
            .iter()
            .map(|(_, at)| {
                let r = &self.batch[*at];
                (r, r.publication.envelope.fields())
            })
            .collect();
        let shape = |rec| shape_of(rec, producer);
        let mut from = 0;
        while from < records.len() {
            let (first, _) = &records[from];
            let usual = shape(&records[from]).is_some();
            let len = records[from..]
                .iter()
                .take_while(|rec| rec.0.stream == first.stream && shape(rec).is_some() == usual)
                .count();
            let category = first.publication.envelope.category.as_str();
            let number = categories.iter().position(|c| *c == category).unwrap_or(0) + 1;
            inv.key(&first.stream)
                .arg(len)
                .arg(number)
                .arg(first.partition.unwrap_or(""))
                .arg(if usual { "k" } else { "f" });
            for rec in &records[from..from + len] {
                inv.arg(rec.0.publication.seq);
                match shape(rec) {
                    Some([meta, payload]) => {
                        inv.arg(meta).arg(payload);
                    }
                    None => {
                        inv.arg(rec.1.len() * 2);
                        for (k, v) in &rec.1 {
                            inv.arg(*k).arg(v.as_ref());
                        }
                    }
                }
            }
            from += len;
        }
        inv
    }
}

/// A routed record with its entry's fields.
type Record<'r, 'e> = (&'r Routed<'e>, Vec<(&'static str, Cow<'e, str>)>);

/// [`usual_entry`] of a record.
fn shape_of<'a>(rec: &'a Record<'_, '_>, producer: &str) -> Option<[&'a str; 2]> {
    usual_entry(&rec.1, rec.0.partition, producer, rec.0.publication.seq)
}

/// The values of convoy's usual entry that a record sends (`meta` and
/// `payload`), when its fields are that entry (`meta`, `payload`, `key` =
/// the record's partition key, `origin` = `{producer}#{seq}`, in that
/// order), which publish.lua writes from them; `None` for any other entry.
fn usual_entry<'a>(
    fields: &'a [(&'static str, Cow<'_, str>)],
    partition: Option<&str>,
    producer: &str,
    seq: u64,
) -> Option<[&'a str; 2]> {
    match fields {
        [
            (META, meta),
            (PAYLOAD, payload),
            (KEY, key),
            (ORIGIN, origin),
        ] if partition == Some(key.as_ref()) && is_origin(origin, producer, seq) => {
            Some([meta.as_ref(), payload.as_ref()])
        }
        _ => None,
    }
}

/// Whether `origin` is `{producer}#{seq}`, the seq written as Lua writes
/// it back (no leading zero).
fn is_origin(origin: &str, producer: &str, seq: u64) -> bool {
    origin
        .strip_prefix(producer)
        .and_then(|rest| rest.strip_prefix('#'))
        .is_some_and(|s| {
            s.bytes().all(|b| b.is_ascii_digit())
                && s.parse::<u64>() == Ok(seq)
                && (s == "0" || !s.starts_with('0'))
        })
}

#[cfg(test)]
mod tests {
    use super::is_origin;

    #[test]
    fn an_origin_is_the_producer_and_the_seq_as_written() {
        assert!(is_origin("pg/a#42", "pg/a", 42));
        assert!(is_origin("pg/a#b#42", "pg/a#b", 42));
        assert!(is_origin("p#0", "p", 0));
        assert!(!is_origin("pg/a#042", "pg/a", 42));
        assert!(!is_origin("pg/b#42", "pg/a", 42));
        assert!(!is_origin("pg/a#43", "pg/a", 42));
        assert!(!is_origin("pg/a42", "pg/a", 42));
        assert!(!is_origin("pg/a#+42", "pg/a", 42));
    }
}
