//! The operator page in a real headless Chromium (Debian's `chromium` and
//! `chromium-driver`, driven over WebDriver): partitions halted by poison
//! events show as halted; the operator opens one, sees its head,
//! dead-letters it from the page; opens another, retries it in place
//! from the page; both keys flow again; the overview refreshes itself
//! live. Screenshots of the overview and of a halted key are taken on the
//! way: written to the build's temporary directory, or to `docs/images/`
//! (the README's) with `CONVOY_SCREENSHOTS=docs`:
//!
//! ```sh
//! CONVOY_SCREENSHOTS=docs cargo test -p convoy-web --test browser
//! ```
//!
//! A missing browser fails the test, naming the fix: `apt-get install -y
//! chromium chromium-driver` (`.ci/run` installs them).

mod common;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{WAIT, ids, posted, settings, setup, wait_until};
use convoy_runtime::redis::admin::Admin;
use convoy_web::{OperatorPage, Settings};
use fantoccini::{Client, ClientBuilder, Locator};
use tokio_util::sync::CancellationToken;

/// The first of `names` found on `PATH`.
fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

/// A chromedriver process, killed on drop.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_driver() -> (Driver, PathBuf) {
    let driver = on_path(&["chromedriver"]);
    let browser = on_path(&["chromium", "chromium-browser"]);
    let (Some(driver), Some(browser)) = (driver, browser) else {
        panic!(
            "the browser test needs headless Chromium and its WebDriver (chromium and chromedriver on PATH): install them with `apt-get install -y chromium chromium-driver` (.ci/run does)"
        );
    };
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new(&driver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", driver.display()));
    let d = Driver { child, port };
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "chromedriver did not listen on port {port} within 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (d, browser)
}

