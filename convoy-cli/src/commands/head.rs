//! The head actions: `convoy skip`, `convoy dead-letter` and `convoy
//! retry` on one partition, and `convoy retry --all-halted`.

use std::io::Write;

use convoy_runtime::redis::admin::{Admin, AdminError, HeadOp, HeadRequest};

use crate::cli::{HeadArgs, RetryArgs};
use crate::confirm::confirm;
use crate::connect::Session;
use crate::error::CliError;
use crate::render;

/// `convoy retry`: one partition's head, or every halted partition's with
/// `--all-halted`.
pub async fn retry(session: &Session, args: &RetryArgs) -> Result<String, CliError> {
    match args.one() {
        Some(one) => run(session, HeadOp::Retry, &one).await,
        None => retry_all_halted(&session.admin, args, &session.who).await,
    }
}

/// Skip, dead-letter or retry: resolve the handler, look at the head,
/// check it is halted there (or `--force`), confirm, then act only if the
/// head is still the entry confirmed.
pub async fn run(session: &Session, op: HeadOp, args: &HeadArgs) -> Result<String, CliError> {
    let (admin, who) = (&session.admin, session.who.as_str());
    let p = &args.partition;
    let key = p.key.value().map_err(CliError::Usage)?;
    let (category, key) = (p.category.as_str(), key.as_str());
    let group = admin
        .resolve_group(category, Some(key), p.handler.handler.as_deref())
        .await?;
    let i = admin.inspect(category, key, &group).await?;
    let action = match op {
        HeadOp::Skip => "skip",
        HeadOp::DeadLetter => "dead-letter",
        HeadOp::Retry => "retry",
    };
    if i.status.halt_reason.as_deref() == Some("not a stream") {
        // Halted because its key held another type: once the operator fixed
        // the key, the script clears the halt (no event is skipped); while
        // the key is still wrong it refuses, naming the key.
        confirm(
            &format!(
                "{category}:{} halted because its key was not a stream; clear the halt for {}?",
                render::key(key),
                render::text(&group)
            ),
            args.yes,
            action,
        )?;
        let request = HeadRequest {
            category,
            key,
            group: &group,
            force: args.force,
            operator: who,
            expect_entry: None,
            expect_generation: Some(i.status.durable_generation),
        };
        admin.act_on_head(op, &request).await?;
        return Ok(format!(
            "halt of {category}:{} cleared for {}; no event was skipped, its owner resumes\n",
            render::key(key),
            render::text(&group)
        ));
    }
    let Some(head) = &i.head else {
        return Err(AdminError::NothingToDo {
            category: category.to_owned(),
            key: key.to_owned(),
            group,
        }
        .into());
    };
    let s = &i.status;
    let on_halt = s.halted && head.pending && s.halt_entry.as_deref() == Some(&head.entry_id);
    if !on_halt && !args.force {
        // The script checks this again, atomically; refusing here spares
        // the question.
        return Err(if s.halted {
            AdminError::HeadMoved {
                category: category.to_owned(),
                key: key.to_owned(),
                group,
                halt_entry: s.halt_entry.clone().unwrap_or_default(),
                head: head.entry_id.clone(),
            }
        } else {
            AdminError::NotHalted {
                category: category.to_owned(),
                key: key.to_owned(),
                group,
            }
        }
        .into());
    }
    let mut err = std::io::stderr().lock();
    err.write_all(render::head_summary(category, &i, head).as_bytes())?;
    if !on_halt {
        err.write_all(render::force_warning(&i).as_bytes())?;
    }
    drop(err);
    confirm(
        &render::head_question(op, category, &i, head),
        args.yes,
        action,
    )?;
    let outcome = admin
        .act_on_head(
            op,
            &HeadRequest {
                category,
                key,
                group: &group,
                force: args.force,
                operator: who,
                expect_entry: Some(&head.entry_id),
                expect_generation: Some(i.status.durable_generation),
            },
        )
        .await?;
    Ok(render::head_outcome(category, &i.status, &outcome))
}

/// `convoy retry CATEGORY --all-halted --handler NAME`: every partition of
/// the category halted for the handler, each retried in place on the head
/// it is halted on (a partition whose head moved meanwhile is left alone
/// and counted), after one confirmation naming how many.
async fn retry_all_halted(admin: &Admin, args: &RetryArgs, who: &str) -> Result<String, CliError> {
    let category = args.category.as_str();
    let Some(handler) = args.handler.handler.as_deref() else {
        return Err(CliError::Usage(
            "--all-halted needs --handler NAME: the handler whose halted partitions to retry"
                .to_owned(),
        ));
    };
    let group = admin.resolve_group(category, None, Some(handler)).await?;
    let report = admin.partitions(category).await?;
    let halted: Vec<_> = report
        .partitions
        .iter()
        .filter(|p| p.group == group && p.halted)
        .collect();
    if halted.is_empty() {
        return Ok(format!(
            "no partition of {} is halted for handler {}\n",
            render::text(category),
            render::text(&group)
        ));
    }
    confirm(
        &format!(
            "Run the halted head again, in place, in {} partitions of {} for handler {}?",
            halted.len(),
            render::text(category),
            render::text(&group)
        ),
        args.yes,
        "retry",
    )?;
    let (mut done, mut left) = (0, Vec::new());
    for p in halted {
        let request = HeadRequest {
            category,
            key: &p.key,
            group: &group,
            force: false,
            operator: who,
            expect_entry: p.halt_entry.as_deref(),
            expect_generation: Some(p.durable_generation),
        };
        match admin.act_on_head(HeadOp::Retry, &request).await {
            Ok(_) => done += 1,
            Err(e) => left.push(format!("{}: {e}", render::key(&p.key))),
        }
    }
    let mut out = format!(
        "retried {done} halted partitions of {} for handler {} in place (each audited); their owners run the heads again, in order\n",
        render::text(category),
        render::text(&group)
    );
    if !left.is_empty() {
        out.push_str(&format!(
            "{} left alone (their heads moved or they resumed meanwhile):\n",
            left.len()
        ));
        for l in left {
            out.push_str(&format!("  {l}\n"));
        }
    }
    Ok(out)
}
