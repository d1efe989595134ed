//! Process-manager instances in Redis: one hash per instance,
//! `convoy:pm:{process manager}:{correlation value}` with `version`,
//! `state` (JSON) and `ended`, saved by a version-checking script.

use std::sync::Arc;

use super::connection::{Conn, Connection};
use super::scripts::save_state::{SaveState, Saved};
use convoy_core::error::Error;
use convoy_core::future::BoxFuture;
use convoy_core::names;
use convoy_core::process_manager::{StateStore, StoredState};

/// Process-manager state kept in Redis.
pub(crate) struct RedisStateStore {
    redis: Arc<Connection>,
}

impl std::fmt::Debug for RedisStateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStateStore").finish_non_exhaustive()
    }
}

impl RedisStateStore {
    pub(crate) fn new(redis: Arc<Connection>) -> Self {
        RedisStateStore { redis }
    }

    async fn conn(&self) -> Result<Conn, Error> {
        self.redis.shared().await
    }
}

impl StateStore for RedisStateStore {
    fn load<'a>(
        &'a self,
        pm: &'a str,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredState>, Error>> {
        Box::pin(async move {
            let mut c = self.conn().await?;
            #[allow(clippy::type_complexity)]
            let (version, state, ended, applied): (
                Option<u64>,
                Option<String>,
                Option<String>,
                Option<String>,
            ) = redis::cmd("HMGET")
                .arg(names::pm_state(pm, id))
                .arg("version")
                .arg("state")
                .arg("ended")
                .arg("applied")
                .query_async(&mut c)
                .await
                .map_err(|e| Error::redis("failed to load a process-manager instance", e))?;
            Ok(match (version, state) {
                (Some(version), Some(state)) => Some(StoredState {
                    version,
                    state,
                    ended: ended.as_deref() == Some("1"),
                    applied: applied
                        .and_then(|a| serde_json::from_str(&a).ok())
                        .unwrap_or_default(),
                }),
                _ => None,
            })
        })
    }

    fn save<'a>(
        &'a self,
        pm: &'a str,
        id: &'a str,
        expected: u64,
        state: StoredState,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async move {
            let mut c = self.conn().await?;
            let applied = serde_json::to_string(&state.applied).unwrap_or_else(|_| "[]".into());
            SaveState {
                pm,
                id,
                expected,
                state: &state.state,
                ended: state.ended,
                applied: &applied,
            }
            .run(&mut c)
            .await
            .map(|saved| saved == Saved::Saved)
        })
    }
}
