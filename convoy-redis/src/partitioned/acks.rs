//! Fenced acknowledgements, committed in groups across the units of one
//! instance: the workers that finish an event at the same time share one
//! script call, while each still waits for its own acknowledgement before
//! its next event (so a crash re-runs at most the event in flight, with
//! `max_unacked = 1`).
//!
//! There is no batching task. A worker that finds a call slot free sends
//! the call itself, carrying its own acknowledgement and every one queued
//! so far; a worker that finds both slots busy queues its acknowledgement
//! and waits. When a call ends, its slot goes to one of the waiting
//! workers, which sends what queued meanwhile the same way. An
//! acknowledgement costs its worker no hop through another task, and a
//! busy instance still sends one call per batch.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

use super::super::scripts::ack::{Ack, AckItem, Acked};
use super::super::unit::{At, Unit};
use super::Shared;
use convoy_core::envelope::now_ms;
use convoy_core::error::Error;

/// The most acknowledgements one call carries.
const MAX_BATCH: usize = 256;
/// The most calls one lane has under way at once (pipelined on the
/// connection): Redis runs one batch while the replies of the other are on
/// their way and the next one is queueing.
const IN_FLIGHT: usize = 2;

/// One unit's acknowledgement, as its worker hands it in.
pub(crate) struct AckRequest {
    pub(crate) unit: Arc<Unit>,
    /// The stream the entries were read from.
    pub(crate) at: At,
    pub(crate) token: Arc<str>,
    /// The owner's incarnation the worker took the lease in.
    pub(crate) inc: Arc<str>,
    pub(crate) ids: Arc<[String]>,
    /// Clear the head's failure count (it had failures).
    pub(crate) clear_head: bool,
    /// Record the unit's last activity.
    pub(crate) touch: bool,
    /// Remove from the stream what every group has consumed.
    pub(crate) trim: bool,
}

impl AckRequest {
    fn item<'a>(&'a self, alive: &'a str) -> AckItem<'a> {
        AckItem {
            unit: &self.unit,
            at: self.at,
            token: &self.token,
            incarnation: &self.inc,
            alive,
            ids: &self.ids,
            clear_head: self.clear_head,
            touch: self.touch,
            trim: self.trim,
        }
    }
}

/// What an acknowledgement's outcome is: an error is shared by every
/// acknowledgement of the call (it may have run: the worker sends the same
/// acknowledgement again).
pub(crate) type Outcome = Result<Acked, Arc<Error>>;

/// The acknowledgement lanes of one subscription on this instance: one on
/// a single server; one per shard on a cluster (a script touches one
/// shard), so a shard whose master is failing over holds up no other
/// shard's acknowledgements.
pub(crate) struct Lanes {
    lanes: Box<[Mutex<Lane>]>,
}

impl Lanes {
    /// `count` lanes (the subscription's shard count on a cluster, else 1).
    pub(crate) fn new(count: u32) -> Self {
        Lanes {
            lanes: (0..count.max(1)).map(|_| Mutex::default()).collect(),
        }
    }

