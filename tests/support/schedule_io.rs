//! What the randomized fault-schedule tests (`fault_schedules.rs`,
//! `cluster_fault_schedules.rs`) do alike around a schedule: raise its
//! events spread over the fault phase, and read back what the handlers
//! recorded.
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use convoy_runtime::testing::{Recorder, Window};
use convoy_runtime::{Domain, Event};
use serde::de::DeserializeOwned;

use crate::faults::Rng;

/// What a schedule publishes: `per_key` events for each key, in per-key
/// order, interleaved across keys; mostly one to three per unit of work,
/// `burst_percent` of them a burst of 10 to 40 (so keys get a backlog:
/// batched reads, and acknowledgements of several events).
pub struct Spread<'a> {
    pub seed: u64,
    pub keys: &'a [String],
    pub per_key: u64,
    pub burst_percent: u64,
    /// The events are spread over this long.
    pub phase: Duration,
}

impl<'a> Spread<'a> {
    pub fn new(seed: u64, keys: &'a [String], per_key: u64, burst: u64, phase: Duration) -> Self {
        Spread {
            seed,
            keys,
            per_key,
            burst_percent: burst,
            phase,
        }
    }
}

/// The id a schedule records for the `seq`-th event of `key`.
pub fn event_id(key: &str, seq: u64) -> String {
    format!("{key}#{seq}")
}

/// Raises `spread`'s events, committing each unit of work; returns the ids
/// ([`event_id`]) of what `commit` returned Ok for, per key, in publish
/// order. An event is built from its serde shape `{"client_id": key,
/// "seq": seq}`, which every schedule's event type has.
pub async fn publish_spread<E: Event + DeserializeOwned>(
    domain: &Domain,
    spread: &Spread<'_>,
) -> BTreeMap<String, Vec<String>> {
    let event = |key: &str, seq: u64| -> E {
        serde_json::from_value(serde_json::json!({ "client_id": key, "seq": seq }))
            .expect("a schedule's event is {client_id, seq}")
    };
    let mut rng = Rng::new(spread.seed).fork(3);
    let mut left: Vec<(String, u64)> = spread.keys.iter().map(|k| (k.clone(), 0)).collect();
    let total = spread.keys.len() as u64 * spread.per_key;
    let mut committed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut raised = 0u64;
    let start = Instant::now();
    while raised < total {
        let mut uow = domain.unit_of_work();
        let mut batch = Vec::new();
        let n = if rng.chance(spread.burst_percent) {
            rng.range(10, 40)
        } else {
            rng.range(1, 3)
        };
        for _ in 0..n {
            let open: Vec<usize> = (0..left.len())
                .filter(|&i| left[i].1 < spread.per_key)
                .collect();
            if open.is_empty() {
                break;
            }
            let i = *rng.pick(&open);
            let (key, seq) = (left[i].0.clone(), left[i].1);
            left[i].1 += 1;
            uow.raise(event(&key, seq)).expect("raise");
            batch.push((key, seq));
        }
        raised += batch.len() as u64;
        if uow.commit().await.is_ok() {
            for (key, seq) in batch {
                committed
                    .entry(key.clone())
                    .or_default()
                    .push(event_id(&key, seq));
            }
        }
        let due = spread.phase.mul_f64(raised as f64 / total as f64);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    committed
}

/// Every key's processing windows (committed keys and any other key
/// seen), each key's in start order: a stalled owner's in-flight event
/// writes its enter record only after it is resumed.
pub async fn windows(
    recorder: &Recorder,
    committed: &BTreeMap<String, Vec<String>>,
) -> BTreeMap<String, Vec<Window>> {
    let mut keys: Vec<String> = committed.keys().cloned().collect();
    if let Ok(seen) = recorder.seen_all().await {
        keys.extend(seen.into_keys());
    }
    keys.sort();
    keys.dedup();
    let mut out = BTreeMap::new();
    for key in keys {
        let mut w = recorder
            .windows_of(&key)
            .await
            .expect("record server windows");
        w.sort_by_key(|w| w.start_us);
        out.insert(key, w);
    }
    out
}

/// How many committed events were handled to completion (entered and
/// exited) at least once.
pub fn completed(
    committed: &BTreeMap<String, Vec<String>>,
    windows: &BTreeMap<String, Vec<Window>>,
) -> usize {
    committed
        .iter()
        .map(|(k, ids)| {
            let ws = windows.get(k).map(Vec::as_slice).unwrap_or_default();
            ids.iter()
                .filter(|id| ws.iter().any(|w| &w.event == *id && w.end_us != u64::MAX))
                .count()
        })
        .sum()
}
