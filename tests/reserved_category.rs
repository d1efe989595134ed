//! A category that would reach convoy's own keys is refused by
//! `Domain::init` even when the aggregate is implemented by hand (the
//! derive refuses it at compile time: `tests/ui/derive/fail/aggregate-category-convoy.rs`).
//! Its own binary: every message linked into a binary is declared to
//! every domain of it.

use convoy_runtime::{Aggregate, Domain, Error, Event, Problem};
use serde::{Deserialize, Serialize};

/// By hand, past the derive's check: its partitions would be `convoy:{key}`
/// (`convoy:audit` is the operators' audit stream).
struct Audit;

impl Aggregate for Audit {
    const CATEGORY: &'static str = "convoy";
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Audit)]
struct Noted {
    key: String,
}

#[test]
fn init_refuses_the_category_convoy() {
    let e = Domain::builder().init().expect_err("convoy is reserved");
    assert!(matches!(e, Error::IncorrectUsage(_)), "{e}");
    let problems = e.problems();
    assert!(
        problems
            .iter()
            .any(|p| matches!(p, Problem::BadCategory { category, .. } if category == "convoy")),
        "{e}"
    );
    let text = e.to_string();
    assert!(
        text.contains(
            "`Noted` is in category \"convoy\", which cannot be used: `convoy` is reserved"
        ),
        "{text}"
    );
    let _ = Noted { key: String::new() }.key;
}
