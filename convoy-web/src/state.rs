//! What the page holds in memory, shared by every request and the
//! background tasks: the admin connection, the settings, the CSRF token,
//! and the lag samples and partition snapshots that `live` refreshes.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use convoy_runtime::redis::admin::{Admin, PartitionStatus};
use tokio::sync::Semaphore;

use crate::Settings;

/// What every request shares.
pub(crate) struct State {
    pub(crate) admin: Admin,
    pub(crate) settings: Settings,
    /// The process's CSRF token (random, per process).
    pub(crate) csrf: String,
    pub(crate) samples: Mutex<Samples>,
    pub(crate) snapshots: RwLock<HashMap<String, Arc<Snapshot>>>,
    pub(crate) live_clients: Arc<Semaphore>,
    /// Cancelled when the server stops: live-update streams end with it,
    /// so a graceful shutdown does not wait for open tabs.
    pub(crate) stopping: tokio_util::sync::CancellationToken,
}

impl State {
    pub(crate) fn new(admin: Admin, settings: Settings) -> Self {
        let mut bytes = [0u8; 32];
        if getrandom::fill(&mut bytes).is_err() {
            // No system randomness: a token nobody can guess is still
            // needed; the time and address are a poor one, so say so.
            tracing::error!("convoy-web: no system randomness for the CSRF token");
            let seed = format!("{:?}{:p}", std::time::SystemTime::now(), &bytes);
            for (i, b) in seed.bytes().enumerate() {
                bytes[i % 32] ^= b;
            }
        }
        let csrf = bytes.iter().map(|b| format!("{b:02x}")).collect();
        State {
            admin,
            live_clients: Arc::new(Semaphore::new(settings.max_live_clients.max(1))),
            settings,
            csrf,
            samples: Mutex::new(Samples::default()),
            snapshots: RwLock::new(HashMap::new()),
            stopping: tokio_util::sync::CancellationToken::new(),
        }
    }

    /// `path` under the base path (the root of a router nested at
    /// `/ops` is `/ops`: axum routes `/ops/` nowhere).
    pub(crate) fn url(&self, path: &str) -> String {
        let base = &self.settings.base_path;
        if path == "/" && !base.is_empty() {
            base.clone()
        } else {
            format!("{base}{path}")
        }
    }

    pub(crate) fn snapshot(&self, category: &str) -> Option<Arc<Snapshot>> {
        self.snapshots
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(category)
            .cloned()
    }

    /// `text` without any of the secrets.
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut t = text.to_owned();
        for s in self.settings.secrets.iter().filter(|s| !s.is_empty()) {
            t = t.replace(s.as_str(), "***");
        }
        t
    }
}

/// Keys whose lag is charted (the key pages open lately), at most.
const KEYS_CHARTED: usize = 64;

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
