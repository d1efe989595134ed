//! The unit of work: events raised by an operation, validated as they are
//! raised and added to the outbox together on commit.

use std::sync::Arc;

use convoy_core::broker::RaisedCheck;
use convoy_core::envelope::Priority;
use convoy_core::error::Error;
use convoy_core::key::KeyPolicy;
use convoy_core::message::Event;
use convoy_core::outbox::OutboxHandle;
use convoy_core::raise::PendingEvents;

/// A unit of work: raise events, then commit them to the outbox at once.
///
/// Dropping it without `commit` discards the events.
pub struct UnitOfWork {
    outbox: OutboxHandle,
    check: RaisedCheck,
    policy: Arc<KeyPolicy>,
    pending: PendingEvents,
    correlation_id: Option<String>,
}

impl std::fmt::Debug for UnitOfWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnitOfWork")
            .field("pending", &self.pending)
            .field("correlation_id", &self.correlation_id)
            .finish_non_exhaustive()
    }
}

impl UnitOfWork {
    /// A unit of work committing to `outbox`, checking keys with `policy`
    /// (and, before it commits, each raised category's key with `check`).
    pub(crate) fn new(outbox: OutboxHandle, check: RaisedCheck, policy: Arc<KeyPolicy>) -> Self {
        UnitOfWork {
            outbox,
            check,
            policy,
            pending: PendingEvents::default(),
            correlation_id: None,
        }
    }

    /// Sets the correlation id carried by every event raised from now on.
    pub fn with_correlation_id(mut self, id: impl Into<String>) -> Self {
        self.correlation_id = Some(id.into());
        self
    }

    /// Raises an event. Its partition key is extracted and validated now; a
    /// rejected key fails this call, naming the field, the value and the
    /// rule, and the event is not kept.
    pub fn raise<E: Event>(&mut self, event: E) -> Result<(), Error> {
        self.raise_with_priority(event, Priority::Normal)
    }

    /// Raises an event with a priority: low-priority events go to the
    /// backfill lane when `[server.priority_lanes]` is enabled.
    pub fn raise_with_priority<E: Event>(
        &mut self,
        event: E,
        priority: Priority,
    ) -> Result<(), Error> {
        self.pending
            .push(&event, &self.policy, priority, self.correlation_id.clone())
    }

    /// How many events are waiting for commit.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether nothing was raised.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Writes every raised event in the caller's own transaction open on
    /// `tx` (feature `postgres`, with a `PgOutbox` as the domain's outbox),
    /// so the state change and its events commit or roll back together:
    ///
    /// ```ignore
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("UPDATE accounts SET cents = cents - $1 WHERE id = $2")
    ///     .bind(cents).bind(&id).execute(&mut *tx).await?;
    /// let mut uow = domain.unit_of_work();
    /// uow.raise(Debited { account_id: id, cents })?;
    /// uow.commit_in(&mut tx).await?;
    /// tx.commit().await?;
    /// ```
    ///
    /// Events of one partition key publish in the order their transactions
    /// commit: this call takes a transaction-scoped lock per key, held until
    /// the transaction ends, so call it near the end. Returns how many
    /// events were written.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub async fn commit_in(self, tx: &mut sqlx::PgConnection) -> Result<usize, Error> {
        let outbox = self
            .outbox
            .transactional()
            .ok_or(Error::Unsupported {
                operation: "UnitOfWork::commit_in",
                broker: "memory outbox".into(),
                hint: "it needs a PgOutbox as the domain's outbox: set [outbox] postgres_url or call .outbox(PgOutbox::...)",
            })?;
        self.check.check(self.pending.key_fields().to_vec()).await?;
        let envelopes = self.pending.into_envelopes();
        outbox.insert_in(tx, &envelopes).await?;
        Ok(envelopes.len())
    }

    /// Adds every raised event to the outbox, all or none, and wakes the
    /// outbox processor. Returns how many events were committed. (With a
    /// `PgOutbox` this is a transaction of its own; use `commit_in` to
    /// write them with your own changes.)
    ///
    /// Fails with [`Error::KeyFieldMismatch`], committing nothing, when an
    /// event's category is recorded in the broker as partitioned by another
    /// field than this process routes it by (or by a field it carries while
    /// this process routes it without a key).
    pub async fn commit(self) -> Result<usize, Error> {
        self.check.check(self.pending.key_fields().to_vec()).await?;
        let envelopes = self.pending.into_envelopes();
        let n = envelopes.len();
        self.outbox.append(envelopes).await?;
        Ok(n)
    }
}
