//! `reap.lua`: retires a drained, idle unit (its index entries, its empty
//! streams and its lease go together; its generation stays).

use redis::aio::ConnectionLike;

use super::{Caller, Invocation, Refusal, SCRIPTS, Status, call};
use convoy_core::error::Error;

/// Retires the caller's unit if it is empty and idle for `idle_ms`.
#[derive(Debug)]
pub(crate) struct Reap<'a> {
    /// The owner of the unit's lease.
    pub(crate) by: Caller<'a>,
    pub(crate) idle_ms: u64,
    /// Now, in ms since the Unix epoch.
    pub(crate) now_ms: u64,
}

/// What [`Reap`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reaped {
    /// Retired.
    Retired,
    /// Not empty, or not idle long enough: kept.
    Kept,
    /// The fence refused the caller.
    Refused(Refusal),
}

impl Reap<'_> {
    pub(crate) async fn run(
        &self,
        conn: &mut (impl ConnectionLike + Send),
    ) -> Result<Reaped, Error> {
        let mut inv = Invocation::new(&SCRIPTS.reap);
        let by = self.by;
        inv.key(&by.unit.lease).key(&by.unit.state);
        for l in &by.unit.lanes {
            inv.key(&l.index).key(&l.primary).key(&l.backfill_always);
        }
        inv.key(by.alive)
            .arg(by.token)
            .arg(&by.unit.key)
            .arg(self.idle_ms)
            .arg(self.now_ms)
            .arg(by.unit.lanes.len())
            .arg(by.incarnation);
        let reply = call("reap", &inv, conn, "reap failed").await?;
        match reply.status {
            Status::Done => Ok(Reaped::Retired),
            Status::NotDone => Ok(Reaped::Kept),
            Status::Refused(why) => Ok(Reaped::Refused(why)),
            _ => Err(reply.unexpected()),
        }
    }
}
