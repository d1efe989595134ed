//! Integration tests, UI tests and examples of convoy. Not published; see the
//! `convoy-runtime` crate for the library users depend on.
