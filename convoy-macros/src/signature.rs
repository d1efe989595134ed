//! Checks shared by the `#[handle]` methods of handlers and process
//! managers: what any such method must be, whatever its receiver.

use std::fmt::Display;

use proc_macro2::Span;
use quote::ToTokens;
use syn::{Safety, Signature};

use crate::ctxt::Ctxt;

/// Collects the problems of one method and remembers whether there were any.
pub(crate) struct Problems<'c> {
    pub(crate) cx: &'c Ctxt,
    pub(crate) found: bool,
}

impl Problems<'_> {
    /// A problem with `tokens` (spanned across all of them).
    pub(crate) fn on(&mut self, tokens: impl ToTokens, message: impl Display) {
        self.cx.error_spanned_by(tokens, message);
        self.found = true;
    }

    /// A problem at `span`.
    pub(crate) fn at(&mut self, span: Span, message: impl Display) {
        self.cx.error_at(span, message);
        self.found = true;
    }
}

/// A `#[handle]` method is a plain `async fn`: not `const`, `unsafe`,
/// `extern`, generic or variadic. `shape` is the expected signature, shown
/// when `async` is missing.
pub(crate) fn check_qualifiers(problems: &mut Problems<'_>, sig: &Signature, shape: &str) {
    if let Some(constness) = &sig.constness {
        problems.on(constness, "`#[handle]` methods cannot be `const`");
    }
    if sig.asyncness.is_none() {
        problems.on(
            sig.fn_token,
            format!("`#[handle]` methods must be `async`: {shape}"),
        );
    }
    if let Safety::Unsafe(unsafety) = &sig.safety {
        problems.on(unsafety, "`#[handle]` methods cannot be `unsafe`");
    }
    if let Some(abi) = &sig.abi {
        problems.on(abi, "`#[handle]` methods cannot have an ABI");
    }
    if !sig.generics.params.is_empty() {
        problems.on(
            &sig.generics,
            "`#[handle]` methods cannot be generic: each handles one concrete type",
        );
    } else if let Some(where_clause) = &sig.generics.where_clause {
        problems.on(
            where_clause,
            "`#[handle]` methods cannot be generic: each handles one concrete type",
        );
    }
    if let Some(variadic) = &sig.variadic {
        problems.on(variadic, "`#[handle]` methods cannot be variadic");
    }
}
