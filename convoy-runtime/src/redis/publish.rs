//! Publishing outbox batches: one script call per batch writes each record's
//! stream entry, index entry and wake-up together.

use super::RedisBroker;
use super::keys;
use super::scripts::SCRIPTS;
use crate::broker::{Publication, PublishError};
use crate::error::Error;

/// How long the producer's high-water mark is kept (7 days).
const PRODUCER_TTL_MS: u64 = 7 * 24 * 3600 * 1000;
/// Approximate cap of each category's wake stream.
pub(super) const WAKE_MAXLEN: u64 = 100_000;

pub(super) async fn publish(
    broker: &RedisBroker,
    producer: &str,
    batch: &[Publication],
) -> Result<(), PublishError> {
    if batch.is_empty() {
        return Ok(());
    }
    let fail = |error: Error| PublishError {
        published: 0,
        error,
    };
    let mut conn = broker.conn().await.map_err(fail)?;
    let mut inv = SCRIPTS.publish.prepare_invoke();
    inv.key(keys::producer(producer));
    inv.arg(PRODUCER_TTL_MS).arg(WAKE_MAXLEN);
    for p in batch {
        let category = &p.envelope.category;
        inv.key(&p.stream)
            .key(keys::partition_index(category))
            .key(keys::wake_stream(category))
            .key(keys::published(category));
        let fields = p.envelope.to_fields();
        inv.arg(p.seq)
            .arg(p.partition.as_deref().unwrap_or(""))
            .arg(fields.len() * 2);
        for (k, v) in fields {
            inv.arg(k).arg(v);
        }
    }
    let _: i64 = inv
        .invoke_async(&mut conn)
        .await
        .map_err(|e| fail(Error::redis("failed to publish outbox records", e)))?;
    Ok(())
}
