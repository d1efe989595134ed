//! `rest.lua`: a drained unit's owner deletes its own consumer where it has
//! nothing pending (its next read creates it again).

use redis::aio::ConnectionLike;

use super::{Caller, Invocation, Refusal, SCRIPTS, Status, call};
use convoy_core::error::Error;

/// Lets the caller's drained unit rest.
#[derive(Debug)]
pub(crate) struct Rest<'a> {
    /// The owner of the unit's lease.
    pub(crate) by: Caller<'a>,
}

/// What [`Rest`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rested {
    /// Done: this many consumers were deleted.
    Rested(u64),
    /// The fence refused the caller.
    Refused(Refusal),
}

impl Rest<'_> {
    pub(crate) async fn run(
        &self,
        conn: &mut (impl ConnectionLike + Send),
    ) -> Result<Rested, Error> {
        let by = self.by;
        let mut inv = Invocation::new(&SCRIPTS.rest);
        inv.key(&by.unit.lease);
        for l in &by.unit.lanes {
            inv.key(&l.primary);
            if !l.backfill.is_empty() {
                inv.key(&l.backfill);
            }
        }
        inv.key(by.alive)
            .arg(by.token)
            .arg(&by.unit.group)
            .arg(by.incarnation);
        let reply = call("rest", &inv, conn, "rest failed").await?;
        match reply.status {
            Status::Done => Ok(Rested::Rested(reply.int(0).max(0) as u64)),
            Status::Refused(why) => Ok(Rested::Refused(why)),
            _ => Err(reply.unexpected()),
        }
    }
}
