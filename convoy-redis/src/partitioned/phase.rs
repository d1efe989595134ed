//! The worker's phase machine, pure: from a phase and the outcome of the
//! last step to the next phase and the action to take. The worker
//! ([`super::worker`]) runs the actions (the I/O behind
//! [`super::unit_io::UnitIo`], the handler, the waits) and feeds back their
//! outcomes; nothing here touches Redis, a clock or a task, so every
//! transition is unit-tested on its own.
//!
//! | phase | outcome | next phase, action |
//! | --- | --- | --- |
//! | any | refused, stopped, retired | the worker ends (lost, release, retired) |
//! | any | halted, not a stream | Halted: wait, then recheck the halt |
//! | any | a failed read | Pending: back off, then read own pending entries |
//! | any | an unseen read | Pending: read own pending entries |
//! | Reclaim | reclaimed | Pending: read own pending entries |
//! | Pending | entries handled | Pending: read own pending entries |
//! | Pending | empty | New: read new entries |
//! | New | a full batch (or a short one of several streams) | New: read new entries |
//! | New | a short batch of a single stream, or empty | Idle: wait |
//! | Idle, Resting | woken, or the reap kept the unit | New: read new entries |
//! | Idle | the rest time | rest, then Resting: wait (no read) |
//! | Idle, Resting | the reap time | reap |
//! | Halted | still halted | Halted: wait, then recheck |
//! | Halted | un-halted | Pending: read own pending entries |

use std::time::Duration;

use super::super::scripts::Refusal;
use super::super::scripts::read::Which;

/// Why a worker ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Exit {
    /// Stop requested (shutdown or rebalancing): release the lease.
    Release,
    /// The fence refused us (see [`Refusal`]).
    Lost(Refusal),
    /// The local deadline passed without a renewal: stop touching the unit.
    Expired,
    /// The unit was reaped.
    Retired,
}

/// Where a unit's worker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// The previous generations' pending entries (both lanes) are moved
    /// to this generation's consumer; if that fails, the unit is given up,
    /// never skipped ahead. The first phase.
    Reclaim,
    /// Reading this consumer's own pending entries, in id order, until none
    /// are left: after the reclaim, after a read whose reply failed or was
    /// lost (what it delivered is pending, unhandled), after an un-halt.
    Pending,
    /// Reading new entries: primary lane first, backfill lane only when the
    /// primary lane is empty.
    New,
    /// Drained: waiting for a wake-up, a stop request, or the time to rest
    /// or reap, without reading (the wake-up keeps its permit, so none is
    /// lost meanwhile).
    Idle,
    /// Drained and rested (its consumer deleted from the unit's streams):
    /// waits without a read (a read would create the consumer again) for a
    /// wake-up or the reap time.
    Resting,
    /// Halted: nothing behind the head runs; waits for a wake-up or the
    /// heartbeat interval, then rechecks the halt in Redis.
    Halted,
}

/// What the last step came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// The reclaim is done and the unit is not halted.
    Reclaimed,
    /// A read's entries were all handled; `short`: fewer than a full
    /// primary batch.
    Handled { short: bool },
    /// A read found nothing.
    Empty,
    /// The fence refused a read or another fenced call.
    Refused(Refusal),
    /// A read failed: it may have run without its reply reaching us.
    Failed,
    /// A read ran twice (sent again by the client after a dropped
    /// connection): what the first delivered is pending, unhandled.
    Unseen,
    /// A lane's key holds something other than a stream: the halt is
    /// recorded.
    NotAStream,
    /// The unit halted (a head failed past its retries or permanently), or
    /// was halted when taken.
    Halted,
    /// The recheck found the unit still halted.
    StillHalted,
    /// An operator un-halted the unit (skipped or dead-lettered the head).
    Unhalted,
    /// The back-off after a failed read ended.
    BackedOff,
    /// A wake-up, or the idle wait's timer.
    Woken,
    /// Drained for [`super::worker::REST_AFTER`] and not rested yet.
    RestDue,
    /// The unit rested.
    Rested,
    /// Idle for `reap_idle`.
    ReapDue,
    /// The reap kept the unit (something arrived meanwhile).
    Kept,
    /// The unit was reaped.
    Retired,
    /// A stop request (shutdown or rebalancing).
    Stopped,
}

