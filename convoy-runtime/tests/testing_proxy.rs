//! Tests of the fault-injection proxy (`--features testing`) between redis-rs
//! clients and a real `redis-server`.
#![cfg(feature = "testing")]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use convoy_runtime::testing::{FaultProxy, Match, RedisServer, TestingError, script_sha};
use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A held reply must take at least this long.
const DELAY: Duration = Duration::from_millis(400);
/// A reply that is not held must come faster than this (generous, for a
/// loaded machine).
const FAST: Duration = Duration::from_millis(200);

fn proxy_to(server: &RedisServer) -> Result<FaultProxy, TestingError> {
    FaultProxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, server.port())))
}

/// Every wait in these tests ends: a reply that does not come within this
/// fails the test instead of hanging it. Generous, because a passing test
/// never waits it out, while a CI machine running the fault schedules
/// beside this can starve the proxy's thread for seconds (3 s once made a
/// closed connection look like a late reply).
const PATIENCE: Duration = Duration::from_secs(10);

/// A multiplexed connection whose replies may take up to [`PATIENCE`] (not
/// redis-rs's default 500 ms), so that only the proxy decides how long a
/// reply takes.
async fn connect(url: &str) -> redis::RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(PATIENCE))
        .set_response_timeout(Some(PATIENCE));
    redis::Client::open(url)?
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// Asserts that `result` failed because the connection broke, not because
/// a reply was late.
#[track_caller]
fn assert_broken<T: std::fmt::Debug>(result: redis::RedisResult<T>) {
    let error = result.expect_err("the connection should be broken");
    assert!(
        !error.is_timeout() && (error.is_io_error() || error.is_connection_dropped()),
        "not a broken connection: {error:?}"
    );
}

async fn ping(connection: &mut MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(connection).await
}

async fn get(
    connection: &mut MultiplexedConnection,
    key: &str,
) -> redis::RedisResult<Option<String>> {
    redis::cmd("GET").arg(key).query_async(connection).await
}

