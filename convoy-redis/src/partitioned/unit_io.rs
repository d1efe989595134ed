//! The I/O of one unit's worker, behind a narrow trait: each call is one
//! fenced script (or one command) on the unit, answered by its typed
//! reply. [`RedisUnit`] runs them on Redis; the worker decides what to do
//! with the replies, and its phase machine ([`super::phase`]) what comes
//! next.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::super::connection::Conn;
use super::super::scripts::ack::{Ack, AckItem, Acked};
use super::super::scripts::claim::{Claim, Claimed};
use super::super::scripts::fail::{Fail, Failed};
use super::super::scripts::head_action::{HeadActed, HeadAction};
use super::super::scripts::read::{AckedRead, Read, ReadReply, Which};
use super::super::scripts::reap::{Reap, Reaped};
use super::super::scripts::release::{Held, Release, Released};
use super::super::scripts::rest::{Rest, Rested};
use super::super::unit::{At, Unit};
use super::Shared;
use convoy_core::envelope::now_ms;
use convoy_core::error::Error;

/// The most entries a fenced read asks of the primary lane: what a unit
/// reads while its consumer owns few units (see [`primary_batch`]).
pub(super) const PRIMARY_BATCH: usize = 100;
/// The entries a consumer holds read ahead, about, across the units it
/// owns: a unit's read asks for this much divided by the units owned,
/// between [`MIN_PRIMARY_BATCH`] and [`PRIMARY_BATCH`].
pub(super) const READ_AHEAD: usize = 3200;
/// The most units a consumer owns while its units read ahead
/// ([`UnitIo::read_ahead`]): a consumer of more units has other units'
/// events to handle while one waits for its next batch.
pub(super) const READ_AHEAD_UNITS: usize = 16;
/// The fewest entries a fenced read asks of the primary lane (unless
/// `max_unacked` is larger: a read batch then holds a whole
/// acknowledgement).
pub(super) const MIN_PRIMARY_BATCH: usize = 16;

/// Entries per read of the primary lane, for a consumer that owns `owned`
/// units and acknowledges every `max_unacked` handled entries.
///
/// A unit handles its batch one entry at a time, so what it read waits in
/// memory meanwhile. With a hundred entries per read, a thousand units
/// hold a hundred thousand entries read ahead, and touching each one again
/// when its turn comes misses the CPU's caches (a third of the consumer's
/// time at 1,024 keys). So the batch shrinks as units are added, keeping
/// the consumer's read-ahead near [`READ_AHEAD`] entries; a consumer of a
/// few units reads [`PRIMARY_BATCH`] at a time (one read per hundred
/// events of a busy key).
pub(super) fn primary_batch(owned: usize, max_unacked: usize) -> usize {
    let floor = MIN_PRIMARY_BATCH.max(max_unacked.min(PRIMARY_BATCH));
    (READ_AHEAD / owned.max(1)).clamp(floor, PRIMARY_BATCH)
}
/// The most new entries a fenced read returns whole; a longer batch comes
/// back as ids and one `XRANGE` reads the fields. Below this, the second
/// round trip costs more than passing the entries back through Lua.
pub(super) const WHOLE: usize = 16;
/// Entries read per fenced read from the backfill lane (small, so primary
/// traffic is looked at again soon).
pub(super) const BACKFILL_BATCH: usize = 10;

/// A fenced acknowledgement of one unit's handled entries.
#[derive(Debug, Clone, Copy)]
pub(super) struct AckOf<'a> {
    /// The stream the entries were read from.
    pub(super) at: At,
    /// Shared with the request, not copied (a retry sends the same ids).
    pub(super) ids: &'a Arc<[String]>,
    /// Clear the head's failure count (it had failures).
    pub(super) clear_head: bool,
    /// Record the unit's last activity.
    pub(super) touch: bool,
    /// Remove from the stream what every group has consumed.
    pub(super) trim: bool,
}

/// The gap a dead-lettered poisoned head leaves, recorded beside the unit.
#[derive(Debug, Clone, Copy)]
pub(super) struct GapOf<'a> {
    pub(super) entry: &'a str,
    pub(super) message: &'a str,
    pub(super) reason: &'a str,
    pub(super) time_ms: u64,
    pub(super) dlq_id: &'a str,
}