/// What the worker does next.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// Acknowledge what is handled, then one fenced read.
    Read(Which),
    /// Wait out the read back-off (a stop request ends it).
    BackOff,
    /// Acknowledge what is handled, then wait for a wake-up, a stop
    /// request or the timer (see [`idle_timer`]).
    Wait,
    /// Delete this owner's consumer from the drained unit's streams.
    Rest,
    /// Try to retire the drained unit.
    Reap,
    /// Wait for a wake-up or the heartbeat interval, then recheck the halt.
    AwaitUnhalt,
    /// End the worker.
    Exit(Exit),
}

/// The phase machine of one unit's worker.
#[derive(Debug, Clone, Copy)]
pub(super) struct Machine {
    phase: Phase,
    /// One lane without a backfill stream: a short batch means drained.
    single_stream: bool,
}

impl Machine {
    pub(super) fn new(single_stream: bool) -> Self {
        Machine {
            phase: Phase::Reclaim,
            single_stream,
        }
    }

    pub(super) fn phase(&self) -> Phase {
        self.phase
    }

    /// Moves on by `outcome`; returns what to do next.
    pub(super) fn next(&mut self, outcome: Outcome) -> Action {
        let (phase, action) = transition(self.phase, outcome, self.single_stream);
        self.phase = phase;
        action
    }
}

/// The transition function: from `phase` and the `outcome` of its last
/// step to the next phase and what to do.
pub(super) fn transition(phase: Phase, outcome: Outcome, single_stream: bool) -> (Phase, Action) {
    use Outcome as O;
    let pending = (Phase::Pending, Action::Read(Which::Pending));
    let new = (Phase::New, Action::Read(Which::New));
    let wait = (Phase::Idle, Action::Wait);
    match outcome {
        O::Refused(why) => (phase, Action::Exit(Exit::Lost(why))),
        O::Stopped => (phase, Action::Exit(Exit::Release)),
        O::Retired => (phase, Action::Exit(Exit::Retired)),
        O::Halted | O::NotAStream | O::StillHalted => (Phase::Halted, Action::AwaitUnhalt),
        // Own pending entries before anything new: after the reclaim, an
        // un-halt, and a read whose reply may be lost.
        O::Reclaimed | O::Unhalted | O::Unseen | O::BackedOff => pending,
        O::Failed => (Phase::Pending, Action::BackOff),
        // Pending entries are read until none are left.
        O::Handled { .. } if phase == Phase::Pending => pending,
        O::Empty if phase == Phase::Pending => new,
        // After a short batch of a single-stream unit the stream is known
        // to be drained: wait for a wake-up instead of reading it empty
        // again.
        O::Handled { short: true } if single_stream => wait,
        O::Handled { .. } => new,
        O::Empty => wait,
        O::Woken | O::Kept => new,
        O::RestDue => (phase, Action::Rest),
        // Back to waiting without a read (a read would create the consumer
        // again); a wake-up that came meanwhile kept its permit.
        O::Rested => (Phase::Resting, Action::Wait),
        O::ReapDue => (phase, Action::Reap),
    }
}

/// What an idle wait does, `idle_for` after the unit's last activity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// Idle for `reap_idle`: reap now.
    Reap,
    /// Drained for `rest_after` and not rested: rest now.
    Rest,
    /// Sleep this long at most (unless woken or stopped first).
    Sleep(Duration),
}

