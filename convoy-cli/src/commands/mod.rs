//! The subcommands, one file each (`head.rs` for the head actions `skip`,
//! `dead-letter` and `retry`); [`run`] picks one and prints its output.
//! Each returns the text for stdout; where to connect and who acts are in
//! `connect.rs`, the confirmation question in `confirm.rs`.

mod acl;
mod audit;
mod dlq;
mod gaps;
mod head;
mod inspect;
mod outbox;
mod partitions;
mod pause;
mod replay;
mod serve;

use std::io::Write;
use std::process::ExitCode;

use convoy_runtime::redis::admin::HeadOp;

use crate::cli::{Cli, Command};
use crate::connect::session;
use crate::error::CliError;
use crate::render;

/// Runs one command; the text for stdout is printed here.
pub async fn run(cli: Cli) -> Result<ExitCode, CliError> {
    let Cli { conn, command } = cli;
    let out = match command {
        // Needs no connection.
        Command::Acl(args) => acl::run(&args)?,
        // The outbox listing needs no Redis; its actions connect for the
        // audit record.
        Command::Outbox(args) => outbox::run(&conn, &args).await?,
        Command::Serve(args) => return serve::run(&conn, &args).await,
        Command::Partitions(args) => partitions::run(&session(&conn).await?, &args).await?,
        Command::Inspect(args) => inspect::run(&session(&conn).await?, &args).await?,
        Command::Skip(args) => head::run(&session(&conn).await?, HeadOp::Skip, &args).await?,
        Command::DeadLetter(args) => {
            head::run(&session(&conn).await?, HeadOp::DeadLetter, &args).await?
        }
        Command::Retry(args) => head::retry(&session(&conn).await?, &args).await?,
        Command::Gaps(args) => gaps::run(&session(&conn).await?, &args).await?,
        Command::Dlq(args) => dlq::run(&session(&conn).await?, &args).await?,
        Command::Replay(args) => replay::run(&session(&conn).await?, &args).await?,
        Command::Pause(args) => pause::run(&session(&conn).await?, &args, true).await?,
        Command::Resume(args) => pause::run(&session(&conn).await?, &args, false).await?,
        Command::Pauses(args) => pause::list(&session(&conn).await?, &args).await?,
        Command::Audit(args) => audit::run(&session(&conn).await?, &args).await?,
    };
    print(&out)
}

/// Writes `out` to stdout, with any control or bidirectional character
/// that escaped rendering escaped (newlines end lines).
fn print(out: &str) -> Result<ExitCode, CliError> {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(render::terminal_safe(out).as_bytes())?;
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}
