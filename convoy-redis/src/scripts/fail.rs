//! `fail.lua`: records a failed attempt at a unit's head beside the lease,
//! and halts the unit when the retries are used up (or at once, for a fault
//! no retry can mend).

use redis::aio::ConnectionLike;

use super::{Caller, Invocation, Refusal, SCRIPTS, Status, call};
use convoy_core::error::Error;

/// Records a failure of `entry` in the caller's unit.
#[derive(Debug)]
pub(crate) struct Fail<'a> {
    /// The owner of the unit's lease.
    pub(crate) by: Caller<'a>,
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
        let mut inv = Invocation::new(&SCRIPTS.fail);
        let by = self.by;
        inv.key(&by.unit.lease)
            .key(&by.unit.state)
            .key(by.alive)
            .arg(by.token)
            .arg(self.entry)
            .arg(self.error)
            .arg(self.max_retries)
            .arg(self.now_ms)
            .arg(self.known)
            .arg(by.incarnation)
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