/// What a unit's worker asks of Redis, each call fenced on the worker's
/// lease (token and incarnation) where the script is.
pub(super) trait UnitIo {
    /// Moves earlier generations' pending entries of `stream` to this
    /// generation's consumer.
    async fn claim(&self, stream: &str) -> Result<Claimed, Error>;

    /// One fenced read of own pending entries or new ones, primary lanes
    /// first, starting at lane `first_lane`, of up to `count` entries of a
    /// primary lane. `held`: the entries handled but not yet acknowledged,
    /// and where (on a cluster the client sends a read again after a
    /// dropped connection: the script checks that nothing pending is
    /// unseen).
    async fn read(
        &self,
        which: Which,
        first_lane: usize,
        count: usize,
        held: (At, usize, Option<&str>),
    ) -> Result<ReadReply, Error>;

    /// A read of up to `count` new entries of a unit of one stream, to run
    /// while the worker handles the batch it holds (`held`: its handled
    /// entries not acknowledged yet and the batch's, all pending, with the
    /// oldest one's id), awaited once that batch is acknowledged. `None`
    /// where this I/O does not read ahead. Its check finds what it expects
    /// pending only if it runs before any of them is acknowledged; run
    /// after, it finds fewer, or the oldest gone, and sends the worker to
    /// its pending entries first (as after a lost reply), which hold what
    /// it delivered.
    fn read_ahead(&self, count: usize, held: (At, usize, String)) -> Option<ReadAhead> {
        let _ = (count, held);
        None
    }

    /// A fenced acknowledgement (committed in one call with other units'
    /// acknowledgements of the same moment, see [`super::acks`]); an error
    /// may have run.
    async fn ack(&self, ack: AckOf<'_>) -> Result<Acked, Arc<Error>>;

    /// [`UnitIo::ack`] of the unit's handled entries, then a read of up to
    /// `count` new entries starting at lane `first_lane`, holding none. The
    /// read's outcome, where it ran, is to be used only once the
    /// acknowledgement is known to be done, except one that sends the
    /// worker to its pending entries first (see [`AckedRead::read`]);
    /// `None`: not read, or not known (it may have run). By default one
    /// after the other; on Redis in one round trip where it can
    /// ([`Read::after_ack`]).
    async fn ack_then_read(&self, ack: AckOf<'_>, first_lane: usize, count: usize) -> AckThenRead {
        ack_then_read_apart(self, ack, first_lane, count).await
    }

    /// Records a failure of the head `entry` after the `known` failures
    /// the worker knew of (repeated after a lost reply, it counts once);
    /// `halt` halts the unit at once with that reason.
    async fn fail(
        &self,
        entry: &str,
        error: &str,
        known: u32,
        halt: Option<&str>,
    ) -> Result<Failed, Error>;

    /// Retires the drained unit if it has been idle for `reap_idle`.
    async fn reap(&self) -> Result<Reaped, Error>;

    /// Deletes this owner's consumer from the drained unit's streams.
    async fn rest(&self) -> Result<Rested, Error>;

    /// Whether the unit is marked halted in Redis.
    async fn halted(&self) -> Result<bool, Error>;

    /// Releases the lease held with the worker's token.
    async fn release(&self) -> Result<Released, Error>;

    /// Moves the poisoned head `entry` to the key's dead letters, only
    /// while the unit's durable generation is still `generation`.
    async fn dead_letter_head(&self, entry: &str, generation: u64) -> Result<HeadActed, Error>;

    /// Records the gap a dead-lettered head left beside the unit.
    async fn record_gap(&self, gap: GapOf<'_>) -> Result<(), Error>;
}

/// A read started ahead ([`UnitIo::read_ahead`]): it owns what it needs,
/// so the worker keeps it while handling a batch.
pub(super) type ReadAhead = Pin<Box<dyn Future<Output = Result<ReadReply, Error>> + Send>>;

/// What [`UnitIo::ack_then_read`] came to: the acknowledgement's outcome
/// (an error may have run), and the read's where it ran.
pub(super) type AckThenRead = (Result<Acked, Arc<Error>>, Option<Result<ReadReply, Error>>);

/// [`UnitIo::ack_then_read`] as two calls, the read only once the
/// acknowledgement is done.
async fn ack_then_read_apart<I: UnitIo + ?Sized>(
    io: &I,
    ack: AckOf<'_>,
    first_lane: usize,
    count: usize,
) -> AckThenRead {
    let acked = io.ack(ack).await;
    let read = match acked {
        Ok(Acked::Acked(_)) => Some(
            io.read(Which::New, first_lane, count, (ack.at, 0, None))
                .await,
        ),
        _ => None,
    };
    (acked, read)
}

/// A unit's I/O on Redis: its scripts, on the instance's shared
/// connection.
#[derive(Clone)]
pub(super) struct RedisUnit {
    pub(super) s: Arc<Shared>,
    pub(super) unit: Arc<Unit>,
    pub(super) token: Arc<str>,
    /// This instance's incarnation when the lease was taken (the fenced
    /// scripts check that the liveness key still holds it).
    pub(super) inc: Arc<str>,
}

impl RedisUnit {
    /// This worker as the fenced scripts check it.
    fn caller(&self) -> super::super::scripts::Caller<'_> {
        super::super::scripts::Caller {
            unit: &self.unit,
            token: &self.token,
            alive: self.s.alive(self.unit.shard),
            incarnation: &self.inc,
        }
    }

    async fn conn(&self) -> Result<Conn, Error> {
        self.s.redis.shared().await
    }

    /// A fenced read by this worker of up to `count` entries of a primary
    /// lane (`first_lane` first), holding `held`.
    fn reading<'a>(
        &'a self,
        which: Which,
        first_lane: usize,
        count: usize,
        held: (At, usize, Option<&'a str>),
        resent: bool,
    ) -> Read<'a> {
        Read {
            by: self.caller(),
            which,
            primary_count: count,
            backfill_count: BACKFILL_BATCH,
            whole: WHOLE,
            first_lane,
            held,
            resent,
        }
    }
}

