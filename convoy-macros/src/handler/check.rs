//! Validation of a handler declaration, and the never-run code that makes
//! rustc check what the macro cannot see.
//!
//! [`validate`] looks at the parsed arguments together with the item
//! (methods, types, the form of the declaration) and builds the model that
//! `expand` turns into code; every independent problem is reported. The
//! facts that only the type checker knows (does `OrderShipped` have a
//! `client_id` field, and is it a key type?) become [`field_checks`]: functions
//! that are compiled but never called, spanned at the user's tokens so that
//! rustc's errors point there.

use proc_macro2::TokenStream;
use quote::{ToTokens, format_ident, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Ident, ImplItemFn, Item, ItemImpl, ItemStruct, Path, Type};

use super::attr::{self, Args};
use crate::ctxt::Ctxt;
use crate::impl_block::{
    self, Header, QuotedField, check_header, item_keyword_span, reject_generics, written,
};
use crate::message::Kind;
use crate::signature::{Arguments, Receiver, check_method};

/// A validated handler declaration.
pub(crate) struct Handler<'a> {
    /// Event or command handler.
    pub(crate) kind: Kind,
    /// The handler type as written (`ClientLedger`, `ledger::ClientLedger`).
    pub(crate) self_ty: TokenStream,
    /// The handler type's name (`ClientLedger`).
    pub(crate) name: String,
    /// `name = "ledger-projector"`: the handler's stable name, which
    /// replaces `module_path!()::ClientLedger` as its descriptor and
    /// consumer-group name.
    pub(crate) explicit_name: Option<String>,
    /// `part_of = ...`.
    pub(crate) part_of: &'a Path,
    /// `sequential_by = "..."`.
    pub(crate) sequential_by: Option<&'a QuotedField>,
    /// `on_poison = "dead_letter"`.
    pub(crate) dead_letter_poison: bool,
    /// The handled message types, in declaration order.
    pub(crate) handled: Vec<Handled<'a>>,
}

/// One handled message type and how it reaches the user's code.
pub(crate) struct Handled<'a> {
    /// The message type as written.
    pub(crate) ty: &'a Type,
    /// How dispatch calls the user's code.
    pub(crate) call: Call<'a>,
}

/// How dispatch calls the user's code for one message type.
pub(crate) enum Call<'a> {
    /// A `#[handle]` method of the impl block.
    Method {
        /// The method's name.
        ident: &'a Ident,
        /// Whether the method takes `ctx: &Context`.
        with_ctx: bool,
        /// The declared return type (errors about it point there).
        output: &'a Type,
    },
    /// `<Self as Handle<T>>::handle` (the struct form).
    HandleTrait,
}

/// Checks the declaration; `None` when `args` failed to parse or an error
/// was reported in `cx`.
pub(crate) fn validate<'a>(
    cx: &Ctxt,
    kind: Kind,
    args: Option<&'a Args>,
    item: &'a Item,
) -> Option<Handler<'a>> {
    let macro_name = macro_name(kind);
    let (self_ty, name, handled) = match item {
        Item::Impl(imp) => impl_form(cx, kind, args, imp)?,
        Item::Struct(st) => struct_form(cx, kind, args, st)?,
        other => {
            cx.error_at(
                item_keyword_span(other),
                format!(
                    "`#[{macro_name}]` goes on an `impl` block with `#[handle]` methods, or on a struct with `handles = [..]`"
                ),
            );
            return None;
        }
    };
    impl_block::reject_duplicates(
        cx,
        &name,
        handled.iter().map(|h| h.ty),
        "message type is handled once per handler",
    );
    let args = args?;
    let explicit_name = args.name.as_ref().map(|lit| {
        let value = lit.value();
        if let Err(problem) = check_handler_name(&value) {
            cx.error_at(lit.span(), problem);
        }
        value
    });
    if cx.has_errors() {
        return None;
    }
    Some(Handler {
        kind,
        self_ty,
        name,
        explicit_name,
        part_of: &args.part_of,
        sequential_by: args.sequential_by.as_ref(),
        dead_letter_poison: args.on_poison.as_ref().is_some_and(|(d, _)| *d),
        handled,
    })
}

/// The longest handler name accepted.
const MAX_NAME_LEN: usize = 100;

/// A handler's explicit name names its consumer group and its leases
/// (`convoy:lease:{handler}:..`): non-empty, at most [`MAX_NAME_LEN`]
/// characters, ASCII letters, digits, `-`, `_` and `.` only (no `:`, which
/// separates the parts of convoy's key names; no `{` or `}`, which Redis
/// Cluster reads as hash tags; nothing a terminal or a log line could
/// misread).
pub(crate) fn check_handler_name(name: &str) -> Result<(), String> {
    let example = "for example `name = \"ledger-projector\"`";
    if name.is_empty() {
        return Err(format!("the handler's `name` must not be empty; {example}"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "the handler's `name` is {} characters long; use at most {MAX_NAME_LEN}",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "the handler's `name` contains {bad:?}; a handler name names its consumer group and leases, so use ASCII letters, digits, `-`, `_` and `.` only, {example}"
        ));
    }
    Ok(())
}

