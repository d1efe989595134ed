//! The domain on the inline broker: init checks, key rules at raise, the
//! outbox, routing, command handlers, and a whole run in submission order.

use std::sync::{Arc, Mutex};

use convoy_runtime::CancellationToken as Token;
use convoy_runtime::broker::ConsumerPlan;
use convoy_runtime::broker::{Capabilities, Producer, Publication, PublishError};
use convoy_runtime::handler::{BoxFuture, HandlerDescriptor, HandlerKind};
use convoy_runtime::outbox::OutboxStatus;
use convoy_runtime::{
    Aggregate, Broker, Command, Context, Domain, Error, Event, HandlerError, KeyRule, Message,
    Problem, command_handler, event_handler,
};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
#[aggregate(category = "account")]
struct Account;

#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Account)]
struct Deposited {
    account_id: String,
    tenant: Option<String>,
    amount: u64,
}

#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Account)]
struct Withdrawn {
    account_id: String,
    tenant: Option<String>,
    amount: u64,
}

#[derive(Command, Serialize, Deserialize, Debug)]
#[command(part_of = Account)]
struct Open {
    account_id: String,
}

type Log = Arc<Mutex<Vec<String>>>;

struct Balances {
    log: Log,
}

#[event_handler(part_of = Account, sequential_by = "tenant")]
impl Balances {
    #[handle]
    async fn deposited(&self, e: Deposited, ctx: &Context) -> Result<(), HandlerError> {
        assert_eq!(ctx.partition_key(), e.tenant.as_deref());
        self.log
            .lock()
            .unwrap()
            .push(format!("{}+{}", e.account_id, e.amount));
        Ok(())
    }

    #[handle]
    async fn withdrawn(&self, e: Withdrawn) -> Result<(), HandlerError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("{}-{}", e.account_id, e.amount));
        Ok(())
    }
}

struct Opener {
    log: Log,
}

#[command_handler(part_of = Account, sequential_by = "account_id")]
impl Opener {
    #[handle]
    async fn open(&self, c: Open, ctx: &Context) -> Result<(), HandlerError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("open {}", c.account_id));
        ctx.raise(Deposited {
            account_id: c.account_id,
            tenant: Some("t1".into()),
            amount: 0,
        })?;
        Ok(())
    }
}

fn dep(account: &str, tenant: Option<&str>, amount: u64) -> Deposited {
    Deposited {
        account_id: account.into(),
        tenant: tenant.map(Into::into),
        amount,
    }
}

fn inline_domain(log: &Log) -> Domain {
    Domain::builder()
        .handler(Balances { log: log.clone() })
        .command_handler(Opener { log: log.clone() })
        .init()
        .expect("init on the inline broker")
}

/// A broker that neither partitions streams nor is the inline broker.
#[derive(Debug)]
struct PlainBroker;

impl Broker for PlainBroker {
    fn name(&self) -> &str {
        "plain"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }
    fn publish<'a>(
        &'a self,
        _producer: &'a Producer,
        _batch: &'a [Publication],
    ) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async { Ok(()) })
    }
    fn run(
        self: Arc<Self>,
        _plan: Arc<ConsumerPlan>,
        _shutdown: Token,
    ) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(async { Ok(()) })
    }
}

#[test]
fn inline_broker_accepts_sequential_by() {
    let log = Log::default();
    let d = inline_domain(&log);
    assert_eq!(d.registry().key_field("account"), Some("tenant"));
}

#[test]
fn a_broker_without_partitioning_is_rejected() {
    let log = Log::default();
    let err = Domain::builder()
        .broker(PlainBroker)
        .handler(Balances { log })
        .init()
        .expect_err("must be rejected");
    let text = err.to_string();
    assert!(text.starts_with("incorrect usage"), "{text}");
    assert!(
        err.problems()
            .iter()
            .any(|p| matches!(p, Problem::BrokerCapability { broker, .. } if broker == "plain")),
        "{text}"
    );
    assert!(
        text.contains("does not advertise STREAM_PARTITIONING"),
        "{text}"
    );
}

static CONFLICTING: HandlerDescriptor = HandlerDescriptor {
    name: "hand::Auditor",
    kind: HandlerKind::Event,
    category: "account",
    sequential_by: Some("account_id"),
    handles: &[<Deposited as Message>::DESCRIPTOR],
    dead_letter_poison: false,
};

static MISSING: HandlerDescriptor = HandlerDescriptor {
    name: "hand::Broken",
    kind: HandlerKind::Event,
    category: "account",
    sequential_by: Some("client_id"),
    handles: &[<Withdrawn as Message>::DESCRIPTOR],
    dead_letter_poison: false,
};

#[test]
fn init_reports_every_problem() {
    let log = Log::default();
    let err = Domain::builder()
        .handler(Balances { log })
        .register(&CONFLICTING)
        .register(&MISSING)
        .init()
        .expect_err("conflicts");
    let text = err.to_string();
    // One key per category, naming both handlers and both keys.
    assert!(
        text.contains("category `account` is partitioned by `tenant` in `domain::Balances` but by `account_id` in `hand::Auditor`"),
        "{text}"
    );
    assert!(
        text.contains("category `account` is partitioned by `tenant` in `domain::Balances` but by `client_id` in `hand::Broken`"),
        "{text}"
    );
    // Field existence, again at init.
    assert!(
        text.contains("`hand::Broken` declares sequential_by = \"client_id\" but `Withdrawn` has no field `client_id` (available fields: account_id, tenant, amount)"),
        "{text}"
    );
    assert_eq!(err.problems().len(), 3, "{text}");
}

