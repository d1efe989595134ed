//! `read.lua`: the fenced read of a unit: its own pending entries, or new
//! ones, primary lanes before backfill lanes.

use redis::Value;
use redis::aio::ConnectionLike;

use super::{Caller, Invocation, Refusal, SCRIPTS, Status, call};
use crate::reply::{Entry, entries, into_text};
use crate::unit::At;
use convoy_core::error::Error;

/// Which entries to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Which {
    /// This consumer's own pending entries (after a lost reply, a restart).
    Pending,
    /// Entries not yet delivered to the group.
    New,
}

/// Reads a batch of the caller's unit.
#[derive(Debug)]
pub(crate) struct Read<'a> {
    /// The owner of the unit's lease (its token names the consumer).
    pub(crate) by: Caller<'a>,
    pub(crate) which: Which,
    /// Entries per read of a primary lane.
    pub(crate) primary_count: usize,
    /// Entries per read of a backfill lane.
    pub(crate) backfill_count: usize,
    /// The most new entries the script returns whole: a longer batch comes
    /// back as ids, and one `XRANGE` reads their fields (an entry passed
    /// back through Lua costs Redis about as much again as reading it).
    pub(crate) whole: usize,
    /// The lane to look at first (rotates for fairness between the
    /// categories of one unit).
    pub(crate) first_lane: usize,
    /// For a read of new entries: check that the consumer holds no pending
    /// entry the caller has not seen, given the entries it holds pending
    /// (handled, not yet acknowledged) and where. A client that sends a
    /// read again after a dropped connection (the Redis Cluster client
    /// does) would otherwise pass over what the first one delivered.
    pub(crate) held: Option<(At, usize)>,
}

/// What [`Read`] found.
#[derive(Debug)]
pub(crate) enum ReadReply {
    /// Entries of one stream.
    Entries(At, Vec<Entry>),
    /// Nothing to read.
    Empty,
    /// The fence refused the caller.
    Refused(Refusal),
    /// A lane's key holds another type than a stream.
    NotAStream { stream: String, kind: String },
    /// The consumer holds pending entries the caller has not seen (see
    /// [`Read::held`]): read them first.
    Unseen,
}

impl Read<'_> {
    pub(crate) async fn run(
        &self,
        conn: &mut (impl ConnectionLike + Send),
    ) -> Result<ReadReply, Error> {
        let by = self.by;
        let lanes = &by.unit.lanes;
        let mut inv = Invocation::new(&SCRIPTS.read);
        inv.key(&by.unit.lease);
        for l in lanes {
            inv.key(&l.primary);
        }
        let backfill_on = by.unit.backfill_on();
        if backfill_on {
            for l in lanes {
                inv.key(&l.backfill);
            }
        }
        inv.key(by.alive)
            .arg(by.token)
            .arg(&by.unit.group)
            .arg(self.primary_count)
            .arg(self.backfill_count)
            .arg(match self.which {
                Which::Pending => "0",
                Which::New => ">",
            })
            .arg(lanes.len())
            .arg(self.first_lane)
            .arg(by.incarnation)
            .arg(if backfill_on { "1" } else { "0" });
        match self.held {
            Some((at, n)) if self.which == Which::New => {
                // KEYS index (1-based) of the stream holding them.
                let index = 2 + at.lane + if at.backfill { lanes.len() } else { 0 };
                inv.arg(n).arg(index);
            }
            _ => {
                inv.arg("").arg(0);
            }
        }
        inv.arg(self.whole);
        let mut reply = call("read", &inv, conn, "fenced read failed").await?;
        match &reply.status {
            Status::Done => {}
            Status::NotDone => return Ok(ReadReply::Unseen),
            Status::Refused(why) => return Ok(ReadReply::Refused(*why)),
            Status::NotAStream => {
                return Ok(ReadReply::NotAStream {
                    stream: reply.text(0),
                    kind: reply.text(1),
                });
            }
            _ => return Err(reply.unexpected()),
        }
        // Lane i in 1..=n is primary stream i, n+i its backfill lane, 0 none.
        let n = lanes.len();
        let lane = reply.int(0).max(0) as usize;
        if lane == 0 {
            return Ok(ReadReply::Empty);
        }
        let at = if lane > n {
            At {
                lane: lane - n - 1,
                backfill: true,
            }
        } else {
            At {
                lane: lane - 1,
                backfill: false,
            }
        };
        if at.lane >= n {
            return Err(reply.unexpected());
        }
        let ids_only = reply.int(2) == 1;
        // The entries move out of the reply (no copy of each event).
        let batch = match reply.take(1) {
            Some(ids) if ids_only => {
                let lane = &lanes[at.lane];
                let stream = if at.backfill {
                    &lane.backfill
                } else {
                    &lane.primary
                };
                fields_of(stream, ids, conn).await?
            }
            Some(v) => entries(v),
            None => Vec::new(),
        };
        if batch.is_empty() {
            return Ok(ReadReply::Empty);
        }
        Ok(ReadReply::Entries(at, batch))
    }
}

/// The entries a read delivered as `ids` (consecutive entries of `stream`,
/// in order), with their fields, from one `XRANGE` over the ids' range. An
/// entry deleted since the read is missing from the range: it comes back
/// without fields, as a field-less entry of a read would.
pub(super) async fn fields_of(
    stream: &str,
    ids: Value,
    conn: &mut (impl ConnectionLike + Send),
) -> Result<Vec<Entry>, Error> {
    let unexpected = |what: String| Error::UnexpectedReply {
        script: "read",
        reply: what,
    };
    let Value::Array(ids) = ids else {
        return Err(unexpected(format!("ids that are not an array: {ids:?}")));
    };
    // Every id or none: an id left out would never be handled.
    let ids: Vec<String> = ids
        .into_iter()
        .map(into_text)
        .collect::<Option<_>>()
        .ok_or_else(|| unexpected("an entry id that is not text".to_owned()))?;
    let (Some(first), Some(last)) = (ids.first().cloned(), ids.last().cloned()) else {
        return Ok(Vec::new());
    };
    let range: Value = redis::cmd("XRANGE")
        .arg(stream)
        .arg(&first)
        .arg(&last)
        .arg("COUNT")
        .arg(ids.len())
        .query_async(conn)
        .await
        .map_err(|e| Error::redis("reading the fields of a fenced read's entries failed", e))?;
    let mut found = entries(range).into_iter().peekable();
    let batch = ids
        .into_iter()
        .map(|id| match found.next_if(|e| e.id == id) {
            Some(entry) => entry,
            None => Entry { id, fields: None },
        })
        .collect();
    // An entry in the range the read did not deliver: the stream is not
    // what the read left (the caller re-reads its pending entries).
    if let Some(other) = found.next() {
        return Err(unexpected(format!(
            "XRANGE of {stream:?} from {first} to {last} holds entry {}, which the read did not deliver",
            other.id
        )));
    }
    Ok(batch)
}
