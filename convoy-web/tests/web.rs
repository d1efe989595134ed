//! The operator page over a real `redis-server` and a running engine: a
//! poison event halts its partition; every view shows it; the head
//! actions, retry all halted and replay change the partition and write an
//! audit record with the operator; a stale confirmation, a POST without
//! the CSRF token and a read-only page are refused; a hostile key and
//! payload come back escaped; a non-loopback address without credentials
//! refuses to start.

mod common;

use std::sync::atomic::Ordering;

use axum::http::StatusCode;
use common::{
    Setup, WAIT, enc, from_loopback, get, ids, post, posted, settings, setup, wait_until,
};
use convoy_web::{Auth, Settings, WebError};

/// The confirmation page of `op` on `key`, and the fields it POSTs.
async fn confirm(
    router: &axum::Router,
    s: &Setup,
    op: &str,
    key: &str,
) -> (common::Reply, Vec<(String, String)>) {
    let page = get(
        router,
        &format!(
            "/c/ledger/confirm?op={op}&key={}&handler={}",
            enc(key),
            enc(&s.group)
        ),
    )
    .await
    .ok();
    let fields = ["csrf", "op", "key", "handler", "entry", "generation"]
        .iter()
        .map(|f| (f.to_string(), page.field(f)))
        .collect();
    (page, fields)
}

/// `POST /c/ledger/act` of the confirmation's `fields`.
async fn act(
    router: &axum::Router,
    fields: &[(String, String)],
    cookie: Option<&str>,
) -> common::Reply {
    post(router, "/c/ledger/act", &form(fields), cookie).await
}