async fn browser(driver: &Driver, binary: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".to_owned(),
        serde_json::json!({
            "binary": binary.display().to_string(),
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1360,1000"],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a Chromium session")
}

/// Waits until the page's DOM contains `text` (without reloading).
async fn wait_text(c: &Client, text: &str) {
    let start = Instant::now();
    loop {
        let src = c.source().await.expect("page source");
        if src.contains(text) {
            return;
        }
        assert!(
            start.elapsed() < WAIT,
            "the page never showed {text:?}; it shows: {src}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Clicks what `locator` finds, again when the live refresh replaced it
/// between finding and clicking.
async fn click(c: &Client, locator: Locator<'_>) {
    let start = Instant::now();
    loop {
        let found = c.wait().for_element(locator).await;
        let done = match found {
            Ok(e) => e.click().await,
            Err(e) => Err(e),
        };
        match done {
            Ok(()) => return,
            Err(e) if start.elapsed() < WAIT => {
                tracing::debug!("retrying a click: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("cannot click {locator:?}: {e}"),
        }
    }
}

/// Waits for the outcome of an action; fails with the page shown.
async fn outcome(c: &Client) {
    if c.wait().for_element(Locator::Id("outcome")).await.is_err() {
        let src = c.source().await.unwrap_or_default();
        panic!("no outcome page: {src}");
    }
}

/// Where screenshots go: `docs/images/` with `CONVOY_SCREENSHOTS=docs`,
/// else the build's temporary directory (a test run leaves the checkout
/// as it was).
fn images() -> PathBuf {
    let dir = if std::env::var("CONVOY_SCREENSHOTS").as_deref() == Ok("docs") {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/images")
    } else {
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots")
    };
    std::fs::create_dir_all(&dir).expect("the screenshots' directory");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_unwedges_halted_partitions_from_the_browser() {
    let (driver, binary) = start_driver();
    let s = setup();
    let engine = s.domain.engine().spawn();
    let mut events = Vec::new();
    for seq in 0..10 {
        for key in ["acme-7", "globex-2", "initech-1"] {
            events.push(posted(
                key,
                seq,
                (key == "globex-2" && seq == 3) || (key == "initech-1" && seq == 5),
            ));
        }
    }
    s.publish(&events).await;
    wait_until(WAIT, "acme-7 finishes, the two others halt", || async {
        s.seen("acme-7").len() == 10
            && s.halted_on("globex-2").await.is_some()
            && s.halted_on("initech-1").await.is_some()
    })
    .await;
    let globex_head = s.halted_on("globex-2").await.expect("halted");
    let initech_head = s.halted_on("initech-1").await.expect("halted");

    let admin = Admin::connect(&s.url).await.expect("admin");
    let page = OperatorPage::new(
        admin,
        Settings {
            live_interval: Duration::from_secs(1),
            sample_interval: Duration::from_secs(1),
            snapshot_interval: Duration::from_secs(2),
            ..settings()
        },
    );
    let shutdown = CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel::<SocketAddr>();
    let server = tokio::spawn(page.serve(
        "127.0.0.1:0".parse().expect("addr"),
        shutdown.clone(),
        move |a| {
            let _ = tx.send(a);
        },
    ));
    let addr = rx.await.expect("bound");
    let base = format!("http://{addr}");
    let c = browser(&driver, &binary).await;

    // The overview shows the two halts (from the first snapshot); a few
    // lag samples for the chart, then its screenshot.
    c.goto(&format!("{base}/")).await.expect("overview");
    wait_text(&c, "2 halted").await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let png = c.screenshot().await.expect("screenshot");
    std::fs::write(images().join("operator-overview.png"), png).expect("write png");

    // Open the halted partitions, then globex-2: its head is the halted
    // entry, decoded.
    click(&c, Locator::LinkText("2 halted")).await;
    wait_text(&c, "state-halted").await;
    click(&c, Locator::LinkText("globex-2")).await;
    wait_text(&c, &globex_head).await;
    wait_text(&c, "poison event globex-2#3").await;
    let png = c.screenshot().await.expect("screenshot");
    std::fs::write(images().join("operator-halted-key.png"), png).expect("write png");

    // Dead-letter it: the confirmation names the entry; confirm.
    click(&c, Locator::LinkText("Dead-letter…")).await;
    let shown = c
        .wait()
        .for_element(Locator::Id("confirm-entry"))
        .await
        .expect("the confirmation")
        .text()
        .await
        .expect("text");
    assert_eq!(shown, globex_head);
    click(&c, Locator::Id("confirm")).await;
    outcome(&c).await;
    wait_text(&c, "tester (web)").await;
    wait_until(WAIT, "globex-2 flows again", || async {
        s.seen("globex-2").len() == 9
    })
    .await;
    assert_eq!(
        s.seen("globex-2"),
        ids("globex-2", &[0, 1, 2, 4, 5, 6, 7, 8, 9])
    );

    // The bug is fixed: retry initech-1 in place from its page.
    s.poison.store(false, Ordering::SeqCst);
    c.goto(&format!("{base}/c/ledger/key?key=initech-1"))
        .await
        .expect("key page");
    wait_text(&c, &initech_head).await;
    click(&c, Locator::LinkText("Retry in place…")).await;
    let shown = c
        .wait()
        .for_element(Locator::Id("confirm-entry"))
        .await
        .expect("the confirmation")
        .text()
        .await
        .expect("text");
    assert_eq!(shown, initech_head);
    click(&c, Locator::Id("confirm")).await;
    outcome(&c).await;
    wait_until(WAIT, "initech-1 flows again, in order", || async {
        s.seen("initech-1").len() == 10
    })
    .await;
    assert_eq!(
        s.seen("initech-1"),
        ids("initech-1", &(0..10).collect::<Vec<_>>())
    );

    // The overview, left open, refreshes itself: no halt any more.
    c.goto(&format!("{base}/")).await.expect("overview");
    let start = Instant::now();
    loop {
        let src = c.source().await.expect("source");
        if !src.contains(" halted</span>") && src.contains(">0</td>") {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "the overview still shows a halt: {src}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    c.close().await.expect("close the browser");
    shutdown.cancel();
    server.await.expect("join").expect("served");
    engine.shutdown().await.expect("shutdown");
}
