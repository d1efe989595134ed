//! `fail.lua`: records a failed attempt at a unit's head beside the lease,
//! and halts the unit when the retries are used up (or at once, for a fault
//! no retry can mend).

use redis::aio::ConnectionLike;

use super::{Refusal, SCRIPTS, Status, call};
use crate::error::Error;
use crate::redis::unit::Unit;

/// Records a failure of `entry` in `unit`.
#[derive(Debug)]
pub(crate) struct Fail<'a> {
    pub(crate) unit: &'a Unit,
    /// The owner's liveness key.
    pub(crate) alive: &'a str,
    /// The fence token.
    pub(crate) token: &'a str,
    /// The owner's incarnation the lease was taken in.
    pub(crate) incarnation: &'a str,
    /// The entry that failed (`""` for a fault of the unit itself).
    pub(crate) entry: &'a str,
    /// The error, rendered.
    pub(crate) error: &'a str,
    pub(crate) max_retries: u32,
    /// Now, in ms since the Unix epoch.
    pub(crate) now_ms: u64,
    /// The failures of `entry` the caller knew of before this one (so a
    /// call repeated after a lost reply counts the failure once).
    pub(crate) known: u32,
    /// Halt at once, with this reason.
    pub(crate) halt: Option<&'a str>,
}

/// What [`Fail`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failed {
    /// Recorded: the failures of the head so far, and whether the unit is
    /// now halted.
    Recorded { failures: u32, halted: bool },
    /// The fence refused the caller.
    Refused(Refusal),
}

impl Fail<'_> {
    pub(crate) async fn run(
        &self,
        conn: &mut (impl ConnectionLike + Send),
    ) -> Result<Failed, Error> {
        let mut inv = SCRIPTS.fail.prepare_invoke();
        inv.key(&self.unit.lease)
            .key(&self.unit.state)
            .key(self.alive)
            .arg(self.token)
            .arg(self.entry)
            .arg(self.error)
            .arg(self.max_retries)
            .arg(self.now_ms)
            .arg(self.known)
            .arg(self.incarnation)
            .arg(self.halt.unwrap_or(""));
        let reply = call("fail", &inv, conn, "failed to record a failure").await?;
        match reply.status {
            Status::Done => Ok(Failed::Recorded {
                failures: reply.int(0).max(0) as u32,
                halted: reply.int(1) == 1,
            }),
            Status::Refused(why) => Ok(Failed::Refused(why)),
            _ => Err(reply.unexpected()),
        }
    }
}
