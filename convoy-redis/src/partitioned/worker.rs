//! One owned unit's worker.
//!
//! # Lifecycle
//!
//! The worker is a phase machine ([`super::phase`]): each step's outcome
//! decides the next phase and action, and the worker runs the action. Its
//! I/O is behind [`UnitIo`] ([`RedisUnit`] on Redis).
//!
//! 1. Reclaim: the previous generations' pending entries (both lanes) are
//!    moved to this generation's consumer; if that fails, the unit is given
//!    up, never skipped ahead.
//! 2. Pending, then New: read this consumer's own pending entries, in id
//!    order, until none are left; then new entries: primary lane first,
//!    backfill lane only when the primary lane is empty. Every read is
//!    fenced. After a failed or lost read reply, the pending entries are
//!    read again before anything new.
//! 3. Before each event: stop requested? local lease deadline passed?
//!    halted? Then run the handler; on success, fenced ack; on failure,
//!    record the failure beside the lease and wait out the back-off (the
//!    head stays pending and nothing behind it runs); after `max_retries`
//!    the unit halts (Halted: it waits, then rechecks; an un-halt goes back
//!    to Pending).
//! 4. Idle, when empty: sleep until a wake-up, a stop request, or the rest
//!    or reap time; Resting once its consumer is deleted, still waiting
//!    without a read.
//! 5. On stop: release the lease (the event in flight was finished first).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::super::reply::Entry;
use super::super::scripts::Refusal;
use super::super::scripts::ack::Acked;
use super::super::scripts::claim::Claimed;
use super::super::scripts::fail::Failed;
use super::super::scripts::head_action::HeadActed;
use super::super::scripts::read::{ReadReply, Which};
use super::super::scripts::reap::Reaped;
use super::super::scripts::release::Released;
use super::super::scripts::rest::Rested;
use super::super::unit::{At, Unit};
use super::phase::{Action, Exit, Machine, Outcome, Timer, idle_timer};
use super::unit_io::{
    AckOf, GapOf, PRIMARY_BATCH, READ_AHEAD_UNITS, ReadAhead, RedisUnit, UnitIo, primary_batch,
};
use super::{Shared, UnitHandle, mono_ms};
use crate::tracing;
use convoy_core::backoff::{Backoff, jitter};
use convoy_core::broker::Attempt;
use convoy_core::broker::outage::{Admission, Verdict};
use convoy_core::envelope::now_ms;
use convoy_core::error::{Error, chain};
use convoy_core::handler::{Fence, Gap, HandlerError, Position};
use convoy_core::key::Escaped;

/// How long a drained unit waits before it rests (its owner's consumer is
/// deleted from its streams, about a quarter of a drained partition's Redis
/// memory; the next read creates it again).
pub(super) const REST_AFTER: Duration = Duration::from_secs(10);

/// The halt reason of a head whose handler returned a permanent error.
const PERMANENT: &str = "permanent error";

/// A unit's worker. Most units are idle most of the time, and an idle
/// worker's task holds its whole state machine, whose size is that of its
/// largest await; so every call that runs a script or a handler is boxed
/// (allocated only while it runs): an idle worker's future is about 1.3 KB
/// rather than 3.3 KB (debug build), per owned unit.
///
/// Its I/O goes through `io` ([`RedisUnit`] on Redis).
struct Worker<I: UnitIo = RedisUnit> {
    s: Arc<Shared>,
    /// The unit's I/O.
    io: I,
    /// The unit and its names (shared with each acknowledgement request).
    unit: Arc<Unit>,
    fence: Fence,
    token: Arc<str>,
    wake: Arc<Notify>,
    stop: CancellationToken,
    halted: Arc<AtomicBool>,
    idle: Arc<AtomicBool>,
    /// The head entry and its failures so far (from Redis).
    head: Option<(String, u32)>,
    /// Entries handled but not yet acknowledged, and their stream.
    unacked: Vec<String>,
    unacked_at: Option<At>,
    /// Acknowledge once this many entries are handled (1: after each).
    max_unacked: usize,
    /// Entries of the primary lane the last read asked for (fewer came
    /// back: a short batch).
    batch_asked: usize,
    /// The head had failures recorded in Redis; the next ack clears them.
    failures_recorded: bool,
    /// When the unit's last activity was last written to Redis.
    touched: Option<Instant>,
    /// Entries of the current batch not yet started: the stream is trimmed
    /// with the acknowledgement of a batch's last entry (and before the
    /// worker waits or leaves), not with every one.
    batch_left: usize,
    /// The last entry acknowledged without a trim, when the stream still
    /// holds acknowledged entries.
    trim_owed: Option<(At, String)>,
    /// The lane a read looks at first (rotates between categories).
    rotate: usize,
    /// A gap the next event's handler sees (`on_poison = "dead_letter"`
    /// moved the head before it to the key's dead letters).
    gap: Option<Gap>,
    /// The read of new entries sent while the batch in hand is handled
    /// ([`Worker::read_ahead`]), used by the next read of new entries (in a
    /// mutex only to be `Sync`, as the worker's future must be: reached
    /// through `&mut self`, never locked).
    ahead: std::sync::Mutex<Option<Ahead>>,
}

/// How long a read sent ahead and given up is waited for, to report what
/// it found gone from the stream.
const GIVEN_UP_READ_WAIT: Duration = Duration::from_secs(30);

/// A read sent ahead ([`Worker::read_ahead`]) until the next read of new
/// entries takes it. Given up instead (the unit halts, turns to its pending
/// entries, or its worker exits), what it delivered stays pending for the
/// unit's next read or next owner; but entries its check found gone from
/// the stream were acknowledged by that read, so once it answers (waited
/// for in a task of its own) they are reported as a used read reports
/// them, never dropped unseen.
struct Ahead {
    read: Option<ReadAhead>,
    group: &'static str,
    unit: Arc<Unit>,
}

