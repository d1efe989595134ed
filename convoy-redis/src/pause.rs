//! Operators' pauses of keys and key prefixes: an operator holds one key
//! (or every key of a tenant, by prefix) of a category, for one handler or
//! all of them, while fixing data by hand. A paused key keeps its place
//! and its lease; its owner starts no new event for it (the event in
//! flight finishes) until it is resumed.
//!
//! Every pause of a category is one field of `convoy:pauses:{category}` (a
//! hash outside the shards): the field names the handler (empty: every
//! handler), the kind (`key` or `prefix`) and the value, as a JSON array;
//! its value is the reason, the operator and the time, as a JSON object.
//! Each engine reads the hash when it starts, when an operator's pause or
//! resume wakes it (a wake-up entry with `p`), after a gap in its wake-ups
//! and every few heartbeats; a worker checks the set before each event only
//! while it holds any pause (no cost per event otherwise). A prefix pause
//! holds keys that appear after it too. Pauses are durable as the hash is:
//! they survive engine restarts and owner changes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// What a pause holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseTarget {
    /// One partition key.
    Key(String),
    /// Every key that starts with this (a tenant's keys), including keys
    /// first seen after the pause.
    Prefix(String),
}

impl PauseTarget {
    /// Whether it holds `key`.
    pub fn holds(&self, key: &str) -> bool {
        match self {
            PauseTarget::Key(k) => k == key,
            PauseTarget::Prefix(p) => key.starts_with(p.as_str()),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            PauseTarget::Key(_) => "key",
            PauseTarget::Prefix(_) => "prefix",
        }
    }

    fn value(&self) -> &str {
        match self {
            PauseTarget::Key(v) | PauseTarget::Prefix(v) => v,
        }
    }
}

impl std::fmt::Display for PauseTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {:?}",
            self.kind(),
            convoy_core::key::Escaped(self.value())
        )
    }
}

/// One operator's pause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyPause {
    /// The handler (consumer group) it holds; `None`: every handler of the
    /// category.
    pub handler: Option<String>,
    /// The key or prefix it holds.
    pub target: PauseTarget,
    /// Why, in the operator's words.
    pub reason: String,
    /// Who paused it.
    pub operator: String,
    /// When (ms since the Unix epoch).
    pub since_ms: u64,
}

/// A pause's value in the hash.
#[derive(Serialize, Deserialize)]
struct Held<'a> {
    #[serde(borrow)]
    reason: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    operator: std::borrow::Cow<'a, str>,
    since_ms: u64,
}

impl KeyPause {
    /// Whether it holds `key` for handler `group`.
    pub fn holds(&self, group: &str, key: &str) -> bool {
        self.handler.as_deref().is_none_or(|h| h == group) && self.target.holds(key)
    }

    /// Its field in `convoy:pauses:{category}`.
    pub(crate) fn field(handler: Option<&str>, target: &PauseTarget) -> String {
        serde_json::to_string(&[handler.unwrap_or(""), target.kind(), target.value()])
            .expect("strings always serialize")
    }

    /// Its value in `convoy:pauses:{category}`.
    pub(crate) fn value(&self) -> String {
        serde_json::to_string(&Held {
            reason: self.reason.as_str().into(),
            operator: self.operator.as_str().into(),
            since_ms: self.since_ms,
        })
        .expect("strings and integers always serialize")
    }

    /// Reads one field and value of the hash back; `None` for one this
    /// convoy did not write.
    pub(crate) fn parse(field: &[u8], value: &[u8]) -> Option<KeyPause> {
        let [handler, kind, target]: [String; 3] = serde_json::from_slice(field).ok()?;
        let held: Held<'_> = serde_json::from_slice(value).ok()?;
        Some(KeyPause {
            handler: (!handler.is_empty()).then_some(handler),
            target: match kind.as_str() {
                "key" => PauseTarget::Key(target),
                "prefix" => PauseTarget::Prefix(target),
                _ => return None,
            },
            reason: held.reason.into_owned(),
            operator: held.operator.into_owned(),
            since_ms: held.since_ms,
        })
    }
}

