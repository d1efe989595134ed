//! `claim.lua`: on takeover, moves the pending entries earlier generations
//! left in one stream of the unit to this generation's consumer.

use redis::aio::ConnectionLike;

use super::{Caller, Invocation, Refusal, SCRIPTS, Status, call};
use crate::reply::text;
use convoy_core::error::Error;

/// Reclaims `stream` of the caller's unit for the caller's consumer.
#[derive(Debug)]
pub(crate) struct Claim<'a> {
    /// The owner of the unit's lease (its token names the consumer).
    pub(crate) by: Caller<'a>,
    /// One of the unit's streams.
    pub(crate) stream: &'a str,
}

/// What [`Claim`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claimed {
    /// `count` entries are now pending for this consumer; `gone` were
    /// pending but no longer exist in the stream (to be reported, never
    /// skipped quietly).
    Done { count: u64, gone: Vec<String> },
    /// The fence refused the caller.
    Refused(Refusal),
    /// The stream's key holds another type (`kind`).
    NotAStream { kind: String },
}

impl Claim<'_> {
    pub(crate) async fn run(
        &self,
        conn: &mut (impl ConnectionLike + Send),
    ) -> Result<Claimed, Error> {
        let mut inv = Invocation::new(&SCRIPTS.claim);
        let by = self.by;
        inv.key(&by.unit.lease)
            .key(self.stream)
            .key(by.alive)
            .arg(by.token)
            .arg(&by.unit.group)
            .arg(by.incarnation);
        let reply = call("claim", &inv, conn, "failed to reclaim pending entries").await?;
        match reply.status {
            Status::Done => Ok(Claimed::Done {
                count: reply.int(0).max(0) as u64,
                gone: reply.values().iter().skip(1).filter_map(text).collect(),
            }),
            Status::Refused(why) => Ok(Claimed::Refused(why)),
            Status::NotAStream => Ok(Claimed::NotAStream {
                kind: reply.text(0),
            }),
            _ => Err(reply.unexpected()),
        }
    }
}
