//! Tests of the test-support kit (`--features testing`) against a real
//! `redis-server`.
#![cfg(feature = "testing")]

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use convoy_runtime::testing::{
    ChildEngine, Recorder, RedisServer, TestingError, check_order, current_test_command,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Set in a re-executed test binary to choose the child role.
const CHILD_ROLE: &str = "CONVOY_TESTING_SUPPORT_CHILD";

async fn set(connection: &mut redis::aio::MultiplexedConnection, key: &str, value: &str) {
    let () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async(connection)
        .await
        .unwrap();
}

async fn get(
    connection: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> redis::RedisResult<Option<String>> {
    redis::cmd("GET").arg(key).query_async(connection).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_starts_and_answers() -> TestResult {
    let server = RedisServer::start()?;
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    let mut connection = server.connection().await?;
    set(&mut connection, "greeting", "hello").await;
    assert_eq!(
        get(&mut connection, "greeting").await?.as_deref(),
        Some("hello")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_kills_the_server_and_removes_its_dir() -> TestResult {
    let server = RedisServer::start()?;
    let pid = server.pid().unwrap();
    let dir = server.dir().to_path_buf();
    assert!(dir.is_dir());
    drop(server);
    assert!(!dir.exists(), "{} still exists", dir.display());
    // The pid was reaped: no such process (or, rarely, a reused pid).
    let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok();
    if alive {
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            !cmdline.contains("redis-server"),
            "redis-server {pid} survived drop"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_times_out_until_thawed() -> TestResult {
    let mut server = RedisServer::start()?;
    let mut connection = server
        .connection_with_timeout(Duration::from_millis(300))
        .await?;
    set(&mut connection, "k", "v").await;

    server.freeze()?;
    let error = get(&mut connection, "k").await.unwrap_err();
    assert!(error.is_timeout(), "expected a timeout, got {error}");

    server.thaw()?;
    assert_eq!(get(&mut connection, "k").await?.as_deref(), Some("v"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_append_only_keeps_data() -> TestResult {
    let mut server = RedisServer::builder().append_only(true).start()?;
    let port = server.port();
    let mut connection = server.connection().await?;
    set(&mut connection, "kept", "yes").await;

    // A crash, not a clean shutdown: only the append-only file saves it.
    server.kill()?;
    assert!(!server.is_running());
    assert!(get(&mut connection, "kept").await.is_err());
    assert!(matches!(
        server.freeze(),
        Err(TestingError::ServerNotRunning)
    ));

    server.restart()?;
    assert_eq!(server.port(), port);
    let mut connection = server.connection().await?;
    assert_eq!(get(&mut connection, "kept").await?.as_deref(), Some("yes"));

    // A clean stop and restart keeps it too.
    server.stop()?;
    server.restart()?;
    let mut connection = server.connection().await?;
    assert_eq!(get(&mut connection, "kept").await?.as_deref(), Some("yes"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_append_only_starts_empty() -> TestResult {
    let mut server = RedisServer::start()?;
    let mut connection = server.connection().await?;
    set(&mut connection, "lost", "yes").await;
    server.restart()?;
    let mut connection = server.connection().await?;
    assert_eq!(get(&mut connection, "lost").await?, None);
    Ok(())
}

#[test]
fn missing_binary_is_an_error_not_a_skip() -> TestResult {
    let empty = std::env::temp_dir().join(format!("convoy-empty-path-{}", std::process::id()));
    std::fs::create_dir_all(&empty)?;

    let error = RedisServer::builder()
        .binary(empty.join("redis-server"))
        .start()
        .unwrap_err();
    assert!(error.is_redis_server_missing());
    assert_eq!(
        error.to_string(),
        format!(
            "redis-server binary `{}` was not found; install redis-server (for example `apt-get install redis-server`) or pass an existing path to `RedisServerBuilder::binary`",
            empty.join("redis-server").display()
        )
    );

    // The default lookup, with PATH pointing to the empty directory, in a
    // child process so this process's environment stays untouched.
    // Both servers: redis-server, and valkey-server with
    // CONVOY_TEST_SERVER=valkey (whatever this run's server is).
    for (role, server) in [
        ("missing-binary", "redis"),
        ("missing-valkey", "valkey"),
        ("missing-redis8", "redis8"),
    ] {
        let mut command = current_test_command("missing_binary_child")?;
        command
            .env(CHILD_ROLE, role)
            .env("CONVOY_TEST_SERVER", server)
            .env_remove("CONVOY_VALKEY_SERVER")
            .env_remove("CONVOY_REDIS8_SERVER")
            .env("PATH", &empty);
        let mut child = ChildEngine::spawn(&mut command)?;
        let status = child.wait_timeout(Duration::from_secs(60))?;
        assert!(
            status.is_some_and(|s| s.success()),
            "child {role} failed: {status:?}"
        );
    }
    std::fs::remove_dir_all(&empty)?;
    Ok(())
}

/// The child role of `missing_binary_is_an_error_not_a_skip`.
#[test]
fn missing_binary_child() {
    match std::env::var(CHILD_ROLE).as_deref() {
        Ok("missing-binary") => {
            let error = RedisServer::start().unwrap_err();
            assert_eq!(
                error.to_string(),
                "redis-server was not found on PATH; install it (for example `apt-get install redis-server`)"
            );
        }
        Ok("missing-valkey") => {
            let error = RedisServer::start().unwrap_err();
            assert!(error.is_redis_server_missing(), "{error}");
            assert!(
                error
                    .to_string()
                    .starts_with("valkey-server `valkey-server` was not found (CONVOY_TEST_SERVER=valkey); install it: `bash .ci/valkey.sh`"),
                "{error}"
            );
        }
        Ok("missing-redis8") => {
            let error = RedisServer::start().unwrap_err();
            assert!(error.is_redis_server_missing(), "{error}");
            assert!(
                error
                    .to_string()
                    .starts_with("the Redis 8 server `redis8-server` was not found (CONVOY_TEST_SERVER=redis8); install it: `bash .ci/redis8.sh`"),
                "{error}"
            );
        }
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorder_detects_overlap_on_one_key() -> TestResult {
    let server = RedisServer::start()?;
    let recorder = Recorder::new(&server.url(), "overlap")?;

    let first = recorder.enter("client-1", "1-0", "a").await?;
    let second = recorder.enter("client-1", "2-0", "b").await?;
    second.exit().await?;
    first.exit().await?;
    assert_eq!(
        recorder.violations().await?,
        vec!["instance b entered event 2-0 for key client-1 while instance a was in event 1-0"]
    );

    // Sequential handling, other keys, and a redelivery of the same event
    // to another instance are not violations.
    let guard = recorder.enter("client-1", "3-0", "a").await?;
    let other_key = recorder.enter("client-2", "4-0", "b").await?;
    let same_event = recorder.enter("client-1", "3-0", "b").await?;
    same_event.exit().await?;
    guard.exit().await?;
    other_key.exit().await?;
    assert_eq!(recorder.violations().await?.len(), 1);

    assert_eq!(
        recorder.seen("client-1").await?,
        ["1-0", "2-0", "3-0", "3-0"]
    );
    let seen = recorder.seen_all().await?;
    assert_eq!(seen.keys().collect::<Vec<_>>(), ["client-1", "client-2"]);

    let published = BTreeMap::from([
        (
            "client-1".to_string(),
            vec!["1-0".into(), "2-0".into(), "3-0".into()],
        ),
        ("client-2".to_string(), vec!["4-0".into()]),
    ]);
    let report = check_order(&published, &seen, 1)?;
    assert_eq!(report.total_reruns, 1);

    assert!(matches!(
        recorder.enter("client-1", "5-0", "bad|id").await,
        Err(TestingError::InvalidInstance { .. })
    ));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorder_forgets_a_crashed_handler_after_the_marker_ttl() -> TestResult {
    let server = RedisServer::start()?;
    let recorder = Recorder::new(&server.url(), "crash")?.marker_ttl(Duration::from_millis(200));

    // Entered and never exited, as after kill -9.
    let crashed = recorder.enter("k", "1-0", "dead").await?;
    drop(crashed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    recorder.enter("k", "2-0", "alive").await?.exit().await?;
    assert!(recorder.violations().await?.is_empty());

    let windows = recorder.windows("k").await?;
    assert_eq!(windows.len(), 2);
    assert_eq!(windows[0].1, u64::MAX, "the crashed window stays open");
    assert!(windows[1].0 < windows[1].1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorder_windows_show_overlap_between_keys() -> TestResult {
    let server = RedisServer::start()?;
    let recorder = Recorder::new(&server.url(), "windows")?;

    let a = recorder.enter("a", "1-0", "x").await?;
    let b = recorder.enter("b", "2-0", "y").await?;
    tokio::time::sleep(Duration::from_millis(5)).await;
    a.exit().await?;
    b.exit().await?;
    tokio::time::sleep(Duration::from_millis(5)).await;
    recorder.enter("c", "3-0", "x").await?.exit().await?;

    assert!(recorder.overlapping_keys("a", "b").await?);
    assert!(recorder.overlapping_keys("b", "a").await?);
    assert!(!recorder.overlapping_keys("a", "c").await?);
    assert!(!recorder.overlapping_keys("a", "missing").await?);

    let windows = recorder.windows("a").await?;
    assert_eq!(windows.len(), 1);
    let (start, end, event) = &windows[0];
    assert!(start < end);
    assert_eq!(event, "1-0");
    assert!(recorder.violations().await?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorder_sees_overlap_across_processes() -> TestResult {
    let server = RedisServer::start()?;
    let recorder = Recorder::new(&server.url(), "processes")?;
    let guard = recorder.enter("k", "1-0", "parent").await?;

    let mut command = current_test_command("recorder_child")?;
    command
        .env(CHILD_ROLE, "recorder")
        .env("CONVOY_TESTING_SUPPORT_URL", server.url());
    let mut child = ChildEngine::spawn(&mut command)?;
    let status =
        tokio::task::spawn_blocking(move || child.wait_timeout(Duration::from_secs(60))).await??;
    assert!(
        status.is_some_and(|s| s.success()),
        "child failed: {status:?}"
    );

    guard.exit().await?;
    assert_eq!(
        recorder.violations().await?,
        vec!["instance child entered event 2-0 for key k while instance parent was in event 1-0"]
    );
    Ok(())
}

/// The child role of `recorder_sees_overlap_across_processes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorder_child() -> TestResult {
    if std::env::var(CHILD_ROLE).as_deref() != Ok("recorder") {
        return Ok(());
    }
    let url = std::env::var("CONVOY_TESTING_SUPPORT_URL")?;
    let recorder = Recorder::new(&url, "processes")?;
    recorder.enter("k", "2-0", "child").await?.exit().await?;
    Ok(())
}

#[test]
fn child_engine_stops_continues_and_kills() -> TestResult {
    let mut child = ChildEngine::spawn(Command::new("sleep").arg("30"))?;
    assert!(child.is_running());
    child.stop()?;
    assert!(child.is_running(), "a stopped process still runs");
    child.cont()?;
    let status = child.kill9()?;
    assert!(!status.success());
    assert!(!child.is_running());
    assert!(matches!(
        child.stop(),
        Err(TestingError::ProcessExited { .. })
    ));
    // Killing again reports the same exit.
    assert_eq!(child.kill9()?, status);

    // terminate() works on a stopped process too.
    let mut child = ChildEngine::spawn(Command::new("sleep").arg("30"))?;
    child.stop()?;
    let status = child.terminate(Duration::from_secs(5))?;
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(15));

    // A process that ignores SIGTERM is killed after the timeout.
    let mut child =
        ChildEngine::spawn(Command::new("sh").args(["-c", "trap '' TERM; exec sleep 30"]))?;
    std::thread::sleep(Duration::from_millis(100));
    let status = child.terminate(Duration::from_millis(200))?;
    assert_eq!(status.signal(), Some(9));
    Ok(())
}

#[test]
fn free_ports_are_bindable() -> TestResult {
    let port = convoy_runtime::testing::free_port()?;
    assert_ne!(port, 0);
    std::net::TcpListener::bind(("127.0.0.1", port))?;
    Ok(())
}

#[test]
fn startup_failure_shows_the_log_tail() {
    let error = RedisServer::builder()
        .arg("--no-such-option")
        .arg("1")
        .start()
        .unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, TestingError::ServerExited { .. }), "{text}");
    assert!(text.contains("before it answered PING"), "{text}");
    assert!(text.contains("no-such-option"), "{text}");
}

#[test]
fn silent_server_times_out_with_the_log_tail() -> TestResult {
    // A fake redis-server that starts but never listens.
    let dir = std::env::temp_dir().join(format!("convoy-fake-redis-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let fake = dir.join("fake-redis-server");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho pretending to start >&2\nexec sleep 30\n",
    )?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755))?;

    let mut attempts = 0;
    let error = loop {
        let error = RedisServer::builder()
            .binary(&fake)
            .startup_timeout(Duration::from_millis(300))
            .start()
            .unwrap_err();
        // Another thread's fork may briefly hold the script open for writing.
        let busy = matches!(&error, TestingError::Spawn { source, .. }
            if source.kind() == std::io::ErrorKind::ExecutableFileBusy);
        attempts += 1;
        if !busy || attempts == 5 {
            break error;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::fs::remove_dir_all(&dir)?;
    let text = error.to_string();
    assert!(
        matches!(error, TestingError::ServerNotReady { .. }),
        "{text}"
    );
    assert!(text.contains("did not answer PING within 300ms"), "{text}");
    assert!(text.contains("pretending to start"), "{text}");
    Ok(())
}

/// `CONVOY_TEST_SERVER` chooses the server every `RedisServer` runs (the
/// Valkey and Redis 8 passes of the suite set it to `valkey` and
/// `redis8`): what answers is that server, as its `INFO` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_kind_follows_the_environment() {
    use convoy_runtime::testing::ServerKind;
    let kind = ServerKind::from_env().expect("CONVOY_TEST_SERVER is redis, valkey or redis8");
    let server = RedisServer::start().expect("start the chosen server");
    assert_eq!(server.kind(), kind);
    let mut c = server.connection().await.expect("connect");
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut c)
        .await
        .expect("INFO");
    assert_eq!(
        info.contains("valkey_version:"),
        kind == ServerKind::Valkey,
        "{kind:?} answers: {info}"
    );
    // Either way, a server convoy supports (Redis 7.0 or later).
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .expect("redis_version");
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .expect("a version");
    assert!(major >= 7, "{version}");
    if kind == ServerKind::Redis8 {
        assert_eq!(
            major, 8,
            "CONVOY_TEST_SERVER=redis8 runs Redis 8: {version}"
        );
    }
}
