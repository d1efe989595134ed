//! An account ledger on PostgreSQL: transfers debit and credit accounts and
//! raise their events **in the same sqlx transaction** (`uow.commit_in`),
//! so a balance never changes without its events and a rolled-back
//! transfer leaves none. A projector declared `sequential_by =
//! "account_id"` keeps a statement table, exactly once per event with the
//! outbox's applied-events helper, so each account's statement lines land
//! in the order the transfers committed. At the end it prints balances and
//! statements and checks that they agree.
//!
//! It needs a PostgreSQL it may write a schema to (`convoy_ledger_example`,
//! dropped and created again at every run), by default the local one:
//!
//! ```text
//! cargo run --example ledger
//! CONVOY_POSTGRES_URL=postgres://app:secret@db.internal/app cargo run --example ledger
//! ```
//!
//! It runs on the inline broker, or against Redis with two engine instances
//! (one of them relays the outbox, both handle accounts):
//!
//! ```text
//! CONVOY_REDIS_URL=redis://127.0.0.1:6379/ cargo run --example ledger
//! ```

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

use convoy_runtime::postgres::{AppliedEvents, PgOutbox};
use convoy_runtime::{Aggregate, Config, Context, Domain, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tracing_subscriber::prelude::*;

/// The example's own schema: its tables and the outbox's.
const SCHEMA: &str = "convoy_ledger_example";
/// The local PostgreSQL (trust authentication).
const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

const ACCOUNTS: [&str; 5] = ["alice", "bob", "carol", "dave", "erin"];
const OPENING_CENTS: i64 = 1_000;
const WRITERS: u64 = 4;
const TRANSFERS_PER_WRITER: u64 = 25;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The `account` stream category.
#[derive(Aggregate)]
#[aggregate(category = "account")]
struct Account;

/// An account was opened with a balance.
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Account)]
struct Opened {
    account_id: String,
    cents: i64,
}

/// Money left an account; `balance` is its balance after the debit.
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Account)]
struct Debited {
    account_id: String,
    transfer_id: String,
    cents: i64,
    balance: i64,
}

/// Money reached an account; `balance` is its balance after the credit.
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Account)]
struct Credited {
    account_id: String,
    transfer_id: String,
    cents: i64,
    balance: i64,
}

/// Keeps `statement`: one line per event of an account, in the order the
/// account's transactions committed. Each line is written in one
/// transaction with the applied-events row of (handler, account), so a
/// re-run after a crash adds nothing and a stalled owner's late write is
/// refused.
struct Statements {
    pool: PgPool,
    applied: AppliedEvents,
}

