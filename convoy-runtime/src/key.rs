//! Partition key values: the rules a key must satisfy to become a stream name
//! segment, and the per-category key policy of a domain.

use std::collections::BTreeMap;
use std::fmt;

/// The reserved token of the dead-letter stream suffix.
pub const DLQ_TOKEN: &str = "dlq";

/// Why a partition key value was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyRule {
    /// The value is null (`None`).
    Null,
    /// The value is the empty string.
    Empty,
    /// The value contains `:`, the stream name separator.
    Colon,
    /// The value is the reserved dead-letter token `dlq`.
    ReservedDlq,
    /// The value equals the configured backfill lane suffix.
    ReservedBackfill,
    /// The value has the reserved `__name__` sentinel form.
    Sentinel,
}

impl fmt::Display for KeyRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyRule::Null => "a partition key must not be null",
            KeyRule::Empty => "a partition key must not be empty",
            KeyRule::Colon => "a partition key must not contain `:` (it separates stream name segments)",
            KeyRule::ReservedDlq => "`dlq` is reserved for dead-letter streams",
            KeyRule::ReservedBackfill => {
                "the backfill lane suffix ([server.priority_lanes] backfill_suffix) is reserved"
            }
            KeyRule::Sentinel => {
                "keys of the form `__name__` are reserved for convoy's own keys (such as `__partitions__`)"
            }
        })
    }
}

/// Checks one key value against every rule.
///
/// Entity identifiers (client ids, UUIDs, integers) always pass.
pub fn check_key(value: Option<&str>, backfill_suffix: &str) -> Result<(), KeyRule> {
    let v = value.ok_or(KeyRule::Null)?;
    if v.is_empty() {
        return Err(KeyRule::Empty);
    }
    if v.contains(':') {
        return Err(KeyRule::Colon);
    }
    if v == DLQ_TOKEN {
        return Err(KeyRule::ReservedDlq);
    }
    if v == backfill_suffix {
        return Err(KeyRule::ReservedBackfill);
    }
    if is_sentinel(v) {
        return Err(KeyRule::Sentinel);
    }
    Ok(())
}

/// Whether `v` has the reserved `__name__` form.
pub(crate) fn is_sentinel(v: &str) -> bool {
    v.len() > 4 && v.starts_with("__") && v.ends_with("__")
}

/// Which field partitions each category, and the lane suffix that keys must
/// avoid. Built by `Domain::init` from the validated handlers.
///
/// Not a stable API: public only so that a [`Context`](crate::Context) can
/// be made by hand to drive a handler in a test.
#[doc(hidden)]
#[derive(Debug, Clone, Default)]
pub struct KeyPolicy {
    pub(crate) category_keys: BTreeMap<&'static str, &'static str>,
    pub(crate) backfill_suffix: String,
}

impl KeyPolicy {
    /// A policy with these category keys.
    pub fn new(
        category_keys: BTreeMap<&'static str, &'static str>,
        backfill_suffix: impl Into<String>,
    ) -> Self {
        KeyPolicy {
            category_keys,
            backfill_suffix: backfill_suffix.into(),
        }
    }

    /// The key field of `category`, if the category is partitioned.
    pub fn key_field(&self, category: &str) -> Option<&'static str> {
        self.category_keys.get(category).copied()
    }

    /// The backfill suffix keys must not equal.
    pub fn backfill_suffix(&self) -> &str {
        &self.backfill_suffix
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn each_rule() {
        let b = "backfill";
        assert_eq!(check_key(None, b), Err(KeyRule::Null));
        assert_eq!(check_key(Some(""), b), Err(KeyRule::Empty));
        assert_eq!(check_key(Some("a:b"), b), Err(KeyRule::Colon));
        assert_eq!(check_key(Some("dlq"), b), Err(KeyRule::ReservedDlq));
        assert_eq!(
            check_key(Some("backfill"), b),
            Err(KeyRule::ReservedBackfill)
        );
        assert_eq!(
            check_key(Some("slow"), "slow"),
            Err(KeyRule::ReservedBackfill)
        );
        assert_eq!(check_key(Some("backfill"), "slow"), Ok(()));
        assert_eq!(check_key(Some("__partitions__"), b), Err(KeyRule::Sentinel));
        assert_eq!(check_key(Some("__x__"), b), Err(KeyRule::Sentinel));
        assert_eq!(check_key(Some("____"), b), Ok(()));
        assert_eq!(check_key(Some("__x"), b), Ok(()));
        assert_eq!(check_key(Some("client-1"), b), Ok(()));
    }

    proptest! {
        #[test]
        fn uuids_always_pass(bytes in any::<[u8; 16]>()) {
            let u = uuid::Uuid::from_bytes(bytes);
            prop_assert_eq!(check_key(Some(&u.to_string()), "backfill"), Ok(()));
            prop_assert_eq!(check_key(Some(&u.simple().to_string()), "backfill"), Ok(()));
        }

        #[test]
        fn integers_always_pass(n in any::<i64>()) {
            prop_assert_eq!(check_key(Some(&n.to_string()), "backfill"), Ok(()));
        }

        #[test]
        fn any_colon_is_rejected(a in ".*", b in ".*") {
            let v = format!("{a}:{b}");
            prop_assert!(check_key(Some(&v), "backfill").is_err());
        }

        #[test]
        fn sentinel_form_is_rejected(name in "[a-z_]{1,12}") {
            let v = format!("__{name}__");
            prop_assert_eq!(check_key(Some(&v), "backfill"), Err(KeyRule::Sentinel));
        }

        #[test]
        fn accepted_keys_obey_every_rule(v in "\\PC{0,24}", suffix in "[a-z]{1,8}") {
            if check_key(Some(&v), &suffix).is_ok() {
                prop_assert!(!v.is_empty());
                prop_assert!(!v.contains(':'));
                prop_assert!(v != "dlq" && v != suffix);
                prop_assert!(!(v.len() > 4 && v.starts_with("__") && v.ends_with("__")));
            }
        }
    }
}