impl UnitIo for RedisUnit {
    async fn claim(&self, stream: &str) -> Result<Claimed, Error> {
        let mut c = self.conn().await?;
        Claim {
            by: self.caller(),
            stream,
        }
        .run(&mut c)
        .await
    }

    async fn read(
        &self,
        which: Which,
        first_lane: usize,
        count: usize,
        held: (At, usize, Option<&str>),
    ) -> Result<ReadReply, Error> {
        let mut c = self.conn().await?;
        let resent = c.is_cluster();
        self.reading(which, first_lane, count, held, resent)
            .run(&mut c)
            .await
    }

    fn read_ahead(&self, count: usize, held: (At, usize, String)) -> Option<ReadAhead> {
        // A native read (a unit of one stream), and only where the client
        // never sends a command again by itself (a cluster client sends a
        // read again after a dropped connection, and its check then goes
        // through read.lua, which knows nothing of a batch in hand).
        if self.s.redis.is_cluster() || !self.unit.one_stream() {
            return None;
        }
        let io = self.clone();
        Some(Box::pin(async move {
            let (at, n, oldest) = held;
            let mut c = io.conn().await?;
            io.reading(Which::New, 0, count, (at, n, Some(&oldest)), false)
                .ahead(&mut c)
                .await
        }))
    }

    async fn ack(&self, ack: AckOf<'_>) -> Result<Acked, Arc<Error>> {
        let request = super::acks::AckRequest {
            unit: self.unit.clone(),
            at: ack.at,
            token: self.token.clone(),
            inc: self.inc.clone(),
            ids: ack.ids.clone(),
            clear_head: ack.clear_head,
            touch: ack.touch,
            trim: ack.trim,
        };
        super::acks::acknowledge(&self.s, request).await
    }

