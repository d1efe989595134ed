//! `publish.lua`: the records of a batch in one shard, in order, in one
//! atomic script (each record's stream entry, index entry and count
//! together).

use redis::aio::ConnectionLike;

use super::{Refusal, SCRIPTS, Status, call};
use crate::broker::{Producer, Publication};
use crate::error::Error;
use crate::names;

/// How long a producer's published set and epoch are kept after its last
/// publish (7 days).
const PRODUCER_TTL_MS: u64 = 7 * 24 * 3600 * 1000;

/// Publishes the records of a batch that are in `shard`, for `producer`.
#[derive(Debug)]
pub(crate) struct Publish<'a> {
    /// Who publishes: its published set drops re-sent records, its epoch
    /// refuses a replaced publisher.
    pub(crate) producer: &'a Producer,
    /// The shard every record's stream is in.
    pub(crate) shard: u32,
    /// The whole batch's first seq: the producer's oldest pending record
    /// (every seq below it is settled).
    pub(crate) floor: u64,
    /// The shard's routed records, in the batch's order.
    pub(crate) batch: &'a [&'a Publication],
}

impl Publish<'_> {
    /// Returns how many records were written (the others were published
    /// before).
    pub(crate) async fn run(&self, conn: &mut (impl ConnectionLike + Send)) -> Result<u64, Error> {
        let mut inv = SCRIPTS.publish.prepare_invoke();
        let shard = self.shard;
        inv.key(names::producer_sent(shard, &self.producer.name))
            .key(names::producer_epoch(shard, &self.producer.name))
            .arg(PRODUCER_TTL_MS)
            .arg(self.floor)
            .arg(self.producer.epoch);
        for p in self.batch {
            let category = &p.envelope.category;
            inv.key(&p.stream)
                .key(names::partition_index(shard, category))
                .key(names::published(shard, category));
            let fields = p.envelope.to_fields();
            inv.arg(p.seq)
                .arg(p.partition.as_deref().unwrap_or(""))
                .arg(fields.len() * 2);
            for (k, v) in fields {
                inv.arg(k).arg(v);
            }
        }
        let reply = call("publish", &inv, conn, "failed to publish outbox records").await?;
        match reply.status {
            Status::Done => Ok(reply.int(0).max(0) as u64),
            Status::Refused(Refusal::FencedOut) => Err(Error::PublisherReplaced {
                producer: self.producer.name.clone(),
                epoch: self.producer.epoch,
                newer: reply.int(0).max(0) as u64,
            }),
            _ => Err(reply.unexpected()),
        }
    }
}