impl Ahead {
    /// The read, taken to be used.
    fn into_read(mut self) -> Option<ReadAhead> {
        self.read.take()
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        let Some(read) = self.read.take() else {
            return;
        };
        // Without a runtime (it is shutting down) nothing can wait for it.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (group, unit) = (self.group, self.unit.clone());
        runtime.spawn(async move {
            if let Ok(Ok(ReadReply::Reclaimed {
                stream,
                moved,
                missing,
            })) = tokio::time::timeout(GIVEN_UP_READ_WAIT, read).await
            {
                tracing::warn!(handler = group, key = ?Escaped(&unit.key), stream = %Escaped(&stream), moved, "a read sent ahead, given up, moved back entries a replaced owner read after losing the lease; they stay pending, read first by the unit's next read or next owner");
                convoy_core::metrics::reclaimed(group, moved);
                if !missing.is_empty() {
                    report_missing(group, &unit.key, &stream, &missing);
                }
            }
        });
    }
}

pub(super) fn spawn(
    s: Arc<Shared>,
    unit: Unit,
    fence: Fence,
    halted: bool,
    head: Option<(String, u32)>,
    stop: CancellationToken,
) -> UnitHandle {
    let token: Arc<str> = Arc::from(fence.to_string());
    let inc = s.incarnation(unit.shard);
    let unit = Arc::new(unit);
    let io = RedisUnit {
        s: s.clone(),
        unit: unit.clone(),
        token: token.clone(),
        inc,
    };
    let w = Worker::new(s, io, unit, fence, halted, head, stop);
    w.s.plan.health.unit_started();
    if halted {
        w.s.plan.health.halted(true);
    }
    UnitHandle {
        token: token.to_string(),
        wake: w.wake.clone(),
        stop: w.stop.clone(),
        idle: w.idle.clone(),
        moving: false,
        task: tokio::spawn(async move {
            let exits = w.s.exits.clone();
            let key = w.unit.key.clone();
            let token = w.token.to_string();
            let health = w.s.plan.health.clone();
            let halted = w.halted_flag();
            let shared = w.s.clone();
            let maybe_held = w.run().await;
            shared.outage.forget(&key, false);
            if halted.load(Ordering::SeqCst) {
                health.halted(false);
            }
            health.unit_stopped();
            let _ = exits.send(super::WorkerExit {
                key,
                token,
                maybe_held,
            });
        }),
    }
}

impl<I: UnitIo> Worker<I> {
    /// The worker of `unit`, leased with `fence`, its I/O through `io`;
    /// `halted` and `head` as Redis had them when the lease was taken.
    fn new(
        s: Arc<Shared>,
        io: I,
        unit: Arc<Unit>,
        fence: Fence,
        halted: bool,
        head: Option<(String, u32)>,
        stop: CancellationToken,
    ) -> Self {
        let token: Arc<str> = Arc::from(fence.to_string());
        let failures_recorded = head.as_ref().is_some_and(|(_, n)| *n > 0);
        let max_unacked = s.settings.max_unacked;
        Worker {
            rotate: 0,
            gap: None,
            ahead: std::sync::Mutex::new(None),
            io,
            s,
            unit,
            fence,
            token,
            wake: Arc::new(Notify::new()),
            stop,
            halted: Arc::new(AtomicBool::new(halted)),
            idle: Arc::new(AtomicBool::new(false)),
            head,
            unacked: Vec::new(),
            unacked_at: None,
            max_unacked,
            batch_asked: PRIMARY_BATCH,
            failures_recorded,
            touched: None,
            batch_left: 0,
            trim_owed: None,
        }
    }

    /// The halted flag, shared (read after the worker ended).
    fn halted_flag(&self) -> Arc<AtomicBool> {
        self.halted.clone()
    }