impl Statements {
    async fn line(
        &self,
        ctx: &Context,
        account: &str,
        what: &str,
        delta: i64,
        balance: i64,
    ) -> Result<(), HandlerError> {
        let mut tx = self.pool.begin().await?;
        if self.applied.claim(&mut tx, ctx).await?.is_already_applied() {
            return Ok(());
        }
        sqlx::query(
            "INSERT INTO convoy_ledger_example.statement (account_id, line, what, delta, balance)
             SELECT $1, coalesce(max(line), 0) + 1, $2, $3, $4
             FROM convoy_ledger_example.statement WHERE account_id = $1",
        )
        .bind(account)
        .bind(what)
        .bind(delta)
        .bind(balance)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

#[event_handler(part_of = Account, sequential_by = "account_id")]
impl Statements {
    #[handle]
    async fn opened(&self, e: Opened, ctx: &Context) -> Result<(), HandlerError> {
        self.line(ctx, &e.account_id, "opened", e.cents, e.cents)
            .await
    }

    #[handle]
    async fn debited(&self, e: Debited, ctx: &Context) -> Result<(), HandlerError> {
        let what = format!("{} out", e.transfer_id);
        self.line(ctx, &e.account_id, &what, -e.cents, e.balance)
            .await
    }

    #[handle]
    async fn credited(&self, e: Credited, ctx: &Context) -> Result<(), HandlerError> {
        let what = format!("{} in", e.transfer_id);
        self.line(ctx, &e.account_id, &what, e.cents, e.balance)
            .await
    }
}

/// Drops and creates the example's schema: the accounts, the statement,
/// then the outbox's tables (its embedded migration).
async fn reset(pool: &PgPool, outbox: &PgOutbox) -> Result<(), BoxError> {
    sqlx::raw_sql(
        "DROP SCHEMA IF EXISTS convoy_ledger_example CASCADE;
         CREATE SCHEMA convoy_ledger_example;
         CREATE TABLE convoy_ledger_example.accounts (
             id text PRIMARY KEY,
             balance bigint NOT NULL CHECK (balance >= 0)
         );
         CREATE TABLE convoy_ledger_example.statement (
             account_id text NOT NULL,
             line integer NOT NULL,
             what text NOT NULL,
             delta bigint NOT NULL,
             balance bigint NOT NULL,
             PRIMARY KEY (account_id, line)
         );",
    )
    .execute(pool)
    .await?;
    outbox.migrate().await?;
    Ok(())
}

/// Opens every account: the rows and their `Opened` events, one
/// transaction.
async fn open_accounts(domain: &Domain, pool: &PgPool) -> Result<(), BoxError> {
    let mut tx = pool.begin().await?;
    let mut uow = domain.unit_of_work();
    for account in ACCOUNTS {
        sqlx::query("INSERT INTO convoy_ledger_example.accounts (id, balance) VALUES ($1, $2)")
            .bind(account)
            .bind(OPENING_CENTS)
            .execute(&mut *tx)
            .await?;
        uow.raise(Opened {
            account_id: account.to_owned(),
            cents: OPENING_CENTS,
        })?;
    }
    uow.commit_in(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

/// Moves `cents` from `from` to `to` and raises `Debited` and `Credited`,
/// all in one transaction. Returns `false` (and writes nothing, events
/// included) when `from` cannot afford it.
async fn transfer(
    domain: &Domain,
    pool: &PgPool,
    id: &str,
    from: &str,
    to: &str,
    cents: i64,
) -> Result<bool, BoxError> {
    let mut tx = pool.begin().await?;
    // Both rows locked in id order, so opposite transfers cannot deadlock.
    sqlx::query(
        "SELECT id FROM convoy_ledger_example.accounts WHERE id = ANY($1) ORDER BY id FOR UPDATE",
    )
    .bind(vec![from.to_owned(), to.to_owned()])
    .execute(&mut *tx)
    .await?;
    let debited: Option<i64> = sqlx::query_scalar(
        "UPDATE convoy_ledger_example.accounts SET balance = balance - $2
         WHERE id = $1 AND balance >= $2 RETURNING balance",
    )
    .bind(from)
    .bind(cents)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(from_balance) = debited else {
        // Dropping the transaction rolls it back.
        return Ok(false);
    };
    let to_balance: i64 = sqlx::query_scalar(
        "UPDATE convoy_ledger_example.accounts SET balance = balance + $2
         WHERE id = $1 RETURNING balance",
    )
    .bind(to)
    .bind(cents)
    .fetch_one(&mut *tx)
    .await?;
    let mut uow = domain.unit_of_work();
    uow.raise(Debited {
        account_id: from.to_owned(),
        transfer_id: id.to_owned(),
        cents,
        balance: from_balance,
    })?;
    uow.raise(Credited {
        account_id: to.to_owned(),
        transfer_id: id.to_owned(),
        cents,
        balance: to_balance,
    })?;
    // Last, as it takes each account's outbox lock until the commit.
    uow.commit_in(&mut tx).await?;
    tx.commit().await?;
    Ok(true)
}

/// `WRITERS` tasks making random transfers at once; returns how many were
/// made and how many refused for want of funds.
async fn transfers(domain: &Domain, pool: &PgPool) -> Result<(u64, u64), BoxError> {
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let domain = domain.clone();
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = (w + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let (mut made, mut refused) = (0, 0);
            for i in 0..TRANSFERS_PER_WRITER {
                let from = ACCOUNTS[(next() % ACCOUNTS.len() as u64) as usize];
                let to = loop {
                    let to = ACCOUNTS[(next() % ACCOUNTS.len() as u64) as usize];
                    if to != from {
                        break to;
                    }
                };
                let cents = (next() % 400 + 1) as i64;
                let id = format!("t{w}-{i}");
                if transfer(&domain, &pool, &id, from, to, cents).await? {
                    made += 1;
                } else {
                    refused += 1;
                }
            }
            Ok::<_, BoxError>((made, refused))
        }));
    }
    let (mut made, mut refused) = (0, 0);
    for t in tasks {
        let (m, r) = t.await??;
        made += m;
        refused += r;
    }
    Ok((made, refused))
}

/// One line of an account's statement.
#[derive(Debug)]
struct Line {
    account_id: String,
    line: i32,
    what: String,
    delta: i64,
    balance: i64,
}

async fn statement_lines(pool: &PgPool) -> Result<i64, BoxError> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM convoy_ledger_example.statement")
            .fetch_one(pool)
            .await?,
    )
}

