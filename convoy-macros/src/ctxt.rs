//! Error accumulator shared by every macro.
//!
//! Independent problems (two bad `#[handle]` methods, a bad attribute on a
//! derive and a missing `part_of`) are collected here and reported together;
//! problems inside one attribute fail fast through `syn::Result` instead.

use std::cell::RefCell;
use std::fmt::Display;
use std::thread;

use proc_macro2::Span;
use quote::ToTokens;

/// Collects errors while a macro input is parsed and validated.
///
/// Shared by `&` (the errors live in a `RefCell`). [`Ctxt::check`] must be
/// called before the context is dropped, so that no error can be lost: a
/// forgotten check panics, which fails the build loudly instead of silently
/// accepting bad input.
pub(crate) struct Ctxt {
    errors: RefCell<Option<Vec<syn::Error>>>,
}

impl Ctxt {
    /// An empty context.
    pub(crate) fn new() -> Self {
        Ctxt {
            errors: RefCell::new(Some(Vec::new())),
        }
    }

    /// Records an error spanned on `tokens` (the whole token range).
    pub(crate) fn error_spanned_by<T: ToTokens, M: Display>(&self, tokens: T, message: M) {
        self.syn_error(syn::Error::new_spanned(tokens.into_token_stream(), message));
    }

    /// Records an error at `span`.
    pub(crate) fn error_at<M: Display>(&self, span: Span, message: M) {
        self.syn_error(syn::Error::new(span, message));
    }

    /// Records an error produced by a parser.
    pub(crate) fn syn_error(&self, error: syn::Error) {
        self.errors
            .borrow_mut()
            .as_mut()
            .expect("Ctxt used after check()")
            .push(error);
    }

    /// Records the error of `result`, if any, and returns its value.
    pub(crate) fn ok<T>(&self, result: syn::Result<T>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(error) => {
                self.syn_error(error);
                None
            }
        }
    }

    /// Whether an error was recorded so far.
    pub(crate) fn has_errors(&self) -> bool {
        self.errors
            .borrow()
            .as_ref()
            .is_some_and(|errors| !errors.is_empty())
    }

    /// Consumes the context: every recorded error combined into one, if any.
    pub(crate) fn check(self) -> syn::Result<()> {
        let errors = self.errors.borrow_mut().take().expect("Ctxt checked twice");
        let mut errors = errors.into_iter();
        let Some(mut combined) = errors.next() else {
            return Ok(());
        };
        for error in errors {
            combined.combine(error);
        }
        Err(combined)
    }
}

/// The messages of the errors `check` records, in order; when it records
/// none, it must have succeeded (returned `Some`). For tests.
#[cfg(test)]
pub(crate) fn messages<T>(check: impl FnOnce(&Ctxt) -> Option<T>) -> Vec<String> {
    let cx = Ctxt::new();
    let value = check(&cx);
    match cx.check() {
        Ok(()) => {
            assert!(value.is_some(), "rejected without an error");
            Vec::new()
        }
        Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !thread::panicking() && self.errors.borrow().is_some() {
            panic!("convoy-macros bug: Ctxt dropped without check()");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combines_errors_in_order() {
        let cx = Ctxt::new();
        assert!(!cx.has_errors());
        cx.error_at(Span::call_site(), "first");
        cx.error_at(Span::call_site(), "second");
        assert!(cx.has_errors());
        let err = cx.check().expect_err("two errors");
        let messages: Vec<String> = err.into_iter().map(|e| e.to_string()).collect();
        assert_eq!(messages, ["first", "second"]);
    }

    #[test]
    fn empty_context_checks_ok() {
        Ctxt::new().check().expect("no errors");
    }

    #[test]
    #[should_panic(expected = "without check()")]
    fn dropping_unchecked_context_panics() {
        let _cx = Ctxt::new();
    }
}
