//! Checks shared by the `#[handle]` methods of handlers and process
//! managers: what any such method must be, with the receiver each asks
//! for.

use std::fmt::Display;

use proc_macro2::Span;
use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::{FnArg, ReceiverKind, ReturnType, Safety, Signature, Type};

use crate::ctxt::Ctxt;

/// Collects the problems of one method and remembers whether there were any.
struct Problems<'c> {
    cx: &'c Ctxt,
    found: bool,
}

impl Problems<'_> {
    /// A problem with `tokens` (spanned across all of them).
    fn on(&mut self, tokens: impl ToTokens, message: impl Display) {
        self.cx.error_spanned_by(tokens, message);
        self.found = true;
    }

    /// A problem at `span`.
    fn at(&mut self, span: Span, message: impl Display) {
        self.cx.error_at(span, message);
        self.found = true;
    }
}

/// The receiver the `#[handle]` methods of one macro take, and how its
/// errors name them.
pub(crate) struct Receiver<'m> {
    /// `&mut self` (a process manager's state) rather than `&self`.
    pub(crate) mutable: bool,
    /// Whose methods they are, after "methods" in errors (`""`,
    /// `" of a process manager"`).
    pub(crate) owner: &'m str,
    /// Why a reference of the other mutability is wrong.
    pub(crate) wrong_mutability: &'m str,
}

/// Checks a `#[handle]` method,
/// `async fn name(<receiver>, <noun>: T [, ctx: &Context]) -> Result<(), E>`
/// (the argument after `before_ctx` is the context), reporting every
/// problem. Returns what the arguments say and whether a problem was found.
pub(crate) fn check_method<'a>(
    cx: &Ctxt,
    sig: &'a Signature,
    receiver: &Receiver<'_>,
    noun: &str,
    before_ctx: &str,
) -> (Arguments<'a>, bool) {
    let Receiver {
        mutable,
        owner,
        wrong_mutability,
    } = *receiver;
    let self_ref = if mutable { "&mut self" } else { "&self" };
    let shape = format!(
        "`async fn {}({self_ref}, {noun}: OrderPlaced, ctx: &Context) -> Result<(), HandlerError>`",
        sig.ident
    );
    let mut problems = Problems { cx, found: false };

    check_qualifiers(&mut problems, sig, &shape);

    let mut inputs = sig.inputs.iter();
    match inputs.next() {
        Some(FnArg::Receiver(receiver)) => match &receiver.kind {
            ReceiverKind::Reference(_, _, m)
                if m.is_some() == mutable && (mutable || receiver.mutability.is_none()) => {}
            ReceiverKind::Reference(_, _, m) if m.is_some() != mutable => {
                problems.on(receiver, wrong_mutability)
            }
            _ => problems.on(
                receiver,
                format!("`#[handle]` methods{owner} take `{self_ref}`: {shape}"),
            ),
        },
        _ => problems.at(
            sig.paren_token.span.join(),
            format!("`#[handle]` methods{owner} take `{self_ref}` first: {shape}"),
        ),
    }

    let arguments = check_arguments(&mut problems, sig, inputs, noun, before_ctx, &shape);
    (arguments, problems.found)
}

/// A `#[handle]` method is a plain `async fn`: not `const`, `unsafe`,
/// `extern`, generic or variadic. `shape` is the expected signature, shown
/// when `async` is missing.
fn check_qualifiers(problems: &mut Problems<'_>, sig: &Signature, shape: &str) {
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

/// What the arguments and the return type of a `#[handle]` method say.
pub(crate) struct Arguments<'a> {
    /// The handled type, when it could be read.
    pub(crate) message: Option<&'a Type>,
    /// The method takes the context after the message.
    pub(crate) with_ctx: bool,
    /// The declared return type, when it is not `()`.
    pub(crate) output: Option<&'a Type>,
}

/// Checks what follows the receiver: the `noun` by value, an optional
/// `ctx: &Context` (the argument after the `before_ctx`), nothing more, and
/// a `Result` return type. `shape` is the expected signature.
fn check_arguments<'a>(
    problems: &mut Problems<'_>,
    sig: &'a Signature,
    mut inputs: impl Iterator<Item = &'a FnArg>,
    noun: &str,
    before_ctx: &str,
    shape: &str,
) -> Arguments<'a> {
    let returns = "`#[handle]` methods return `Result<(), E>` where `E` converts into `convoy_runtime::HandlerError`";
    let mut context_first = false;
    let message = match inputs.next() {
        Some(FnArg::Typed(arg)) if is_context(&arg.ty) => {
            let article = if noun.starts_with(['a', 'e', 'i', 'o', 'u']) {
                "an"
            } else {
                "a"
            };
            problems.on(
                arg,
                format!(
                    "`Context` is not {article} {noun}: the {noun} comes first, then the context by shared reference: {shape}"
                ),
            );
            context_first = true;
            None
        }
        Some(FnArg::Typed(arg)) => match &*arg.ty {
            Type::Reference(r) => {
                problems.on(
                    r.and_token,
                    format!("the {noun} is passed by value: remove the `&`"),
                );
                None
            }
            Type::ImplTrait(_) | Type::Infer(_) => {
                problems.on(&arg.ty, format!("name the {noun} type here: {shape}"));
                None
            }
            ty => Some(ty),
        },
        Some(other) => {
            problems.on(other, format!("expected the {noun} argument: {shape}"));
            None
        }
        None => {
            problems.at(
                sig.paren_token.span.join(),
                format!("missing the {noun} argument: {shape}"),
            );
            None
        }
    };

    let with_ctx = match inputs.next() {
        None => false,
        // Already reported as the context written before the message: the
        // argument after it is most likely the message, not a context.
        Some(_) if context_first => true,
        Some(FnArg::Typed(arg)) => {
            match &*arg.ty {
                Type::Reference(r) if r.mutability.is_none() => {}
                other => problems.on(
                    other,
                    format!(
                        "the argument after the {before_ctx} is the handler context, taken by shared reference: `ctx: &Context`"
                    ),
                ),
            }
            true
        }
        Some(other) => {
            problems.on(
                other,
                format!(
                    "the argument after the {before_ctx} is the handler context: `ctx: &Context`"
                ),
            );
            true
        }
    };
    let extra: TokenStream = inputs.map(ToTokens::to_token_stream).collect();
    if !extra.is_empty() {
        problems.on(&extra, format!("too many arguments: {shape}"));
    }

    let output = match &sig.output {
        ReturnType::Type(_, ty) if matches!(&**ty, Type::Tuple(t) if t.elems.is_empty()) => {
            problems.on(ty, returns);
            None
        }
        ReturnType::Type(_, ty) => Some(&**ty),
        ReturnType::Default => {
            problems.at(
                sig.paren_token.span.close(),
                format!("{returns}: add `-> Result<(), HandlerError>`"),
            );
            None
        }
    };
    Arguments {
        message,
        with_ctx,
        output,
    }
}

/// Whether `ty` is the handler context (`Context`, `&Context`,
/// `convoy_runtime::Context`, ..): the last path segment is `Context`.
fn is_context(ty: &Type) -> bool {
    match ty {
        Type::Reference(r) => is_context(&r.elem),
        Type::Paren(p) => is_context(&p.elem),
        Type::Path(path) if path.qself.is_none() => path
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "Context" && s.arguments.is_empty()),
        _ => false,
    }
}