/// Prints balances and statements; checks that every statement starts at
/// the opening balance, that each line's balance is the one before plus
/// its amount (the events landed in commit order), that no transfer is
/// there twice, and that it ends at the account's balance. Returns whether
/// all of that held.
async fn report(pool: &PgPool) -> Result<bool, BoxError> {
    let balances: BTreeMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
        "SELECT id, balance FROM convoy_ledger_example.accounts",
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .collect();
    let lines: Vec<Line> = sqlx::query_as::<_, (String, i32, String, i64, i64)>(
        "SELECT account_id, line, what, delta, balance FROM convoy_ledger_example.statement
         ORDER BY account_id, line",
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|(account_id, line, what, delta, balance)| Line {
        account_id,
        line,
        what,
        delta,
        balance,
    })
    .collect();
    let mut by_account: BTreeMap<&str, Vec<&Line>> = BTreeMap::new();
    for l in &lines {
        by_account.entry(&l.account_id).or_default().push(l);
    }
    let total: i64 = balances.values().sum();
    println!("{:<7} {:>8} {:>6}  check", "account", "balance", "lines");
    let mut all_ok = total == OPENING_CENTS * ACCOUNTS.len() as i64;
    for (account, balance) in &balances {
        let statement = by_account
            .get(account.as_str())
            .cloned()
            .unwrap_or_default();
        let mut problems = Vec::new();
        let mut running = 0;
        let mut seen = std::collections::HashSet::new();
        for l in &statement {
            running += l.delta;
            if l.balance != running {
                problems.push(format!(
                    "line {} ({}) says {} after {}, expected {running}",
                    l.line, l.what, l.balance, l.delta
                ));
            }
            if !seen.insert(&l.what) {
                problems.push(format!("line {} ({}) is there twice", l.line, l.what));
            }
        }
        if statement.first().map(|l| l.what.as_str()) != Some("opened") {
            problems.push("the statement does not start with the opening".into());
        }
        if running != *balance {
            problems.push(format!("the statement ends at {running}"));
        }
        let ok = problems.is_empty();
        all_ok &= ok;
        println!(
            "{account:<7} {balance:>8} {:>6}  {}",
            statement.len(),
            if ok {
                "statement agrees".to_owned()
            } else {
                problems.join("; ")
            }
        );
    }
    if let Some((account, statement)) = by_account.iter().next() {
        println!("\nthe last lines of {account}'s statement:");
        for l in statement.iter().rev().take(5).rev() {
            println!(
                "  {:>3}  {:<10} {:>+6} -> {:>6}",
                l.line, l.what, l.delta, l.balance
            );
        }
    }
    println!(
        "total {total} (opened with {})",
        OPENING_CENTS * ACCOUNTS.len() as i64
    );
    Ok(all_ok)
}