    fn lock(&self, lane: usize) -> MutexGuard<'_, Lane> {
        // A panic while the lock was held left the lane's counts as they
        // were: still usable.
        self.lanes[lane.min(self.lanes.len() - 1)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// One lane's state.
#[derive(Default)]
struct Lane {
    /// Calls under way (at most [`IN_FLIGHT`]).
    in_flight: usize,
    /// Acknowledgements waiting for a slot, oldest first.
    queue: Vec<Queued>,
}

impl Lane {
    /// The oldest queued acknowledgements, at most `room`.
    fn take(&mut self, room: usize) -> Vec<Queued> {
        let n = self.queue.len().min(room);
        self.queue.drain(..n).collect()
    }
}

/// An acknowledgement waiting for a slot, with where its worker waits
/// (none once that worker is gone).
struct Queued {
    request: AckRequest,
    reply: Option<oneshot::Sender<Answer>>,
}

/// What a waiting worker is handed.
enum Answer {
    /// Its acknowledgement's outcome (another worker sent it).
    Done(Outcome),
    /// A call slot, with the acknowledgements it is to send.
    Lead(Handover),
}

/// A call slot handed to a waiting worker, with the acknowledgements to
/// send: its own and those queued beside it. Dropped unopened (that worker
/// went away after it was handed over), it queues them again, first, and
/// its slot goes on to another waiting worker.
struct Handover {
    own: Option<AckRequest>,
    others: Vec<Queued>,
    slot: Option<Slot>,
}

impl Handover {
    /// What to send, and the slot to send it in.
    fn open(mut self) -> Option<(AckRequest, Vec<Queued>, Slot)> {
        let own = self.own.take()?;
        let slot = self.slot.take()?;
        Some((own, std::mem::take(&mut self.others), slot))
    }
}

impl Drop for Handover {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        if let Some(shared) = &slot.shared {
            let mut lane = shared.acks.lock(slot.lane);
            let again = self
                .own
                .take()
                .map(|request| Queued {
                    request,
                    reply: None,
                })
                .into_iter()
                .chain(self.others.drain(..));
            lane.queue.splice(0..0, again);
        }
        // Now the slot goes on.
        drop(slot);
    }
}

/// A call slot of one lane. Dropping it (the call answered, failed or
/// abandoned) hands it to a waiting worker with what queued meanwhile, or
/// frees it.
struct Slot {
    shared: Option<Arc<Shared>>,
    lane: usize,
}

impl Slot {
    /// Drops the slot without handing it on (it was never passed on: the
    /// count it stands for is still the sender's).
    fn defuse(mut self) {
        self.shared = None;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        let mut lane = shared.acks.lock(self.lane);
        loop {
            let mut batch = lane.take(MAX_BATCH);
            if batch.is_empty() {
                lane.in_flight -= 1;
                return;
            }
            // The newest waiter leads (any would do: one unit has at most
            // one acknowledgement queued or under way, so calls never share
            // a unit and their order does not matter).
            while let Some(i) = batch.iter().rposition(|q| q.reply.is_some()) {
                let mut leader = batch.swap_remove(i);
                let Some(reply) = leader.reply.take() else {
                    continue;
                };
                let handover = Handover {
                    own: Some(leader.request),
                    others: batch,
                    slot: Some(Slot {
                        shared: Some(shared.clone()),
                        lane: self.lane,
                    }),
                };
                match reply.send(Answer::Lead(handover)) {
                    Ok(()) => return,
                    Err(Answer::Lead(handover)) => {
                        // That worker is gone: its acknowledgement still
                        // goes with the batch, unanswered.
                        let Some((own, others, slot)) = handover.open() else {
                            return;
                        };
                        slot.defuse();
                        batch = others;
                        batch.push(Queued {
                            request: own,
                            reply: None,
                        });
                    }
                    Err(Answer::Done(_)) => return,
                }
            }
            // Every worker of this batch is gone: nobody waits for these
            // acknowledgements, and their entries stay pending (read again
            // by the unit's next worker, as after a crash).
        }
    }
}

/// The outcome of an acknowledgement whose call ended unanswered (its
/// sender went away): it may have run, and is sent again.
fn ended() -> Arc<Error> {
    Arc::new(Error::TaskFailed {
        task: "acknowledgement",
        reason: "the call carrying it ended before answering".to_owned(),
    })
}

/// Acknowledges `request`, in a call of its own or shared with the
/// acknowledgements of other units queued at the same time.
pub(crate) async fn acknowledge(shared: &Arc<Shared>, request: AckRequest) -> Outcome {
    let lane = if shared.redis.is_cluster() {
        request.unit.shard as usize
    } else {
        0
    };
    // Under the lock: take a free slot with what is queued, or queue.
    let taken = {
        let mut l = shared.acks.lock(lane);
        if l.in_flight < IN_FLIGHT {
            l.in_flight += 1;
            Ok((request, l.take(MAX_BATCH - 1)))
        } else {
            let (tx, rx) = oneshot::channel();
            l.queue.push(Queued {
                request,
                reply: Some(tx),
            });
            Err(rx)
        }
    };
    let (own, others, slot) = match taken {
        Ok((request, others)) => {
            let slot = Slot {
                shared: Some(shared.clone()),
                lane,
            };
            (request, others, slot)
        }
        Err(rx) => match rx.await {
            Ok(Answer::Done(outcome)) => return outcome,
            Ok(Answer::Lead(handover)) => match handover.open() {
                Some(opened) => opened,
                None => return Err(ended()),
            },
            Err(_) => return Err(ended()),
        },
    };
    let outcome = send(shared, &own, others).await;
    // The slot goes on to a waiting worker before this one handles its
    // next event.
    drop(slot);
    outcome
}

/// One call: acknowledges `own` and `others`, answers `others` and
/// returns `own`'s outcome.
async fn send(shared: &Shared, own: &AckRequest, others: Vec<Queued>) -> Outcome {
    let alive = |r: &AckRequest| shared.alive(r.unit.shard);
    let result = match shared.redis.shared().await {
        Ok(mut conn) => {
            let items: Vec<AckItem<'_>> = std::iter::once(own)
                .chain(others.iter().map(|q| &q.request))
                .map(|r| r.item(alive(r)))
                .collect();
            Ack {
                group: shared.group(),
                now_ms: now_ms(),
                items: &items,
            }
            .run(&mut conn, shared.settings.wait_acks)
            .await
        }
        Err(e) => Err(e),
    };
    match result {
        Ok(answers) => {
            let mut answers = answers.into_iter();
            let mine = answers.next();
            for (q, answer) in others.into_iter().zip(answers) {
                if let Some(reply) = q.reply {
                    let _ = reply.send(Answer::Done(Ok(answer)));
                }
            }
            mine.map(Ok).unwrap_or_else(|| {
                Err(Arc::new(Error::TaskFailed {
                    task: "acknowledgement",
                    reason: "the script answered fewer acknowledgements than it was sent"
                        .to_owned(),
                }))
            })
        }
        Err(e) => {
            let e = Arc::new(e);
            for q in others {
                if let Some(reply) = q.reply {
                    let _ = reply.send(Answer::Done(Err(e.clone())));
                }
            }
            Err(e)
        }
    }
}

#[cfg(all(test, feature = "testing"))]
#[path = "acks_tests.rs"]
mod tests;
