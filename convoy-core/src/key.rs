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

/// The first segment of every key convoy keeps for itself
/// (`convoy:lease:..`, `convoy:unit:..`, the `convoy:audit` stream): no
/// category may have this name, or its partitions would be convoy's keys.
pub const OWN_PREFIX: &str = "convoy";

/// Why a category name was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CategoryRule {
    /// The name is empty.
    Empty,
    /// The name contains `:`, the stream name separator.
    Colon,
    /// The name contains whitespace, a control character or a character
    /// that must be escaped for a terminal (see [`needs_escape`]).
    Whitespace,
    /// The name is `convoy`, the prefix of convoy's own keys.
    Reserved,
}

impl fmt::Display for CategoryRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CategoryRule::Empty => "a category must not be empty",
            CategoryRule::Colon => {
                "a category must not contain `:`; it is the first segment of stream names (`{category}:{key}`)"
            }
            CategoryRule::Whitespace => {
                "a category must not contain whitespace, control or bidirectional characters"
            }
            CategoryRule::Reserved => {
                "`convoy` is reserved: convoy's own keys (`convoy:lease:..`, the `convoy:audit` stream) start with it; name the aggregate's category otherwise, for example `#[aggregate(category = \"...\")]`"
            }
        })
    }
}

/// Checks a category name: the first segment of every stream name of the
/// category, so it must not reach another category's streams or convoy's
/// own keys. (The `Aggregate` derive checks the same at compile time.)
pub fn check_category(category: &str) -> Result<(), CategoryRule> {
    if category.is_empty() {
        return Err(CategoryRule::Empty);
    }
    if category.contains(':') {
        return Err(CategoryRule::Colon);
    }
    if category
        .chars()
        .any(|c| c.is_whitespace() || needs_escape(c))
    {
        return Err(CategoryRule::Whitespace);
    }
    if category == OWN_PREFIX {
        return Err(CategoryRule::Reserved);
    }
    Ok(())
}

/// Text that came from users or from Redis (a key value, an error
/// message, an entry's field) made safe for a terminal or a log line:
/// control characters, Unicode bidirectional controls, line and paragraph
/// separators and invisible format characters are written as escapes
/// (`\n`, `\t`, `\0`, `\u{202e}`), and `\` as `\\`, so the text keeps one
/// line, cannot reorder or hide what is around it, and reads back
/// unambiguously. `Display` writes the escaped text, `Debug` the same in
/// double quotes (`"` escaped), the form log fields use:
///
/// ```
/// use convoy_runtime::key::Escaped;
/// assert_eq!(Escaped("acme").to_string(), "acme");
/// assert_eq!(Escaped("a\nb\u{202e}c").to_string(), "a\\nb\\u{202e}c");
/// assert_eq!(format!("{:?}", Escaped("say \"hi\"")), "\"say \\\"hi\\\"\"");
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Escaped<'a>(pub &'a str);

impl Escaped<'_> {
    fn write(&self, f: &mut fmt::Formatter<'_>, quoted: bool) -> fmt::Result {
        use fmt::Write as _;
        let s = self.0;
        if !s
            .chars()
            .any(|c| needs_escape(c) || c == '\\' || (quoted && c == '"'))
        {
            return f.write_str(s);
        }
        for c in s.chars() {
            match c {
                '\\' => f.write_str("\\\\")?,
                '"' if quoted => f.write_str("\\\"")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                '\0' => f.write_str("\\0")?,
                c if needs_escape(c) => write!(f, "\\u{{{:x}}}", c as u32)?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f, false)
    }
}

impl fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"")?;
        self.write(f, true)?;
        f.write_str("\"")
    }
}

/// Whether `c` must not reach a terminal or a log line as itself: control
/// characters (C0, DEL, C1), bidirectional controls, line and paragraph
/// separators, and invisible format characters (zero-width ones, the BOM,
/// soft hyphen).
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00ad}'
                | '\u{061c}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
        )
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

    /// Every partitioned category with its key field.
    pub(crate) fn key_fields(&self) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
        self.category_keys.iter().map(|(c, f)| (*c, *f))
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

    #[test]
    fn categories() {
        assert_eq!(check_category("order"), Ok(()));
        assert_eq!(check_category(""), Err(CategoryRule::Empty));
        assert_eq!(check_category("a:b"), Err(CategoryRule::Colon));
        assert_eq!(check_category("a b"), Err(CategoryRule::Whitespace));
        assert_eq!(check_category("convoy"), Err(CategoryRule::Reserved));
        assert_eq!(check_category("convoys"), Ok(()));
        assert!(CategoryRule::Reserved.to_string().contains("convoy:audit"));
    }

    #[test]
    fn escaping() {
        assert_eq!(Escaped("client-1").to_string(), "client-1");
        assert_eq!(Escaped("a\r\nb").to_string(), "a\\r\\nb");
        assert_eq!(
            Escaped("\u{1b}[31mred\r\n\0\u{202e}\u{2066}x\u{85}").to_string(),
            "\\u{1b}[31mred\\r\\n\\0\\u{202e}\\u{2066}x\\u{85}"
        );
        assert_eq!(Escaped("a\\b").to_string(), "a\\\\b");
        assert_eq!(
            Escaped("\u{200b}\u{feff}").to_string(),
            "\\u{200b}\\u{feff}"
        );
        assert_eq!(format!("{:?}", Escaped("k\"1\"")), "\"k\\\"1\\\"\"");
        assert_eq!(format!("{:?}", Escaped("")), "\"\"");
    }

    proptest! {
        #[test]
        fn escaped_text_is_one_safe_line(s in any::<String>()) {
            let e = Escaped(&s).to_string();
            prop_assert!(!e.chars().any(needs_escape), "{e:?}");
        }

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