fn form(fields: &[(String, String)]) -> Vec<(&str, &str)> {
    fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

fn with(fields: &[(String, String)], name: &str, value: &str) -> Vec<(String, String)> {
    fields
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                if k == name {
                    value.to_owned()
                } else {
                    v.clone()
                },
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_actions_fencing_and_refusals() {
    let s = setup();
    let engine = s.domain.engine().spawn();
    let hostile = "<script>alert(1)</script>";
    let mut events = Vec::new();
    for seq in 0..10 {
        for key in ["c0", "c1", "c2"] {
            events.push(posted(key, seq, key == "c1" && (seq == 3 || seq == 6)));
        }
    }
    let mut bad = posted(hostile, 0, true);
    bad.note = "<img src=x onerror=alert(2)>".to_owned();
    events.push(bad);
    s.publish(&events).await;
    wait_until(
        WAIT,
        "c0 and c2 finish, c1 and the hostile key halt",
        || async {
            s.seen("c0").len() == 10
                && s.seen("c2").len() == 10
                && s.halted_on("c1").await.is_some()
                && s.halted_on(hostile).await.is_some()
        },
    )
    .await;
    let halt_entry = s.halted_on("c1").await.expect("halted");
    let page = s.page(settings()).await;
    let router = page.router();

    // The overview: the category, its handler, the halts, the instance,
    // the chart; and the security headers.
    let r = get(&router, "/").await.ok();
    let csp = r.headers["content-security-policy"].to_str().expect("csp");
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe"),
        "{csp}"
    );
    assert_eq!(r.headers["x-frame-options"], "DENY");
    assert!(r.body.contains(">ledger<"), "{}", r.body);
    assert!(r.body.contains(">Recorder<"), "{}", r.body);
    assert!(r.body.contains("2 halted"), "{}", r.body);
    assert!(
        r.body.contains(">e0<") && r.body.contains("alive"),
        "{}",
        r.body
    );
    assert!(
        r.body.contains("<svg") && r.body.contains("ledger / Recorder: "),
        "{}",
        r.body
    );
    assert!(r.body.contains("retry all halted"), "{}", r.body);
    assert!(!r.body.contains(&s.url), "the Redis URL is never shown");
    // Its live part alone.
    let part = get(&router, "/?fragment=1").await.ok();
    assert!(!part.body.contains("<html") && part.body.contains(">ledger<"));

    // The partitions, live in index order, by prefix, by state, by lag.
    let r = get(&router, "/c/ledger").await.ok();
    for k in ["c0", "c1", "c2"] {
        assert!(r.body.contains(&format!(">{k}</a>")), "{k}: {}", r.body);
    }
    assert!(r.body.contains("SSCAN call"), "{}", r.body);
    assert!(
        r.body.contains("max_retries exceeded") || r.body.contains("poison event c1#3"),
        "{}",
        r.body
    );
    let r = get(&router, "/c/ledger?prefix=c1").await.ok();
    assert!(
        r.body.contains(">c1</a>") && !r.body.contains(">c0</a>"),
        "{}",
        r.body
    );
    let r = get(&router, "/c/ledger?state=halted").await.ok();
    assert!(
        r.body.contains(">c1</a>") && !r.body.contains(">c0</a>"),
        "{}",
        r.body
    );
    assert!(r.body.contains("state-halted"), "{}", r.body);
    let r = get(&router, "/c/ledger?sort=lag").await.ok();
    let (c1, c0) = (r.body.find(">c1</a>"), r.body.find(">c0</a>"));
    assert!(
        c1.is_some() && c0.is_some() && c1 < c0,
        "c1 (lag 7) first: {}",
        r.body
    );

    // The key: its head decoded, the payload pretty-printed, escaped.
    let r = get(&router, "/c/ledger/key?key=c1").await.ok();
    assert!(r.body.contains(&halt_entry), "{}", r.body);
    assert!(r.body.contains("Posted"), "{}", r.body);
    assert!(r.body.contains("&quot;seq&quot;: 3"), "{}", r.body);
    assert!(r.body.contains("poison event c1#3"), "{}", r.body);
    assert!(r.body.contains("Retry in place…"), "{}", r.body);

    // A hostile key and payload render as text.
    let r = get(&router, &format!("/c/ledger/key?key={}", enc(hostile)))
        .await
        .ok();
    assert!(
        r.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{}",
        r.body
    );
    assert!(
        r.body.contains("&lt;img src=x onerror=alert(2)&gt;"),
        "{}",
        r.body
    );
    assert!(
        !r.body.contains("<script>alert") && !r.body.contains("<img src=x"),
        "{}",
        r.body
    );
    let r = get(&router, "/c/ledger?state=halted").await.ok();
    assert!(
        r.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;")
            && !r.body.contains("<script>alert")
    );

    // A read-only page over the same Redis hides and refuses the actions.
    let ro = s
        .page(Settings {
            read_only: true,
            ..settings()
        })
        .await
        .router();
    let r = get(&ro, "/c/ledger/key?key=c1").await.ok();
    assert!(
        !r.body.contains("Retry in place") && r.body.contains("read-only"),
        "{}",
        r.body
    );
    assert!(!get(&ro, "/").await.ok().body.contains("retry all halted"));
    let r = get(
        &ro,
        &format!("/c/ledger/confirm?op=skip&key=c1&handler={}", enc(&s.group)),
    )
    .await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{}", r.body);
    let (page_, fields) = confirm(&router, &s, "skip", "c1").await;
    for path in ["/c/ledger/act", "/c/ledger/retry-all", "/c/ledger/replay"] {
        let r = post(&ro, path, &form(&fields), Some(&page_.cookie())).await;
        assert_eq!(
            r.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{path}: {}",
            r.body
        );
    }

    // Payloads hidden by the setting; the outbox's backlog when one is
    // configured.
    let outbox = std::sync::Arc::new(convoy_runtime::outbox::MemoryOutbox::new());
    let hidden = s
        .page(Settings {
            hide_payloads: true,
            outbox: Some(("memory outbox".to_owned(), outbox)),
            ..settings()
        })
        .await
        .router();
    let r = get(&hidden, "/c/ledger/key?key=c1").await.ok();
    assert!(
        !r.body.contains("&quot;seq&quot;") && r.body.contains("Payload hidden"),
        "{}",
        r.body
    );
    let r = get(&hidden, "/").await.ok();
    assert!(
        r.body.contains("memory outbox") && r.body.contains("pending"),
        "{}",
        r.body
    );

    // The confirmation names the head entry and the generation.
    let (page_, fields) = confirm(&router, &s, "skip", "c1").await;
    let cookie = page_.cookie();
    let entry = page_.field("entry");
    assert_eq!(entry, halt_entry);
    assert!(
        page_
            .body
            .contains(&format!("id=\"confirm-entry\">{halt_entry}<")),
        "{}",
        page_.body
    );
    let generation: u64 = page_.field("generation").parse().expect("generation");
    assert!(generation >= 1);

    // Refused: no CSRF token, a wrong one, no cookie, another site.
    let r = act(&router, &with(&fields, "csrf", ""), Some(&cookie)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert!(r.body.contains("CSRF"), "{}", r.body);
    let r = act(&router, &with(&fields, "csrf", "00"), Some(&cookie)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = act(&router, &fields, None).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // Stale: the generation moved, or the head is another entry.
    let r = act(
        &router,
        &with(&fields, "generation", &(generation + 1).to_string()),
        Some(&cookie),
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert!(r.body.contains("stale confirmation"), "{}", r.body);
    let r = act(&router, &with(&fields, "entry", "1-0"), Some(&cookie)).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    assert_eq!(
        s.halted_on("c1").await.as_deref(),
        Some(halt_entry.as_str()),
        "nothing was done"
    );
    assert!(s.audit("c1").await.is_empty(), "nothing was audited");

    // Skip from the page: audited with the operator; c1 runs on to its
    // second poison event.
    let r = act(&router, &fields, Some(&cookie)).await.ok();
    assert!(
        r.body.contains("audit record") && r.body.contains("tester (web)"),
        "{}",
        r.body
    );
    wait_until(WAIT, "c1 runs up to its second poison event", || async {
        s.seen("c1").len() == 5 && s.halted_on("c1").await.is_some_and(|e| e != halt_entry)
    })
    .await;
    assert_eq!(s.seen("c1"), ids("c1", &[0, 1, 2, 4, 5]));
    let audit = s.audit("c1").await;
    assert_eq!(audit.len(), 1, "{audit:?}");
    let a = &audit[0];
    assert_eq!(
        (
            a["op"].as_str(),
            a["key"].as_str(),
            a["entry"].as_str(),
            a["operator"].as_str(),
            a["forced"].as_str()
        ),
        ("skip", "c1", halt_entry.as_str(), "tester (web)", "0")
    );
    // The confirmation shown before the skip is now stale.
    let r = act(&router, &fields, Some(&cookie)).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);

    // Dead-letter the second poison event from the page.
    let second = s.halted_on("c1").await.expect("halted");
    let (page_, fields) = confirm(&router, &s, "dead_letter", "c1").await;
    assert_eq!(page_.field("entry"), second);
    act(&router, &fields, Some(&page_.cookie())).await.ok();
    wait_until(WAIT, "c1 finishes", || async { s.seen("c1").len() == 8 }).await;
    assert_eq!(s.seen("c1"), ids("c1", &[0, 1, 2, 4, 5, 7, 8, 9]));

    // The dead letter shows on the key's page and the dead letters view;
    // the audit log shows both actions.
    let r = get(&router, "/c/ledger/key?key=c1").await.ok();
    assert!(
        r.body.contains("poison event c1#6") && r.body.contains("replay…"),
        "{}",
        r.body
    );
    let r = get(&router, "/c/ledger/dlq?key=c1").await.ok();
    assert!(
        r.body.contains(&second) && r.body.contains("tester (web)"),
        "{}",
        r.body
    );
    let r = get(&router, "/audit").await.ok();
    assert!(
        r.body.contains("dead_letter") && r.body.contains(">skip<"),
        "{}",
        r.body
    );

    // Replay it at the tail, cured: it runs, last.
    let key_page = get(&router, "/c/ledger/key?key=c1").await.ok();
    let at = key_page.body.find("dlq_id=").expect("a replay link") + "dlq_id=".len();
    let dlq_id: String = key_page.body[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '-' || *c == '%')
        .collect::<String>()
        .replace("%2D", "-");
    let r = get(
        &router,
        &format!("/c/ledger/confirm-replay?key=c1&dlq_id={dlq_id}"),
    )
    .await
    .ok();
    // The preselected choice reaches the handler that dead-lettered it
    // alone; every handler is a form of its own that names them and must
    // be ticked, fenced on the handlers it named.
    assert!(
        r.body.contains(r#"name="at" value="tail" checked"#)
            && r.body.contains("acknowledge it without running it")
            && r.body.contains(r#"id="every-handlers""#)
            && r.body
                .contains(&format!(r#"<li class="mono">{}</li>"#, s.group)),
        "{}",
        r.body
    );
    for (handlers, ticked, status) in [
        (s.group.clone(), "", StatusCode::BAD_REQUEST),
        ("app::Gone".to_owned(), "1", StatusCode::CONFLICT),
    ] {
        let every = [
            ("csrf", r.field("csrf")),
            ("key", r.field("key")),
            ("dlq_id", r.field("dlq_id")),
            ("at", "every".to_owned()),
            ("handlers", handlers),
            ("every_confirmed", ticked.to_owned()),
        ];
        let every: Vec<(&str, &str)> = every.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let refused = post(&router, "/c/ledger/replay", &every, Some(&r.cookie())).await;
        assert_eq!(refused.status, status, "{}", refused.body);
        assert!(
            refused.body.contains("nothing was done"),
            "{}",
            refused.body
        );
    }
    let replay = [
        ("csrf", r.field("csrf")),
        ("key", r.field("key")),
        ("dlq_id", r.field("dlq_id")),
        ("at", "tail".to_owned()),
    ];
    let replay: Vec<(&str, &str)> = replay.iter().map(|(k, v)| (*k, v.as_str())).collect();
    s.poison.store(false, Ordering::SeqCst);
    let done = post(&router, "/c/ledger/replay", &replay, Some(&r.cookie()))
        .await
        .ok();
    assert!(
        done.body
            .contains(&format!(r#"id="replayed-to">{}<"#, s.group)),
        "{}",
        done.body
    );
    wait_until(WAIT, "the replayed event is handled", || async {
        s.seen("c1").len() == 9
    })
    .await;
    assert_eq!(s.seen("c1"), ids("c1", &[0, 1, 2, 4, 5, 7, 8, 9, 6]));
    // Replaying the same dead letter again is refused (it is gone).
    let r = post(&router, "/c/ledger/replay", &replay, Some(&r.cookie())).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    assert!(r.body.contains("no dead letter"), "{}", r.body);

    // Retry all halted: the hostile key is still halted; cured, it runs.
    page.refresh_snapshot().await;
    let r = get(
        &router,
        &format!("/c/ledger/confirm-retry-all?handler={}", enc(&s.group)),
    )
    .await
    .ok();
    assert!(
        r.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{}",
        r.body
    );
    assert!(r.body.contains("Retry 1 halted partitions"), "{}", r.body);
    let unit = r.field("unit");
    let fields = [
        ("csrf", r.field("csrf")),
        ("handler", r.field("handler")),
        ("unit", unit),
    ];
    let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let done = post(&router, "/c/ledger/retry-all", &fields, Some(&r.cookie()))
        .await
        .ok();
    assert!(
        done.body.contains("Retried 1 halted partitions"),
        "{}",
        done.body
    );
    wait_until(WAIT, "the hostile key's event runs", || async {
        s.seen(hostile).len() == 1
    })
    .await;
    let ops: Vec<String> = s
        .audit(hostile)
        .await
        .iter()
        .map(|a| a["op"].clone())
        .collect();
    assert!(ops.contains(&"retry".to_owned()), "{ops:?}");
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_hosts_and_listen_addresses() {
    let s = setup();
    // No authentication: loopback hosts only (no DNS rebinding).
    let router = s.page(settings()).await.router();
    get(&router, "/").await.ok();
    let req = axum::http::Request::get("/")
        .header("host", "evil.example:8080")
        .body(axum::body::Body::empty())
        .expect("request");
    let r = tower::ServiceExt::oneshot(router.clone(), from_loopback(req))
        .await
        .expect("reply");
    assert_eq!(r.status(), StatusCode::MISDIRECTED_REQUEST);
    // Another machine's client, or a server that does not say who the
    // client is, is refused whatever Host it sends.
    for peer in [Some([10, 0, 0, 5]), None] {
        let mut req = axum::http::Request::get("/")
            .header("host", "127.0.0.1:8080")
            .body(axum::body::Body::empty())
            .expect("request");
        if let Some(ip) = peer {
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(std::net::SocketAddr::from((
                    ip, 40_000,
                ))));
        }
        let r = tower::ServiceExt::oneshot(router.clone(), req)
            .await
            .expect("reply");
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "peer {peer:?}");
    }
    // A POST from another site is refused before its form is read.
    let req = axum::http::Request::post("/c/ledger/act")
        .header("host", "127.0.0.1:8080")
        .header("sec-fetch-site", "cross-site")
        .body(axum::body::Body::empty())
        .expect("request");
    let r = tower::ServiceExt::oneshot(router.clone(), from_loopback(req))
        .await
        .expect("reply");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    // Basic credentials: 401 without, the user is the operator with.
    let auth = Auth::Basic(vec![("ann".into(), "s3cret-pass".into())]);
    let router = s
        .page(Settings {
            auth: auth.clone(),
            ..settings()
        })
        .await
        .router();
    let r = get(&router, "/").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(
        r.headers["www-authenticate"]
            .to_str()
            .expect("h")
            .starts_with("Basic")
    );
    use base64::Engine as _;
    let basic = base64::engine::general_purpose::STANDARD.encode("ann:s3cret-pass");
    let req = axum::http::Request::get("/")
        .header("host", "ops.example")
        .header("authorization", format!("Basic {basic}"))
        .body(axum::body::Body::empty())
        .expect("request");
    let r = tower::ServiceExt::oneshot(router.clone(), from_loopback(req))
        .await
        .expect("reply");
    assert_eq!(r.status(), StatusCode::OK);

    // Mounted under a prefix: links, assets and the cookie point there.
    let nested = s
        .page(Settings {
            base_path: "/ops".to_owned(),
            ..settings()
        })
        .await
        .router();
    let app = axum::Router::new().nest("/ops", nested);
    let r = get(&app, "/ops").await.ok();
    assert!(
        r.body.contains("href=\"/ops/audit\"") && r.body.contains("/ops/assets/app.js"),
        "{}",
        r.body
    );
    assert!(r.cookie().starts_with("convoy_csrf="));
    assert!(
        r.headers["set-cookie"]
            .to_str()
            .expect("cookie")
            .contains("Path=/ops")
    );
    get(&app, "/ops/assets/app.css").await.ok();
    assert!(
        get(&app, "/ops?fragment=1")
            .await
            .ok()
            .body
            .contains("Categories")
    );

    // A non-loopback address without credentials refuses to start.
    let admin = convoy_runtime::redis::admin::Admin::connect(&s.url)
        .await
        .expect("admin");
    let page = convoy_web::OperatorPage::new(admin, settings());
    let e = page
        .serve(
            "0.0.0.0:0".parse().expect("addr"),
            Default::default(),
            |_| {},
        )
        .await
        .expect_err("refused");
    assert!(matches!(e, WebError::Unauthenticated { .. }), "{e}");
    assert!(e.to_string().contains("without authentication"), "{e}");
    assert!(convoy_web::check_listen(&"0.0.0.0:8080".parse().expect("addr"), &auth).is_ok());
    assert!(convoy_web::check_listen(&"[::1]:8080".parse().expect("addr"), &Auth::None).is_ok());
}

/// The replay confirmation of `dlq_id` of `key`, and the fields it POSTs
/// for a replay at the head.
async fn confirm_at_head(router: &axum::Router, key: &str, dlq_id: &str) -> common::Reply {
    get(
        router,
        &format!(
            "/c/ledger/confirm-replay?key={}&dlq_id={}",
            enc(key),
            enc(dlq_id)
        ),
    )
    .await
    .ok()
}

fn at_head_fields(r: &common::Reply) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = ["csrf", "key", "dlq_id", "handler", "generation"]
        .iter()
        .map(|f| (f.to_string(), r.field(f)))
        .collect();
    if r.body.contains("name=\"head\"") {
        fields.push(("head".to_owned(), r.field("head")));
    }
    fields.push(("at".to_owned(), "head".to_owned()));
    fields
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_at_the_head_shows_and_is_fenced_on_the_entry_it_goes_before_and_the_generation() {
    let s = setup();
    let engine = s.domain.engine().spawn();
    let events: Vec<_> = (0..6)
        .map(|seq| posted("c1", seq, seq == 2 || seq == 4))
        .collect();
    s.publish(&events).await;
    wait_until(WAIT, "c1 halts on #2", || async {
        s.halted_on("c1").await.is_some()
    })
    .await;
    let page = s.page(settings()).await;
    let router = page.router();
    // Dead-letter #2; c1 runs on and halts on #4.
    let (p, fields) = confirm(&router, &s, "dead_letter", "c1").await;
    act(&router, &fields, Some(&p.cookie())).await.ok();
    wait_until(WAIT, "c1 halts on #4", || async {
        s.seen("c1").len() == 3 && s.halted_on("c1").await.is_some()
    })
    .await;
    let halted_on_4 = s.halted_on("c1").await.expect("halted");
    let letters = page_dlq_ids(&router).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    let dlq_id = &letters[0];

    // The confirmation names the entry the letter goes before (the halted
    // head, #4) and the unit's generation.
    let r = confirm_at_head(&router, "c1", dlq_id).await;
    assert!(
        r.body
            .contains(&format!("id=\"replay-head-entry\">{halted_on_4}<")),
        "{}",
        r.body
    );
    assert_eq!(r.field("head"), halted_on_4);
    let generation: u64 = r.field("generation").parse().expect("generation");
    assert!(
        r.body
            .contains(&format!("id=\"replay-head-generation\">{generation}<")),
        "{}",
        r.body
    );
    assert!(r.body.contains("halted on its head"), "{}", r.body);
    let stale = at_head_fields(&r);
    let cookie = r.cookie();

    // A wrong generation is refused, nothing done.
    let moved = with(&stale, "generation", &(generation + 1).to_string());
    let refused = post(&router, "/c/ledger/replay", &form(&moved), Some(&cookie)).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.body);
    assert!(
        refused.body.contains("stale confirmation") && refused.body.contains("generation"),
        "{}",
        refused.body
    );
    // Another operator skips #4 meanwhile: the entry the page showed is
    // no longer the first unfinished one; the replay is refused.
    let (p, fields) = confirm(&router, &s, "skip", "c1").await;
    act(&router, &fields, Some(&p.cookie())).await.ok();
    wait_until(WAIT, "c1 finishes #5", || async { s.seen("c1").len() == 4 }).await;
    let refused = post(&router, "/c/ledger/replay", &form(&stale), Some(&cookie)).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.body);
    assert!(
        refused.body.contains("stale confirmation") && refused.body.contains(&halted_on_4),
        "{}",
        refused.body
    );
    assert_eq!(page_dlq_ids(&router).await, letters, "the letter stays");
    let replays = s
        .audit("c1")
        .await
        .iter()
        .filter(|a| a["op"] == "replay")
        .count();
    assert_eq!(replays, 0, "nothing audited");

    // Confirmed again: nothing unfinished to go before; cured, it runs.
    let r = confirm_at_head(&router, "c1", dlq_id).await;
    assert!(
        r.body.contains("nothing: the handler has finished"),
        "{}",
        r.body
    );
    assert_eq!(r.field("head"), "none");
    s.poison.store(false, Ordering::SeqCst);
    let done = post(
        &router,
        "/c/ledger/replay",
        &form(&at_head_fields(&r)),
        Some(&r.cookie()),
    )
    .await
    .ok();
    assert!(done.body.contains("at the head"), "{}", done.body);
    wait_until(WAIT, "the replayed event runs", || async {
        s.seen("c1").len() == 5
    })
    .await;
    assert_eq!(s.seen("c1"), ids("c1", &[0, 1, 3, 5, 2]));
    let audit = s.audit("c1").await;
    let replay = audit.iter().find(|a| a["op"] == "replay").expect("audited");
    assert_eq!(
        (replay["at"].as_str(), replay["operator"].as_str()),
        ("head", "tester (web)")
    );
    // The key's page shows the key's audit records, read from its shard.
    let key_page = get(&router, "/c/ledger/key?key=c1").await.ok();
    for op in [">dead_letter<", ">skip<", ">replay<"] {
        assert!(key_page.body.contains(op), "{op}: {}", key_page.body);
    }
    engine.shutdown().await.expect("shutdown");
}

/// The ids of the dead letters the dead letters view lists.
async fn page_dlq_ids(router: &axum::Router) -> Vec<String> {
    let r = get(router, "/c/ledger/dlq?key=c1").await.ok();
    let mut out = Vec::new();
    let mut rest = r.body.as_str();
    while let Some(at) = rest.find("dlq_id=") {
        rest = &rest[at + "dlq_id=".len()..];
        let id: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '-' || *c == '%')
            .collect::<String>()
            .replace("%2D", "-");
        if !out.contains(&id) {
            out.push(id);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_of_a_paused_handler_show_as_paused_until_its_dependency_is_back() {
    let s = setup();
    s.down.store(true, Ordering::SeqCst);
    let engine = s.domain.engine().spawn();
    let keys = ["c0", "c1", "c2", "c3"];
    let events: Vec<_> = keys
        .iter()
        .flat_map(|k| (0..3).map(move |seq| posted(k, seq, false)))
        .collect();
    s.publish(&events).await;
    let page = s.page(settings()).await;
    let router = page.router();
    // The dependency is down for every key: the handler pauses (3 keys
    // failing at once, the default threshold) and its heartbeat says so.
    wait_until(WAIT, "the page shows c0 paused", || async {
        get(&router, "/c/ledger/key?key=c0")
            .await
            .body
            .contains("state-paused")
    })
    .await;
    let r = get(&router, "/c/ledger/key?key=c0").await.ok();
    assert!(r.body.contains("its dependency down"), "{}", r.body);
    page.refresh_snapshot().await;
    let r = get(&router, "/c/ledger?state=paused").await.ok();
    for k in keys {
        assert!(r.body.contains(&format!(">{k}</a>")), "{k}: {}", r.body);
    }
    assert!(r.body.contains("state-paused"), "{}", r.body);
    let r = get(&router, "/c/ledger?state=running").await.ok();
    assert!(!r.body.contains(">c0</a>"), "{}", r.body);
    assert!(s.seen("c0").is_empty());

    // Back: every key runs, in order, and nothing shows paused any more.
    s.down.store(false, Ordering::SeqCst);
    wait_until(WAIT, "every key runs", || async {
        keys.iter().all(|k| s.seen(k).len() == 3)
    })
    .await;
    for k in keys {
        assert_eq!(s.seen(k), ids(k, &[0, 1, 2]));
    }
    wait_until(WAIT, "the pause is no longer shown", || async {
        !get(&router, "/c/ledger/key?key=c0")
            .await
            .body
            .contains("state-paused")
    })
    .await;
    page.refresh_snapshot().await;
    let r = get(&router, "/c/ledger?state=paused").await.ok();
    assert!(!r.body.contains(">c0</a>"), "{}", r.body);
    engine.shutdown().await.expect("shutdown");
}

/// Pause and resume a key from its page: the button posts, the page
/// redirects to the key's live status (a reload sends nothing again), the
/// key shows paused with who and why and runs no new event; resumed, it
/// goes on in order. A read-only page shows no button and refuses the POST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_paused_and_resumed_from_its_page() {
    let s = setup();
    let engine = s.domain.engine().spawn();
    s.publish(&[posted("c1", 0, false)]).await;
    wait_until(WAIT, "c1#0 handled", || async { s.seen("c1").len() == 1 }).await;
    let page = s.page(settings()).await;
    let router = page.router();
    let r = get(&router, "/c/ledger/key?key=c1").await.ok();
    assert!(r.body.contains("Pause this key for"), "{}", r.body);
    let fields = [
        ("csrf", r.field("csrf")),
        ("key", "c1".to_owned()),
        ("handler", s.group.clone()),
        ("reason", "fixing c1 by hand".to_owned()),
    ];
    let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let done = post(&router, "/c/ledger/pause", &fields, Some(&r.cookie())).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert!(
        done.headers["location"]
            .to_str()
            .expect("location")
            .ends_with("/c/ledger/key?key=c1"),
        "{:?}",
        done.headers
    );
    let r = get(&router, "/c/ledger/key?key=c1").await.ok();
    assert!(
        r.body.contains("paused by an operator") && r.body.contains("fixing c1 by hand"),
        "{}",
        r.body
    );
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    s.publish(&[posted("c1", 1, false)]).await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(s.seen("c1"), ids("c1", &[0]), "paused: no new event");
    // Read-only: no button, and the POST is refused.
    let ro = s
        .page(Settings {
            read_only: true,
            ..settings()
        })
        .await
        .router();
    let r2 = get(&ro, "/c/ledger/key?key=c1").await.ok();
    assert!(!r2.body.contains("Resume key"), "{}", r2.body);
    let refused = post(&ro, "/c/ledger/resume", &fields, Some(&r.cookie())).await;
    assert_ne!(refused.status, StatusCode::SEE_OTHER);
    // Resumed from the page.
    let resume = [
        ("csrf", r.field("csrf")),
        ("key", "c1".to_owned()),
        ("handler", s.group.clone()),
    ];
    let resume: Vec<(&str, &str)> = resume.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let done = post(&router, "/c/ledger/resume", &resume, Some(&r.cookie())).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    wait_until(WAIT, "c1 resumed", || async { s.seen("c1").len() == 2 }).await;
    assert_eq!(s.seen("c1"), ids("c1", &[0, 1]));
    let audit = s.audit("c1").await;
    let ops: Vec<&str> = audit.iter().map(|a| a["op"].as_str()).collect();
    assert_eq!(ops, ["pause", "resume"], "{audit:?}");
    engine.shutdown().await.expect("shutdown");
}
