//! The inline broker: in-process, one queue, one event at a time.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::plan::{Attempt, ConsumerPlan};
use super::{Broker, Capabilities, Producer, Publication, PublishError};
use crate::envelope::Envelope;
use crate::error::Error;
use crate::future::BoxFuture;
use crate::handler::Position;
use crate::key::Escaped;
use crate::tracing;

/// An event an inline handler gave up on: after its retries, or at once
/// for a permanent error.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The handler.
    pub handler: &'static str,
    /// The event.
    pub envelope: Envelope,
    /// The last error.
    pub error: String,
}

/// The in-process broker: one queue, delivered in strict submission order,
/// one event at a time. It does not advertise `STREAM_PARTITIONING` but
/// `SERIAL_DELIVERY`: `sequential_by` is an accepted no-op here because
/// nothing runs in parallel.
#[derive(Debug)]
pub struct InlineBroker {
    queue: Mutex<VecDeque<Envelope>>,
    wake: Notify,
    dead: Mutex<Vec<DeadLetter>>,
    /// When this broker was made (ms since the Unix epoch) and how many
    /// events it delivered: the entry ids of handlers' positions
    /// (`{started}-{n}`), growing across restarts as a stream's would.
    started_ms: u64,
    delivered: AtomicU64,
}

impl Default for InlineBroker {
    fn default() -> Self {
        InlineBroker {
            queue: Mutex::default(),
            wake: Notify::new(),
            dead: Mutex::default(),
            started_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            delivered: AtomicU64::new(0),
        }
    }
}

impl InlineBroker {
    /// A new, empty inline broker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Where `envelope`, delivered now, sits: its partition stream's name
    /// and the next entry id.
    fn position(&self, envelope: &Envelope) -> Position {
        let n = self.delivered.fetch_add(1, Ordering::Relaxed) + 1;
        let stream = match &envelope.partition_key {
            // No shards here: one process, one queue.
            Some(k) => format!("{}:{k}", envelope.category),
            None => envelope.category.clone(),
        };
        Position {
            stream,
            entry_id: format!("{}-{n}", self.started_ms),
        }
    }

    /// Events given up on after their retries.
    pub fn dead_letters(&self) -> Vec<DeadLetter> {
        self.dead
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn pop(&self) -> Option<Envelope> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop_front()
    }

    /// Delivers every queued event (and those queued meanwhile); returns how
    /// many events were delivered.
    pub(crate) async fn drain(&self, plan: &ConsumerPlan) -> usize {
        let mut n = 0;
        while let Some(e) = self.pop() {
            self.deliver(plan, &e).await;
            n += 1;
        }
        n
    }

    async fn deliver(&self, plan: &ConsumerPlan, envelope: &Envelope) {
        let position = self.position(envelope);
        for sub in plan
            .subscriptions
            .iter()
            .filter(|s| s.categories.contains(&envelope.category.as_str()))
        {
            let retry = &plan.config.retry_for(sub.name);
            let mut attempt = 1;
            loop {
                match plan
                    .invoke(
                        sub,
                        envelope.clone(),
                        Attempt {
                            position: Some(position.clone()),
                            ..Attempt::new(attempt)
                        },
                    )
                    .await
                {
                    Ok(_) => break,
                    Err(e) if e.is_transient() => {
                        // A dependency is down: retried for as long as it
                        // lasts, never dead-lettered.
                        tracing::debug!(handler = sub.name, id = %Escaped(&envelope.id), attempt, error = %Escaped(&e.to_string()), "transient failure; retrying");
                        tokio::time::sleep(crate::backoff::jitter(
                            retry.transient_backoff(attempt),
                        ))
                        .await;
                        attempt = attempt.saturating_add(1);
                    }
                    Err(e) if attempt > retry.max_retries || e.is_permanent() => {
                        let why = if e.is_permanent() {
                            "handler returned a permanent error"
                        } else {
                            "handler failed after retries"
                        };
                        tracing::error!(handler = sub.name, id = %Escaped(&envelope.id), attempt, error = %Escaped(&e.to_string()), "{why}; event dead-lettered");
                        self.dead
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push(DeadLetter {
                                handler: sub.name,
                                envelope: envelope.clone(),
                                error: e.to_string(),
                            });
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(handler = sub.name, id = %Escaped(&envelope.id), attempt, error = %Escaped(&e.to_string()), "handler failed; retrying");
                        tokio::time::sleep(retry.backoff(attempt)).await;
                        attempt += 1;
                    }
                }
            }
        }
    }
}

impl Broker for InlineBroker {
    fn name(&self) -> &str {
        "inline"
    }

    fn deliver_published<'a>(&'a self, plan: &'a ConsumerPlan) -> Option<BoxFuture<'a, usize>> {
        Some(Box::pin(self.drain(plan)))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::SERIAL_DELIVERY
    }

    fn publish<'a>(
        &'a self,
        producer: &'a Producer,
        batch: &'a [Publication],
    ) -> BoxFuture<'a, Result<(), PublishError>> {
        {
            let mut q = self
                .queue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            q.extend(batch.iter().map(|p| p.delivered(producer)));
        }
        self.wake.notify_one();
        Box::pin(async { Ok(()) })
    }

    fn run(
        self: Arc<Self>,
        plan: Arc<ConsumerPlan>,
        shutdown: CancellationToken,
    ) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(async move {
            loop {
                let notified = self.wake.notified();
                while let Some(e) = self.pop() {
                    self.deliver(&plan, &e).await;
                    if shutdown.is_cancelled() {
                        return Ok(());
                    }
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = notified => {}
                }
            }
        })
    }
}
