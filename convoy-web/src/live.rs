//! The background refresh of what the page keeps in memory (see
//! [`state`](crate::state)): lag samples of every handler (for the charts)
//! and a snapshot of every partition's status (for sorting by lag and
//! filtering by state), each at a bounded, configurable cost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use convoy_runtime::redis::admin::ScanCursor;
use tokio_util::sync::CancellationToken;

use crate::state::{RowState, SnapRow, Snapshot, State, now_ms};

/// Keys read per step of a snapshot.
const SNAPSHOT_CHUNK: usize = 200;

/// The background task: lag samples every `sample_interval`, a snapshot
/// every `snapshot_interval`, until `shutdown`.
pub(crate) async fn run(state: Arc<State>, shutdown: CancellationToken) {
    let sampler = {
        let state = state.clone();
        let shutdown = shutdown.clone();
        async move {
            let mut tick = tokio::time::interval(state.settings.sample_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tick.tick() => sample(&state).await,
                }
            }
        }
    };
    let snapshots = async {
        loop {
            let started = Instant::now();
            snapshot_all(&state, &shutdown).await;
            let wait = state
                .settings
                .snapshot_interval
                .saturating_sub(started.elapsed())
                .max(Duration::from_secs(1));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    };
    tokio::join!(sampler, snapshots);
}

/// One lag sample of every handler of every category: `category_summary`
/// per category (a few commands per shard).
pub(crate) async fn sample(state: &State) {
    let categories = match state.admin.categories().await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "convoy-web: cannot read the categories");
            return;
        }
    };
    let at = now_ms();
    for category in categories {
        match state.admin.category_summary(&category).await {
            Ok(summary) => {
                let kept = state.settings.samples_kept;
                let mut samples = state.samples.lock().unwrap_or_else(|p| p.into_inner());
                for (group, lag) in &summary.lag {
                    samples.handler(&category, group, at, *lag, kept);
                }
            }
            Err(e) => tracing::warn!(category, error = %e, "convoy-web: cannot sample the lag"),
        }
    }
}

/// A new snapshot of every category, one after the other.
pub(crate) async fn snapshot_all(state: &State, shutdown: &CancellationToken) {
    let categories = match state.admin.categories().await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "convoy-web: cannot read the categories");
            return;
        }
    };
    for category in categories {
        if shutdown.is_cancelled() {
            return;
        }
        match snapshot(state, &category, shutdown).await {
            Ok(Some(snap)) => {
                state
                    .snapshots
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(category, Arc::new(snap));
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(category, error = %e, "convoy-web: snapshot failed"),
        }
    }
}

/// Every unit of `category`: its index page by page, each page's status,
/// pausing so that at most `snapshot_keys_per_second` keys are read a
/// second. `None` when stopped.
async fn snapshot(
    state: &State,
    category: &str,
    shutdown: &CancellationToken,
) -> Result<Option<Snapshot>, convoy_runtime::redis::admin::AdminError> {
    let started = Instant::now();
    let taken_ms = now_ms();
    let rate = state.settings.snapshot_keys_per_second as f64;
    let mut rows = Vec::new();
    let mut cursor = Some(ScanCursor::default());
    let mut read = 0usize;
    while let Some(at) = cursor {
        let page = state
            .admin
            .partition_keys_page(category, at, "", SNAPSHOT_CHUNK, 1000, 4)
            .await?;
        cursor = page.next;
        read += page.keys.len();
        let statuses = state.admin.partition_statuses(category, &page.keys).await?;
        rows.extend(statuses.iter().map(|s| SnapRow {
            key: s.key.clone(),
            group: s.group.clone(),
            lag: s.lag,
            state: RowState::of(s),
            owner: s.owner.clone(),
            owner_alive: s.owner_alive,
        }));
        let due = Duration::from_secs_f64(read as f64 / rate);
        let ahead = due.saturating_sub(started.elapsed());
        if !ahead.is_zero() {
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(None),
                _ = tokio::time::sleep(ahead) => {}
            }
        }
    }
    rows.sort_by(|a, b| (&a.key, &a.group).cmp(&(&b.key, &b.group)));
    rows.dedup_by(|a, b| a.key == b.key && a.group == b.group);
    Ok(Some(Snapshot {
        taken_ms,
        took: started.elapsed(),
        rows,
    }))
}
