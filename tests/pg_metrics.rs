//! The outbox metrics of a PostgreSQL outbox's relay, against a real
//! PostgreSQL and a real Redis: rows published, a row abandoned for a key
//! that is invalid at publish time, rows waiting while Redis is down (the
//! backlog, the oldest row's age, failed publish calls), all published
//! once Redis is back.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use convoy_runtime::Domain;
use metrics_util::debugging::{DebugValue, Snapshotter};
use support::pg::PgEnv;
use support::{Posted, install_debugging_recorder, publisher, wait_until};

const WAIT: Duration = Duration::from_secs(40);

/// What the recorder showed so far: counters summed over the snapshots
/// (a debugging snapshot resets what it read), and every value each gauge
/// was seen at.
#[derive(Debug, Default)]
struct Seen {
    counters: BTreeMap<String, u64>,
    gauges: BTreeMap<String, Vec<f64>>,
}

impl Seen {
    fn take(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let name = key.key().name().to_owned();
            match value {
                DebugValue::Counter(n) => *self.counters.entry(name).or_default() += n,
                DebugValue::Gauge(g) => self.gauges.entry(name).or_default().push(g.into_inner()),
                DebugValue::Histogram(_) => {}
            }
        }
    }

    fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    fn gauge_was(&self, name: &str, f: impl Fn(f64) -> bool) -> bool {
        self.gauges
            .get(name)
            .is_some_and(|v| v.iter().any(|g| f(*g)))
    }
}

async fn commit(domain: &Domain, events: &[Posted]) {
    let mut uow = domain.unit_of_work();
    for e in events {
        uow.raise(e.clone()).expect("raise");
    }
    uow.commit().await.expect("commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_exports_backlog_age_abandoned_published_and_failures() {
    let snapshotter = install_debugging_recorder();

    let mut env = PgEnv::start();
    env.outbox().await;
    let writer = publisher(env.config(), "writer");
    // The relay's backfill lane suffix is `slow`: a key the writer may
    // raise, invalid at publish time.
    let mut relay_config = env.config();
    relay_config.server.priority_lanes.backfill_suffix = "slow".into();
    let engine = publisher(relay_config, "relay").engine().spawn();

    let mut seen = Seen::default();
    commit(&writer, &[Posted::new("a", 0), Posted::new("a", 1)]).await;
    commit(&writer, &[Posted::new("slow", 0), Posted::new("a", 2)]).await;
    wait_until(WAIT, "three rows published, one abandoned", || async {
        env.stream("a").await.len() == 3 && env.statuses() == (0, 3, 1)
    })
    .await;

    env.redis.stop().expect("stop redis");
    commit(
        &writer,
        &(0..4).map(|s| Posted::new("b", s)).collect::<Vec<_>>(),
    )
    .await;
    // The relay exports the store's statistics every 5 s.
    let start = std::time::Instant::now();
    loop {
        seen.take(&snapshotter);
        let done = seen.gauge_was("convoy_outbox_pending", |g| g == 4.0)
            && seen.gauge_was("convoy_outbox_oldest_pending_seconds", |g| g > 0.0)
            && seen.gauge_was("convoy_outbox_abandoned", |g| g == 1.0)
            && seen.counter("convoy_outbox_publish_failures_total") >= 1;
        if done {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "the backlog of 4, its age, 1 abandoned and a failed publish while Redis is down; seen {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        seen.counter("convoy_outbox_published_total"),
        3,
        "nothing published while Redis is down: {seen:?}"
    );
    assert!(
        !seen.gauge_was("convoy_outbox_pending", |g| g > 4.0),
        "the abandoned row is not in the backlog: {seen:?}"
    );

    env.redis.restart().expect("restart redis");
    wait_until(WAIT, "the backlog published", || async {
        env.stream("b").await.len() == 4
    })
    .await;
    engine.shutdown().await.expect("shutdown");
    seen.take(&snapshotter);
    assert_eq!(
        seen.counter("convoy_outbox_published_total"),
        7,
        "each row counted once: {seen:?}"
    );
    assert_eq!(env.statuses(), (0, 7, 1));
}
