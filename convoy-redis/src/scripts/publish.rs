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
use convoy_core::envelope::fields::ORIGIN;
use convoy_core::envelope::{Envelope, Origin};
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
    /// Wake-up entries the script could not write (a wake stream key
    /// holding something else): the records are published all the same.
    pub(crate) wake_failures: u64,
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
    /// Whether the script writes the wake-ups of the keys it wrote to (on
    /// one server, where the wake streams are beside the shard's keys; on
    /// a cluster they are in other slots, and the caller writes them).
    pub(crate) wakes: bool,
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
                    .get(2..)
                    .unwrap_or_default()
                    .chunks_exact(3)
                    .filter_map(|c| Some((text(&c[0])?, int(&c[1])?, int(&c[2])?)))
                    .collect();
                Ok(Published {
                    written: reply.int(0).max(0) as u64,
                    counts,
                    wake_failures: reply.int(1).max(0) as u64,
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
        let shard = self.shard;
        let producer = self.producer.name.as_str();
        let mut categories: Vec<&str> = Vec::new();
        for r in self.batch {
            let category = r.publication.envelope.category.as_str();
            if !categories.contains(&category) {
                categories.push(category);
            }
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
        let records: Vec<(&Routed<'_>, Shape<'_>)> = order
            .iter()
            .map(|(_, at)| {
                let r = &self.batch[*at];
                (r, Shape::of(r, producer))
            })
            .collect();
        // Sized for the usual entries (a run's four values at most per
        // record, and its seq, meta and payload); others grow it.
        let bytes: usize = records
            .iter()
            .map(|(_, shape)| match shape {
                Shape::Usual(e) => {
                    // `meta`: its five names, time and priority, about 80
                    // bytes, and its strings.
                    let meta = 80 + e.id.len() + e.type_name.len() + e.category.len();
                    32 + meta + e.correlation_id.as_ref().map_or(0, String::len) + e.payload.len()
                }
                Shape::Fields(_) => 64,
            })
            .sum();
        // The runs: records of one stream and one shape, as (first, len).
        let mut runs: Vec<(usize, usize)> = Vec::with_capacity(rank.len());
        let mut from = 0;
        while from < records.len() {
            let (first, shape) = &records[from];
            let usual = shape.is_usual();
            let len = records[from..]
                .iter()
                .take_while(|(r, shape)| r.stream == first.stream && shape.is_usual() == usual)
                .count();
            runs.push((from, len));
            from += len;
        }
        let wakes = if self.wakes { categories.len() } else { 0 };
        // Every key first (the call is written as the command itself),
        // then the values.
        let mut inv = Invocation::keys_first(
            &SCRIPTS.publish,
            3 + 2 * categories.len() + wakes + runs.len(),
            9 + 4 * runs.len() + 3 * records.len(),
            128 + bytes,
        );
        inv.key(names::producer_sent(shard, producer))
            .key(names::producer_epoch(shard, producer))
            .key(names::producer_last(shard, producer));
        for category in &categories {
            inv.key(names::partition_index(shard, category))
                .key(names::published(shard, category));
        }
        for category in &categories[..wakes] {
            inv.key(names::wake_stream(category));
        }
        for &(first, _) in &runs {
            inv.key(&records[first].0.stream);
        }
        inv.arg(if self.producer.epoch > 0 {
            0
        } else {
            PRODUCER_TTL_MS
        })
        .arg(self.floor)
        .arg(self.producer.epoch)
        .arg(categories.len())
        .arg(self.call)
        .arg(self.behind.unwrap_or(""))
        .arg(producer)
        .arg(wakes)
        .arg(names::WAKE_MAXLEN);
        // Each usual record's `meta`, written here before it is copied
        // into the call.
        let mut meta = Vec::with_capacity(256);
        for &(from, len) in &runs {
            let (first, shape) = &records[from];
            let category = first.publication.envelope.category.as_str();
            let number = categories.iter().position(|c| *c == category).unwrap_or(0) + 1;
            inv.arg(len)
                .arg(number)
                .arg(first.partition.unwrap_or(""))
                .arg(if shape.is_usual() { "k" } else { "f" });
            for (r, shape) in &records[from..from + len] {
                inv.arg(r.publication.seq);
                match shape {
                    Shape::Usual(e) => {
                        meta.clear();
                        e.write_meta(&mut meta);
                        inv.arg(meta.as_slice()).arg(e.payload.as_str());
                    }
                    Shape::Fields(fields) => {
                        inv.arg(fields.len() * 2);
                        for (k, v) in fields {
                            inv.arg(*k).arg(v.as_ref());
                        }
                    }
                }
            }
        }
        inv
    }
}

/// A record's entry as the script is sent it.
#[derive(Debug)]
enum Shape<'e> {
    /// convoy's usual entry (`meta`, `payload`, `key` = the record's
    /// partition key, `origin` = `{producer}#{seq}`, in that order), which
    /// publish.lua writes from the values of `meta` and `payload` alone:
    /// the envelope they are written from.
    Usual(&'e Envelope),
    /// Any other entry: every field, in order.
    Fields(Vec<(&'static str, Cow<'e, str>)>),
}

impl<'e> Shape<'e> {
    /// The shape of `r`'s entry, published by `producer`: usual when the
    /// envelope has the record's partition key (its origin is the
    /// producer's record of its seq, which the script writes from the
    /// producer's name and the seq: its text is never sent).
    fn of(r: &Routed<'e>, producer: &str) -> Shape<'e> {
        let e: &'e Envelope = &r.publication.envelope;
        let usual = e.partition_key.is_some() && r.partition == e.partition_key.as_deref();
        if usual {
            Shape::Usual(e)
        } else {
            let mut fields = e.fields();
            fields.retain(|(name, _)| *name != ORIGIN);
            fields.push((
                ORIGIN,
                Cow::Owned(Origin::wire(producer, r.publication.seq)),
            ));
            Shape::Fields(fields)
        }
    }

    /// Whether this is convoy's usual entry.
    fn is_usual(&self) -> bool {
        matches!(self, Shape::Usual(_))
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use std::sync::Arc;

    use super::Shape;
    use crate::routing::Routed;
    use convoy_core::broker::Publication;
    use convoy_core::envelope::{Origin, fields};

    /// Record `seq` of `key` (none: unpartitioned), whose envelope names
    /// `origin` as its own.
    fn publication(seq: u64, key: Option<&str>, origin: Option<(&str, u64)>) -> Publication {
        let mut p = super::super::tests::publication(seq, key.unwrap_or_default());
        let e = Arc::make_mut(&mut p.envelope);
        e.partition_key = key.map(Into::into);
        e.origin = origin.map(|(producer, seq)| Origin {
            producer: producer.into(),
            seq,
        });
        p
    }

    fn routed<'a>(p: &'a Publication, partition: Option<&'a str>) -> Routed<'a> {
        Routed {
            publication: p,
            stream: "s".into(),
            partition,
        }
    }

    /// A record of its own key is sent as the usual entry, which the script
    /// writes back with this producer's origin of its seq, whatever origin
    /// its envelope names; any other entry is sent field by field, with
    /// that same origin.
    #[test]
    fn the_usual_entry_is_a_record_of_its_key_and_every_entry_has_this_producers_origin() {
        for origin in [None, Some(("pg/b", 7))] {
            let usual = publication(42, Some("k"), origin);
            match Shape::of(&routed(&usual, Some("k")), "pg/a") {
                Shape::Usual(e) => assert!(std::ptr::eq(e, &*usual.envelope)),
                other => panic!("the usual entry sent as {other:?}"),
            }
        }
        for (p, partition) in [
            (publication(42, Some("k"), Some(("pg/a", 42))), Some("j")),
            (publication(42, None, None), None),
            (publication(42, None, Some(("pg/b", 3))), None),
        ] {
            let Shape::Fields(f) = Shape::of(&routed(&p, partition), "pg/a") else {
                panic!("{p:?} sent as the usual entry");
            };
            let want = convoy_core::envelope::Envelope {
                origin: Some(Origin {
                    producer: "pg/a".into(),
                    seq: 42,
                }),
                ..convoy_core::envelope::Envelope::clone(&p.envelope)
            };
            assert_eq!(f, want.fields(), "sent as it is, with its origin");
            assert_eq!(f[0].0, fields::META);
        }
    }
}