/// `event_handler` or `command_handler`.
pub(crate) fn macro_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Event => "event_handler",
        Kind::Command => "command_handler",
    }
}

type Form<'a> = (TokenStream, String, Vec<Handled<'a>>);

/// The error for generic parameters or arguments of a handler.
const GENERIC: &str = "convoy handlers cannot be generic";

/// `#[event_handler(..)] impl ClientLedger { #[handle] async fn .. }`.
fn impl_form<'a>(
    cx: &Ctxt,
    kind: Kind,
    args: Option<&'a Args>,
    imp: &'a ItemImpl,
) -> Option<Form<'a>> {
    let macro_name = macro_name(kind);
    let header = Header {
        trait_impl: &format!(
            "`#[{macro_name}]` goes on an inherent impl block (`impl ClientLedger {{ .. }}`), not on a trait impl"
        ),
        unsafe_impl: "a handler impl block cannot be `unsafe`",
        generic: GENERIC,
        not_named: "a handler is a named struct type, for example `impl ClientLedger { .. }`",
    };
    let name = check_header(cx, imp, &header);
    if let Some(handles) = args.and_then(|a| a.handles.as_ref()) {
        cx.error_at(
            handles.key,
            "`handles = [..]` is for a handler declared on a struct; on an impl block, mark the handler methods with `#[handle]`",
        );
    }

    let mut handled = Vec::new();
    let mut marked = 0;
    impl_block::for_each_method(cx, imp, |method| {
        if attr::handle_marker(cx, &method.attrs) {
            marked += 1;
            if let Some(h) = handler_method(cx, kind, method) {
                handled.push(h);
            }
        }
    });
    if marked == 0 {
        cx.error_spanned_by(
            &imp.self_ty,
            format!(
                "`#[{macro_name}]` on an impl block needs at least one `#[handle]` method, for example `#[handle] async fn placed(&self, {noun}: OrderPlaced, ctx: &Context) -> Result<(), HandlerError>`",
                noun = kind.noun()
            ),
        );
    }
    Some((imp.self_ty.to_token_stream(), name?, handled))
}

/// `#[event_handler(.., handles = [A, B])] struct ClientLedger { .. }`.
fn struct_form<'a>(
    cx: &Ctxt,
    kind: Kind,
    args: Option<&'a Args>,
    st: &'a ItemStruct,
) -> Option<Form<'a>> {
    reject_generics(cx, &st.generics, GENERIC);
    let args = args?;
    let Some(handles) = &args.handles else {
        cx.error_at(
            st.ident.span(),
            format!(
                "a handler declared on a struct needs `handles = [..]` naming the {noun}s it handles (with a `convoy_runtime::Handle<..>` impl for each); or put `#[{macro_name}]` on an `impl` block with `#[handle]` methods",
                noun = kind.noun(),
                macro_name = macro_name(kind),
            ),
        );
        return None;
    };
    if handles.types.is_empty() {
        cx.error_at(
            handles.brackets.span.join(),
            format!("`handles = []` names no {}s to handle", kind.noun()),
        );
    }
    let handled = handles
        .types
        .iter()
        .map(|ty| Handled {
            ty,
            call: Call::HandleTrait,
        })
        .collect();
    Some((
        st.ident.to_token_stream(),
        st.ident.unraw().to_string(),
        handled,
    ))
}

/// Checks a `#[handle]` method:
/// `async fn name(&self, message: T [, ctx: &Context]) -> Result<(), E>`.
fn handler_method<'a>(cx: &Ctxt, kind: Kind, method: &'a ImplItemFn) -> Option<Handled<'a>> {
    let sig = &method.sig;
    let receiver = Receiver {
        mutable: false,
        owner: "",
        wrong_mutability: "`#[handle]` methods take `&self`, not `&mut self`: a handler runs for many partitions at once, so keep mutable state behind a lock",
    };
    let (
        Arguments {
            message: message_ty,
            with_ctx,
            output,
        },
        found,
    ) = check_method(cx, sig, &receiver, kind.noun(), "message");
    if found {
        return None;
    }
    Some(Handled {
        ty: message_ty?,
        call: Call::Method {
            ident: &sig.ident,
            with_ctx,
            output: output?,
        },
    })
}

