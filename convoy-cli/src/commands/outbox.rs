//! `convoy outbox`: the PostgreSQL outbox's backlog, oldest pending age and
//! abandoned rows; `retry` or `discard` one abandoned row, audited in
//! `convoy:audit` (which `convoy audit` reads with the shards' audit
//! streams of the partition actions).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use convoy_runtime::config::redact_url;
use convoy_runtime::outbox::{OutboxRecord, OutboxStatus, OutboxStore};
use convoy_runtime::postgres::PgOutbox;
use convoy_runtime::redis::admin::{OutboxOp, OutboxOutcome};
use convoy_runtime::{Config, Envelope};
use serde::Serialize;
use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPoolOptions};

use crate::cli::{Connection, OutboxAction, OutboxArgs, RowArgs};
use crate::confirm::confirm;
use crate::connect::{connect, load_config, operator, target};
use crate::error::CliError;
use crate::render::{self, Align, Table};

/// How long the command waits for a PostgreSQL connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What `convoy outbox` shows.
#[derive(Debug, Serialize)]
pub struct OutboxReport {
    /// The outbox table, qualified.
    pub outbox: String,
    /// Rows waiting to be published.
    pub pending: u64,
    /// When the oldest pending row was raised (ms since the Unix epoch).
    pub oldest_pending_ms: Option<u64>,
    /// How long ago that was, in ms.
    pub oldest_pending_age_ms: Option<u64>,
    /// Rows abandoned, waiting for an operator.
    pub abandoned: u64,
    /// The oldest abandoned rows (up to `--limit`).
    pub abandoned_rows: Vec<AbandonedRow>,
}

/// One abandoned row.
#[derive(Debug, Serialize)]
pub struct AbandonedRow {
    /// The row's id (what `retry` and `discard` take).
    pub id: u64,
    /// Why it was abandoned.
    pub reason: String,
    /// Failed publish attempts before it was abandoned.
    pub attempts: u32,
    /// The event.
    pub envelope: Envelope,
}

/// Runs `convoy outbox ...`; returns the text for stdout.
pub async fn run(conn: &Connection, args: &OutboxArgs) -> Result<String, CliError> {
    let config = load_config(&conn.config)?;
    let store = open(conn, args, &config).await?;
    match &args.action {
        None => {
            let report = read(&store, args.limit).await?;
            Ok(if args.json {
                render::json(&report)?
            } else {
                show(&report)
            })
        }
        Some(OutboxAction::Retry(row)) => act(conn, &store, OutboxOp::Retry, row).await,
        Some(OutboxAction::Discard(row)) => act(conn, &store, OutboxOp::Discard, row).await,
    }
}

/// The outbox of `--postgres-url` (or `$CONVOY_POSTGRES_URL`), else of
/// `[outbox] postgres_url`; its schema and table from the configuration.
/// Checks that it can connect; never migrates.
pub(crate) async fn open(
    conn: &Connection,
    args: &OutboxArgs,
    config: &Config,
) -> Result<PgOutbox, CliError> {
    let (url, from) = match (&args.postgres_url, &config.outbox.postgres_url) {
        (Some(url), _) => (url, "--postgres-url".to_owned()),
        (None, Some(url)) => (
            url,
            format!("[outbox] postgres_url of {}", conn.config.display()),
        ),
        (None, None) => {
            return Err(CliError::NoPostgresUrl {
                config: conn.config.display().to_string(),
            });
        }
    };
    let options = PgConnectOptions::from_str(url).map_err(|e| {
        CliError::Config(convoy_runtime::Error::Config {
            file: from,
            message: format!("{:?} is not a valid PostgreSQL URL: {e}", redact_url(url)),
        })
    })?;
    // One connection first, for an error that says why it failed (a
    // pool's only says it timed out).
    let shown = redact_url(url);
    let unreachable = |source| {
        CliError::Outbox(convoy_runtime::Error::Postgres {
            context: format!("cannot connect to {shown}"),
            source,
        })
    };
    let first = tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options))
        .await
        .unwrap_or_else(|_| {
            Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {} s", CONNECT_TIMEOUT.as_secs()),
            )))
        })
        .map_err(unreachable)?;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_lazy_with(options);
    drop(first);
    PgOutbox::with_pool(pool, &config.outbox).map_err(CliError::Config)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The backlog, the oldest pending row and the oldest `limit` abandoned
