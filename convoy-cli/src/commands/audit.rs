//! `convoy audit`: the latest operator actions.

use crate::cli::AuditArgs;
use crate::connect::Session;
use crate::error::CliError;
use crate::render;

/// The latest `limit` audit records, as a table or JSON.
pub async fn run(s: &Session, args: &AuditArgs) -> Result<String, CliError> {
    let records = s.admin.audit(args.limit).await?;
    Ok(if args.json {
        render::json(&records)?
    } else {
        render::audit(&records)
    })
}
