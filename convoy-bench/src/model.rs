//! The benchmark's domain: one partitioned category (`bench`), one event
//! ([`Tick`]) and one trivial handler ([`Probe`]) that only records what it
//! saw in a [`ProbeState`]. The plain-group baseline records into the same
//! [`ProbeState`], so both sides do the same work per event.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use convoy_runtime::{Aggregate, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};

/// The stream category of the benchmark.
pub const CATEGORY: &str = "bench";

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Nanoseconds since the first call in this process (monotonic), the
/// sub-millisecond send stamp carried in [`Tick::sent_ns`].
pub fn now_ns() -> u64 {
    u64::try_from(EPOCH.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The `bench` stream category.
#[derive(Aggregate, Debug)]
#[aggregate(category = "bench")]
pub struct Bench;

/// One event for one key; `seq` counts per key from 0.
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Bench)]
pub struct Tick {
    /// The partition key.
    pub client_id: String,
    /// Position of the event among its key's events.
    pub seq: u64,
    /// [`now_ns`] when it was raised; 0 when not stamped.
    pub sent_ns: u64,
}

impl Tick {
    /// An unstamped event.
    pub fn new(key: &str, seq: u64) -> Self {
        Tick {
            client_id: key.to_owned(),
            seq,
            sent_ns: 0,
        }
    }

    /// An event stamped with the current [`now_ns`].
    pub fn stamped(key: &str, seq: u64) -> Self {
        Tick {
            client_id: key.to_owned(),
            seq,
            sent_ns: now_ns(),
        }
    }
}

/// The name of key number `i`.
pub fn key_name(i: usize) -> String {
    format!("k{i}")
}

/// `total` events spread round robin over `keys` keys (the last round may
/// be partial).
pub fn spread(keys: usize, total: usize) -> Vec<Tick> {
    let names: Vec<String> = (0..keys).map(key_name).collect();
    (0..total)
        .map(|i| Tick::new(&names[i % keys], (i / keys) as u64))
        .collect()
}

/// The trivial handler: records the event and returns.
#[derive(Debug)]
pub struct Probe {
    /// Where it records.
    pub state: Arc<ProbeState>,
}

#[event_handler(part_of = Bench, sequential_by = "client_id")]
impl Probe {
    #[handle]
    async fn tick(&self, e: Tick) -> Result<(), HandlerError> {
        self.state.record(&e);
        Ok(())
    }
}

/// What one key's handler saw last.
#[derive(Debug, Clone, Copy)]
pub struct KeySeen {
    /// The highest `seq` handled.
    pub last_seq: u64,
    /// When the last event was handled.
    pub last_at: Instant,
    /// Events handled.
    pub count: u64,
}

/// What the handlers of one run saw, shared by every instance and consumer
/// of the run.
#[derive(Debug, Default)]
pub struct ProbeState {
    handled: AtomicU64,
    /// Whether [`ProbeState::record`] logs every event with its time
    /// (off by default: the throughput scenarios do not pay for it).
    log_handled: AtomicBool,
    /// Whether [`ProbeState::record`] leaves the per-key map out (the idle
    /// scenario measures the engine's memory per unit: a map entry per key
    /// in the benchmark's own state would count against it).
    untracked: AtomicBool,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    keys: HashMap<String, KeySeen>,
    /// Events of a key handled after one with a higher `seq`.
    decreases: u64,
    /// Events of a key handled again (same `seq` as the last one).
    reruns: u64,
    /// Publish-to-handle latencies of stamped events, in ns.
    latencies_ns: Vec<u64>,
    /// When the last event (of any key) was handled.
    last_at: Option<Instant>,
    /// The longest time between two consecutive handled events.
    longest_pause: Duration,
    /// `(key, seq, now_ns())` of every handled event, when logging.
    handled_log: Vec<(String, u64, u64)>,
}

impl Inner {
    /// Records `e` in the per-key map, counting order breaks.
    fn track(&mut self, e: &Tick, at: Instant) {
        match self.keys.get_mut(&e.client_id) {
            Some(k) => {
                if e.seq < k.last_seq {
                    self.decreases += 1;
                } else if e.seq == k.last_seq {
                    self.reruns += 1;
                }
                k.last_seq = k.last_seq.max(e.seq);
                k.last_at = at;
                k.count += 1;
            }
            None => {
                self.keys.insert(
                    e.client_id.clone(),
                    KeySeen {
                        last_seq: e.seq,
                        last_at: at,
                        count: 1,
                    },
                );
            }
        }
    }
}

/// The per-key order check of a run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct OrderCheck {
    /// Keys seen.
    pub keys: usize,
    /// Events handled after a later event of the same key.
    pub decreases: u64,
    /// Events handled twice in a row (at-least-once redelivery).
    pub reruns: u64,
}

impl OrderCheck {
    /// `ok`, or how the order broke.
    pub fn describe(&self) -> String {
        match (self.decreases, self.reruns) {
            (0, 0) => "ok".to_owned(),
            (0, r) => format!("ok ({r} reruns)"),
            (d, r) => format!("{d} out of order, {r} reruns"),
        }
    }
}

impl ProbeState {
    /// A fresh state, shared.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A fresh state that counts handled events and latencies only, with
    /// no per-key record (so no per-key order check).
    pub fn counting_only() -> Arc<Self> {
        let s = Self::default();
        s.untracked.store(true, Ordering::Relaxed);
        Arc::new(s)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records one handled event.
    pub fn record(&self, e: &Tick) {
        let at = Instant::now();
        let at_ns = now_ns();
        let latency = (e.sent_ns > 0).then(|| at_ns.saturating_sub(e.sent_ns));
        {
            let mut g = self.lock();
            let inner = &mut *g;
            if !self.untracked.load(Ordering::Relaxed) {
                inner.track(e, at);
            }
            if let Some(l) = latency {
                inner.latencies_ns.push(l);
            }
            if self.log_handled.load(Ordering::Relaxed) {
                inner.handled_log.push((e.client_id.clone(), e.seq, at_ns));
            }
            if let Some(prev) = inner.last_at {
                inner.longest_pause = inner.longest_pause.max(at.saturating_duration_since(prev));
            }
            inner.last_at = Some(at);
        }
        self.handled.fetch_add(1, Ordering::Release);
    }

    /// Events handled so far.
    pub fn handled(&self) -> u64 {
        self.handled.load(Ordering::Acquire)
    }

    /// The per-key order check so far.
    pub fn order(&self) -> OrderCheck {
        let g = self.lock();
        OrderCheck {
            keys: g.keys.len(),
            decreases: g.decreases,
            reruns: g.reruns,
        }
    }

    /// What `key`'s handler saw last.
    pub fn key(&self, key: &str) -> Option<KeySeen> {
        self.lock().keys.get(key).copied()
    }

    /// The longest time between two consecutive handled events so far.
    pub fn longest_pause(&self) -> Duration {
        self.lock().longest_pause
    }

    /// Logs every handled event from now on (see
    /// [`ProbeState::take_handled_log`]).
    pub fn log_handled(&self) {
        self.log_handled.store(true, Ordering::Relaxed);
    }

    /// Takes the `(key, seq, handled at now_ns())` log so far.
    pub fn take_handled_log(&self) -> Vec<(String, u64, u64)> {
        std::mem::take(&mut self.lock().handled_log)
    }

    /// Takes the latencies recorded so far (ns).
    pub fn take_latencies(&self) -> Vec<u64> {
        std::mem::take(&mut self.lock().latencies_ns)
    }
}