/// The idle wait's timer in `phase` ([`Phase::Resting`] rests no more).
pub(super) fn idle_timer(
    phase: Phase,
    idle_for: Duration,
    reap_idle: Duration,
    rest_after: Duration,
) -> Timer {
    let reap_in = reap_idle.saturating_sub(idle_for);
    if reap_in.is_zero() {
        return Timer::Reap;
    }
    if phase == Phase::Resting {
        return Timer::Sleep(reap_in);
    }
    let rest_in = rest_after.saturating_sub(idle_for);
    if rest_in.is_zero() {
        return Timer::Rest;
    }
    Timer::Sleep(reap_in.min(rest_in))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `outcomes` from the start, returning each action.
    fn run(single_stream: bool, outcomes: &[Outcome]) -> (Machine, Vec<Action>) {
        let mut m = Machine::new(single_stream);
        let actions = outcomes.iter().map(|o| m.next(*o)).collect();
        (m, actions)
    }

    const READ_PENDING: Action = Action::Read(Which::Pending);
    const READ_NEW: Action = Action::Read(Which::New);

    #[test]
    fn reclaim_then_own_pending_entries_until_none_then_new() {
        let (m, a) = run(
            false,
            &[
                Outcome::Reclaimed,
                Outcome::Handled { short: true },
                Outcome::Handled { short: true },
                Outcome::Empty,
                Outcome::Handled { short: false },
                Outcome::Handled { short: true },
                Outcome::Empty,
            ],
        );
        assert_eq!(
            a,
            vec![
                READ_PENDING,
                READ_PENDING,
                READ_PENDING,
                READ_NEW,
                READ_NEW,
                // Two streams: a short batch of one says nothing of the other.
                READ_NEW,
                Action::Wait,
            ]
        );
        assert_eq!(m.phase(), Phase::Idle);
    }

    #[test]
    fn a_failed_or_lost_read_rereads_pending_entries_before_anything_new() {
        for single in [false, true] {
            // A failed read backs off, then reads the pending entries.
            let (m, a) = run(
                single,
                &[
                    Outcome::Reclaimed,
                    Outcome::Empty,
                    Outcome::Failed,
                    Outcome::BackedOff,
                ],
            );
            assert_eq!(a[2..], [Action::BackOff, READ_PENDING]);
            assert_eq!(m.phase(), Phase::Pending);
            // A read that ran twice: its entries are pending, read at once.
            let (m, a) = run(
                single,
                &[Outcome::Reclaimed, Outcome::Empty, Outcome::Unseen],
            );
            assert_eq!(a[2], READ_PENDING);
            assert_eq!(m.phase(), Phase::Pending);
            // Only once they are read does a new read come.
            let mut m = m;
            assert_eq!(m.next(Outcome::Handled { short: true }), READ_PENDING);
            assert_eq!(m.next(Outcome::Empty), READ_NEW);
        }
        // A failed read of pending entries stays in pending.
        let (m, a) = run(false, &[Outcome::Reclaimed, Outcome::Failed]);
        assert_eq!(a[1], Action::BackOff);
        assert_eq!(m.phase(), Phase::Pending);
    }

    #[test]
    fn a_short_batch_of_a_single_stream_unit_waits_without_another_read() {
        let (m, a) = run(
            true,
            &[
                Outcome::Reclaimed,
                Outcome::Empty,
                Outcome::Handled { short: true },
            ],
        );
        assert_eq!(a[2], Action::Wait);
        assert_eq!(m.phase(), Phase::Idle);
        // A full batch reads on; so does a short batch of pending entries.
        let (_, a) = run(
            true,
            &[
                Outcome::Reclaimed,
                Outcome::Handled { short: true },
                Outcome::Empty,
                Outcome::Handled { short: false },
            ],
        );
        assert_eq!(a[1..], [READ_PENDING, READ_NEW, READ_NEW]);
        // Woken, it reads.
        let mut m = m;
        assert_eq!(m.next(Outcome::Woken), READ_NEW);
    }

    #[test]
    fn a_rested_unit_waits_without_a_read_until_woken() {
        let (m, a) = run(
            false,
            &[
                Outcome::Reclaimed,
                Outcome::Empty,
                Outcome::Empty,
                Outcome::RestDue,
                Outcome::Rested,
            ],
        );
        assert_eq!(a[2..], [Action::Wait, Action::Rest, Action::Wait]);
        assert_eq!(m.phase(), Phase::Resting);
        let mut woken = m;
        assert_eq!(woken.next(Outcome::Woken), READ_NEW);
        // Resting, the reap time still comes.
        let mut reap = m;
        assert_eq!(reap.next(Outcome::ReapDue), Action::Reap);
        assert_eq!(reap.next(Outcome::Retired), Action::Exit(Exit::Retired));
    }

    #[test]
    fn halted_waits_then_rechecks_and_an_unhalt_returns_to_pending() {
        for from in [
            &[Outcome::Halted][..],
            &[Outcome::Reclaimed, Outcome::Halted],
            &[Outcome::Reclaimed, Outcome::Empty, Outcome::Halted],
            &[Outcome::Reclaimed, Outcome::Empty, Outcome::NotAStream],
        ] {
            let (mut m, a) = run(true, from);
            assert_eq!(a.last(), Some(&Action::AwaitUnhalt));
            assert_eq!(m.phase(), Phase::Halted);
            assert_eq!(m.next(Outcome::StillHalted), Action::AwaitUnhalt);
            assert_eq!(m.phase(), Phase::Halted);
            assert_eq!(m.next(Outcome::Unhalted), READ_PENDING);
            assert_eq!(m.phase(), Phase::Pending);
        }
    }

    #[test]
    fn reap_after_reap_idle_and_a_kept_unit_reads_again() {
        let (mut m, a) = run(
            false,
            &[
                Outcome::Reclaimed,
                Outcome::Empty,
                Outcome::Empty,
                Outcome::ReapDue,
            ],
        );
        assert_eq!(a[3], Action::Reap);
        assert_eq!(
            m.clone().next(Outcome::Retired),
            Action::Exit(Exit::Retired)
        );
        assert_eq!(m.next(Outcome::Kept), READ_NEW);
        assert_eq!(m.phase(), Phase::New);
    }

    #[test]
    fn refusals_and_stops_end_the_worker_from_any_phase() {
        for phase in [
            Phase::Reclaim,
            Phase::Pending,
            Phase::New,
            Phase::Idle,
            Phase::Resting,
            Phase::Halted,
        ] {
            let (_, a) = transition(phase, Outcome::Refused(Refusal::FencedOut), false);
            assert_eq!(a, Action::Exit(Exit::Lost(Refusal::FencedOut)));
            let (_, a) = transition(phase, Outcome::Stopped, true);
            assert_eq!(a, Action::Exit(Exit::Release));
        }
    }

    #[test]
    fn the_idle_timer_reaps_after_reap_idle_and_rests_once() {
        let s = Duration::from_secs;
        let (reap, rest) = (s(60), s(10));
        assert_eq!(
            idle_timer(Phase::Idle, s(0), reap, rest),
            Timer::Sleep(s(10))
        );
        assert_eq!(
            idle_timer(Phase::Idle, s(4), reap, rest),
            Timer::Sleep(s(6))
        );
        assert_eq!(idle_timer(Phase::Idle, s(10), reap, rest), Timer::Rest);
        // Rested: only the reap time is waited for.
        assert_eq!(
            idle_timer(Phase::Resting, s(10), reap, rest),
            Timer::Sleep(s(50))
        );
        assert_eq!(idle_timer(Phase::Resting, s(60), reap, rest), Timer::Reap);
        assert_eq!(idle_timer(Phase::Idle, s(61), reap, rest), Timer::Reap);
        // A reap time shorter than the rest time reaps before resting.
        assert_eq!(
            idle_timer(Phase::Idle, s(1), s(3), rest),
            Timer::Sleep(s(2))
        );
        assert_eq!(idle_timer(Phase::Idle, s(3), s(3), rest), Timer::Reap);
    }
}
