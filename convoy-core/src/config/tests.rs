//! Tests of the configuration: loading, validation, environment overrides
//! and URL redaction.

use super::*;

#[test]
fn cluster_urls_are_redacted_node_by_node() {
    assert_eq!(
        redact_url("redis+cluster://u:pw@h1:1,h2:2/?password=x&protocol=3"),
        "redis+cluster://u:***@h1:1,u:***@h2:2/?password=***&protocol=3"
    );
    assert_eq!(
        redact_url("redis+cluster://h1:1,h2:2"),
        "redis+cluster://h1:1,h2:2"
    );
}

#[test]
fn cluster_urls_list_their_nodes_with_the_credentials() {
    let nodes = cluster_nodes("redis+cluster://u:pw@h1:1,h2:2/?protocol=3")
        .expect("a cluster URL")
        .expect("valid");
    assert_eq!(
        nodes,
        [
            "redis://u:pw@h1:1/?protocol=3",
            "redis://u:pw@h2:2/?protocol=3"
        ]
    );
    assert_eq!(
        cluster_nodes("rediss+cluster://h:1")
            .expect("cluster")
            .expect("valid"),
        ["rediss://h:1/"]
    );
    assert!(cluster_nodes("redis://h:1/").is_none());
    let e = cluster_nodes("redis+cluster://h:1/3")
        .expect("cluster")
        .expect_err("db 3");
    assert!(e.contains("database 3"), "{e}");
    let e = cluster_nodes("redis+cluster:///")
        .expect("cluster")
        .expect_err("no node");
    assert!(e.contains("no node"), "{e}");
}

#[test]
fn defaults() {
    let c = Config::from_toml("").expect("empty is fine");
    assert_eq!(c, Config::default());
    let p = &c.server.partitioning;
    assert_eq!(p.lease_ttl_ms, 15_000);
    assert_eq!(p.heartbeat_interval(), Duration::from_secs(3));
    assert_eq!(p.poll_interval(), Duration::from_millis(250));
    assert_eq!(p.reap_idle_ms, 3_600_000);
    assert!(!c.server.priority_lanes.enabled);
    assert_eq!(c.server.priority_lanes.backfill_suffix, "backfill");
    assert_eq!(c.broker.url, "inline");
}

#[test]
fn handle_span_level() {
    let c = Config::from_toml("").expect("defaults");
    assert_eq!(c.server.observability.handle_span_level, SpanLevel::Info);
    let c = Config::from_toml("[server.observability]\nhandle_span_level = \"debug\"\n")
        .expect("debug");
    assert_eq!(
        c.server.observability.handle_span_level.level(),
        tracing::Level::DEBUG
    );
    let e = Config::from_toml("[server.observability]\nhandle_span_level = \"loud\"\n")
        .expect_err("not a level")
        .to_string();
    assert!(e.contains("handle_span_level") || e.contains("loud"), "{e}");
}

#[test]
fn heartbeat_follows_ttl() {
    let c = Config::from_toml("[server.partitioning]\nlease_ttl_ms = 5000\n").expect("ok");
    assert_eq!(
        c.server.partitioning.heartbeat_interval(),
        Duration::from_secs(1)
    );
}

