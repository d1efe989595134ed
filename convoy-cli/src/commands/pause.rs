//! `convoy pause`, `convoy resume` and `convoy pauses`: operators' pauses
//! of a key or a key prefix (a tenant), for one handler or all.

use convoy_runtime::redis::admin::{KeyPause, PauseTarget};

use crate::cli::{PauseArgs, PausesArgs, key_value};
use crate::confirm::confirm;
use crate::connect::Session;
use crate::error::CliError;
use crate::render::{self, Align, Table};

/// Pauses (`pause`) or resumes what `args` names, after confirmation.
pub async fn run(s: &Session, args: &PauseArgs, pause: bool) -> Result<String, CliError> {
    let target = match (&args.key, &args.prefix) {
        (Some(k), None) => PauseTarget::Key(key_value(k, args.key_hex).map_err(CliError::Usage)?),
        (None, Some(p)) => PauseTarget::Prefix(p.clone()),
        _ => {
            return Err(CliError::Usage(
                "name a key or --prefix, not both".to_owned(),
            ));
        }
    };
    let category = &args.category;
    let handler = match &args.handler.handler {
        Some(h) => Some(s.admin.resolve_group(category, None, Some(h)).await?),
        None => None,
    };
    let who = handler.as_deref().map_or("every handler".to_owned(), |h| {
        format!("handler {}", render::text(h))
    });
    let question = if pause {
        format!(
            "Pause {target} of category {} for {who}? Its owner starts no new event of it (the event in flight finishes) until `convoy resume`.",
            render::text(category)
        )
    } else {
        format!(
            "Resume {target} of category {} for {who}? It goes on with its next event, in order.",
            render::text(category)
        )
    };
    confirm(&question, args.yes, if pause { "pause" } else { "resume" })?;
    let o = if pause {
        s.admin
            .pause(category, &target, handler.as_deref(), &args.reason, &s.who)
            .await?
    } else {
        s.admin
            .resume(category, &target, handler.as_deref(), &s.who)
            .await?
    };
    Ok(format!(
        "{} {target} of category {} for {who}; the engines were woken\naudit record {} in {}\n",
        if pause { "paused" } else { "resumed" },
        render::text(category),
        render::text(&o.audit_id),
        render::text(&o.audit_stream)
    ))
}

/// Lists the category's pauses.
pub async fn list(s: &Session, args: &PausesArgs) -> Result<String, CliError> {
    let pauses = s.admin.pauses(&args.category).await?;
    Ok(if args.json {
        render::json(&pauses)?
    } else {
        table(&args.category, &pauses)
    })
}

/// `convoy pauses`: one row per pause.
fn table(category: &str, pauses: &[KeyPause]) -> String {
    if pauses.is_empty() {
        return format!("no key of category {} is paused\n", render::text(category));
    }
    let mut t = Table::new(&[
        ("HANDLER", Align::Left),
        ("PAUSED", Align::Left),
        ("BY", Align::Left),
        ("SINCE", Align::Left),
        ("REASON", Align::Left),
    ]);
    for p in pauses {
        t.row(vec![
            p.handler
                .as_deref()
                .map_or("(every handler)".to_owned(), render::text),
            p.target.to_string(),
            render::text(&p.operator),
            render::utc(p.since_ms),
            render::text(&p.reason),
        ]);
    }
    format!(
        "{}\n{} pauses in category {}; lift one with: convoy resume {} <key> | --prefix P [--handler H]\n",
        t.render(),
        pauses.len(),
        render::text(category),
        render::text(category)
    )
}
