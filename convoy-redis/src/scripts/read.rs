//! The fenced read of a unit: its own pending entries, or new ones,
//! primary lanes before backfill lanes.
//!
//! - `read.lua` reads inside the script, behind the fence check.
//! - New entries of a unit that reads one stream (one category, priority
//!   lanes off: every handler's unit unless priority lanes are on) are read
//!   natively instead: a plain `XREADGROUP`, and `verify.lua` right behind
//!   it in the same pipeline (one round trip), which checks the fence after
//!   the read and moves back what a replaced owner read (see the script's
//!   header). Redis then spends no Lua on the entries: a script's reply
//!   passed through Lua costs it about as much again as the read itself.

use redis::Value;
use redis::aio::ConnectionLike;

use super::ack::{Ack, Acked};
use super::{Caller, Invocation, Refusal, Reply, SCRIPTS, Status, call, load, no_script};
use crate::connection::refused_reply;
use crate::reply::{Entry, entries, first_stream_entries, into_text};
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
#[derive(Debug, Clone, Copy)]
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
    /// The entries the caller holds pending (handled, not yet
    /// acknowledged, or a batch in hand while it reads ahead), where, and
    /// the oldest one's id. A read of new entries checks that the consumer
    /// holds nothing else pending: more means a read ran without the
    /// caller seeing its reply (failed, or sent again by the client after
    /// a dropped connection, as the Redis Cluster client does), and what it
    /// delivered would be passed over. The native read's check also finds
    /// the oldest pending entry to be the oldest held: a read that ran
    /// after the caller acknowledged some of them counts fewer, and would
    /// otherwise take as many unseen entries for them.
    pub(crate) held: (At, usize, Option<&'a str>),
    /// Whether the scripted read checks [`Read::held`] too (the native read
    /// always does): where the client sends a read again by itself (a
    /// cluster). Elsewhere a read either answers or fails, and the caller
    /// re-reads its pending entries after a failure.
    pub(crate) resent: bool,
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
    /// Entries a replaced owner read without the fence (natively, after it
    /// lost the lease) were moved from `stream` to the caller's consumer
    /// (`moved` of them): read its pending entries first. `missing`: those
    /// that were pending but whose entries no longer exist (to report,
    /// never to skip quietly).
    Reclaimed {
        stream: String,
        moved: u64,
        missing: Vec<String>,
    },
}

/// The [`ReadReply::Reclaimed`] of a read's reply with status `2`:
/// `{2, stream, moved, gone ids...}`.
fn moved_back(mut reply: Reply) -> ReadReply {
    let stream = reply.text(0);
    let moved = reply.int(1).max(0) as u64;
    let missing = (2..reply.values().len())
        .filter_map(|i| reply.take(i).and_then(into_text))
        .collect();
    ReadReply::Reclaimed {
        stream,
        moved,
        missing,
    }
}

/// What a native read came to.
#[derive(Debug)]
pub(crate) enum Native {
    /// Read and checked.
    Read(ReadReply),
    /// The script reads instead: the stream or its group does not exist
    /// yet (the script creates the group), or the key holds another type
    /// than a stream. The read did not run.
    Script,
    /// Redis refused the read or its check before running it (a
    /// redirection, a replica's `READONLY`): the script reads instead,
    /// checking that nothing pending is unseen (the read may have run).
    Refused,
}

/// What [`Read::after_ack`] came to: the acknowledgement's outcome and the
/// read's, each known or failed on its own.
#[derive(Debug)]
pub(crate) struct AckedRead {
    /// One outcome per acknowledged unit; an error may have run.
    pub(crate) acked: Result<Vec<Acked>, Error>,
    /// The read's outcome where it ran, to be used only once the
    /// acknowledgement is known to be done; except that one sending the
    /// caller to its pending entries first ([`ReadReply::Unseen`],
    /// [`ReadReply::Reclaimed`]) holds whatever came of the
    /// acknowledgement. `None`: not read (the read needed the script, which
    /// is not sent while the acknowledgement is not done).
    pub(crate) read: Option<Result<ReadReply, Error>>,
}

/// What [`Read::native`] came to: the read's outcome, and that of the
/// acknowledgement sent in front of it, if one was.
type NativeRead = (Result<Native, Error>, Option<Result<Vec<Acked>, Error>>);