#[tokio::test]
async fn raise_validates_the_key_and_keeps_nothing_on_rejection() {
    let log = Log::default();
    let d = inline_domain(&log);
    let cases: [(Option<&str>, KeyRule); 6] = [
        (None, KeyRule::Null),
        (Some(""), KeyRule::Empty),
        (Some("a:b"), KeyRule::Colon),
        (Some("dlq"), KeyRule::ReservedDlq),
        (Some("backfill"), KeyRule::ReservedBackfill),
        (Some("__partitions__"), KeyRule::Sentinel),
    ];
    for (value, rule) in cases {
        let mut uow = d.unit_of_work();
        uow.raise(dep("a1", Some("ok"), 1)).expect("valid key");
        let err = uow.raise(dep("a1", value, 1)).expect_err("invalid key");
        match &err {
            Error::InvalidKey { field, rule: r, .. } => {
                assert_eq!(field, "tenant");
                assert_eq!(*r, rule);
            }
            other => panic!("unexpected {other:?}"),
        }
        let text = err.to_string();
        assert!(
            text.contains("`tenant`") && text.contains("`Deposited`"),
            "{text}"
        );
        assert_eq!(uow.len(), 1, "the rejected event was not kept");
    }
    let mut uow = d.unit_of_work();
    assert!(uow.raise(dep("a1", None, 1)).is_err());
    uow.commit().await.expect("commit");
    assert!(
        d.outbox().records().await.expect("records").is_empty(),
        "no outbox record exists"
    );
}

#[tokio::test]
async fn outbox_records_carry_the_key_and_publish_in_order() {
    let log = Log::default();
    let d = inline_domain(&log);
    let mut uow = d.unit_of_work();
    uow.raise(dep("a1", Some("t1"), 10)).expect("raise");
    uow.raise(Withdrawn {
        account_id: "a1".into(),
        tenant: Some("t1".into()),
        amount: 3,
    })
    .expect("raise");
    uow.raise(dep("a2", Some("t2"), 7)).expect("raise");
    uow.commit().await.expect("commit");
    let records = d.outbox().records().await.expect("records");
    let keys: Vec<_> = records
        .iter()
        .map(|r| r.partition_key().map(str::to_owned))
        .collect();
    assert_eq!(
        keys,
        vec![Some("t1".into()), Some("t1".into()), Some("t2".into())]
    );
    assert!(records.iter().all(|r| r.status == OutboxStatus::Pending));
    d.engine().run_until_idle().await.expect("run");
    assert_eq!(*log.lock().unwrap(), vec!["a1+10", "a1-3", "a2+7"]);
    let records = d.outbox().records().await.expect("records");
    assert!(records.iter().all(|r| r.status == OutboxStatus::Published));
}

#[tokio::test]
async fn command_handlers_run_synchronously_and_commit_raised_events() {
    let log = Log::default();
    let d = inline_domain(&log);
    d.process(Open {
        account_id: "a9".into(),
    })
    .await
    .expect("process");
    assert_eq!(
        *log.lock().unwrap(),
        vec!["open a9"],
        "the command ran at once"
    );
    let records = d.outbox().records().await.expect("records");
    assert_eq!(
        records.len(),
        1,
        "only the raised event reached the outbox, not the command"
    );
    assert_eq!(records[0].envelope.type_name, "Deposited");
    d.engine().run_until_idle().await.expect("run");
    assert_eq!(*log.lock().unwrap(), vec!["open a9", "a9+0"]);
}

#[tokio::test]
async fn a_failing_inline_handler_is_retried_then_dead_lettered() {
    struct Flaky {
        calls: Arc<Mutex<u32>>,
    }
    #[derive(Aggregate)]
    #[aggregate(category = "flaky")]
    struct FlakyAgg;
    #[derive(Event, Serialize, Deserialize, Debug, Clone)]
    #[event(part_of = FlakyAgg)]
    struct Tick {
        n: u32,
    }
    #[event_handler(part_of = FlakyAgg)]
    impl Flaky {
        #[handle]
        async fn tick(&self, t: Tick) -> Result<(), HandlerError> {
            *self.calls.lock().unwrap() += 1;
            if t.n == 1 {
                return Err(HandlerError::msg("boom"));
            }
            Ok(())
        }
    }
    let calls = Arc::new(Mutex::new(0));
    let mut config = convoy_runtime::Config::default();
    config.server.retry.initial_backoff_ms = 1;
    config.server.retry.max_backoff_ms = 1;
    let broker = Arc::new(convoy_runtime::InlineBroker::new());
    let d = Domain::builder()
        .config(config)
        .broker_arc(broker.clone())
        .handler(Flaky {
            calls: calls.clone(),
        })
        .init()
        .expect("init");
    let mut uow = d.unit_of_work();
    uow.raise(Tick { n: 1 }).expect("raise");
    uow.raise(Tick { n: 2 }).expect("raise");
    uow.commit().await.expect("commit");
    d.engine().run_until_idle().await.expect("run");
    assert_eq!(
        *calls.lock().unwrap(),
        4 + 1,
        "1 attempt + 3 retries, then the next event"
    );
    let dead = broker.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].error, "boom");
}

#[test]
fn a_classifier_must_name_a_handler_this_domain_runs() {
    let log = Log::default();
    let classify =
        |_: &(dyn std::error::Error + 'static)| Some(convoy_runtime::ErrorClass::Transient);
    let ok = Domain::builder()
        .handler(Balances { log: log.clone() })
        .classify_errors("Balances", classify)
        .init();
    assert!(ok.is_ok(), "the last segment of the handler's name: {ok:?}");
    let e = Domain::builder()
        .handler(Balances { log })
        .classify_errors("Ballances", classify)
        .init()
        .expect_err("a typo");
    let text = e.to_string();
    assert!(
        text.contains("classify_errors(\"Ballances\")")
            && text.contains("names no handler")
            && text.contains("Balances"),
        "{text}"
    );
}