/// Never-run functions asserting, for each handled type, that the
/// `sequential_by` field exists and is a key type. Spanned at the user's
/// `"field"` literal: a missing field is rustc's E0609 "no field `client_id`
/// on type `&OrderShipped`" (with the available fields), a field of another
/// type is "`f64` cannot be a partition key".
pub(crate) fn field_checks(handler: &Handler<'_>) -> TokenStream {
    let Some(key) = handler.sequential_by else {
        return TokenStream::new();
    };
    let span = key.lit.span();
    let field = &key.ident;
    let checks = handler.handled.iter().enumerate().map(|(i, h)| {
        let check = format_ident!("__convoy_check_key_{}", i);
        let ty = h.ty;
        quote_spanned! {span=>
            #[doc(hidden)]
            #[allow(dead_code, non_snake_case, clippy::all)]
            fn #check(__convoy_event: &#ty) {
                __convoy_assert_key(&__convoy_event.#field)
            }
        }
    });
    quote_spanned! {span=>
        #[doc(hidden)]
        #[allow(dead_code, clippy::all)]
        fn __convoy_assert_key<K: ?::core::marker::Sized + ::convoy_runtime::PartitionKey>(_: &K) {}
        #(#checks)*
    }
}

/// Compile-time assertions that every handled type belongs to the
/// handler's `part_of` aggregate: both categories are constants, so a
/// handler `part_of = Account` handling an event of `Order` fails to compile
/// (rustc's E0080 with the message below), spanned at the handled type.
/// They read the `Handled` constants and `__CONVOY_CATEGORY`, so a type that
/// is not a message, or a `part_of` that is not an aggregate, is not
/// reported again here.
pub(crate) fn part_of_checks(handler: &Handler<'_>, consts: &[Ident]) -> TokenStream {
    let part_of = written(handler.part_of);
    let attr = handler.kind.attr();
    handler
        .handled
        .iter()
        .zip(consts)
        .map(|(h, c)| {
            let ty = h.ty;
            let written = written(ty);
            let message = format!(
                "`{written}` is not part of `{part_of}`, the aggregate of this handler: use `part_of = ` the aggregate of `{written}` (its `#[{attr}(part_of = ..)]`), or handle it in a second handler"
            );
            quote_spanned! {ty.span()=>
                const _: () = ::core::assert!(
                    ::convoy_runtime::__private::same_category(#c.descriptor.category, __CONVOY_CATEGORY),
                    #message
                );
            }
        })
        .collect()
}

/// For an event handler's `sequential_by`: a compile-time assertion that it
/// names the partition key its category's aggregate declares (when one
/// does: `#[aggregate(partition_key = ..)]`), spanned at the user's string.
/// It reads the first handled type's descriptor (the part-of checks make
/// every handled type's category the handler's).
pub(crate) fn declared_key_check(handler: &Handler<'_>, consts: &[Ident]) -> TokenStream {
    let (Kind::Event, Some(key), Some(first)) =
        (handler.kind, handler.sequential_by, consts.first())
    else {
        return TokenStream::new();
    };
    let part_of = written(handler.part_of);
    let name = &key.name;
    let message = format!(
        "`sequential_by = \"{name}\"` is not the partition key that the aggregate `{part_of}` declares (`#[aggregate(partition_key = ..)]`): a category has one key, so name the declared field"
    );
    quote_spanned! {key.lit.span()=>
        const _: () = ::core::assert!(
            ::convoy_runtime::__private::agrees_with_declared_key(#first.descriptor.partition_key, #name),
            #message
        );
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;
    use syn::parse_quote;

    use super::*;
    use crate::ctxt::messages;
    use crate::message::Kind;

    fn errors(kind: Kind, args: TokenStream, item: Item) -> Vec<String> {
        messages(|cx| {
            let args = cx.ok(Args::parse(kind, args));
            validate(cx, kind, args.as_ref(), &item).map(drop)
        })
    }

    #[test]
    fn valid_impl_block() {
        let item: Item = parse_quote! {
            impl ClientLedger {
                #[handle]
                async fn placed(&self, e: OrderPlaced, ctx: &Context) -> Result<(), HandlerError> { Ok(()) }
                #[handle]
                async fn shipped(&self, e: OrderShipped) -> Result<(), HandlerError> { Ok(()) }
                fn helper(&self) {}
            }
        };
        let cx = Ctxt::new();
        let args = Args::parse(
            Kind::Event,
            quote!(part_of = Order, sequential_by = "client_id"),
        )
        .expect("args");
        let handler = validate(&cx, Kind::Event, Some(&args), &item).expect("valid");
        cx.check().expect("no errors");
        assert_eq!(handler.name, "ClientLedger");
        assert_eq!(handler.handled.len(), 2);
        assert!(matches!(
            handler.handled[0].call,
            Call::Method { with_ctx: true, .. }
        ));
        assert!(matches!(
            handler.handled[1].call,
            Call::Method {
                with_ctx: false,
                ..
            }
        ));
    }

    #[test]
    fn every_bad_method_is_reported() {
        let item: Item = parse_quote! {
            impl ClientLedger {
                #[handle]
                fn placed(&self, e: OrderPlaced) -> Result<(), HandlerError> { Ok(()) }
                #[handle]
                async fn shipped(&mut self, e: &OrderShipped) -> Result<(), HandlerError> { Ok(()) }
                #[handle]
                async fn paid(&self, e: OrderPaid, ctx: &Context, extra: u8) {}
            }
        };
        let errors = errors(Kind::Event, quote!(part_of = Order), item);
        assert_eq!(errors.len(), 5, "{errors:#?}");
        assert!(
            errors[0].starts_with("`#[handle]` methods must be `async`"),
            "{errors:#?}"
        );
        assert!(errors[1].contains("not `&mut self`"), "{errors:#?}");
        assert_eq!(errors[2], "the event is passed by value: remove the `&`");
        assert!(errors[3].starts_with("too many arguments"), "{errors:#?}");
        assert!(
            errors[4].starts_with("`#[handle]` methods return `Result<(), E>`"),
            "{errors:#?}"
        );
    }

    #[test]
    fn context_before_the_message_is_reported_once() {
        for item in [
            parse_quote! {
                impl Ledger {
                    #[handle]
                    async fn on(&self, ctx: Context, e: Debited) -> Result<(), HandlerError> { Ok(()) }
                }
            },
            parse_quote! {
                impl Ledger {
                    #[handle]
                    async fn on(&self, ctx: &convoy_runtime::Context, e: Debited) -> Result<(), HandlerError> { Ok(()) }
                }
            },
        ] {
            assert_eq!(
                errors(Kind::Event, quote!(part_of = Account), item),
                [
                    "`Context` is not an event: the event comes first, then the context by shared reference: `async fn on(&self, event: OrderPlaced, ctx: &Context) -> Result<(), HandlerError>`"
                ]
            );
        }
        let item: Item = parse_quote! {
            impl Ledger {
                #[handle]
                async fn on(&self, ctx: Context) -> Result<(), HandlerError> { Ok(()) }
            }
        };
        assert_eq!(
            errors(Kind::Command, quote!(part_of = Account), item),
            [
                "`Context` is not a command: the command comes first, then the context by shared reference: `async fn on(&self, command: OrderPlaced, ctx: &Context) -> Result<(), HandlerError>`"
            ]
        );
    }

    #[test]
    fn duplicates_and_forms() {
        let item: Item = parse_quote! {
            impl ClientLedger {
                #[handle] async fn a(&self, e: OrderPlaced) -> Result<(), HandlerError> { Ok(()) }
                #[handle] async fn b(&self, e: OrderPlaced) -> Result<(), HandlerError> { Ok(()) }
            }
        };
        assert_eq!(
            errors(Kind::Event, quote!(part_of = Order), item),
            [
                "`OrderPlaced` is handled twice by `ClientLedger`; each message type is handled once per handler"
            ]
        );

        let item: Item = parse_quote!(impl ClientLedger {});
        let e = errors(Kind::Command, quote!(part_of = Order, handles = [A]), item);
        assert_eq!(e.len(), 2, "{e:#?}");
        assert!(e[0].starts_with("`handles = [..]` is for a handler declared on a struct"));
        assert!(e[1].starts_with(
            "`#[command_handler]` on an impl block needs at least one `#[handle]` method"
        ));

        let item: Item = parse_quote!(
            struct ClientLedger;
        );
        let e = errors(Kind::Event, quote!(part_of = Order), item);
        assert!(
            e[0].starts_with("a handler declared on a struct needs `handles = [..]`"),
            "{e:#?}"
        );

        let item: Item = parse_quote!(
            struct ClientLedger;
        );
        assert_eq!(
            errors(
                Kind::Event,
                quote!(part_of = Order, handles = [A, B, A]),
                item
            ),
            [
                "`A` is handled twice by `ClientLedger`; each message type is handled once per handler"
            ]
        );

        let item: Item = parse_quote!(
            struct ClientLedger<T>(T);
        );
        assert_eq!(
            errors(Kind::Event, quote!(part_of = Order, handles = [A]), item),
            ["convoy handlers cannot be generic"]
        );

        let item: Item = parse_quote!(
            enum ClientLedger {}
        );
        assert_eq!(
            errors(Kind::Event, quote!(part_of = Order), item),
            [
                "`#[event_handler]` goes on an `impl` block with `#[handle]` methods, or on a struct with `handles = [..]`"
            ]
        );
    }
}
