//! convoy's own log lines keep the targets they had before the runtime was
//! split into crates: a filter on `convoy_runtime` still selects a line the
//! inline broker (now in convoy-core) writes, under its old module path.
#![cfg(feature = "testing")]

use convoy_runtime::testing::CapturedLog;
use convoy_runtime::{Aggregate, Domain, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
#[aggregate(category = "logtarget")]
struct LogTarget;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = LogTarget)]
struct Logged {
    id: String,
}

struct Refuses;

#[event_handler(part_of = LogTarget)]
impl Refuses {
    #[handle]
    async fn logged(&self, _e: Logged) -> Result<(), HandlerError> {
        Err(HandlerError::permanent("refused"))
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_convoy_runtime_filter_selects_the_inline_broker_s_lines() {
    let log = CapturedLog::default();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("convoy_runtime=warn")
        .with_writer(log.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let domain = Domain::builder().handler(Refuses).init().expect("init");
    let mut uow = domain.unit_of_work();
    uow.raise(Logged { id: "l-1".into() }).expect("raise");
    uow.commit().await.expect("commit");
    domain.engine().run_until_idle().await.expect("run");
    let lines = log.lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("convoy_runtime::broker::inline:")
                && l.contains("event dead-lettered")),
        "no dead-letter line under convoy_runtime::broker::inline: {lines:#?}"
    );
}