/// Reads every pause of `category` (one `HGETALL`), in a stable order.
pub(crate) async fn read(
    conn: &mut crate::connection::Conn,
    category: &str,
) -> Result<Vec<KeyPause>, redis::RedisError> {
    let raw: Vec<(Vec<u8>, Vec<u8>)> = redis::cmd("HGETALL")
        .arg(convoy_core::names::pauses(category))
        .query_async(conn)
        .await?;
    let mut out: Vec<KeyPause> = raw
        .iter()
        .filter_map(|(f, v)| KeyPause::parse(f, v))
        .collect();
    out.sort_by(|a, b| {
        (a.since_ms, &a.handler, a.target.value()).cmp(&(b.since_ms, &b.handler, b.target.value()))
    });
    Ok(out)
}

/// The pauses one engine's consumer of a handler knows, shared by its
/// workers: a worker looks at them before each event only while there are
/// any for the handler, and waits for a change while its key is held.
#[derive(Debug)]
pub(crate) struct Pauses {
    group: &'static str,
    any: AtomicBool,
    set: watch::Sender<Arc<Vec<KeyPause>>>,
}

impl Pauses {
    pub(crate) fn new(group: &'static str) -> Self {
        Pauses {
            group,
            any: AtomicBool::new(false),
            set: watch::Sender::new(Arc::new(Vec::new())),
        }
    }

    /// Replaces the set with `all` (every pause of the handler's
    /// categories), keeping those that hold this handler.
    pub(crate) fn update(&self, all: Vec<KeyPause>) {
        let mine: Vec<KeyPause> = all
            .into_iter()
            .filter(|p| p.handler.as_deref().is_none_or(|h| h == self.group))
            .collect();
        self.any.store(!mine.is_empty(), Ordering::SeqCst);
        self.set.send_if_modified(|old| {
            if **old == mine {
                return false;
            }
            *old = Arc::new(mine);
            true
        });
    }

    /// The pause that holds `key`, if any (no lookup while the handler has
    /// none).
    pub(crate) fn holding(&self, key: &str) -> Option<KeyPause> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        self.set
            .borrow()
            .iter()
            .find(|p| p.holds(self.group, key))
            .cloned()
    }

    /// A receiver that sees the next change (subscribe before checking, so
    /// a change between the check and the wait is not missed).
    pub(crate) fn subscribe(&self) -> watch::Receiver<Arc<Vec<KeyPause>>> {
        self.set.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pause(handler: Option<&str>, target: PauseTarget) -> KeyPause {
        KeyPause {
            handler: handler.map(str::to_owned),
            target,
            reason: "fixing balances".into(),
            operator: "alice".into(),
            since_ms: 7,
        }
    }

    #[test]
    fn fields_round_trip_whatever_the_key_holds() {
        for target in [
            PauseTarget::Key("a\"b\n[c]".into()),
            PauseTarget::Prefix("tenant-1/".into()),
        ] {
            for handler in [None, Some("app::Ledger")] {
                let p = pause(handler, target.clone());
                let field = KeyPause::field(handler, &target);
                let back = KeyPause::parse(field.as_bytes(), p.value().as_bytes());
                assert_eq!(back, Some(p));
            }
        }
        assert_eq!(KeyPause::parse(b"not json", b"{}"), None);
    }

    #[test]
    fn a_pause_holds_its_handler_and_keys_only() {
        let p = pause(Some("g"), PauseTarget::Prefix("t1-".into()));
        assert!(p.holds("g", "t1-a"));
        assert!(p.holds("g", "t1-later"), "keys seen after the pause too");
        assert!(!p.holds("g", "t2-a"));
        assert!(!p.holds("other", "t1-a"));
        let every = pause(None, PauseTarget::Key("k".into()));
        assert!(every.holds("g", "k") && every.holds("other", "k"));
        assert!(!every.holds("g", "k2"));
    }

    #[test]
    fn the_set_holds_only_the_handlers_pauses() {
        let pauses = Pauses::new("g");
        assert_eq!(pauses.holding("k"), None);
        pauses.update(vec![
            pause(Some("other"), PauseTarget::Key("k".into())),
            pause(None, PauseTarget::Prefix("t".into())),
        ]);
        assert_eq!(pauses.holding("k"), None, "another handler's pause");
        assert!(pauses.holding("t9").is_some());
        pauses.update(Vec::new());
        assert_eq!(pauses.holding("t9"), None, "resumed");
    }
}
