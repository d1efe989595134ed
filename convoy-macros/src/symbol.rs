//! The names convoy's macros recognise, in one place, and the "did you
//! mean" helper used when a user misspells one.

use std::fmt::{self, Display};

use syn::ext::IdentExt;
use syn::{Ident, Path};

/// An attribute or argument name.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Symbol(pub(crate) &'static str);

/// `#[aggregate(..)]`, the helper attribute of `#[derive(Aggregate)]`.
pub(crate) const AGGREGATE: Symbol = Symbol("aggregate");
/// `#[event(..)]`, the helper attribute of `#[derive(Event)]`.
pub(crate) const EVENT: Symbol = Symbol("event");
/// `#[command(..)]`, the helper attribute of `#[derive(Command)]`.
pub(crate) const COMMAND: Symbol = Symbol("command");
/// `category = "..."` in `#[aggregate(..)]`.
pub(crate) const CATEGORY: Symbol = Symbol("category");
/// `partition_key = "field"` in `#[aggregate(..)]`.
pub(crate) const PARTITION_KEY: Symbol = Symbol("partition_key");
/// `name = "..."` in `#[event(..)]` / `#[command(..)]`.
pub(crate) const NAME: Symbol = Symbol("name");
/// `part_of = Aggregate`, in message derives and handler attributes.
pub(crate) const PART_OF: Symbol = Symbol("part_of");
/// `sequential_by = "field"` in handler attributes.
pub(crate) const SEQUENTIAL_BY: Symbol = Symbol("sequential_by");
/// `on_poison = "halt" | "dead_letter"` in `#[event_handler(..)]`.
pub(crate) const ON_POISON: Symbol = Symbol("on_poison");
/// `handles = [A, B]` in handler attributes on a struct.
pub(crate) const HANDLES: Symbol = Symbol("handles");
/// `reply = Type` in `#[command(..)]`.
pub(crate) const REPLY: Symbol = Symbol("reply");
/// `#[handle]`, the marker of handler methods.
pub(crate) const HANDLE: Symbol = Symbol("handle");

/// The arguments of `#[event_handler(..)]` and `#[command_handler(..)]`.
pub(crate) const HANDLER_ARGS: &[Symbol] = &[PART_OF, SEQUENTIAL_BY, HANDLES, NAME, ON_POISON];
/// The arguments of `#[aggregate(..)]`.
pub(crate) const AGGREGATE_ARGS: &[Symbol] = &[CATEGORY, PARTITION_KEY];
/// The arguments of `#[event(..)]` and `#[command(..)]`.
pub(crate) const MESSAGE_ARGS: &[Symbol] = &[PART_OF, NAME, REPLY];

impl PartialEq<Symbol> for Ident {
    fn eq(&self, word: &Symbol) -> bool {
        self == word.0
    }
}

impl PartialEq<Symbol> for &Ident {
    fn eq(&self, word: &Symbol) -> bool {
        *self == word.0
    }
}

impl PartialEq<Symbol> for Path {
    fn eq(&self, word: &Symbol) -> bool {
        self.is_ident(word.0)
    }
}

impl PartialEq<Symbol> for &Path {
    fn eq(&self, word: &Symbol) -> bool {
        self.is_ident(word.0)
    }
}

impl Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// The message for an unknown argument `unknown` where `valid` are accepted:
/// suggests the nearest valid name when it is close, otherwise lists them.
pub(crate) fn unknown_argument(unknown: &str, valid: &[Symbol]) -> String {
    match nearest(unknown, valid) {
        Some(best) => format!("unknown argument `{unknown}`; did you mean `{best}`?"),
        None => format!("unknown argument `{unknown}`; expected {}", one_of(valid)),
    }
}

/// [`unknown_argument`] as an error spanned on the argument `unknown`
/// (written raw or not).
pub(crate) fn unknown_argument_at(unknown: &Ident, valid: &[Symbol]) -> syn::Error {
    syn::Error::new(
        unknown.span(),
        unknown_argument(&unknown.unraw().to_string(), valid),
    )
}

/// "`a`", "`a` or `b`", "`a`, `b` or `c`".
pub(crate) fn one_of(valid: &[Symbol]) -> String {
    let quoted: Vec<String> = valid.iter().map(|s| format!("`{s}`")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// The valid name nearest to `unknown` by edit distance, when near enough
/// to be a plausible typo: at most one edit per three characters, at least
/// one.
pub(crate) fn nearest(unknown: &str, valid: &[Symbol]) -> Option<Symbol> {
    let limit = (unknown.chars().count() / 3).max(1);
    valid
        .iter()
        .map(|s| (edit_distance(unknown, s.0), *s))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, s)| s)
}

/// Edit distance between `a` and `b`, by characters: insertions, deletions,
/// substitutions and transpositions of neighbours (`nmae` is one edit from
/// `name`) each count one.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // d[i][j]: distance between a[..i] and b[..j].
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("part_of", "part_of"), 0);
        assert_eq!(edit_distance("sequental_by", "sequential_by"), 1);
        assert_eq!(edit_distance("partof", "part_of"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("nmae", "name"), 1);
    }

    #[test]
    fn suggests_the_nearest_name_when_close() {
        assert_eq!(nearest("sequental_by", HANDLER_ARGS), Some(SEQUENTIAL_BY));
        assert_eq!(
            nearest("sequentially_by", HANDLER_ARGS),
            Some(SEQUENTIAL_BY)
        );
        assert_eq!(nearest("partof", HANDLER_ARGS), Some(PART_OF));
        assert_eq!(nearest("handle", HANDLER_ARGS), Some(HANDLES));
        assert_eq!(nearest("nme", MESSAGE_ARGS), Some(NAME));
        assert_eq!(nearest("key", HANDLER_ARGS), None);
        assert_eq!(nearest("correlate", HANDLER_ARGS), None);
    }

    #[test]
    fn unknown_argument_messages() {
        assert_eq!(
            unknown_argument("sequental_by", HANDLER_ARGS),
            "unknown argument `sequental_by`; did you mean `sequential_by`?"
        );
        assert_eq!(
            unknown_argument("key", HANDLER_ARGS),
            "unknown argument `key`; expected `part_of`, `sequential_by`, `handles`, `name` or `on_poison`"
        );
        assert_eq!(
            unknown_argument("x", AGGREGATE_ARGS),
            "unknown argument `x`; expected `category` or `partition_key`"
        );
        assert_eq!(
            unknown_argument("kind", MESSAGE_ARGS),
            "unknown argument `kind`; expected `part_of`, `name` or `reply`"
        );
    }
}
