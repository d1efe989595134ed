//! Process managers declared `sequential_by = true`: instances keyed by a
//! correlation value spanning two categories, on the inline broker and on
//! Redis with several engines (no two events of one instance at once,
//! instances in parallel, crash failover), and the init rules.

#[path = "support/names.rs"]
mod names;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use convoy_runtime::handler::{HandlerDescriptor, HandlerKind};
use convoy_runtime::process_manager::{MemoryStateStore, StateStore};
use convoy_runtime::testing::{
    ChildEngine, Recorder, RedisCluster, RedisServer, current_test_command,
};
use convoy_runtime::{
    Aggregate, Config, Context, Domain, Event, HandlerError, Message, ProcessManager,
    process_manager,
};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
#[aggregate(category = "order")]
struct Order;

#[derive(Aggregate)]
#[aggregate(category = "payment")]
struct Payment;

#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Order)]
struct OrderPlaced {
    order_id: String,
    amount: u64,
}

#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Order)]
struct OrderShipped {
    order_id: String,
}

#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Order)]
struct OrderClosed {
    order_id: String,
}

#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Payment)]
struct PaymentCaptured {
    order_ref: String,
    amount: u64,
}

/// One event of a story, raised into a unit of work.
type Step = Box<dyn FnOnce(&mut convoy_runtime::UnitOfWork) + Send>;

/// Where handlers record what they saw (set in tests that run on Redis).
static RECORDER: OnceLock<(Recorder, String, Duration)> = OnceLock::new();

/// Keys of the cluster test, which records nothing (the recorder belongs
/// to another test, whose Redis may be gone by then).
const UNRECORDED: &str = "k-";

async fn mark(ctx: &Context) -> Result<(), HandlerError> {
    if let Some((rec, instance, work)) = RECORDER.get() {
        let key = ctx.partition_key().unwrap_or("none");
        if key.starts_with(UNRECORDED) {
            return Ok(());
        }
        let g = rec.enter(key, ctx.message_id(), instance).await?;
        tokio::time::sleep(*work).await;
        g.exit().await?;
    }
    Ok(())
}

#[derive(Default, Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Fulfilment {
    order_id: String,
    placed: u64,
    paid: u64,
    shipped: bool,
    closed: bool,
}

#[process_manager(sequential_by = true)]
impl Fulfilment {
    #[handle(start, correlate = "order_id")]
    async fn placed(&mut self, e: OrderPlaced, ctx: &Context) -> Result<(), HandlerError> {
        mark(ctx).await?;
        self.order_id = e.order_id;
        self.placed = e.amount;
        Ok(())
    }

    #[handle(correlate = "order_ref")]
    async fn paid(&mut self, e: PaymentCaptured, ctx: &Context) -> Result<(), HandlerError> {
        mark(ctx).await?;
        self.paid += e.amount;
        Ok(())
    }

    #[handle(correlate = "order_id")]
    async fn shipped(&mut self, _e: OrderShipped, ctx: &Context) -> Result<(), HandlerError> {
        mark(ctx).await?;
        self.shipped = true;
        Ok(())
    }

    #[handle(end, correlate = "order_id")]
    async fn closed(&mut self, _e: OrderClosed) -> Result<(), HandlerError> {
        self.closed = true;
        Ok(())
    }
}

fn name() -> &'static str {
    <Fulfilment as ProcessManager>::DESCRIPTOR.name
}

/// The events of one order: placed, `payments` payments of 10, shipped.
fn story(order: &str, payments: u64) -> Vec<Step> {
    let mut v: Vec<Step> = Vec::new();
    let o = order.to_owned();
    v.push(Box::new(move |u| {
        u.raise(OrderPlaced {
            order_id: o,
            amount: 100,
        })
        .expect("raise")
    }));
    for _ in 0..payments {
        let o = order.to_owned();
        v.push(Box::new(move |u| {
            u.raise(PaymentCaptured {
                order_ref: o,
                amount: 10,
            })
            .expect("raise")
        }));
    }
    let o = order.to_owned();
    v.push(Box::new(move |u| {
        u.raise(OrderShipped { order_id: o }).expect("raise")
    }));
    v
}