    fn group(&self) -> &'static str {
        self.s.group()
    }

    /// Marks the unit halted or not, keeping the engine's count of halted
    /// units (its health) in step.
    fn set_halted(&self, on: bool) {
        if self.halted.swap(on, Ordering::SeqCst) != on {
            self.s.plan.health.halted(on);
        }
    }

    fn past_deadline(&self) -> bool {
        mono_ms() >= self.s.deadline(self.unit.shard)
    }

    /// Runs the unit to its end; returns whether the lease may still be
    /// held with this worker's token (its release failed), so the
    /// coordinator releases or retakes it: a lease held by a live instance
    /// always has a worker behind it.
    async fn run(mut self) -> bool {
        let exit = match Box::pin(self.reclaim()).await {
            Ok(()) => self.consume().await,
            Err(exit) => exit,
        };
        match exit {
            Exit::Release | Exit::Expired => {
                // Handled entries are acknowledged (fenced) before leaving.
                match Box::pin(self.flush()).await {
                    Ok(()) => !Box::pin(self.release()).await,
                    Err(Exit::Lost(why)) => {
                        self.lost(why);
                        false
                    }
                    Err(_) => !Box::pin(self.release()).await,
                }
            }
            Exit::Lost(why) => {
                self.lost(why);
                false
            }
            Exit::Retired => {
                tracing::debug!(handler = self.group(), key = ?Escaped(&self.unit.key), "drained idle partition retired");
                false
            }
        }
    }

    fn lost(&self, why: Refusal) {
        convoy_core::metrics::lost(self.group(), 1);
        match why {
            Refusal::LeaseGone => {
                tracing::error!(handler = self.group(), key = ?Escaped(&self.unit.key), token = %self.token, "{}", why.describe())
            }
            _ => {
                tracing::warn!(handler = self.group(), key = ?Escaped(&self.unit.key), token = %self.token, "{}", why.describe())
            }
        }
    }

    /// Halts the unit at once for a fault no retry can mend (a partition
    /// key that holds something other than a stream); an operator fixes
    /// the key, then skips to resume.
    async fn halt_unit(&mut self, stream: &str, kind: &str) -> Result<(), Exit> {
        let reason = format!(
            "the partition's key {stream} holds a {kind}, not a stream; delete or rename that key, then run `convoy skip` for the partition to resume"
        );
        let err = HandlerError::msg(reason.clone());
        match self.record_failure("", &err, Some("not a stream")).await {
            Ok(_) => {
                tracing::error!(handler = self.group(), key = ?Escaped(&self.unit.key), stream, kind, "partition halted: {reason}");
                self.set_halted(true);
                convoy_core::metrics::halted(self.group());
                Ok(())
            }
            Err(exit) => Err(exit),
        }
    }

    /// Moves earlier generations' pending entries to this consumer.
    async fn reclaim(&mut self) -> Result<(), Exit> {
        let unit = self.unit.clone();
        let streams = unit
            .lanes
            .iter()
            .flat_map(|l| [l.primary.as_str(), l.backfill.as_str()])
            .filter(|s| !s.is_empty());
        for stream in streams {
            match self.io.claim(stream).await {
                Ok(Claimed::Done { count, gone }) => {
                    if count > 0 {
                        convoy_core::metrics::reclaimed(self.group(), count);
                        tracing::info!(handler = self.group(), key = ?Escaped(&unit.key), stream = ?Escaped(stream), claimed = count, "reclaimed pending entries of earlier owners");
                    }
                    if !gone.is_empty() {
                        self.report_missing(stream, &gone);
                    }
                }
                Ok(Claimed::Refused(why)) => return Err(Exit::Lost(why)),
                Ok(Claimed::NotAStream { kind }) => {
                    self.halt_unit(stream, &kind).await?;
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(handler = self.group(), key = ?Escaped(&unit.key), error = %chain(&e), "reclaim failed; giving the unit up rather than skipping ahead");
                    return Err(Exit::Release);
                }
            }
        }
        Ok(())
    }

    /// Drives the phase machine from the reclaim to the worker's end: runs
    /// each action and feeds its outcome back.
    async fn consume(&mut self) -> Exit {
        let mut machine = Machine::new(self.unit.one_stream());
        // Spawned halted, or halted by the reclaim (a lane is not a stream).
        let mut action = machine.next(if self.halted.load(Ordering::SeqCst) {
            Outcome::Halted
        } else {
            Outcome::Reclaimed
        });
        // On tokio's clock (the same as the system's, but for tests that
        // pause it).
        let mut last_active = tokio::time::Instant::now();
        let reap_idle = self.s.settings.reap_idle;
        // Failed reads are retried with back-off up to the poll interval.
        let mut backoff = Backoff::retry(self.s.settings.poll);
        loop {
            if !matches!(action, Action::Read(Which::New)) {
                // A read sent ahead is used only by the next read of new
                // entries. Dropped, what it delivered is pending, unseen:
                // the next read of new entries finds more pending than it
                // knows of and reads the pending entries first, as after a
                // lost reply (and what it found gone from the stream is
                // reported when it answers: see `Ahead`).
                *self.ahead_mut() = None;
            }
            let outcome = match action {
                Action::Exit(exit) => return exit,
                _ if self.stop.is_cancelled() => return Exit::Release,
                _ if self.past_deadline() => return Exit::Expired,
                Action::AwaitUnhalt => {
                    self.idle.store(true, Ordering::Relaxed);
                    // Rechecked at the heartbeat interval too, in case the
                    // operator's wake-up (written after the action) was lost.
                    let recheck = self.s.settings.heartbeat;
                    tokio::select! {
                        _ = self.stop.cancelled() => return Exit::Release,
                        _ = self.wake.notified() => {}
                        _ = tokio::time::sleep(recheck) => {}
                    }
                    // An operator un-halts by skipping or dead-lettering the
                    // head, which also wakes the unit.
                    if Box::pin(self.still_halted()).await {
                        Outcome::StillHalted
                    } else {
                        tracing::info!(handler = self.group(), key = ?Escaped(&self.unit.key), "partition un-halted; resuming");
                        self.set_halted(false);
                        self.head = None;
                        Outcome::Unhalted
                    }
                }
                Action::Read(which) => {
                    let read = if which == Which::New && self.ahead_mut().is_some() {
                        // Sent while the batch was handled: used once what
                        // was handled is acknowledged, as with a read sent
                        // behind the acknowledgement.
                        if let Err(exit) = Box::pin(self.flush()).await {
                            return exit;
                        }
                        match self.ahead_mut().take().and_then(Ahead::into_read) {
                            Some(ahead) => ahead.await,
                            None => Box::pin(self.read(which)).await,
                        }
                    } else if which == Which::New && !self.unacked.is_empty() {
                        // The batch's acknowledgement goes with the next
                        // read, in front of it.
                        match Box::pin(self.ack_then_read()).await {
                            Ok(read) => read,
                            Err(exit) => return exit,
                        }
                    } else {
                        if let Err(exit) = Box::pin(self.flush()).await {
                            return exit;
                        }
                        Box::pin(self.read(which)).await
                    };
                    match read {
                        Ok(ReadReply::Entries(at, batch)) => {
                            backoff.reset();
                            self.idle.store(false, Ordering::Relaxed);
                            // One boxed future per batch, not per entry.
                            let new = which == Which::New;
                            match Box::pin(self.handle_batch(at, batch, new, &mut last_active))
                                .await
                            {
                                Ok(outcome) => outcome,
                                Err(exit) => return exit,
                            }
                        }
                        Ok(ReadReply::Empty) => Outcome::Empty,
                        Ok(ReadReply::Refused(why)) => Outcome::Refused(why),
                        Ok(ReadReply::NotAStream { stream, kind }) => {
                            if let Err(exit) = Box::pin(self.halt_unit(&stream, &kind)).await {
                                return exit;
                            }
                            Outcome::NotAStream
                        }
                        Ok(ReadReply::Unseen) => {
                            // A read ran twice (sent again by the client after
                            // a dropped connection): what the first delivered
                            // is pending for this consumer, unhandled. Read it
                            // first.
                            tracing::info!(handler = self.group(), key = ?Escaped(&self.unit.key), "entries delivered by a read whose reply was lost are pending; reading them before anything new");
                            Outcome::Unseen
                        }
                        Ok(ReadReply::Reclaimed {
                            stream,
                            moved,
                            missing,
                        }) => {
                            // A replaced owner read entries natively after it
                            // lost the lease; they are this consumer's now,
                            // below anything new: read them first.
                            self.report_reclaimed(&stream, moved, &missing);
                            Outcome::Unseen
                        }
                        Err(e) => {
                            // The read may have run without its reply
                            // reaching us: the entries it delivered are then
                            // pending for this consumer, unhandled. Re-read
                            // those before anything new.
                            tracing::warn!(handler = self.group(), key = ?Escaped(&self.unit.key), error = %chain(&e), "fenced read failed; re-reading this unit's pending entries before anything new");
                            Outcome::Failed
                        }
                    }
                }
                Action::BackOff => {
                    if backoff.wait_or_stop(&self.stop).await {
                        Outcome::BackedOff
                    } else {
                        Outcome::Stopped
                    }
                }
                Action::Wait => {
                    // Nothing handled waits for its acknowledgement (a
                    // no-op after a read, which flushed first).
                    if let Err(exit) = Box::pin(self.flush()).await {
                        return exit;
                    }
                    // Empty: sleep until woken, stopped, or time to rest or
                    // reap.
                    self.idle.store(true, Ordering::Relaxed);
                    let idle_for = last_active.elapsed();
                    match idle_timer(machine.phase(), idle_for, reap_idle, REST_AFTER) {
                        Timer::Reap => Outcome::ReapDue,
                        Timer::Rest => Outcome::RestDue,
                        Timer::Sleep(sleep) => {
                            tokio::select! {
                                _ = self.stop.cancelled() => Outcome::Stopped,
                                _ = self.wake.notified() => Outcome::Woken,
                                _ = tokio::time::sleep(sleep) => Outcome::Woken,
                            }
                        }
                    }
                }
                Action::Rest => match Box::pin(self.rest()).await {
                    Ok(()) => Outcome::Rested,
                    Err(exit) => return exit,
                },
                Action::Reap => match Box::pin(self.reap()).await {
                    Ok(true) => Outcome::Retired,
                    Ok(false) => {
                        last_active = tokio::time::Instant::now();
                        Outcome::Kept
                    }
                    Err(exit) => return exit,
                },
            };
            action = machine.next(outcome);
        }
    }

    /// One fenced read: own pending entries or new ones, primary lanes
    /// first.
    async fn read(&mut self, which: Which) -> Result<ReadReply, Error> {
        // On a cluster the client sends a read again after a dropped
        // connection: the script checks that nothing pending is unseen.
        let (first_lane, count) = self.next_read();
        let held = (
            self.unacked_at.unwrap_or(At {
                lane: 0,
                backfill: false,
            }),
            self.unacked.len(),
            self.unacked.first().map(String::as_str),
        );
        self.io.read(which, first_lane, count, held).await
    }

    /// Sends the next read of new entries now, while the entries just read
    /// (`in_hand`, at `at`) are handled, where the unit's I/O reads ahead,
    /// the consumer owns at most [`READ_AHEAD_UNITS`] units (one of many
    /// units has other units' events to handle while it waits for its
    /// read), and the batch is acknowledged at its end, in one call. A unit
    /// with one busy key otherwise waits, after each batch, for Redis to
    /// read the next one. Its check counts the batch and what is handled
    /// but not acknowledged as this consumer's own pending entries, the
    /// oldest first: run after the batch's acknowledgement (held up on its
    /// way), it finds otherwise, and the worker reads its pending entries
    /// first.
    async fn read_ahead(&mut self, at: At, in_hand: &[Entry]) {
        let held = self.unacked.len() + in_hand.len();
        if self.ahead_mut().is_some()
            || held > self.max_unacked
            || self.s.plan.health.owned() > READ_AHEAD_UNITS
        {
            return;
        }
        let Some(oldest) = self.unacked.first().or(in_hand.first().map(|e| &e.id)) else {
            return;
        };
        let held = (at, held, oldest.clone());
        let (_, count) = self.next_read();
        let Some(mut read) = self.io.read_ahead(count, held) else {
            return;
        };
        if let std::task::Poll::Ready(done) =
            std::future::poll_fn(|cx| std::task::Poll::Ready(read.as_mut().poll(cx))).await
        {
            read = Box::pin(std::future::ready(done));
        }
        *self.ahead_mut() = Some(Ahead {
            read: Some(read),
            group: self.group(),
            unit: self.unit.clone(),
        });
        // The connection's task writes it to the socket: let it run now
        // rather than once this batch's handling happens to yield.
        tokio::task::yield_now().await;
    }

    /// The read sent ahead, if any.
    fn ahead_mut(&mut self) -> &mut Option<Ahead> {
        // Never locked: a poisoned lock still holds the value.
        self.ahead
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The lane the next read looks at first, and the entries it asks of a
    /// primary lane.
    fn next_read(&mut self) -> (usize, usize) {
        self.rotate = (self.rotate + 1) % self.unit.lanes.len().max(1);
        self.batch_asked = primary_batch(self.s.plan.health.owned(), self.max_unacked);
        (self.rotate, self.batch_asked)
    }

    /// Acknowledges every handled entry (trimming) and reads new entries,
    /// in one round trip where Redis allows ([`UnitIo::ack_then_read`]).
    /// The read's reply is used only once the acknowledgement is known to
    /// be done; after a failed one the acknowledgement is sent again (as
    /// [`Self::ack`] does) and the read with it is not trusted for entries:
    /// a new one finds what it delivered pending and unseen, and reads that
    /// first. A read that sends the worker to its pending entries first is
    /// used either way (and so reports what a replaced owner left missing).
    async fn ack_then_read(&mut self) -> Result<Result<ReadReply, Error>, Exit> {
        let Some(at) = self.unacked_at else {
            return Ok(self.read(Which::New).await);
        };
        let ids: Arc<[String]> = self.unacked.drain(..).collect();
        let touch = self.touch_due();
        let (first_lane, count) = self.next_read();
        let ack = AckOf {
            at,
            ids: &ids,
            clear_head: self.failures_recorded,
            touch,
            trim: true,
        };
        match self.io.ack_then_read(ack, first_lane, count).await {
            (Ok(Acked::Refused(why)), read) => {
                // What the read's check acknowledged as missing is reported
                // on every way out, or it would go unseen.
                if let Some(Ok(ReadReply::Reclaimed {
                    stream,
                    moved,
                    missing,
                })) = read
                {
                    self.report_reclaimed(&stream, moved, &missing);
                }
                Err(Exit::Lost(why))
            }
            (Ok(Acked::Acked(_)), read) => {
                self.acked(at, &ids, touch, true);
                match read {
                    Some(read) => Ok(read),
                    None => Ok(self
                        .io
                        .read(Which::New, first_lane, count, (at, 0, None))
                        .await),
                }
            }
            (Err(e), read) => {
                // A read whose check sent it to the pending entries is right
                // whatever came of the acknowledgement, and stands: the ids
                // it found missing are reported now, before any way out
                // below, the rest when it is used.
                let pending_first = match read {
                    Some(Ok(ReadReply::Unseen)) => Some(ReadReply::Unseen),
                    Some(Ok(ReadReply::Reclaimed {
                        stream,
                        moved,
                        missing,
                    })) => {
                        if !missing.is_empty() {
                            self.report_missing(&stream, &missing);
                        }
                        Some(ReadReply::Reclaimed {
                            stream,
                            moved,
                            missing: Vec::new(),
                        })
                    }
                    _ => None,
                };
                if self.past_deadline() {
                    return Err(Exit::Expired);
                }
                tracing::warn!(handler = self.group(), key = ?Escaped(&self.unit.key), error = %chain(&*e), "ack failed; retrying");
                self.ack(at, &ids, true).await?;
                match pending_first {
                    Some(read) => Ok(Ok(read)),
                    None => Ok(self
                        .io
                        .read(Which::New, first_lane, count, (at, 0, None))
                        .await),
                }
            }
        }
    }

    /// Handles a batch's entries in order, each to its end, until one
    /// halts the unit or the worker exits; `last_active` is when the last
    /// one was handled.
    async fn handle_batch(
        &mut self,
        at: At,
        batch: Vec<Entry>,
        new: bool,
        last_active: &mut tokio::time::Instant,
    ) -> Result<Outcome, Exit> {
        let short = batch.len() < self.batch_asked;
        if new && !short {
            // A full batch of new entries: more are likely waiting.
            self.read_ahead(at, &batch).await;
        }
        self.batch_left = batch.len();
        // When the last entry was handled: read once the batch ends (the
        // worker looks at it only between batches).
        let mut handled = false;
        for mut entry in batch {
            self.batch_left -= 1;
            match self.process(at, &mut entry).await {
                Step::Done => handled = true,
                Step::Halted => {
                    if handled {
                        *last_active = tokio::time::Instant::now();
                    }
                    return Ok(Outcome::Halted);
                }
                Step::Exit(e) => return Err(e),
            }
        }
        if handled {
            *last_active = tokio::time::Instant::now();
        }
        Ok(Outcome::Handled { short })
    }

    /// Handles one entry to the end: success and ack, halt, or exit.
    /// Its id is moved to the handled entries awaiting acknowledgement.
    async fn process(&mut self, at: At, entry: &mut Entry) -> Step {
        let unit = self.unit.clone();
        let stream = unit.stream(at);
        let retry = self.s.settings.retry.clone();
        let mut transient = 0;
        let mut again = false;
        loop {
            if self.stop.is_cancelled() {
                return Step::Exit(Exit::Release);
            }
            // Checked below, after the clock is read for the dispatch;
            // here too after a retry's wait.
            if again && self.past_deadline() {
                return Step::Exit(Exit::Expired);
            }
            again = true;
            if self.halted.load(Ordering::SeqCst) {
                return Step::Halted;
            }
            if entry.fields.is_none() {
                // Pending but gone from the stream (deleted by hand, or lost
                // with Redis state): nothing to run, and never quietly.
                self.report_missing(stream, std::slice::from_ref(&entry.id));
                return match self.done(at, std::mem::take(&mut entry.id)).await {
                    Ok(()) => Step::Done,
                    Err(exit) => Step::Exit(exit),
                };
            }
            if let Err(exit) = self.wait_while_paused().await {
                return Step::Exit(exit);
            }
            if entry.replayed_elsewhere(self.group()) {
                // An operator replayed a dead letter to other handlers:
                // this one handled the event already.
                tracing::debug!(handler = self.group(), key = ?Escaped(&self.unit.key), entry = %entry.id, "an operator's replay for other handlers: acknowledged without running it");
                return match self.done(at, std::mem::take(&mut entry.id)).await {
                    Ok(()) => Step::Done,
                    Err(exit) => Step::Exit(exit),
                };
            }
            let failures = match &self.head {
                Some((id, n)) if *id == entry.id => *n,
                _ => 0,
            };
            let attempt = failures + 1;
            // A paused handler (an outage of its dependency) starts no
            // event but its one probe; the lease is kept meanwhile.
            let (admission, waited) = match self.s.outage.try_admit() {
                Some(a) => (a, false),
                None => tokio::select! {
                    _ = self.stop.cancelled() => return Step::Exit(Exit::Release),
                    a = self.s.outage.admit() => (a, true),
                },
            };
            let probe = admission == Admission::Probe;
            if waited && self.past_deadline() {
                self.s.outage.forget(&unit.key, probe);
                return Step::Exit(Exit::Expired);
            }
            let origin = unit.lane(at);
            let result = match entry.envelope(stream).and_then(|env| {
                env.check_origin(stream, &entry.id, &origin.category, Some(&unit.key))
                    .map(|()| env)
            }) {
                Ok(env) => {
                    let _permit = self.s.permits.acquire().await;
                    // The wait for a permit may have outlasted the lease:
                    // check the deadline again, after reading the clock, so
                    // an attempt either fails this check after a stall or
                    // carries a dispatch time from before it.
                    let dispatched_at = SystemTime::now();
                    if self.past_deadline() {
                        // A probe that never ran frees the paused handler's
                        // probe for another key.
                        self.s.outage.forget(&unit.key, probe);
                        return Step::Exit(Exit::Expired);
                    }
                    self.s
                        .plan
                        .invoke(self.s.sub(), env, {
                            // `Attempt` is non-exhaustive outside convoy-core.
                            let mut at = Attempt::dispatched(attempt, dispatched_at);
                            at.fence = Some(self.fence.clone());
                            at.position = Some(Position {
                                stream: stream.to_owned(),
                                entry_id: entry.id.clone(),
                            });
                            at.gap = self.gap.clone();
                            at
                        })
                        .await
                }
                Err(e) => Err(HandlerError::from(e)),
            };
            // Many keys failing at once with default-class errors is a
            // handler-wide failure, retried as an outage.
            let handler_wide = match &result {
                Ok(_) => {
                    self.s.outage.succeeded(&unit.key, probe);
                    false
                }
                Err(err) if err.is_transient() => {
                    self.s.outage.failed(&unit.key, probe, &err.to_string());
                    false
                }
                Err(err) if err.is_permanent() || is_fenced_write(err) => {
                    self.s.outage.forget(&unit.key, probe);
                    false
                }
                Err(err) => {
                    self.s
                        .outage
                        .failed_default(&unit.key, probe, &err.to_string())
                        == Verdict::HandlerWide
                }
            };
            match result {
                Err(err) if err.is_transient() || handler_wide => {
                    // A dependency is down, not the event at fault: the
                    // same event again after a capped, jittered back-off,
                    // for as long as it lasts; never counted, never halting.
                    transient += 1;
                    let wait = jitter(retry.transient_backoff(transient));
                    tracing::debug!(handler = self.group(), key = ?Escaped(&self.unit.key), entry = %entry.id, retry_in_ms = wait.as_millis() as u64, error = %Escaped(&err.to_string()), "transient failure; retrying the head in place");
                    if transient == 1 {
                        // What was handled before waits no longer for its
                        // acknowledgement.
                        if let Err(exit) = self.flush().await {
                            return Step::Exit(exit);
                        }
                    }
                    tokio::select! {
                        _ = self.stop.cancelled() => return Step::Exit(Exit::Release),
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
                Ok(_) => {
                    self.gap = None;
                    return match self.done(at, std::mem::take(&mut entry.id)).await {
                        Ok(()) => {
                            self.head = None;
                            Step::Done
                        }
                        Err(exit) => Step::Exit(exit),
                    };
                }
                Err(err) if is_fenced_write(&err) => {
                    // The handler's exactly-once write found a newer owner's
                    // effects: this owner was replaced while it stalled.
                    tracing::warn!(handler = self.group(), key = ?Escaped(&self.unit.key), entry = %entry.id, error = %Escaped(&err.to_string()), "handler's write fenced out by a newer owner; giving up the unit");
                    return Step::Exit(Exit::Lost(Refusal::FencedOut));
                }
                Err(err) => match self.flush_then_fail(&entry.id, failures, &err).await {
                    Ok((n, halted)) => {
                        self.head = Some((entry.id.clone(), n));
                        self.failures_recorded = true;
                        if halted {
                            // The key stops failing here: halted, or moved
                            // past its head.
                            self.s.outage.forget(&unit.key, false);
                        }
                        if halted && self.dead_letters_poison() {
                            return match self.dead_letter_poison(stream, entry, n, &err).await {
                                Ok(()) => Step::Done,
                                Err(exit) => Step::Exit(exit),
                            };
                        }
                        if halted {
                            let why = if err.is_permanent() {
                                "the handler returned a permanent error"
                            } else {
                                "the head failed after max_retries"
                            };
                            tracing::error!(
                                handler = self.group(),
                                key = ?Escaped(&self.unit.key),
                                entry = %entry.id,
                                attempts = n,
                                error = %Escaped(&err.to_string()),
                                retry = %format_args!("convoy retry {} {:?} --handler {}", origin.category, Escaped(&self.unit.key), self.group()),
                                "partition halted: {why}; it stays pending and nothing behind it runs. Fix the cause, then run it again in place, in order (the `retry` command); skipping it or moving it to the dead letters loses or moves the event"
                            );
                            self.set_halted(true);
                            convoy_core::metrics::halted(self.group());
                            return Step::Halted;
                        }
                        let wait = retry.backoff(n);
                        tracing::warn!(handler = self.group(), key = ?Escaped(&self.unit.key), entry = %entry.id, attempt = n, retry_in_ms = wait.as_millis() as u64, error = %Escaped(&err.to_string()), "handler failed; retrying the head in place");
                        tokio::select! {
                            _ = self.stop.cancelled() => return Step::Exit(Exit::Release),
                            _ = tokio::time::sleep(wait) => {}
                        }
                    }
                    Err(exit) => return Step::Exit(exit),
                },
            }
        }
    }

    /// Waits while an operator's pause holds the unit's key (see
    /// [`crate::pause`]): what was handled is acknowledged first, no new
    /// event starts, the lease is kept (the heartbeat renews it). Returns
    /// at once when the handler holds no pause.
    async fn wait_while_paused(&mut self) -> Result<(), Exit> {
        let mut changes = self.s.pauses.subscribe();
        let Some(pause) = self.s.pauses.holding(&self.unit.key) else {
            return Ok(());
        };
        self.flush().await?;
        tracing::info!(handler = self.group(), key = ?Escaped(&self.unit.key), operator = %Escaped(&pause.operator), reason = %Escaped(&pause.reason), "key paused by an operator: no new event starts until it is resumed (the lease is kept)");
        convoy_core::metrics::key_paused(self.group(), true);
        let stopped = loop {
            tokio::select! {
                _ = self.stop.cancelled() => break true,
                _ = changes.changed() => {}
            }
            if self.s.pauses.holding(&self.unit.key).is_none() {
                break false;
            }
        };
        convoy_core::metrics::key_paused(self.group(), false);
        if stopped {
            return Err(Exit::Release);
        }
        tracing::info!(handler = self.group(), key = ?Escaped(&self.unit.key), "key resumed by an operator");
        if self.past_deadline() {
            return Err(Exit::Expired);
        }
        Ok(())
    }

    /// Whether this handler's poisoned heads go to the key's dead letters
    /// (`on_poison = "dead_letter"`, or `[handlers."name"] on_poison`)
    /// rather than halting the key. Process managers always halt.
    fn dead_letters_poison(&self) -> bool {
        self.s.settings.dead_letter_poison
    }

    /// The head failed past its retries (fail.lua halted the unit on it):
    /// moves it to the key's dead letters with its reason, attempts and
    /// handler (one script, atomic against everyone else, audited), records
    /// the gap beside the unit, and goes on: the next event's handler sees
    /// the gap.
    async fn dead_letter_poison(
        &mut self,
        stream: &str,
        entry: &Entry,
        attempts: u32,
        err: &HandlerError,
    ) -> Result<(), Exit> {
        let reason = err.to_string();
        let message_id = entry.envelope(stream).map(|e| e.id).unwrap_or_default();
        let mut backoff = Backoff::retry(Duration::from_millis(500));
        let dlq_id = loop {
            if self.past_deadline() {
                return Err(Exit::Expired);
            }
            // Only while the unit is still this owner's: a replaced owner
            // (stalled past its lease) leaves the head to its successor.
            let acted = self
                .io
                .dead_letter_head(&entry.id, self.fence.generation)
                .await;
            match acted {
                Ok(HeadActed::Done { dlq_id, .. }) => break dlq_id.unwrap_or_default(),
                Ok(HeadActed::GenerationMoved { generation }) => {
                    tracing::warn!(handler = self.group(), key = ?Escaped(&self.unit.key), entry = %entry.id, owned_at = self.fence.generation, now = generation, "the unit changed hands before its poisoned head was dead-lettered; leaving it to the new owner");
                    return Err(Exit::Lost(Refusal::FencedOut));
                }
                Ok(other) => {
                    // Someone else acted on the head first (an operator):
                    // nothing of ours to record; read on.
                    tracing::warn!(handler = self.group(), key = ?Escaped(&self.unit.key), entry = %entry.id, outcome = ?other, "the poisoned head was not dead-lettered by its owner");
                    self.set_halted(false);
                    self.head = None;
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(handler = self.group(), key = ?Escaped(&self.unit.key), error = %chain(&e), "dead-lettering the poisoned head failed; retrying");
                    backoff.wait().await;
                }
            }
        };
        let record = self
            .io
            .record_gap(GapOf {
                entry: &entry.id,
                message: &message_id,
                reason: &reason,
                time_ms: now_ms(),
                dlq_id: &dlq_id,
            })
            .await;
        if let Err(e) = record {
            tracing::warn!(handler = self.group(), key = ?Escaped(&self.unit.key), error = %chain(&e), "the gap could not be recorded beside the unit (the dead letter and its audit record hold it)");
        }
        tracing::error!(
            handler = self.group(),
            key = ?Escaped(&self.unit.key),
            entry = %entry.id,
            attempts,
            dead_letter = %dlq_id,
            error = %Escaped(&reason),
            "poisoned head moved to the key's dead letters with a recorded gap (on_poison = dead_letter); the key goes on with its next event"
        );
        convoy_core::metrics::gap(self.group());
        self.gap = Some(Gap::new(entry.id.clone(), message_id, reason, dlq_id));
        self.set_halted(false);
        self.head = None;
        self.failures_recorded = false;
        Ok(())
    }

    /// Records a handled entry; acknowledges once `max_unacked` are waiting.
    async fn done(&mut self, at: At, id: String) -> Result<(), Exit> {
        if self.unacked_at != Some(at) {
            self.flush().await?;
            self.unacked_at = Some(at);
        }
        self.unacked.push(id);
        // The acknowledgement that ends a batch goes with what follows it:
        // the next read (in front of it, one round trip for both), or the
        // flush before the worker waits or leaves.
        if self.unacked.len() >= self.max_unacked && self.batch_left > 0 {
            self.flush_trimming(false).await?;
        }
        Ok(())
    }

    /// Acknowledges every handled entry not yet acknowledged, and trims.
    async fn flush(&mut self) -> Result<(), Exit> {
        self.flush_trimming(true).await
    }

    /// Acknowledges every handled entry not yet acknowledged; `trim` also
    /// removes from the stream what every group has consumed.
    async fn flush_trimming(&mut self, trim: bool) -> Result<(), Exit> {
        if self.unacked.is_empty() {
            // Nothing to acknowledge; settle a trim still owed (acknowledging
            // an acknowledged entry again changes nothing).
            if trim && let Some((at, last)) = self.trim_owed.clone() {
                return self.ack(at, &Arc::from([last]), true).await;
            }
            return Ok(());
        }
        let Some(at) = self.unacked_at else {
            return Ok(());
        };
        // The ids go to the request in one allocation; `unacked` keeps its
        // capacity for the next ones.
        let ids: Arc<[String]> = self.unacked.drain(..).collect();
        self.ack(at, &ids, trim).await
    }

    async fn flush_then_fail(
        &mut self,
        id: &str,
        failures: u32,
        err: &HandlerError,
    ) -> Result<(u32, bool), Exit> {
        self.flush().await?;
        // A permanent error halts at once: no retry can mend it.
        let halt = err.is_permanent().then_some(PERMANENT);
        self.record_failure_after(id, failures, err, halt).await
    }

    /// Logs and counts what a [`ReadReply::Reclaimed`] did: entries a
    /// replaced owner read after losing the lease, moved back to this
    /// consumer, and any of them gone from the stream.
    fn report_reclaimed(&self, stream: &str, moved: u64, missing: &[String]) {
        tracing::warn!(handler = self.group(), key = ?Escaped(&self.unit.key), stream = %Escaped(stream), moved, "entries a replaced owner read after losing the lease were moved back; reading them before anything new");
        convoy_core::metrics::reclaimed(self.group(), moved);
        if !missing.is_empty() {
            self.report_missing(stream, missing);
        }
    }

    /// Logs and counts entries that were pending for this unit but are gone
    /// from its stream: they can never be handled, and that is an error
    /// an operator must see, not a quiet skip.
    fn report_missing(&self, stream: &str, ids: &[String]) {
        report_missing(self.group(), &self.unit.key, stream, ids);
    }

    /// Fenced ack, retried while the lease is ours and Redis is unreachable.
    async fn ack(&mut self, at: At, ids: &Arc<[String]>, trim: bool) -> Result<(), Exit> {
        let mut backoff = Backoff::retry(Duration::from_millis(500));
        loop {
            let touch = self.touch_due();
            let r: Result<Acked, Arc<Error>> = self
                .io
                .ack(AckOf {
                    at,
                    ids,
                    clear_head: self.failures_recorded,
                    touch,
                    trim,
                })
                .await;
            match r {
                Ok(Acked::Refused(why)) => return Err(Exit::Lost(why)),
                Ok(Acked::Acked(_)) => {
                    self.acked(at, ids, touch, trim);
                    return Ok(());
                }
                Err(e) => {
                    if self.past_deadline() {
                        return Err(Exit::Expired);
                    }
                    tracing::warn!(handler = self.group(), key = ?Escaped(&self.unit.key), error = %chain(&*e), "ack failed; retrying");
                    backoff.wait().await;
                }
            }
        }
    }

    /// Whether the next acknowledgement records the unit's last activity:
    /// it only feeds reaping, so it is written at most a few times per
    /// reap period.
    fn touch_due(&self) -> bool {
        let touch_every = (self.s.settings.reap_idle / 4).min(Duration::from_secs(1));
        self.touched.is_none_or(|t| t.elapsed() >= touch_every)
    }

    /// What follows a done acknowledgement of `ids` (of the stream at
    /// `at`, with `touch` and `trim` as sent).
    fn acked(&mut self, at: At, ids: &[String], touch: bool, trim: bool) {
        if touch {
            self.touched = Some(Instant::now());
        }
        self.failures_recorded = false;
        self.trim_owed = match (trim, ids.last()) {
            (false, Some(last)) => Some((at, last.clone())),
            _ => None,
        };
    }

    /// Records a failure of the head beside the lease (as its first
    /// failure; see [`Self::record_failure_after`]).
    async fn record_failure(
        &self,
        id: &str,
        err: &HandlerError,
        halt: Option<&str>,
    ) -> Result<(u32, bool), Exit> {
        self.record_failure_after(id, 0, err, halt).await
    }

    /// Records a failure of `id` after the `known` failures this worker
    /// knew of, beside the lease; repeated after a lost reply, it counts
    /// the failure once. `halt` halts the unit at once with that reason.
    async fn record_failure_after(
        &self,
        id: &str,
        known: u32,
        err: &HandlerError,
        halt: Option<&str>,
    ) -> Result<(u32, bool), Exit> {
        let error = err.to_string();
        let mut backoff = Backoff::retry(Duration::from_millis(500));
        loop {
            match self.io.fail(id, &error, known, halt).await {
                Ok(Failed::Recorded { failures, halted }) => return Ok((failures, halted)),
                Ok(Failed::Refused(why)) => return Err(Exit::Lost(why)),
                Err(e) => {
                    if self.past_deadline() {
                        return Err(Exit::Expired);
                    }
                    tracing::warn!(handler = self.group(), key = ?Escaped(&self.unit.key), error = %chain(&e), "recording a failure failed; retrying");
                    backoff.wait().await;
                }
            }
        }
    }

    /// Tries to retire the drained unit; true when retired.
    async fn reap(&self) -> Result<bool, Exit> {
        match self.io.reap().await {
            Ok(Reaped::Refused(why)) => Err(Exit::Lost(why)),
            Ok(Reaped::Retired) => Ok(true),
            Ok(Reaped::Kept) => Ok(false),
            Err(e) => {
                // It may have run (the unit retired, its lease gone): give
                // the unit up rather than act on a lease that may be gone.
                tracing::warn!(handler = self.group(), key = ?Escaped(&self.unit.key), error = %chain(&e), "reap failed; giving the unit up (it may have been retired)");
                Err(Exit::Release)
            }
        }
    }

    /// Deletes this owner's consumer from the drained unit's streams (see
    /// [`REST_AFTER`]). A failure only costs the memory: logged, not fatal.
    async fn rest(&self) -> Result<(), Exit> {
        match self.io.rest().await {
            Ok(Rested::Refused(why)) => Err(Exit::Lost(why)),
            Ok(Rested::Rested(_)) => Ok(()),
            Err(e) => {
                tracing::debug!(handler = self.group(), key = ?Escaped(&self.unit.key), error = %chain(&e), "a drained unit could not rest; its consumer stays");
                Ok(())
            }
        }
    }

    /// Whether the unit is still marked halted in Redis (true when unsure).
    async fn still_halted(&self) -> bool {
        !matches!(self.io.halted().await, Ok(false))
    }

    /// Releases the lease; returns whether it is known not to be held with
    /// this token any more (released, or held by someone else).
    async fn release(&self) -> bool {
        match self.io.release().await {
            Ok(Released::Released) => {
                tracing::debug!(handler = self.group(), key = ?Escaped(&self.unit.key), token = %self.token, "lease released");
                true
            }
            Ok(Released::NotHeld) => true,
            Err(e) => {
                tracing::warn!(handler = self.group(), key = ?Escaped(&self.unit.key), error = %chain(&e), "lease release failed; the coordinator releases it later, or it lapses with this instance's liveness");
                false
            }
        }
    }
}

enum Step {
    Done,
    Halted,
    Exit(Exit),
}

/// Whether a handler failed because its exactly-once write was refused by
/// a newer owner (`Error::FencedWrite`, from `postgres::AppliedEvents`).
fn is_fenced_write(err: &HandlerError) -> bool {
    err.as_error()
        .downcast_ref::<Error>()
        .is_some_and(|e| matches!(e, Error::FencedWrite { .. }))
}

/// Logs and counts entries of `key` that were pending for handler `group`
/// but are gone from `stream`: they can never be handled, and that is an
/// error an operator must see, not a quiet skip.
fn report_missing(group: &'static str, key: &str, stream: &str, ids: &[String]) {
    convoy_core::metrics::missing(group, ids.len());
    tracing::error!(
        handler = group,
        key = ?Escaped(key),
        stream,
        entries = ?ids,
        "pending entries are gone from the stream and can never be handled (deleted by hand, or lost with Redis state); they are acknowledged so the partition can go on"
    );
}

#[cfg(test)]
#[path = "worker_tests.rs"]
pub(super) mod tests;
