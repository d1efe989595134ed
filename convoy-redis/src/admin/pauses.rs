//! Pausing and resuming keys and key prefixes (see [`crate::pause`]): one
//! field of `convoy:pauses:{category}`, an audit record in the key's shard
//! (a prefix's: the category's own shard), and a wake-up that makes every
//! engine read the pauses again.

use serde::Serialize;

use super::{Admin, AdminError};
use crate::pause::{self, KeyPause, PauseTarget};
use crate::wake;
use convoy_core::envelope::now_ms;
use convoy_core::error::Error;
use convoy_core::names;

/// What [`Admin::pause`] or [`Admin::resume`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PauseOutcome {
    /// The pause set or lifted.
    pub pause: KeyPause,
    /// The audit record's id.
    pub audit_id: String,
    /// The audit stream it is in.
    pub audit_stream: String,
}

impl Admin {
    /// Every operator's pause of `category`'s keys and key prefixes, oldest
    /// first (one `HGETALL`).
    pub async fn pauses(&self, category: &str) -> Result<Vec<KeyPause>, AdminError> {
        super::check_category(category)?;
        let mut c = self.conn.clone();
        pause::read(&mut c, category)
            .await
            .map_err(|e| Error::redis("reading the pauses", e).into())
    }

    /// Pauses `target` of `category` for `handler` (by name or last `::`
    /// segments; `None`: every handler of the category): its owners start
    /// no new event of the key (or of any key with the prefix, including
    /// keys that appear later) until [`resume`](Self::resume); the event in
    /// flight finishes, and the key keeps its place and its lease. Audited;
    /// the engines are woken to read it at once.
    pub async fn pause(
        &self,
        category: &str,
        target: &PauseTarget,
        handler: Option<&str>,
        reason: &str,
        operator: &str,
    ) -> Result<PauseOutcome, AdminError> {
        let handler = self.pause_handler(category, target, handler).await?;
        let existing = self.pauses(category).await?;
        if let Some(p) = existing
            .into_iter()
            .find(|p| p.handler == handler && &p.target == target)
        {
            return Err(AdminError::AlreadyPaused {
                category: category.to_owned(),
                pause: Box::new(p),
            });
        }
        let pause = KeyPause {
            handler,
            target: target.clone(),
            reason: reason.to_owned(),
            operator: operator.to_owned(),
            since_ms: now_ms(),
        };
        let field = KeyPause::field(pause.handler.as_deref(), target);
        let mut c = self.conn.clone();
        let _: () = redis::cmd("HSET")
            .arg(names::pauses(category))
            .arg(&field)
            .arg(pause.value())
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis("recording the pause", e))?;
        self.pause_changed(category, pause, "pause").await
    }

    /// Lifts the pause of `target` for `handler` (as it was paused: `None`
    /// for one of every handler): its owners go on with its next event, in
    /// order. Audited; the engines are woken to read it at once.
    pub async fn resume(
        &self,
        category: &str,
        target: &PauseTarget,
        handler: Option<&str>,
        operator: &str,
    ) -> Result<PauseOutcome, AdminError> {
        let handler = self.pause_handler(category, target, handler).await?;
        let Some(mut pause) = self
            .pauses(category)
            .await?
            .into_iter()
            .find(|p| p.handler == handler && &p.target == target)
        else {
            return Err(AdminError::NotPaused {
                category: category.to_owned(),
                handler,
                target: target.clone(),
            });
        };
        let field = KeyPause::field(handler.as_deref(), target);
        let mut c = self.conn.clone();
        let removed: u64 = redis::cmd("HDEL")
            .arg(names::pauses(category))
            .arg(&field)
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis("lifting the pause", e))?;
        if removed == 0 {
            // Another operator resumed it meanwhile.
            return Err(AdminError::NotPaused {
                category: category.to_owned(),
                handler,
                target: target.clone(),
            });
        }
        pause.operator = operator.to_owned();
        self.pause_changed(category, pause, "resume").await
    }

    /// The handler a pause names, resolved; the category must have one.
    async fn pause_handler(
        &self,
        category: &str,
        target: &PauseTarget,
        handler: Option<&str>,
    ) -> Result<Option<String>, AdminError> {
        super::check_category(category)?;
        if let PauseTarget::Key(k) | PauseTarget::Prefix(k) = target
            && k.is_empty()
        {
            return Err(AdminError::EmptyPause {
                category: category.to_owned(),
            });
        }
        match handler {
            Some(h) => Ok(Some(self.resolve_group(category, None, Some(h)).await?)),
            None if self.groups(category).await?.is_empty() => {
                Err(self.no_handlers(category).await)
            }
            None => Ok(None),
        }
    }

    /// Audits a pause or resume and wakes the category's engines.
    async fn pause_changed(
        &self,
        category: &str,
        pause: KeyPause,
        op: &str,
    ) -> Result<PauseOutcome, AdminError> {
        let shards = self.shards(category).await?;
        let (shard, key, prefix) = match &pause.target {
            PauseTarget::Key(k) => (names::shard_of(k, shards), k.as_str(), ""),
            PauseTarget::Prefix(p) => (names::base_shard(category, shards), "", p.as_str()),
        };
        let audit_stream = names::audit(shard);
        let time = now_ms().to_string();
        let mut c = self.conn.clone();
        let audit_id: String = redis::cmd("XADD")
            .arg(&audit_stream)
            .arg("*")
            .arg(&[
                ("op", op),
                ("category", category),
                ("key", key),
                ("prefix", prefix),
                ("group", pause.handler.as_deref().unwrap_or("")),
                ("operator", pause.operator.as_str()),
                ("reason", pause.reason.as_str()),
                ("time", time.as_str()),
                ("forced", "0"),
            ])
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis("writing the audit record", e))?;
        if let Err(e) = wake::pauses_changed(&mut c, category).await {
            crate::tracing::debug!(error = %convoy_core::error::chain(&e), "pause recorded, but the wake-up failed; the engines read it within a few heartbeats");
        }
        Ok(PauseOutcome {
            pause,
            audit_id,
            audit_stream,
        })
    }
}
