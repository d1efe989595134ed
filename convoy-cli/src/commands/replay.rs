//! `convoy replay`: a dead letter put back into its partition, at its
//! tail or (restoring the key's order) at its head, for the handler that
//! dead-lettered it unless others are named.

use convoy_runtime::redis::admin::AdminError;

use crate::cli::ReplayArgs;
use crate::confirm::confirm;
use crate::connect::Session;
use crate::error::CliError;
use crate::render;

/// Finds the dead letter, confirms, replays it.
pub async fn run(s: &Session, args: &ReplayArgs) -> Result<String, CliError> {
    let (admin, category, entry_id) = (&s.admin, &args.category, &args.entry_id);
    let key = args.key.value().map_err(CliError::Usage)?;
    let letters = admin.dlq(category, Some(&key)).await?;
    let Some(letter) = letters.iter().find(|l| &l.dlq_id == entry_id) else {
        return Err(AdminError::NoSuchDeadLetter {
            stream: admin.dlq_stream(category, Some(&key)).await?,
            category: category.clone(),
            key,
            id: entry_id.clone(),
        }
        .into());
    };
    let head = args.at == "head";
    if head && args.all_handlers {
        return Err(CliError::Usage(
            "--all-handlers replays at the tail: a replay at the head is for one handler".into(),
        ));
    }
    // Whom it reaches: the handler named, every handler (named in the
    // question), or the one that dead-lettered it.
    let to: Vec<String> = if args.all_handlers {
        admin.groups(category).await?
    } else if let Some(h) = &args.handler.handler {
        vec![admin.resolve_group(category, Some(&key), Some(h)).await?]
    } else {
        Vec::new()
    };
    confirm(
        &render::replay_question(category, &key, letter, &to, args.all_handlers, head),
        args.yes,
        "replay",
    )?;
    let o = if head {
        admin
            .replay_at_head(
                category,
                &key,
                entry_id,
                to.first().map(String::as_str),
                &s.who,
                args.force,
            )
            .await?
    } else {
        admin
            .replay_to(category, &key, entry_id, &to, &s.who)
            .await?
    };
    Ok(render::replay_outcome(&o, head))
}