    async fn ack_then_read(&self, ack: AckOf<'_>, first_lane: usize, count: usize) -> AckThenRead {
        let mut c = match self.conn().await {
            Ok(c) => c,
            Err(e) => return (Err(Arc::new(e)), None),
        };
        // One pipeline only where the client never sends a command again by
        // itself, and the acknowledgement waits for no replica; and only a
        // native read (a unit of one stream) takes an acknowledgement in
        // front.
        if c.is_cluster() || self.s.settings.wait_acks.is_some() || !self.unit.one_stream() {
            return ack_then_read_apart(self, ack, first_lane, count).await;
        }
        let items = [AckItem {
            unit: &self.unit,
            at: ack.at,
            token: &self.token,
            incarnation: &self.inc,
            alive: self.s.alive(self.unit.shard),
            ids: ack.ids,
            clear_head: ack.clear_head,
            touch: ack.touch,
            trim: ack.trim,
        }];
        let acknowledge = Ack {
            group: self.s.group(),
            now_ms: now_ms(),
            items: &items,
        };
        let read = self.reading(Which::New, first_lane, count, (ack.at, 0, None), false);
        match read.after_ack(&acknowledge, &mut c).await {
            Ok(AckedRead { acked, read }) => {
                let acked = acked.and_then(|answers| {
                    answers.into_iter().next().ok_or(Error::UnexpectedReply {
                        script: "ack",
                        reply: "no outcome for the unit it acknowledged".to_owned(),
                    })
                });
                (acked.map_err(Arc::new), read)
            }
            Err(e) => (Err(Arc::new(e)), None),
        }
    }

    async fn fail(
        &self,
        entry: &str,
        error: &str,
        known: u32,
        halt: Option<&str>,
    ) -> Result<Failed, Error> {
        let mut c = self.conn().await?;
        Fail {
            by: self.caller(),
            entry,
            error,
            max_retries: self.s.settings.retry.max_retries,
            now_ms: now_ms(),
            known,
            halt,
        }
        .run(&mut c)
        .await
    }

    async fn reap(&self) -> Result<Reaped, Error> {
        let mut c = self.conn().await?;
        Reap {
            by: self.caller(),
            idle_ms: self.s.settings.reap_idle.as_millis() as u64,
            now_ms: now_ms(),
        }
        .run(&mut c)
        .await
    }

    async fn rest(&self) -> Result<Rested, Error> {
        let mut c = self.conn().await?;
        Rest { by: self.caller() }.run(&mut c).await
    }

    async fn halted(&self) -> Result<bool, Error> {
        let mut c = self.conn().await?;
        let halted: Option<String> = redis::cmd("HGET")
            .arg(&self.unit.state)
            .arg("halted")
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis("failed to read the halt flag", e))?;
        Ok(halted.is_some())
    }

    async fn release(&self) -> Result<Released, Error> {
        let mut c = self.conn().await?;
        Release {
            unit: &self.unit,
            held: Held::Token(&self.token),
        }
        .run(&mut c)
        .await
    }

    async fn dead_letter_head(&self, entry: &str, generation: u64) -> Result<HeadActed, Error> {
        let mut c = self.conn().await?;
        HeadAction {
            unit: &self.unit,
            op: "dead_letter",
            force: false,
            operator: "convoy (on_poison = dead_letter)",
            expect_entry: Some(entry),
            // Only while the unit is still this owner's: a replaced owner
            // (stalled past its lease) leaves the head to its successor.
            expect_generation: Some(generation),
            now_ms: now_ms(),
        }
        .run(&mut c)
        .await
    }

    async fn record_gap(&self, gap: GapOf<'_>) -> Result<(), Error> {
        let mut c = self.conn().await?;
        redis::pipe()
            .cmd("HSET")
            .arg(&*self.unit.state)
            .arg("gap_entry")
            .arg(gap.entry)
            .arg("gap_message")
            .arg(gap.message)
            .arg("gap_reason")
            .arg(gap.reason)
            .arg("gap_time")
            .arg(gap.time_ms)
            .arg("gap_dlq")
            .arg(gap.dlq_id)
            .ignore()
            .cmd("HINCRBY")
            .arg(&*self.unit.state)
            .arg("gaps")
            .arg(1)
            .ignore()
            .query_async::<()>(&mut c)
            .await
            .map_err(|e| Error::redis("failed to record the gap", e))
    }
}
