//! `publish.lua`: the records of a batch in one shard, in order, in one
//! atomic script (each record's stream entry, index entry and count
//! together).

use std::borrow::Cow;

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

    /// The script's invocation: every key and value of the shard's records.
    /// Each category's index and count are named once, and each record
    /// gives its category's number.
    fn invocation(&self) -> Invocation {
        let mut inv = Invocation::new(&SCRIPTS.publish);
        let shard = self.shard;
        let mut categories: Vec<&str> = Vec::new();
        for r in self.batch {
            let category = r.publication.envelope.category.as_str();
            if !categories.contains(&category) {
                categories.push(category);
            }
        }
        inv.key(names::producer_sent(shard, &self.producer.name))
            .key(names::producer_epoch(shard, &self.producer.name))
            .key(names::producer_last(shard, &self.producer.name))
            .arg(if self.producer.epoch > 0 {
                0
            } else {
                PRODUCER_TTL_MS
            })
            .arg(self.floor)
            .arg(self.producer.epoch)
            .arg(categories.len())
            .arg(self.call)
            .arg(self.behind.unwrap_or(""));
        for category in &categories {
            inv.key(names::partition_index(shard, category))
                .key(names::published(shard, category));
        }
        for r in self.batch {
            let p = r.publication;
            let category = p.envelope.category.as_str();
            let number = categories.iter().position(|c| *c == category).unwrap_or(0) + 1;
            inv.key(&r.stream);
            let fields = p.envelope.fields();
            inv.arg(p.seq).arg(number).arg(r.partition.unwrap_or(""));
            match usual_entry(&fields, r.partition) {
                Some([meta, payload, origin]) => {
                    inv.arg("k").arg(meta).arg(payload).arg(origin);
                }
                None => {
                    inv.arg(fields.len() * 2);
                    for (k, v) in &fields {
                        inv.arg(*k).arg(v.as_ref());
                    }
                }
            }
        }
        inv
    }
}

/// The values of convoy's usual entry (`meta`, `payload`, `key` = the
/// record's partition key, `origin`, in that order), which publish.lua
/// writes from the values alone; `None` for any other entry.
fn usual_entry<'a>(
    fields: &'a [(&'static str, Cow<'_, str>)],
    partition: Option<&str>,
) -> Option<[&'a str; 3]> {
    match fields {
        [
            (META, meta),
            (PAYLOAD, payload),
            (KEY, key),
            (ORIGIN, origin),
        ] if partition == Some(key.as_ref()) => {
            Some([meta.as_ref(), payload.as_ref(), origin.as_ref()])
        }
        _ => None,
    }
}