impl Read<'_> {
    pub(crate) async fn run(
        &self,
        conn: &mut (impl ConnectionLike + Send),
    ) -> Result<ReadReply, Error> {
        if self.which == Which::New && self.by.unit.one_stream() {
            match self.native(conn, None).await?.0? {
                Native::Read(reply) => return Ok(reply),
                Native::Script => {}
                // The read may have run without the check: the script then
                // checks that nothing pending is unseen.
                Native::Refused => {
                    return Read {
                        resent: true,
                        ..*self
                    }
                    .scripted(conn)
                    .await;
                }
            }
        }
        self.scripted(conn).await
    }

    /// New entries of a unit of one stream read ahead, natively only: its
    /// outcome is used once the entries it counts as held may have been
    /// acknowledged, and the scripted read's check (more pending than held)
    /// would then pass over as many unseen entries. A read that needs the
    /// script, or that Redis refused before running, sends the caller to
    /// its pending entries first instead (they hold what it delivered, if
    /// it ran).
    pub(crate) async fn ahead(
        &self,
        conn: &mut (impl ConnectionLike + Send),
    ) -> Result<ReadReply, Error> {
        debug_assert!(self.which == Which::New && self.by.unit.one_stream());
        match self.native(conn, None).await?.0? {
            Native::Read(reply) => Ok(reply),
            Native::Script | Native::Refused => Ok(ReadReply::Unseen),
        }
    }

    /// New entries of a unit of one stream, with `ack` (the unit's own
    /// acknowledgement of what it handled) sent in front of the read in one
    /// pipeline: a unit that finished its batch pays one round trip for both
    /// rather than two, one after the other. Redis runs them in that order,
    /// so the read holds what the acknowledgement left pending, and
    /// [`Read::held`] counts none (a caller holding entries it does not
    /// acknowledge here reads with [`Read::run`]).
    ///
    /// Only where the client never sends a command again by itself (one
    /// server, not a cluster) and without `wait_acks`: the caller sees to
    /// both. An `Err` means neither outcome is known: the acknowledgement
    /// may have run, and so may the read.
    pub(crate) async fn after_ack(
        &self,
        ack: &Ack<'_>,
        conn: &mut (impl ConnectionLike + Send),
    ) -> Result<AckedRead, Error> {
        debug_assert!(self.which == Which::New && self.by.unit.one_stream() && self.held.1 == 0);
        let (native, acked) = self.native(conn, Some(ack)).await?;
        let acked = acked.unwrap_or_else(|| {
            Err(Error::UnexpectedReply {
                script: "ack",
                reply: "no reply to an acknowledgement sent with a read".to_owned(),
            })
        });
        let done = matches!(&acked, Ok(all) if all.iter().all(|a| matches!(a, Acked::Acked(_))));
        let read = match native {
            Ok(Native::Read(reply)) => Some(Ok(reply)),
            Err(e) => Some(Err(e)),
            // The script reads instead, and only once the acknowledgement is
            // done (the caller would not use its reply): it then reads what
            // the acknowledgement left, the same as on its own.
            Ok(_) if !done => None,
            Ok(Native::Script) => Some(self.scripted(conn).await),
            Ok(Native::Refused) => Some(
                Read {
                    resent: true,
                    ..*self
                }
                .scripted(conn)
                .await,
            ),
        };
        Ok(AckedRead { acked, read })
    }

    /// New entries of a unit of one stream: a plain `XREADGROUP` with
    /// `verify.lua` behind it in one pipeline, and `ack` in front of them
    /// when given (see [`Read::after_ack`]; its outcome is returned beside
    /// the read's, each known or failed on its own). An `Err`: neither is
    /// known.
    pub(super) async fn native(
        &self,
        conn: &mut (impl ConnectionLike + Send),
        ack: Option<&Ack<'_>>,
    ) -> Result<NativeRead, Error> {
        let by = self.by;
        let stream = &by.unit.lanes[0].primary;
        let mut inv = Invocation::new(&SCRIPTS.verify);
        inv.key(&by.unit.lease)
            .key(stream)
            .key(by.alive)
            .arg(by.token)
            .arg(&by.unit.group)
            .arg(by.incarnation);
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        // The pipeline keeps its commands: the calls go in as written.
        if let Some(a) = ack {
            pipe.add_command(a.invocation().into_command());
        }
        pipe.cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&by.unit.group)
            .arg(by.token)
            .arg("COUNT")
            .arg(self.primary_count)
            .arg("STREAMS")
            .arg(stream)
            .arg(">")
            .add_command(inv.into_command());
        let unknown =
            |v: &Value| matches!(v, Value::ServerError(e) if no_script(&e.clone().into()));
        let mut loaded = false;
        loop {
            let replies: Vec<Value> = pipe
                .query_async(conn)
                .await
                .map_err(|e| Error::redis("native read failed", e))?;
            let mut replies = replies.into_iter();
            let acked = match ack {
                Some(_) => replies.next(),
                None => None,
            };
            let (Some(read), Some(check), None) = (replies.next(), replies.next(), replies.next())
            else {
                return Err(Error::UnexpectedReply {
                    script: "verify",
                    reply: "a native read's pipeline answered with another number of replies"
                        .to_owned(),
                });
            };
            let ack_unknown = acked.as_ref().is_some_and(unknown);
            if !loaded && unknown(&check) {
                // Redis did not know the check: sent again as a whole once
                // loaded. The read ran the first time, so the check sees more
                // pending than the second read delivered, and the caller
                // re-reads its pending entries. (An acknowledgement in front
                // ran, or if unknown too did not and runs the second time.)
                loaded = true;
                load("verify", &SCRIPTS.verify, conn).await?;
                if ack_unknown && ack.is_some() {
                    load("ack", &SCRIPTS.ack, conn).await?;
                }
                continue;
            }
            let read = self.checked(read, check);
            let Some(a) = ack else {
                return Ok((read, None));
            };
            let acked = match acked {
                // Only the acknowledgement did not run; the read and its
                // check did, and their outcome stands (the check counted the
                // entries the acknowledgement was to take: the read usually
                // comes out unseen). The acknowledgement goes on its own,
                // loading its script, rather than the whole pipeline again:
                // that would lose the check's outcome (the ids a replaced
                // owner left missing are in it, and only there).
                Some(_) if ack_unknown => a.run(conn, None).await,
                Some(Value::ServerError(e)) => {
                    Err(Error::redis("fenced acknowledgement failed", e.into()))
                }
                Some(v) => Reply::parse("ack", v).and_then(|reply| a.answers(&reply)),
                None => Err(Error::UnexpectedReply {
                    script: "ack",
                    reply: "no reply".to_owned(),
                }),
            };
            return Ok((read, Some(acked)));
        }
    }

    /// What a native read's `XREADGROUP` reply and `verify.lua`'s check of
    /// it come to.
    fn checked(&self, read: Value, check: Value) -> Result<Native, Error> {
        // Refused before running (a redirection, a replica's READONLY): the
        // cluster client follows a redirection only for a request that
        // fails as a whole, which this pipeline of error replies does not,
        // so the script, sent on its own, reads instead.
        let refused = |v: &Value| matches!(v, Value::ServerError(e) if refused_reply(e));
        if refused(&read) || refused(&check) {
            return Ok(Native::Refused);
        }
        if let Value::ServerError(e) = check {
            return Err(Error::redis("checking a native read failed", e.into()));
        }
        let check = Reply::parse("verify", check)?;
        match &check.status {
            Status::Done => {}
            Status::Refused(why) => return Ok(Native::Read(ReadReply::Refused(*why))),
            Status::MovedBack => return Ok(Native::Read(moved_back(check))),
            _ => return Err(check.unexpected()),
        }
        let batch = match read {
            Value::ServerError(e) if matches!(e.code(), "NOGROUP" | "WRONGTYPE") => {
                return Ok(Native::Script);
            }
            Value::ServerError(e) => return Err(Error::redis("native read failed", e.into())),
            Value::Nil => Vec::new(),
            v => first_stream_entries(v)
                .into_iter()
                .next()
                .map(|(_, entries)| entries)
                .unwrap_or_default(),
        };
        // A unit of one stream holds its entries in that stream.
        let (_, held, oldest) = self.held;
        let reply = if usize::try_from(check.int(0)).ok() != Some(held + batch.len())
            || oldest.is_some_and(|oldest| check.text(1) != oldest)
        {
            ReadReply::Unseen
        } else if batch.is_empty() {
            ReadReply::Empty
        } else {
            ReadReply::Entries(
                At {
                    lane: 0,
                    backfill: false,
                },
                batch,
            )
        };
        Ok(Native::Read(reply))
    }

    /// The read inside `read.lua`, behind its fence check.
    pub(super) async fn scripted(
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
            (at, n, _) if self.resent && self.which == Which::New => {
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
            Status::MovedBack => return Ok(moved_back(reply)),
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