#[test]
fn unknown_key_names_key_and_file() {
    let dir = std::env::temp_dir().join(format!("convoy-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let f = dir.join("domain.toml");
    std::fs::write(&f, "[server.partitioning]\nlease_tll_ms = 1000\n").expect("write");
    let e = Config::from_file(&f).expect_err("unknown key").to_string();
    assert!(e.contains("lease_tll_ms"), "{e}");
    assert!(e.contains("domain.toml"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn missing_file_is_an_error_naming_it() {
    for e in [
        Config::from_file("/nonexistent/convoy/domain.toml"),
        Config::load("/nonexistent/convoy/domain.toml"),
    ] {
        let e = e.expect_err("missing file");
        assert!(matches!(e, Error::Config { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("/nonexistent/convoy/domain.toml"), "{e}");
        assert!(e.contains("does not exist"), "{e}");
        assert!(e.contains("Config::default()"), "{e}");
    }
}

#[test]
fn environment_overrides_the_file() {
    let file = "[broker]\nurl = \"inline\"\n[server.partitioning]\nlease_ttl_ms = 6000\nreap_idle_ms = 5000\n";
    let c = Config::from_toml_with_env(
        file,
        "domain.toml",
        [
            ("CONVOY_BROKER_URL", "redis://:pw@127.0.0.1:6379/0"),
            ("CONVOY_INSTANCE_ID", "replica-0"),
            ("CONVOY__SERVER__PARTITIONING__LEASE_TTL_MS", "9000"),
            ("CONVOY__server__retry__MAX_RETRIES", "7"),
            ("CONVOY__SERVER__PRIORITY_LANES__ENABLED", "true"),
            ("CONVOY__SERVER__PRIORITY_LANES__BACKFILL_SUFFIX", "\"7\""),
            ("CONVOY__HANDLERS__ledger-Projector__CONCURRENCY", "8"),
            ("CONVOY_REDIS_URL", "redis://ignored/"),
            ("PATH", "/bin"),
        ],
    )
    .expect("valid");
    assert_eq!(c.broker.url, "redis://:pw@127.0.0.1:6379/0");
    assert_eq!(c.server.instance_id.as_deref(), Some("replica-0"));
    let p = &c.server.partitioning;
    assert_eq!(p.lease_ttl_ms, 9000, "env over file");
    assert_eq!(p.reap_idle_ms, 5000, "file over defaults");
    assert_eq!(p.poll_interval_seconds, 0.25, "defaults");
    assert_eq!(c.server.retry.max_retries, 7);
    assert!(c.server.priority_lanes.enabled);
    assert_eq!(c.server.priority_lanes.backfill_suffix, "7");
    assert_eq!(c.concurrency("ledger-Projector"), 8);
    assert_eq!(c.concurrency("other"), DEFAULT_CONCURRENCY);
    assert!(
        c.origin()
            .starts_with("domain.toml with environment overrides"),
        "{}",
        c.origin()
    );
    assert!(c.origin().contains("CONVOY_BROKER_URL"), "{}", c.origin());
    assert!(!c.origin().contains("CONVOY_REDIS_URL"), "{}", c.origin());
    // The short alias is applied after the general form.
    let c = Config::from_toml_with_env(
        "",
        "x",
        [
            ("CONVOY_BROKER_URL", "redis://a/"),
            ("CONVOY__BROKER__URL", "redis://b/"),
        ],
    )
    .expect("valid");
    assert_eq!(c.broker.url, "redis://a/");
}

#[test]
fn environment_errors_name_the_variable() {
    let e = Config::from_toml_with_env(
        "",
        "domain.toml",
        [("CONVOY__SERVER__PARTITIONING__LEASE_TLL_MS", "9000")],
    )
    .expect_err("unknown key")
    .to_string();
    assert!(e.contains("lease_tll_ms"), "{e}");
    assert!(
        e.contains("CONVOY__SERVER__PARTITIONING__LEASE_TLL_MS"),
        "{e}"
    );
    let e = Config::from_toml_with_env(
        "",
        "domain.toml",
        [("CONVOY__SERVER__PARTITIONING__LEASE_TTL_MS", "soon")],
    )
    .expect_err("not a number")
    .to_string();
    assert!(e.contains("lease_ttl_ms"), "{e}");
    let e = Config::from_toml_with_env("", "domain.toml", [("CONVOY__", "1")])
        .expect_err("no key")
        .to_string();
    assert!(e.contains("does not name a key"), "{e}");
    let e = Config::from_toml_with_env(
        "",
        "domain.toml",
        [("CONVOY__SERVER__PARTITIONING__LEASE_TTL_MS", "1")],
    )
    .expect_err("out of range")
    .to_string();
    assert!(
        e.contains("CONVOY__SERVER__PARTITIONING__LEASE_TTL_MS"),
        "{e}"
    );
    assert!(e.contains("lease_ttl_ms = 1 is out of range"), "{e}");
}

#[test]
fn out_of_range_values_name_the_key() {
    for (bad, key) in [
        (
            "[server.partitioning]\npoll_interval_seconds = 1e300\n",
            "poll_interval_seconds",
        ),
        (
            "[server.partitioning]\npoll_interval_seconds = nan\n",
            "poll_interval_seconds",
        ),
        (
            "[server.partitioning]\npoll_interval_seconds = 0\n",
            "poll_interval_seconds",
        ),
        (
            "[server.partitioning]\nheartbeat_interval_seconds = 0.000001\n",
            "heartbeat_interval_seconds",
        ),
        (
            "[server.partitioning]\nheartbeat_interval_seconds = -1\n",
            "heartbeat_interval_seconds",
        ),
        (
            "[server.partitioning]\nlease_ttl_ms = 9223372036854775807\n",
            "lease_ttl_ms",
        ),
        ("[server.partitioning]\nlease_ttl_ms = 99\n", "lease_ttl_ms"),
        (
            "[server.partitioning]\nreap_idle_ms = 9223372036854775807\n",
            "reap_idle_ms",
        ),
        ("[server.partitioning]\nreap_idle_ms = 0\n", "reap_idle_ms"),
        (
            "[server.partitioning]\npartition_warning_threshold = 0\n",
            "partition_warning_threshold",
        ),
        ("[server.partitioning]\nmax_unacked = 0\n", "max_unacked"),
        (
            "[server.partitioning]\nmax_unacked = 10001\n",
            "max_unacked",
        ),
        ("[server.retry]\nmax_retries = 1000000\n", "max_retries"),
        (
            "[server.retry]\ninitial_backoff_ms = 0\n",
            "initial_backoff_ms",
        ),
        (
            "[server.retry]\nmax_backoff_ms = 9223372036854775807\n",
            "max_backoff_ms",
        ),
        ("[handlers.\"a\"]\nconcurrency = 0\n", "concurrency"),
        (
            "[handlers.\"a\"]\nmax_retries = 1000000\n",
            "[handlers.\"a\"] max_retries",
        ),
        ("[server.retry]\noutage_window_ms = 0\n", "outage_window_ms"),
        ("[handlers.\"a\"]\nconcurrency = 100000\n", "concurrency"),
        ("[server]\ninstance_id = \"a:b\"\n", "instance_id"),
    ] {
        let e = Config::from_toml(bad).expect_err(bad).to_string();
        assert!(e.contains(key), "{bad}: {e}");
        assert!(e.contains("<string>"), "{bad}: {e}");
    }
    // The bounds themselves are accepted.
    Config::from_toml(
        "[server.partitioning]\nlease_ttl_ms = 86400000\nheartbeat_interval_seconds = 0.01\npoll_interval_seconds = 60\nreap_idle_ms = 100\npartition_warning_threshold = 1\nmax_unacked = 10000\n[server.retry]\nmax_retries = 0\ninitial_backoff_ms = 1\nmax_backoff_ms = 3600000\n[handlers.\"a\"]\nconcurrency = 10000\n",
    )
    .expect("bounds are in range");
    // Values set in code are checked the same way.
    let mut c = Config::default();
    c.server.partitioning.lease_ttl_ms = u64::MAX;
    let e = c.validate("<code>").expect_err("too long").to_string();
    assert!(e.contains("lease_ttl_ms"), "{e}");
}

#[test]
fn every_problem_is_reported_at_once() {
    let e = Config::from_toml(
        "[server.partitioning]\nlease_ttl_ms = 99\n[outbox]\ntable = \"Outbox\"\n",
    )
    .expect_err("two problems");
    assert!(matches!(e, Error::Config { .. }), "{e:?}");
    let e = e.to_string();
    assert!(
        e.starts_with("invalid configuration in <string>: 2 problems: (1) "),
        "{e}"
    );
    assert!(e.contains("[outbox] table = \"Outbox\" must be"), "{e}");
    assert!(
        e.contains("; (2) [server.partitioning] lease_ttl_ms = 99 is out of range"),
        "{e}"
    );
    assert!(!e.contains('\n'), "one line: {e}");
    // One problem reads as it always did.
    let e = Config::from_toml("[server.partitioning]\nlease_ttl_ms = 99\n")
        .expect_err("one problem")
        .to_string();
    assert_eq!(
        e,
        "invalid configuration in <string>: [server.partitioning] lease_ttl_ms = 99 is out of range; use 100 to 86400000 ms (0.1 s to 24 h)"
    );
    // A value out of range is not also reported as too slow for the TTL.
    let e = Config::from_toml("[server.partitioning]\nheartbeat_interval_seconds = inf\n")
        .expect_err("infinite")
        .to_string();
    assert!(
        !e.contains("problems") && !e.contains("not well under"),
        "{e}"
    );
    // Values set in code, every section.
    let mut c = Config::default();
    c.server.retry.max_retries = 5_000;
    c.broker.shards = 0;
    c.broker.url = "kafka://k".into();
    c.outbox.max_connections = 1;
    let e = c.validate("<code>").expect_err("four problems").to_string();
    assert!(
        e.contains("4 problems: (1) [outbox] max_connections"),
        "{e}"
    );
    for key in ["max_retries", "[broker] url", "shards = 0"] {
        assert!(e.contains(key), "{key}: {e}");
    }
}

#[test]
fn heartbeat_must_be_well_under_ttl() {
    let e = Config::from_toml(
        "[server.partitioning]\nlease_ttl_ms = 3000\nheartbeat_interval_seconds = 2.5\n",
    )
    .expect_err("too slow")
    .to_string();
    assert!(e.contains("not well under"), "{e}");
    Config::from_toml(
        "[server.partitioning]\nlease_ttl_ms = 3000\nheartbeat_interval_seconds = 0.5\n",
    )
    .expect("fine");
}

#[test]
fn bad_values() {
    for bad in [
        "[broker]\nurl = \"kafka://x\"\n",
        "[server.priority_lanes]\nbackfill_suffix = \"a:b\"\n",
        "[server.priority_lanes]\nbackfill_suffix = \"dlq\"\n",
        "[server.partitioning]\npoll_interval_seconds = 0\n",
        "[server.retry]\ninitial_backoff_ms = 10\nmax_backoff_ms = 1\n",
        "[server.partitioning]\nlease_ttl_ms = \"x\"\n",
    ] {
        assert!(Config::from_toml(bad).is_err(), "{bad}");
    }
}

#[test]
fn redacts_passwords() {
    assert_eq!(redact_url("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
    assert_eq!(redact_url("redis://:secret@h:1/0"), "redis://:***@h:1/0");
    assert_eq!(redact_url("redis://u:p@ss@h:1/0"), "redis://u:***@h:1/0");
    assert_eq!(redact_url("redis://h:1/0"), "redis://h:1/0");
    assert_eq!(redact_url("rediss://:p%40ss@h/0"), "rediss://:***@h/0");
    // An `@` in the password, written raw: the parser takes the last one.
    assert_eq!(redact_url("redis://u:a@b@h:1/"), "redis://u:***@h:1/");
    assert_eq!(
        redact_url("unix:///run/redis.sock?db=1&pass=hunter2"),
        "unix:///run/redis.sock?db=1&pass=***"
    );
    assert_eq!(
        redact_url("redis+unix:///s.sock?user=app&password=hunter2"),
        "redis+unix:///s.sock?user=app&password=***"
    );
    assert_eq!(
        redact_url("redis://u:hunter2@h:99999/"),
        "redis://<hidden: not a valid URL>"
    );
    assert_eq!(redact_url("inline"), "inline");
    let c = Config::from_toml("[broker]\nurl = \"rediss://:pw@h/0\"\n").expect("ok");
    assert!(!format!("{c:?}").contains("pw"));
}

#[test]
fn url_secrets_as_written_and_decoded() {
    assert_eq!(url_secrets("redis://u:p%40ss@h/"), ["p%40ss", "p@ss"]);
    assert_eq!(url_secrets("unix:///s?pass=x%2By"), ["x%2By", "x+y"]);
    assert!(url_secrets("redis://h/").is_empty());
    assert_eq!(
        url_secrets("redis+cluster://u:p%40ss@h1:1,h2:2/?password=q"),
        ["p%40ss", "p@ss", "q"]
    );
}

#[test]
fn a_syntax_error_on_the_url_line_hides_the_password() {
    for text in [
        "[broker]\nurl = \"redis://app:hunter2@h:6379/0\n",
        "[broker]\nurl = redis://app:hunter2@h:6379/0\n",
        "[broker]\nurl = \"redis://app:hunter2@h:6379/0\" x\n",
        "[broker]\nurl = \"unix:///run/r.sock?pass=hunter2\" = 1\n",
    ] {
        let e = Config::from_toml(text)
            .expect_err("syntax error")
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
        assert!(e.contains("***") || e.contains("<hidden"), "{e}");
    }
    let e = Config::from_toml("[broker]\nurl = \"redis://a:b@h/\" x\n")
        .expect_err("syntax error")
        .to_string();
    assert!(e.contains("redis://a:***@h/"), "{e}");
}

#[test]
fn backoff_doubles_to_max() {
    let r = RetryConfig {
        max_retries: 5,
        initial_backoff_ms: 100,
        max_backoff_ms: 350,
        max_transient_backoff_ms: 500,
        ..RetryConfig::default()
    };
    assert_eq!(r.transient_backoff(4), Duration::from_millis(500));
    assert_eq!(r.backoff(1), Duration::from_millis(100));
    assert_eq!(r.backoff(2), Duration::from_millis(200));
    assert_eq!(r.backoff(3), Duration::from_millis(350));
}

#[test]
fn the_publish_batch_is_one_to_ten_thousand_records() {
    let c: Config = toml::from_str("[outbox]\nbatch = 64\n").expect("parses");
    assert_eq!(c.outbox.batch, 64);
    assert!(c.validate("<test>").is_ok());
    assert_eq!(Config::default().outbox.batch, 2_048);
    for bad in [0, 10_001] {
        let mut c = Config::default();
        c.outbox.batch = bad;
        let e = c.validate("<code>").expect_err("out of range").to_string();
        assert!(
            e.contains(&format!(
                "[outbox] batch = {bad} must be between 1 and 10000"
            )),
            "{e}"
        );
    }
}

#[test]
fn a_handler_has_a_retry_policy_of_its_own() {
    let c = Config::from_toml(
        "[server.retry]\nmax_retries = 4\noutage_threshold = 5\n[handlers.\"ledger\"]\nmax_retries = 9\noutage_window_ms = 500\n",
    )
    .expect("valid");
    let own = c.retry_for("ledger");
    assert_eq!(own.max_retries, 9);
    assert_eq!(own.outage_window_ms, 500);
    assert_eq!(own.outage_threshold, 5, "the rest from [server.retry]");
    assert_eq!(c.retry_for("other"), c.server.retry);
}
