//! `convoy dlq`: the dead letters of a key, or of a category's ordinary
//! handlers.

use crate::cli::{DlqArgs, optional_key};
use crate::connect::Session;
use crate::error::CliError;
use crate::render;

/// The key's dead letters with a key, else the category's.
pub async fn run(s: &Session, args: &DlqArgs) -> Result<String, CliError> {
    let category = &args.category;
    let key = optional_key(args.key.as_deref(), args.key_hex).map_err(CliError::Usage)?;
    let letters = s.admin.dlq(category, key.as_deref()).await?;
    if args.json {
        return Ok(render::json(&letters)?);
    }
    let stream = match letters.first() {
        Some(l) => l.stream.clone(),
        None => s.admin.dlq_stream(category, key.as_deref()).await?,
    };
    Ok(render::dead_letters(&render::stream(&stream), &letters))
}
