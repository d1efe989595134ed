//! The cost model, guarded: Redis commands per event for fixed workloads
//! against a real `redis-server`, counted from `INFO commandstats`
//! (commands a script runs included), never timed. A change that adds a
//! command per event fails here and has to say why (and raise the budget
//! with its reason), or take it out. The figures are printed with
//! `--nocapture`.
//!
//! Budgets are today's counts plus a small margin for what does not scale
//! with events (heartbeats, lease taking, wake-ups during a run).

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use convoy_runtime::testing::RedisServer;
use convoy_runtime::{Aggregate, Config, Domain, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};
use support::{publish_outbox, test_config, wait_until};

#[derive(Aggregate)]
#[aggregate(category = "cost")]
struct Cost;

#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Cost)]
struct Ticked {
    key: String,
    n: u64,
}

struct Counter {
    handled: Arc<AtomicU64>,
}

#[event_handler(part_of = Cost, sequential_by = "key")]
impl Counter {
    #[handle]
    async fn ticked(&self, _e: Ticked) -> Result<(), HandlerError> {
        self.handled.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Every command's calls, by name (`INFO commandstats`), less the
/// measurement's own.
async fn calls(server: &RedisServer) -> BTreeMap<String, u64> {
    let mut c = server.connection().await.expect("connect");
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .expect("INFO");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let n = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), n.parse().ok()?))
        })
        .filter(|(name, _)| !matches!(name.as_str(), "info" | "ping" | "client|setinfo"))
        .collect()
}

fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

fn per_event(d: &BTreeMap<String, u64>, events: u64) -> f64 {
    d.values().sum::<u64>() as f64 / events as f64
}

/// Publishes `per_key` events to each of `keys` keys, then runs an engine
/// with `max_unacked` until all are handled: commands per published event
/// and per handled event, with the breakdowns.
async fn measure(keys: u64, per_key: u64, max_unacked: usize) -> (f64, f64, String) {
    let server = RedisServer::start().expect("start redis-server");
    let mut config: Config = test_config(&server.url());
    config.server.partitioning.max_unacked = max_unacked;
    let handled = Arc::new(AtomicU64::new(0));
    let domain = Domain::builder()
        .config(config)
        .instance_id("e0")
        .handler(Counter {
            handled: handled.clone(),
        })
        .without_discovery()
        .init()
        .expect("init");
    let events = keys * per_key;
    let mut uow = domain.unit_of_work();
    for n in 0..per_key {
        for k in 0..keys {
            uow.raise(Ticked {
                key: format!("k{k}"),
                n,
            })
            .expect("raise");
        }
    }
    // The first commit records the category's key (once per process).
    uow.commit().await.expect("commit");
    let before = calls(&server).await;
    publish_outbox(&domain).await;
    let published = delta(&before, &calls(&server).await);
    let before = calls(&server).await;
    let engine = domain.engine().spawn();
    wait_until(Duration::from_secs(60), "every event handled", || async {
        handled.load(Ordering::SeqCst) >= events
    })
    .await;
    let consumed = delta(&before, &calls(&server).await);
    engine.shutdown().await.expect("shutdown");
    let report = format!(
        "K={keys} mu={max_unacked}: publish {:.3}/event {published:?}; consume {:.3}/event {consumed:?}",
        per_event(&published, events),
        per_event(&consumed, events)
    );
    println!("{report}");
    (
        per_event(&published, events),
        per_event(&consumed, events),
        report,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_commands_per_event_stay_within_their_budgets() {
    // (keys, events per key, max_unacked, publish budget, consume budget)
    let cases = [
        // Measured 2026-12-01 (debug build): publish 1.35, consume
        // 3.06-3.18 (the acknowledgements batched per moment vary).
        (64, 150, 1, 1.45, 3.45),
        // Publish 1.02, consume 5.31.
        (1, 1000, 1, 1.10, 5.60),
        // Publish 1.35, consume 0.30.
        (64, 150, 100, 1.45, 0.40),
    ];
    let mut over = Vec::new();
    for (keys, per_key, mu, publish_budget, consume_budget) in cases {
        let (publish, consume, report) = measure(keys, per_key, mu).await;
        if publish > publish_budget {
            over.push(format!("publish {publish:.3} > {publish_budget}: {report}"));
        }
        if consume > consume_budget {
            over.push(format!("consume {consume:.3} > {consume_budget}: {report}"));
        }
    }
    assert!(
        over.is_empty(),
        "Redis commands per event over budget (a command added per event must say why):\n{}",
        over.join("\n")
    );
}