/// Stories of several orders, interleaved event by event.
fn interleave(orders: &[&str], payments: u64) -> Vec<Step> {
    let mut stories: Vec<_> = orders
        .iter()
        .map(|o| story(o, payments).into_iter())
        .collect();
    let mut out = Vec::new();
    loop {
        let mut any = false;
        for s in &mut stories {
            if let Some(f) = s.next() {
                out.push(f);
                any = true;
            }
        }
        if !any {
            return out;
        }
    }
}

fn expected(order: &str, payments: u64) -> Fulfilment {
    Fulfilment {
        order_id: order.to_owned(),
        placed: 100,
        paid: 10 * payments,
        shipped: true,
        closed: false,
    }
}

#[tokio::test]
async fn inline_instances_start_progress_end_and_ignore_strays() {
    let store = Arc::new(MemoryStateStore::new());
    let d = Domain::builder()
        .process_manager::<Fulfilment>()
        .state_store_arc(store.clone())
        .init()
        .expect("init");
    let mut uow = d.unit_of_work();
    for f in interleave(&["o1", "o2"], 2) {
        f(&mut uow);
    }
    // An event for an instance that was never started, and one after the end.
    uow.raise(PaymentCaptured {
        order_ref: "o9".into(),
        amount: 5,
    })
    .expect("raise");
    for o in ["o1", "o2"] {
        uow.raise(OrderClosed { order_id: o.into() })
            .expect("raise");
    }
    uow.raise(PaymentCaptured {
        order_ref: "o1".into(),
        amount: 1000,
    })
    .expect("raise");
    uow.commit().await.expect("commit");
    d.engine().run_until_idle().await.expect("run");
    for o in ["o1", "o2"] {
        let s = store
            .load(name(), o)
            .await
            .expect("load")
            .expect("instance exists");
        assert!(s.ended);
        let state: Fulfilment = serde_json::from_str(&s.state).expect("state");
        let want = Fulfilment {
            closed: true,
            ..expected(o, 2)
        };
        assert_eq!(state, want, "late payment after the end was ignored");
    }
    assert_eq!(
        store.load(name(), "o9").await.expect("load"),
        None,
        "never started"
    );
}

static AUDITOR: HandlerDescriptor = HandlerDescriptor {
    name: "hand::PaymentAuditor",
    kind: HandlerKind::Event,
    category: "payment",
    sequential_by: Some("amount"),
    handles: &[<PaymentCaptured as Message>::DESCRIPTOR],
    dead_letter_poison: false,
};

#[test]
fn an_event_handler_partitioning_a_shared_category_by_another_field_is_an_init_error() {
    let err = Domain::builder()
        .without_discovery()
        .process_manager::<Fulfilment>()
        .register(&AUDITOR)
        .init()
        .expect_err("conflict");
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "category `payment` is partitioned by `amount` in `hand::PaymentAuditor` but by `order_ref` in `{}`",
            name()
        )),
        "{text}"
    );
}

fn test_config(url: &str) -> Config {
    let mut c = Config::default();
    c.broker.url = url.to_owned();
    c.server.partitioning.lease_ttl_ms = 2000;
    c.server.partitioning.heartbeat_interval_seconds = Some(0.3);
    c.server.retry.initial_backoff_ms = 20;
    c.server.retry.max_backoff_ms = 100;
    c
}

fn engine_domain(url: &str, instance: &str) -> Domain {
    Domain::builder()
        .config(test_config(url))
        .instance_id(instance)
        .process_manager::<Fulfilment>()
        .init()
        .expect("init")
}

async fn publish(d: &Domain, events: Vec<Step>) {
    let mut uow = d.unit_of_work();
    for f in events {
        f(&mut uow);
    }
    uow.commit().await.expect("commit");
}

async fn states(server: &RedisServer, orders: &[&str]) -> BTreeMap<String, Fulfilment> {
    let mut c = server.connection().await.expect("conn");
    states_on(&mut c, orders).await
}