async fn set(
    connection: &mut MultiplexedConnection,
    key: &str,
    value: &str,
) -> redis::RedisResult<()> {
    redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async(connection)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_commands_pipelines_and_large_values() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = proxy_to(&server)?;
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}/", proxy.port()));
    assert_ne!(proxy.port(), server.port());
    let mut via = connect(&proxy.url()).await?;
    let mut direct = server.connection().await?;

    set(&mut via, "greeting", "hello").await?;
    assert_eq!(
        get(&mut direct, "greeting").await?.as_deref(),
        Some("hello")
    );
    assert_eq!(get(&mut via, "greeting").await?.as_deref(), Some("hello"));

    // 500 requests in one write, 500 replies in order.
    let mut pipe = redis::pipe();
    for _ in 0..500 {
        pipe.cmd("INCR").arg("counter");
    }
    let counts: Vec<i64> = pipe.query_async(&mut via).await?;
    assert_eq!(counts, (1..=500).collect::<Vec<i64>>());

    // Many concurrent commands on one multiplexed connection.
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let mut connection = via.clone();
            tokio::spawn(async move {
                let key = format!("key-{i}");
                set(&mut connection, &key, &i.to_string()).await?;
                get(&mut connection, &key).await
            })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        assert_eq!(task.await??, Some(i.to_string()));
    }

    // A value larger than any socket buffer, both ways.
    let big: String = (0..4 * 1024 * 1024)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    set(&mut via, "big", &big).await?;
    assert_eq!(get(&mut via, "big").await?.as_deref(), Some(big.as_str()));
    let big_direct: String = redis::cmd("GET")
        .arg("big")
        .query_async(&mut direct)
        .await?;
    assert_eq!(big_direct, big);

    assert_eq!(proxy.connections(), 1);
    assert_eq!(proxy.open_connections(), 1);
    assert_eq!(proxy.fired(), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_reply_holds_its_own_connection_only() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = proxy_to(&server)?;
    let mut direct = server.connection().await?;
    set(&mut direct, "k", "v").await?;
    let mut held = connect(&proxy.url()).await?;
    let mut other = connect(&proxy.url()).await?;

    proxy.delay_reply(Match::Command("GET".into()), DELAY, 1);
    let started = Instant::now();
    let get_task = {
        let mut held = held.clone();
        tokio::spawn(async move {
            let value = get(&mut held, "k").await;
            (value, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Behind the held GET on the same connection: queued behind it.
    let behind_task = {
        let mut held = held.clone();
        tokio::spawn(async move {
            let pong = ping(&mut held).await;
            (pong, started.elapsed())
        })
    };
    // Another connection is not held.
    let other_started = Instant::now();
    assert_eq!(ping(&mut other).await?, "PONG");
    assert!(
        other_started.elapsed() < FAST,
        "{:?}",
        other_started.elapsed()
    );
    // The GET on `held` came first and used the rule up.
    assert_eq!(get(&mut other, "k").await?.as_deref(), Some("v"));
    assert!(
        other_started.elapsed() < FAST,
        "{:?}",
        other_started.elapsed()
    );

    let (value, took) = get_task.await?;
    assert_eq!(value?.as_deref(), Some("v"));
    assert!(took >= DELAY, "the GET took only {took:?}");
    let (pong, took) = behind_task.await?;
    assert_eq!(pong?, "PONG");
    assert!(took >= DELAY, "the PING behind the GET took only {took:?}");
    assert_eq!(proxy.fired(), 1);

    // Used up: the next GET is fast again.
    let started = Instant::now();
    assert_eq!(get(&mut held, "k").await?.as_deref(), Some("v"));
    assert!(started.elapsed() < FAST, "{:?}", started.elapsed());
    assert_eq!(proxy.fired(), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_reply_breaks_the_connection_after_redis_ran_the_command() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = proxy_to(&server)?;
    let mut direct = server.connection().await?;
    let mut via = connect(&proxy.url()).await?;
    assert_eq!(ping(&mut via).await?, "PONG");

    proxy.drop_reply(Match::Command("INCR".into()), 1);
    let result: redis::RedisResult<i64> = redis::cmd("INCR").arg("n").query_async(&mut via).await;
    assert_broken(result);
    // It happened all the same.
    assert_eq!(get(&mut direct, "n").await?.as_deref(), Some("1"));
    assert_eq!(proxy.fired(), 1);
    // The multiplexed connection stays broken; a new one works.
    assert_broken(ping(&mut via).await);
    let mut again = connect(&proxy.url()).await?;
    let n: i64 = redis::cmd("INCR").arg("n").query_async(&mut again).await?;
    assert_eq!(n, 2);
    assert_eq!(proxy.fired(), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_script_reply_skips_noscript_and_catches_eval_too() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = proxy_to(&server)?;
    let mut direct = server.connection().await?;
    let body = "redis.call('INCR', KEYS[1]) return 'ran'";
    let script = redis::Script::new(body);

    // A fresh server: redis-rs sends EVALSHA, gets NOSCRIPT (not counted),
    // loads the script and sends EVALSHA again, whose reply is dropped.
    proxy.drop_reply(Match::Script(script.get_hash().to_owned()), 1);
    let mut via = connect(&proxy.url()).await?;
    assert_broken(script.key("runs").invoke_async::<String>(&mut via).await);
    assert_eq!(get(&mut direct, "runs").await?.as_deref(), Some("1"));
    assert_eq!(proxy.fired(), 1);

    // Used up: a new connection runs it normally.
    let mut via = connect(&proxy.url()).await?;
    let ran: String = script.key("runs").invoke_async(&mut via).await?;
    assert_eq!(ran, "ran");
    assert_eq!(get(&mut direct, "runs").await?.as_deref(), Some("2"));

    // EVAL of the same body matches the same SHA.
    proxy.drop_reply(Match::Script(script.get_hash().to_uppercase()), 1);
    let result: redis::RedisResult<String> = redis::cmd("EVAL")
        .arg(body)
        .arg(1)
        .arg("runs")
        .query_async(&mut via)
        .await;
    assert_broken(result);
    assert_eq!(get(&mut direct, "runs").await?.as_deref(), Some("3"));
    assert_eq!(proxy.fired(), 2);

    // convoy's own scripts have SHAs, and another script is not matched.
    let read = script_sha("read").ok_or("no read.lua")?;
    proxy.drop_reply(Match::Script(read), 1);
    let mut via = connect(&proxy.url()).await?;
    let ran: String = script.key("runs").invoke_async(&mut via).await?;
    assert_eq!(ran, "ran");
    assert_eq!(proxy.fired(), 2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_all_closes_every_connection_and_new_ones_work() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = proxy_to(&server)?;
    let mut a = connect(&proxy.url()).await?;
    let mut b = connect(&proxy.url()).await?;
    let client = redis::Client::open(proxy.url())?;
    let mut manager = client.get_connection_manager().await?;
    assert_eq!(ping(&mut a).await?, "PONG");
    assert_eq!(ping(&mut b).await?, "PONG");
    let pong: String = redis::cmd("PING").query_async(&mut manager).await?;
    assert_eq!(pong, "PONG");
    assert_eq!(proxy.open_connections(), 3);

    proxy.cut_all();
    assert_eq!(proxy.open_connections(), 0);
    assert_broken(ping(&mut a).await);
    assert_broken(ping(&mut b).await);
    let mut c = connect(&proxy.url()).await?;
    assert_eq!(ping(&mut c).await?, "PONG");

    // A ConnectionManager reconnects by itself (through the proxy).
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let pong: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut manager).await;
        match pong {
            Ok(pong) => {
                assert_eq!(pong, "PONG");
                break;
            }
            Err(error) if Instant::now() < deadline => {
                assert!(
                    error.is_io_error() || error.is_connection_dropped(),
                    "{error:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => return Err(error.into()),
        }
    }
    assert_eq!(proxy.connections(), 5);
    assert_eq!(proxy.fired(), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_traffic_in_both_directions_until_resume() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = proxy_to(&server)?;
    let mut direct = server.connection().await?;
    let mut via = connect(&proxy.url()).await?;
    assert_eq!(ping(&mut via).await?, "PONG");

    proxy.pause();
    assert!(proxy.is_paused());
    let set_task = {
        let mut via = via.clone();
        tokio::spawn(async move { set(&mut via, "k", "during pause").await })
    };
    let url = proxy.url();
    let connect_task = tokio::spawn(async move {
        let mut connection = connect(&url).await?;
        ping(&mut connection).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!set_task.is_finished());
    assert!(!connect_task.is_finished());
    // The SET has not reached Redis.
    assert_eq!(get(&mut direct, "k").await?, None);
    assert_eq!(proxy.connections(), 2, "the new connection is accepted");

    proxy.resume();
    assert!(!proxy.is_paused());
    tokio::time::timeout(Duration::from_secs(2), set_task).await???;
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(2), connect_task).await???,
        "PONG"
    );
    assert_eq!(
        get(&mut direct, "k").await?.as_deref(),
        Some("during pause")
    );
    assert_eq!(get(&mut via, "k").await?.as_deref(), Some("during pause"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_restart_closes_clients_and_new_connections_work_again() -> TestResult {
    let mut server = RedisServer::start()?;
    let proxy = proxy_to(&server)?;
    let mut via = connect(&proxy.url()).await?;
    assert_eq!(ping(&mut via).await?, "PONG");

    server.stop()?;
    assert_broken(ping(&mut via).await);
    // While the server is down, the proxy closes new connections at once.
    let started = Instant::now();
    assert_broken(connect(&proxy.url()).await);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );

    server.restart()?;
    let mut again = connect(&proxy.url()).await?;
    assert_eq!(ping(&mut again).await?, "PONG");
    set(&mut again, "k", "v").await?;
    assert_eq!(
        get(&mut server.connection().await?, "k").await?.as_deref(),
        Some("v")
    );

    // A restart while connected: the client sees the cut, then reconnects.
    server.restart()?;
    assert_broken(ping(&mut again).await);
    let mut third = connect(&proxy.url()).await?;
    assert_eq!(ping(&mut third).await?, "PONG");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp3_pushes_pass_through_and_answer_no_request() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = proxy_to(&server)?;
    let mut direct = server.connection().await?;
    let (tx, mut pushes) = tokio::sync::mpsc::unbounded_channel();
    let config = AsyncConnectionConfig::new()
        .set_response_timeout(Some(PATIENCE))
        .set_push_sender(tx);
    let mut via = redis::Client::open(format!("{}?protocol=resp3", proxy.url()))?
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    // Confirmed by a push frame, not by a reply.
    via.subscribe("news").await?;

    proxy.delay_reply(Match::Command("BLPOP".into()), DELAY, 1);
    let blpop_task = {
        let mut via = via.clone();
        tokio::spawn(async move {
            let popped: redis::RedisResult<(String, String)> = redis::cmd("BLPOP")
                .arg("queue")
                .arg(5)
                .query_async(&mut via)
                .await;
            (popped, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The BLPOP waits in Redis; a message pushed meanwhile is not its reply
    // and is not held.
    let published = Instant::now();
    let receivers: i64 = redis::cmd("PUBLISH")
        .arg("news")
        .arg("hello")
        .query_async(&mut direct)
        .await?;
    assert_eq!(receivers, 1);
    loop {
        let push = tokio::time::timeout(Duration::from_secs(2), pushes.recv())
            .await?
            .ok_or("push channel closed")?;
        if push.kind == redis::PushKind::Message {
            break;
        }
    }
    assert!(
        published.elapsed() < FAST,
        "the push was held: {:?}",
        published.elapsed()
    );

    let pushed = Instant::now();
    let _: i64 = redis::cmd("RPUSH")
        .arg("queue")
        .arg("job")
        .query_async(&mut direct)
        .await?;
    let (popped, done) = blpop_task.await?;
    assert_eq!(popped?, ("queue".to_owned(), "job".to_owned()));
    let took = done - pushed;
    assert!(took >= DELAY, "the BLPOP reply was not held: {took:?}");
    assert_eq!(proxy.fired(), 1);
    assert_eq!(ping(&mut via).await?, "PONG");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_reply_does_not_shift_later_replies() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = proxy_to(&server)?;
    let mut direct = server.connection().await?;
    set(&mut direct, "first", "1").await?;
    set(&mut direct, "second", "2").await?;
    let config =
        AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_millis(150)));
    let mut via = redis::Client::open(proxy.url())?
        .get_multiplexed_async_connection_with_config(&config)
        .await?;

    proxy.delay_reply(Match::Command("GET".into()), DELAY, 1);
    let started = Instant::now();
    let error = get(&mut via, "first").await.expect_err("the reply is late");
    assert!(error.is_timeout(), "{error:?}");
    assert!(started.elapsed() < DELAY);
    // Once the late reply has come and gone, replies match requests again.
    tokio::time::sleep(DELAY).await;
    assert_eq!(get(&mut via, "second").await?.as_deref(), Some("2"));
    assert_eq!(proxy.fired(), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_proxy_closes_its_connections_and_port() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = proxy_to(&server)?;
    let addr = proxy.addr();
    let mut via = connect(&proxy.url()).await?;
    assert_eq!(ping(&mut via).await?, "PONG");
    proxy.pause();
    drop(proxy);
    assert_broken(ping(&mut via).await);
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    Ok(())
}

#[test]
fn works_from_synchronous_code() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = proxy_to(&server)?;
    let mut direct = server.client()?.get_connection()?;
    let mut via = redis::Client::open(proxy.url())?.get_connection()?;
    via.set_read_timeout(Some(PATIENCE))?;
    let () = redis::cmd("SET").arg("k").arg("v").query(&mut via)?;
    let value: String = redis::cmd("GET").arg("k").query(&mut via)?;
    assert_eq!(value, "v");

    proxy.drop_reply(Match::Any, 1);
    assert_broken(redis::cmd("INCR").arg("n").query::<i64>(&mut via));
    let n: i64 = redis::cmd("GET").arg("n").query(&mut direct)?;
    assert_eq!(n, 1);
    assert_eq!(proxy.fired(), 1);
    proxy.clear();

    proxy.delay_reply(Match::Command("incr".into()), DELAY, 5);
    proxy.clear();
    let mut again = redis::Client::open(proxy.url())?.get_connection()?;
    again.set_read_timeout(Some(PATIENCE))?;
    let started = Instant::now();
    let n: i64 = redis::cmd("INCR").arg("n").query(&mut again)?;
    assert_eq!(n, 2);
    assert!(started.elapsed() < FAST, "cleared rules still fired");
    assert_eq!(proxy.fired(), 1);
    Ok(())
}
