//! `convoy`: the operator's command line for convoy's per-key partitions on
//! Redis and its PostgreSQL outbox. `convoy --help` lists the commands; the
//! work is done by `convoy_runtime::redis::admin::Admin` and the outbox's
//! `OutboxStore` methods.

// A binary has no public API: `pub` in its modules only marks what the
// other modules use (the workspace's `unreachable_pub` is for libraries).
#![allow(unreachable_pub)]

mod cli;
mod commands;
mod confirm;
mod connect;
mod error;
mod render;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { error::USAGE } else { 0 });
        }
    };
    let urls = connect::urls_for_errors(&cli);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("convoy: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("convoy: {}", error::one_line(&e, &urls));
            ExitCode::from(e.exit_code())
        }
    }
}