/// The ledger's run: reset the schema, open the accounts, transfer, let the
/// engine publish and project, report. `config` names the broker and the
/// outbox (`[outbox] postgres_url`, schema `convoy_ledger_example`).
/// Returns whether balances and statements agree.
pub(crate) async fn run(config: Config) -> Result<bool, BoxError> {
    let url = config
        .outbox
        .postgres_url
        .clone()
        .ok_or("the outbox needs a postgres_url")?;
    // A transaction left idle (its owner stalled) ends after 10 s, which
    // releases the applied-events row it holds.
    let options =
        PgConnectOptions::from_str(&url)?.options([("idle_in_transaction_session_timeout", "10s")]);
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(|e| {
            format!(
                "cannot connect to PostgreSQL at {} ({e}); set CONVOY_POSTGRES_URL",
                convoy_runtime::config::redact_url(&url)
            )
        })?;
    // The outbox shares the application's pool: its rows are written in
    // the application's transactions.
    let outbox = PgOutbox::with_pool(pool.clone(), &config.outbox)?;
    reset(&pool, &outbox).await?;
    let build = |instance: &str| {
        Domain::builder()
            .config(config.clone())
            .instance_id(instance)
            .outbox(outbox.clone())
            .handler(Statements {
                pool: pool.clone(),
                applied: outbox.applied_events(),
            })
            .init()
    };
    let expected_lines = |made: u64| ACCOUNTS.len() as i64 + 2 * made as i64;
    if config.broker.url == "inline" {
        println!(
            "ledger on the inline broker, outbox {}",
            outbox.qualified_table()
        );
        let domain = build("inline")?;
        open_accounts(&domain, &pool).await?;
        let (made, refused) = transfers(&domain, &pool).await?;
        println!(
            "{made} transfers made, {refused} refused (not enough funds: rolled back, no events)\n"
        );
        // Publishes the committed rows, then handles them.
        domain.engine().run_until_idle().await?;
        if statement_lines(&pool).await? != expected_lines(made) {
            return Err("some events were not projected".into());
        }
    } else {
        println!(
            "ledger on Redis at {}, outbox {}: two engine instances",
            convoy_runtime::config::redact_url(&config.broker.url),
            outbox.qualified_table()
        );
        let run = std::process::id();
        let domains = ["engine-a", "engine-b"]
            .into_iter()
            .map(|name| build(&format!("{name}-{run}")))
            .collect::<Result<Vec<_>, _>>()?;
        let engines: Vec<_> = domains.iter().map(|d| d.engine().spawn()).collect();
        open_accounts(&domains[0], &pool).await?;
        let (made, refused) = transfers(&domains[1], &pool).await?;
        println!(
            "{made} transfers made, {refused} refused (not enough funds: rolled back, no events)\n"
        );
        let start = Instant::now();
        while statement_lines(&pool).await? < expected_lines(made) {
            if start.elapsed() > Duration::from_secs(60) {
                return Err("the statements did not catch up within 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for e in engines {
            e.shutdown().await?;
        }
    }
    report(&pool).await
}

/// `domain.toml` with the outbox in PostgreSQL (`CONVOY_POSTGRES_URL`) and,
/// with `CONVOY_REDIS_URL`, the Redis broker.
fn config_from_env() -> Result<Config, BoxError> {
    let mut config = Config::from_file("domain.toml")?;
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    config.outbox.postgres_url =
        Some(env("CONVOY_POSTGRES_URL").unwrap_or_else(|| DEFAULT_POSTGRES_URL.to_owned()));
    config.outbox.schema = SCHEMA.to_owned();
    config.outbox.poll_interval_ms = 200;
    if let Some(url) = env("CONVOY_REDIS_URL") {
        config.broker.url = url;
        config.server.partitioning.heartbeat_interval_seconds = Some(0.5);
    }
    Ok(config)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // The Redis client's repeated reconnect warnings, at most one line per
    // source per ten seconds (convoy's own lines are all kept).
    tracing_subscriber::registry()
        .with(
            convoy_runtime::log::quiet_redis(tracing_subscriber::fmt::layer()).with_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            ),
        )
        .init();
    if run(config_from_env()?).await? {
        println!("balances and statements agree: every event once, in commit order");
        Ok(())
    } else {
        Err("balances and statements disagree".into())
    }
}
