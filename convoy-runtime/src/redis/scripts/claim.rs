//! `claim.lua`: on takeover, moves the pending entries earlier generations
//! left in one stream of the unit to this generation's consumer.

use redis::aio::ConnectionLike;

use super::{Refusal, SCRIPTS, Status, call};
use crate::error::Error;
use crate::redis::reply::text;
use crate::redis::unit::Unit;

/// Reclaims `stream` of `unit` for the consumer `token`.
#[derive(Debug)]
pub(crate) struct Claim<'a> {
    pub(crate) unit: &'a Unit,
    pub(crate) stream: &'a str,
    /// The owner's liveness key.
    pub(crate) alive: &'a str,
    /// The fence token, also the consumer name.
    pub(crate) token: &'a str,
    /// The owner's incarnation the lease was taken in.
    pub(crate) incarnation: &'a str,
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
        let mut inv = SCRIPTS.claim.prepare_invoke();
        inv.key(&self.unit.lease)
            .key(self.stream)
            .key(self.alive)
            .arg(self.token)
            .arg(&self.unit.group)
            .arg(self.incarnation);
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