/// rows.
async fn read(store: &PgOutbox, limit: usize) -> Result<OutboxReport, CliError> {
    let stats = store.stats().await.map_err(CliError::Outbox)?;
    let rows = store.abandoned(limit).await.map_err(CliError::Outbox)?;
    let now = now_ms();
    Ok(OutboxReport {
        outbox: store.qualified_table().to_owned(),
        pending: stats.pending,
        oldest_pending_ms: stats.oldest_pending_ms,
        oldest_pending_age_ms: stats.oldest_pending_ms.map(|ms| now.saturating_sub(ms)),
        abandoned: stats.abandoned,
        abandoned_rows: rows.into_iter().filter_map(abandoned_row).collect(),
    })
}

fn abandoned_row(r: OutboxRecord) -> Option<AbandonedRow> {
    match r.status {
        OutboxStatus::Abandoned { reason } => Some(AbandonedRow {
            id: r.seq,
            reason,
            attempts: r.attempts,
            envelope: Arc::unwrap_or_clone(r.envelope),
        }),
        _ => None,
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn partition(e: &Envelope) -> String {
    match &e.partition_key {
        Some(k) => format!("{}:{}", e.category, render::truncate(k, 40)),
        None => format!("{} (no key)", e.category),
    }
}

/// `convoy outbox` for people: one summary line, then the abandoned rows.
pub fn show(r: &OutboxReport) -> String {
    let pending = match r.oldest_pending_age_ms {
        Some(age) if r.pending > 0 => format!(
            "{}, the oldest raised {} ago",
            plural(r.pending, "row pending", "rows pending"),
            render::duration(age)
        ),
        _ => "nothing pending".to_owned(),
    };
    let mut out = format!(
        "outbox {}: {pending}; {}\n",
        r.outbox,
        plural(r.abandoned, "row abandoned", "rows abandoned")
    );
    if r.abandoned_rows.is_empty() {
        return out;
    }
    let mut t = Table::new(&[
        ("ID", Align::Right),
        ("RAISED", Align::Left),
        ("PARTITION", Align::Left),
        ("TYPE", Align::Left),
        ("MESSAGE ID", Align::Left),
        ("ATTEMPTS", Align::Right),
        ("REASON", Align::Left),
    ]);
    for row in &r.abandoned_rows {
        let e = &row.envelope;
        t.row(vec![
            row.id.to_string(),
            render::utc(e.time_ms),
            partition(e),
            e.type_name.clone(),
            e.id.clone(),
            row.attempts.to_string(),
            render::truncate(&row.reason, 200),
        ]);
    }
    out.push('\n');
    out.push_str(&t.render());
    let shown = r.abandoned_rows.len() as u64;
    if shown < r.abandoned {
        out.push_str(&format!(
            "(the oldest {shown} of {}; --limit N shows more)\n",
            r.abandoned
        ));
    }
    out.push_str(
        "\n`convoy outbox retry <id>` makes a row pending again; `convoy outbox discard <id>` deletes it\n",
    );
    out
}

/// The question asked before a retry or discard.
fn question(op: OutboxOp, outbox: &str, r: &OutboxRecord, reason: &str) -> String {
    let e = &r.envelope;
    let what = format!(
        "outbox row {} of {outbox} ({} {} for {}, abandoned: {})",
        r.seq,
        e.type_name,
        e.id,
        partition(e),
        render::truncate(reason, 200)
    );
    match op {
        OutboxOp::Retry => format!(
            "Retry {what}? It becomes pending: the relay publishes it after the rows of its key published meanwhile, or abandons it again if its key is still invalid."
        ),
        OutboxOp::Discard => {
            format!("Discard {what}? The row is deleted and its event is never published.")
        }
    }
}

/// What a retry or discard did.
fn outcome(o: &OutboxOutcome) -> String {
    let done = match o.op {
        OutboxOp::Retry => format!(
            "outbox row {} of {} is pending again; the relay publishes it",
            o.id, o.outbox
        ),
        OutboxOp::Discard => format!(
            "discarded outbox row {} of {}; its event is never published",
            o.id, o.outbox
        ),
    };
    format!(
        "{done} (it had been abandoned: {})\naudit record {}\n",
        render::truncate(&o.reason, 200),
        o.audit_id
    )
}

/// Retry or discard: connect to Redis first (the action is audited there;
/// nothing changes if it cannot be reached), look at the row, confirm,
/// act.
async fn act(
    conn: &Connection,
    store: &PgOutbox,
    op: OutboxOp,
    row: &RowArgs,
) -> Result<String, CliError> {
    let target = target(conn).map_err(|e| match e {
        CliError::NoUrl { config } | CliError::Inline { config } => {
            CliError::AuditNeedsRedis { config }
        }
        e => e,
    })?;
    let admin = connect(&target).await?;
    let who = operator(conn);
    let outbox = store.qualified_table().to_owned();
    let action = match op {
        OutboxOp::Retry => "retry",
        OutboxOp::Discard => "discard",
    };
    // A row that is not abandoned is refused by the action itself, without
    // a question.
    if let Some(r) = store.record(row.id).await.map_err(CliError::Outbox)?
        && let OutboxStatus::Abandoned { reason } = &r.status
    {
        confirm(&question(op, &outbox, &r, reason), row.yes, action)?;
    }
    let o = admin
        .outbox_action(op, store, &outbox, row.id, &who)
        .await?;
    Ok(outcome(&o))
}

#[cfg(test)]
mod tests {
    use convoy_runtime::Priority;

    use super::*;

    fn envelope(key: &str) -> Envelope {
        Envelope {
            id: "m-1".into(),
            type_name: "Posted".into(),
            category: "ledger".into(),
            partition_key: Some(key.into()),
            time_ms: 1_764_424_280_000,
            priority: Priority::Normal,
            correlation_id: None,
            payload: "{}".into(),
            origin: None,
            replay: None,
        }
    }

    #[test]
    fn the_report_says_backlog_age_and_why_rows_were_abandoned() {
        let report = OutboxReport {
            outbox: "\"public\".\"convoy_outbox\"".into(),
            pending: 3,
            oldest_pending_ms: Some(1),
            oldest_pending_age_ms: Some(2_100),
            abandoned: 2,
            abandoned_rows: vec![AbandonedRow {
                id: 17,
                reason: "invalid partition key \"slow\": reserved".into(),
                attempts: 0,
                envelope: envelope("slow"),
            }],
        };
        let text = show(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "outbox \"public\".\"convoy_outbox\": 3 rows pending, the oldest raised 2.1s ago; 2 rows abandoned"
        );
        assert_eq!(
            lines[2],
            "ID  RAISED                       PARTITION    TYPE    MESSAGE ID  ATTEMPTS  REASON"
        );
        assert_eq!(
            lines[3],
            "17  2025-11-29 13:51:20.000 UTC  ledger:slow  Posted  m-1                0  invalid partition key \"slow\": reserved"
        );
        assert!(text.contains("the oldest 1 of 2"), "{text}");
        let empty = OutboxReport {
            pending: 0,
            oldest_pending_ms: None,
            oldest_pending_age_ms: None,
            abandoned: 0,
            abandoned_rows: Vec::new(),
            ..report
        };
        assert_eq!(
            show(&empty),
            "outbox \"public\".\"convoy_outbox\": nothing pending; 0 rows abandoned\n"
        );
    }

    #[test]
    fn questions_name_the_row_and_what_follows() {
        let r = OutboxRecord {
            seq: 17,
            envelope: Arc::new(envelope("slow")),
            status: OutboxStatus::Abandoned {
                reason: "bad".into(),
            },
            attempts: 0,
        };
        let q = question(OutboxOp::Retry, "t", &r, "bad");
        assert!(
            q.starts_with("Retry outbox row 17 of t (Posted m-1 for ledger:slow, abandoned: bad)?"),
            "{q}"
        );
        let q = question(OutboxOp::Discard, "t", &r, "bad");
        assert!(q.contains("never published"), "{q}");
    }
}
