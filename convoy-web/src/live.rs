//! What the page keeps in memory and refreshes in the background: lag
//! samples of every handler (for the charts) and a snapshot of every
//! partition's status (for sorting by lag and filtering by state), each at
//! a bounded, configurable cost.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use convoy_runtime::redis::admin::{PartitionStatus, ScanCursor};
use tokio_util::sync::CancellationToken;

use crate::views::State;

/// Keys whose lag is charted (the key pages open lately), at most.
const KEYS_CHARTED: usize = 64;

/// Keys read per step of a snapshot.
const SNAPSHOT_CHUNK: usize = 200;

/// A partition's state, as the listing filters it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowState {
    /// Halted on its head, waiting for an operator.
    Halted,
    /// Its owner's handler is paused: its dependency is down (transient
    /// failures of many keys at once); one probe at a time runs.
    Paused,
    /// Its head failed and is being retried.
    Retrying,
    /// A gap was recorded (`on_poison = "dead_letter"`) and not
    /// acknowledged.
    Gap,
    /// Owned by a live instance.
    Running,
    /// No live owner.
    Unowned,
}

impl RowState {
    /// Every state, in the filter's order.
    pub(crate) const ALL: [RowState; 6] = [
        RowState::Halted,
        RowState::Paused,
        RowState::Retrying,
        RowState::Gap,
        RowState::Running,
        RowState::Unowned,
    ];

    pub(crate) fn of(s: &PartitionStatus) -> RowState {
        if s.halted {
            RowState::Halted
        } else if s.paused_since_ms.is_some() {
            RowState::Paused
        } else if s.attempts > 0 {
            RowState::Retrying
        } else if s.gap.is_some() {
            RowState::Gap
        } else if s.owner_alive {
            RowState::Running
        } else {
            RowState::Unowned
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RowState::Halted => "halted",
            RowState::Paused => "paused",
            RowState::Retrying => "retrying",
            RowState::Gap => "gap",
            RowState::Running => "running",
            RowState::Unowned => "unowned",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<RowState> {
        RowState::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// One unit in a snapshot.
#[derive(Debug, Clone)]
pub(crate) struct SnapRow {
    pub(crate) key: String,
    pub(crate) group: String,
    pub(crate) lag: Option<u64>,
    pub(crate) state: RowState,
    pub(crate) owner: Option<String>,
    pub(crate) owner_alive: bool,
}

/// Every unit of a category, as read between `taken_ms` and `took`.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    /// When it started (ms since the Unix epoch).
    pub(crate) taken_ms: u64,
    /// How long it took.
    pub(crate) took: Duration,
    /// Sorted by key, then group.
    pub(crate) rows: Vec<SnapRow>,
}

/// Lag samples: `(ms since the Unix epoch, lag)`, oldest first.
pub(crate) type Series = VecDeque<(u64, i64)>;

/// Every series the charts draw.
#[derive(Debug, Default)]
pub(crate) struct Samples {
    /// Per (category, handler).
    pub(crate) handlers: HashMap<(String, String), Series>,
    /// Per (category, key, handler), for the keys looked at lately.
    pub(crate) keys: HashMap<(String, String, String), Series>,
    /// Those keys, the least recently sampled first.
    key_order: VecDeque<(String, String, String)>,
}

impl Samples {
    fn push(series: &mut Series, at: u64, lag: i64, kept: usize) {
        series.push_back((at, lag));
        while series.len() > kept {
            series.pop_front();
        }
    }

    pub(crate) fn handler(&mut self, category: &str, group: &str, at: u64, lag: i64, kept: usize) {
        let s = self
            .handlers
            .entry((category.to_owned(), group.to_owned()))
            .or_default();
        Self::push(s, at, lag, kept);
    }

    /// A key's sample, taken when its page refreshes.
    pub(crate) fn key(&mut self, id: (String, String, String), at: u64, lag: i64, kept: usize) {
        if let Some(s) = self.keys.get_mut(&id) {
            // Not more often than the handlers' samples.
            if s.back().is_some_and(|(t, _)| at.saturating_sub(*t) < 900) {
                return;
            }
            Self::push(s, at, lag, kept);
            self.key_order.retain(|k| k != &id);
            self.key_order.push_back(id);
            return;
        }
        while self.keys.len() >= KEYS_CHARTED {
            match self.key_order.pop_front() {
                Some(old) => {
                    self.keys.remove(&old);
                }
                None => break,
            }
        }
        let mut s = Series::new();
        Self::push(&mut s, at, lag, kept);
        self.keys.insert(id.clone(), s);
        self.key_order.push_back(id);
    }
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

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