/// The process manager's state of each of `orders` that has one, read
/// through `c` (a server's connection or a cluster's).
async fn states_on(
    c: &mut impl redis::aio::ConnectionLike,
    orders: &[&str],
) -> BTreeMap<String, Fulfilment> {
    let mut out = BTreeMap::new();
    for o in orders {
        let state: Option<String> = redis::cmd("HGET")
            .arg(convoy_runtime::redis::keys::pm_state(name(), o))
            .arg("state")
            .query_async(c)
            .await
            .expect("hget");
        if let Some(s) = state {
            out.insert(
                (*o).to_owned(),
                serde_json::from_str(&s).expect("state json"),
            );
        }
    }
    out
}

async fn wait_for_states(server: &RedisServer, orders: &[&str], payments: u64) {
    let want: BTreeMap<String, Fulfilment> = orders
        .iter()
        .map(|o| ((*o).to_owned(), expected(o, payments)))
        .collect();
    let start = std::time::Instant::now();
    loop {
        let got = states(server, orders).await;
        if got == want {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "final states: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_one_instance_never_runs_two_events_at_once_and_instances_run_in_parallel() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let rec = Recorder::new(&url, "pm").expect("recorder");
    RECORDER
        .set((rec.clone(), "shared".to_owned(), Duration::from_millis(20)))
        .expect("recorder set once in this test binary");
    let a = engine_domain(&url, "a").engine().spawn();
    let b = engine_domain(&url, "b").engine().spawn();
    let orders = ["o1", "o2", "o3", "o4"];
    let p = engine_domain(&url, "publisher");
    publish(&p, interleave(&orders, 5)).await;
    let pe = p.engine().spawn();
    wait_for_states(&server, &orders, 5).await;
    assert_eq!(
        rec.violations().await.expect("violations"),
        Vec::<String>::new()
    );
    let mut parallel = false;
    for (x, y) in [("o1", "o2"), ("o1", "o3"), ("o2", "o4"), ("o3", "o4")] {
        parallel |= rec.overlapping_keys(x, y).await.expect("windows");
    }
    assert!(parallel, "instances never ran at the same time");
    // One lease covers both categories of an instance.
    let mut c = server.connection().await.expect("conn");
    let lease: Option<String> = redis::cmd("GET")
        .arg(names::lease(name(), "*", "o1"))
        .query_async(&mut c)
        .await
        .expect("get");
    assert!(lease.is_some(), "o1 is leased as one unit");
    // Operators' tools see the unit's owner through either category.
    let admin = convoy_runtime::redis::admin::Admin::connect(&url)
        .await
        .expect("admin");
    for category in ["order", "payment"] {
        let report = admin.partitions(category).await.expect("partitions");
        let o1 = report
            .partitions
            .iter()
            .find(|p| p.key == "o1" && p.group == name())
            .expect("o1 listed");
        assert!(o1.owner_alive, "{category}: {o1:?}");
        assert!(
            o1.owner
                .as_deref()
                .is_some_and(|o| ["a", "b", "publisher"].contains(&o)),
            "{category}: {o1:?}"
        );
    }
    for e in [a, b, pe] {
        e.shutdown().await.expect("shutdown");
    }
}

/// Runs an engine until SIGTERM when started as a child engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_engine() {
    let Ok(url) = std::env::var("CONVOY_CHILD_ENGINE") else {
        return;
    };
    let instance = std::env::var("CONVOY_INSTANCE").expect("instance");
    let rec = Recorder::new(&url, "pm-crash")
        .expect("recorder")
        .marker_ttl(Duration::from_millis(1000));
    RECORDER
        .set((rec, instance.clone(), Duration::from_millis(20)))
        .expect("once");
    engine_domain(&url, &instance)
        .engine()
        .run_until(convoy_runtime::shutdown_signal())
        .await
        .expect("engine");
}

fn spawn_engine(url: &str, instance: &str) -> ChildEngine {
    let mut cmd: Command = current_test_command("child_engine").expect("command");
    cmd.env("CONVOY_CHILD_ENGINE", url)
        .env("CONVOY_INSTANCE", instance);
    ChildEngine::spawn(&mut cmd).expect("spawn")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_failover_of_an_instance_owner_loses_nothing() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let rec = Recorder::new(&url, "pm-crash").expect("recorder");
    let orders = ["o1", "o2"];
    let p = engine_domain(&url, "publisher");
    publish(&p, interleave(&orders, 30)).await;
    // Publish without consuming here: the publisher only runs its outbox.
    let processor = convoy_runtime::outbox::OutboxProcessor::new(
        p.outbox().clone(),
        p.broker().clone(),
        p.config().server.priority_lanes.clone(),
        "publisher",
        Arc::new(tokio::sync::Notify::new()),
    );
    processor.drain().await.expect("publish");
    let mut a = spawn_engine(&url, "a");
    let start = std::time::Instant::now();
    loop {
        let seen: usize = rec
            .seen_all()
            .await
            .map(|m| m.values().map(Vec::len).sum())
            .unwrap_or(0);
        if seen >= 10 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "a never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let b = spawn_engine(&url, "b");
    a.kill9().expect("kill -9");
    wait_for_states(&server, &orders, 30).await;
    assert_eq!(
        rec.violations().await.expect("violations"),
        Vec::<String>::new()
    );
    drop(b);
}

#[test]
fn a_sequential_process_manager_needs_a_partitioning_broker() {
    #[derive(Debug)]
    struct PlainBroker;
    impl convoy_runtime::Broker for PlainBroker {
        fn name(&self) -> &str {
            "plain"
        }
        fn capabilities(&self) -> convoy_runtime::Capabilities {
            convoy_runtime::Capabilities::NONE
        }
        fn publish<'a>(
            &'a self,
            _producer: &'a convoy_runtime::broker::Producer,
            _batch: &'a [convoy_runtime::broker::Publication],
        ) -> convoy_runtime::handler::BoxFuture<'a, Result<(), convoy_runtime::broker::PublishError>>
        {
            Box::pin(async { Ok(()) })
        }
        fn run(
            self: Arc<Self>,
            _plan: Arc<convoy_runtime::broker::ConsumerPlan>,
            _shutdown: convoy_runtime::CancellationToken,
        ) -> convoy_runtime::handler::BoxFuture<'static, Result<(), convoy_runtime::Error>>
        {
            Box::pin(async { Ok(()) })
        }
    }
    let err = Domain::builder()
        .broker(PlainBroker)
        .process_manager::<Fulfilment>()
        .init()
        .expect_err("rejected");
    assert!(
        err.to_string().contains(
            "declares sequential_by but the broker `plain` does not advertise STREAM_PARTITIONING"
        ),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_category_stream_appearing_after_the_lease_joins_the_unit() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let d = engine_domain(&url, "solo");
    let engine = d.engine().spawn();
    let mut uow = d.unit_of_work();
    uow.raise(OrderPlaced {
        order_id: "o7".into(),
        amount: 100,
    })
    .expect("raise");
    uow.commit().await.expect("commit");
    let mut c = server.connection().await.expect("conn");
    let lease_key = names::lease(name(), "*", "o7");
    let start = std::time::Instant::now();
    let lease = loop {
        let l: Option<String> = redis::cmd("GET")
            .arg(&lease_key)
            .query_async(&mut c)
            .await
            .expect("get");
        if let Some(l) = l {
            break l;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "o7 never leased");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Only now does the payment stream for o7 appear.
    let mut uow = d.unit_of_work();
    uow.raise(PaymentCaptured {
        order_ref: "o7".into(),
        amount: 40,
    })
    .expect("raise");
    uow.raise(OrderShipped {
        order_id: "o7".into(),
    })
    .expect("raise");
    uow.commit().await.expect("commit");
    let start = std::time::Instant::now();
    loop {
        let s = states(&server, &["o7"]).await;
        if s.get("o7").is_some_and(|f| f.paid == 40 && f.shipped) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "state: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let now: Option<String> = redis::cmd("GET")
        .arg(&lease_key)
        .query_async(&mut c)
        .await
        .expect("get");
    assert_eq!(
        now,
        Some(lease),
        "the same lease and generation covered the new stream"
    );
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_instance_is_reaped_across_its_categories() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let mut config = test_config(&url);
    config.server.partitioning.reap_idle_ms = 300;
    let d = Domain::builder()
        .config(config)
        .instance_id("reaper")
        .process_manager::<Fulfilment>()
        .init()
        .expect("init");
    let engine = d.engine().spawn();
    let mut uow = d.unit_of_work();
    uow.raise(OrderPlaced {
        order_id: "o5".into(),
        amount: 100,
    })
    .expect("raise");
    uow.raise(PaymentCaptured {
        order_ref: "o5".into(),
        amount: 10,
    })
    .expect("raise");
    uow.commit().await.expect("commit");
    let mut c = server.connection().await.expect("conn");
    let start = std::time::Instant::now();
    loop {
        let in_orders: bool = redis::cmd("SISMEMBER")
            .arg(names::partition_index("order", "o5"))
            .arg("o5")
            .query_async(&mut c)
            .await
            .expect("sismember");
        let in_payments: bool = redis::cmd("SISMEMBER")
            .arg(names::partition_index("payment", "o5"))
            .arg("o5")
            .query_async(&mut c)
            .await
            .expect("sismember");
        let streams: i64 = redis::cmd("EXISTS")
            .arg(names::stream("order", "o5"))
            .arg(names::stream("payment", "o5"))
            .query_async(&mut c)
            .await
            .expect("exists");
        let state = states(&server, &["o5"]).await;
        if !in_orders
            && !in_payments
            && streams == 0
            && state.get("o5").is_some_and(|f| f.paid == 10)
        {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "o5 was not retired: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The instance's state outlives the retirement of its partitions, and a
    // later event brings the unit back.
    let mut uow = d.unit_of_work();
    uow.raise(PaymentCaptured {
        order_ref: "o5".into(),
        amount: 5,
    })
    .expect("raise");
    uow.commit().await.expect("commit");
    let start = std::time::Instant::now();
    loop {
        let state = states(&server, &["o5"]).await;
        if state.get("o5").is_some_and(|f| f.paid == 15) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the later payment was not applied: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    engine.shutdown().await.expect("shutdown");
}

#[test]
fn a_process_manager_over_categories_with_different_shard_counts_is_an_init_error() {
    let mut config = test_config("redis://127.0.0.1:1/");
    config.broker.category_shards.insert("order".into(), 8);
    let err = Domain::builder()
        .config(config)
        .process_manager::<Fulfilment>()
        .init()
        .expect_err("different shard counts")
        .to_string();
    assert!(err.contains("different shard counts"), "{err}");
    assert!(err.contains("order with 8"), "{err}");
    assert!(err.contains("payment with 16"), "{err}");
}

/// Process-manager states read through a cluster connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_a_correlation_value_s_streams_share_a_slot_and_instances_finish() {
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let url = cluster.url();
    let a = engine_domain(&url, "ca").engine().spawn();
    let b = engine_domain(&url, "cb").engine().spawn();
    // Keys of their own (UNRECORDED): another test of this binary records
    // `o1`...
    let orders = ["k-o1", "k-o2", "k-o3", "k-o4", "k-o5", "k-o6"];
    let p = engine_domain(&url, "cpublisher");
    publish(&p, interleave(&orders, 4)).await;
    let pe = p.engine().spawn();
    let mut c = redis::cluster::ClusterClient::new(cluster.node_urls())
        .expect("client")
        .get_async_connection()
        .await
        .expect("cluster connection");
    let want: BTreeMap<String, Fulfilment> = orders
        .iter()
        .map(|o| ((*o).to_owned(), expected(o, 4)))
        .collect();
    let start = std::time::Instant::now();
    loop {
        let got = states_on(&mut c, &orders).await;
        if got == want {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "final states: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // One lease covers both categories of a correlation value, in the
    // value's shard, the slot of both its streams.
    let s = names::shard("k-o1");
    let lease: Option<String> = redis::cmd("GET")
        .arg(convoy_runtime::redis::keys::lease(s, name(), "*", "k-o1"))
        .query_async(&mut c)
        .await
        .expect("get");
    assert!(lease.is_some(), "k-o1 is leased as one unit");
    for stream in [
        names::stream("order", "k-o1"),
        names::stream("payment", "k-o1"),
    ] {
        assert!(
            stream.starts_with(&convoy_runtime::redis::keys::tag(s)),
            "{stream}"
        );
    }
    for e in [a, b, pe] {
        e.shutdown().await.expect("shutdown");
    }
}
