//! Validation of a process manager declaration, and the generated code that
//! makes rustc check what the macro cannot see.
//!
//! [`validate`] looks at the arguments, the impl block and each `#[handle]`
//! method, and builds the model that `expand` turns into code; every
//! independent problem is reported. Whether the `correlate` field exists on
//! its event and has a key type is only known to the type checker: each
//! handled type gets one [`correlation_fns`] function reading the field,
//! spanned at the user's `"field"` literal, so that rustc's errors point
//! there.

use proc_macro2::TokenStream;
use quote::{format_ident, quote_spanned};
use syn::{Ident, ImplItemFn, Item, ItemImpl, Type};

use super::attr::{Args, HandleAttrs};
use crate::ctxt::Ctxt;
use crate::impl_block::{
    self, Header, QuotedField, check_header, handle_marker, item_keyword_span, written,
};
use crate::signature::{Arguments, Receiver, check_method};

/// A validated process manager declaration.
pub(crate) struct ProcessManager<'a> {
    /// The state type as written (`Fulfilment`, `sagas::Fulfilment`).
    pub(crate) self_ty: &'a Type,
    /// The state type's name (`Fulfilment`).
    pub(crate) name: String,
    /// `sequential_by = true`.
    pub(crate) sequential: bool,
    /// The handled events, in declaration order.
    pub(crate) handled: Vec<Handled<'a>>,
}

/// One `#[handle]` method and the event it handles.
pub(crate) struct Handled<'a> {
    /// The event type as written.
    pub(crate) ty: &'a Type,
    /// The method's name.
    pub(crate) method: &'a Ident,
    /// Whether the method takes `ctx: &Context`.
    pub(crate) with_ctx: bool,
    /// The declared return type (errors about it point there).
    pub(crate) output: &'a Type,
    /// `correlate = "..."`.
    pub(crate) correlate: QuotedField,
    /// `start`.
    pub(crate) start: bool,
    /// `end`.
    pub(crate) end: bool,
}

const MACRO: &str = "#[process_manager]";

/// Checks the declaration; `None` when `args` failed to parse or an error
/// was reported in `cx`.
pub(crate) fn validate<'a>(
    cx: &Ctxt,
    args: Option<&Args>,
    item: &'a Item,
) -> Option<ProcessManager<'a>> {
    let Item::Impl(imp) = item else {
        let what = match item {
            Item::Struct(_) => "struct (not on the struct itself)",
            _ => "type",
        };
        cx.error_at(
            item_keyword_span(item),
            format!(
                "`{MACRO}` goes on the `impl` block of the process manager's state {what}, with `#[handle(correlate = \"...\")]` methods: `impl Fulfilment {{ .. }}`"
            ),
        );
        return None;
    };
    let (self_ty, name, handled) = impl_form(cx, imp)?;
    impl_block::reject_duplicates(
        cx,
        &name,
        handled.iter().map(|h| h.ty),
        "event type is handled once per process manager",
    );
    let args = args?;
    if cx.has_errors() {
        return None;
    }
    Some(ProcessManager {
        self_ty,
        name,
        sequential: args.sequential(),
        handled,
    })
}

/// `#[process_manager(..)] impl Fulfilment { #[handle(..)] async fn .. }`.
fn impl_form<'a>(cx: &Ctxt, imp: &'a ItemImpl) -> Option<(&'a Type, String, Vec<Handled<'a>>)> {
    let header = Header {
        trait_impl: &format!(
            "`{MACRO}` goes on the inherent impl block of the state struct (`impl Fulfilment {{ .. }}`), not on a trait impl"
        ),
        unsafe_impl: "a process manager impl block cannot be `unsafe`",
        generic: "a process manager cannot be generic",
        not_named: "a process manager is a named state struct, for example `impl Fulfilment { .. }`",
    };
    let name = check_header(cx, imp, &header);

    let mut handled = Vec::new();
    let mut marked = 0;
    impl_block::for_each_method(cx, imp, |method| {
        let Some(marker) = handle_marker(cx, &method.attrs, |_| {}) else {
            return;
        };
        marked += 1;
        let (event, checked) = handler_method(cx, method);
        let Some(marker) = cx.ok(HandleAttrs::parse(marker)) else {
            return;
        };
        let Some(correlate) = marker.correlate else {
            missing_correlate(cx, &marker, event);
            return;
        };
        if let (Some(ty), Some((with_ctx, output))) = (event, checked) {
            handled.push(Handled {
                ty,
                method: &method.sig.ident,
                with_ctx,
                output,
                correlate,
                start: marker.start,
                end: marker.end,
            });
        }
    });
    if marked == 0 {
        cx.error_spanned_by(
            &imp.self_ty,
            format!(
                "`{MACRO}` needs at least one `#[handle]` method, for example `#[handle(start, correlate = \"order_id\")] async fn placed(&mut self, event: OrderPlaced, ctx: &Context) -> Result<(), HandlerError>`"
            ),
        );
    }
    Some((&imp.self_ty, name?, handled))
}

/// Reports a `#[handle]` without `correlate`, at the marker.
fn missing_correlate(cx: &Ctxt, marker: &HandleAttrs<'_>, event: Option<&Type>) {
    let event = match event {
        Some(ty) => format!("`{}`", written(ty)),
        None => "the event".to_owned(),
    };
    let flags = match (marker.start, marker.end) {
        (true, true) => "start, end, ",
        (true, false) => "start, ",
        (false, true) => "end, ",
        (false, false) => "",
    };
    cx.error_spanned_by(
        marker.attr,
        format!(
            "add `correlate = \"field\"` to `#[handle]`, naming the field of {event} that carries the correlation value: for example `#[handle({flags}correlate = \"order_id\")]`"
        ),
    );
}

/// Checks a `#[handle]` method:
/// `async fn name(&mut self, event: T [, ctx: &Context]) -> Result<(), E>`.
/// Returns the event type, when it could be read, and, when the method is
/// valid, whether it takes the context and its declared return type.
fn handler_method<'a>(
    cx: &Ctxt,
    method: &'a ImplItemFn,
) -> (Option<&'a Type>, Option<(bool, &'a Type)>) {
    let receiver = Receiver {
        mutable: true,
        owner: " of a process manager",
        wrong_mutability: "`#[handle]` methods of a process manager take `&mut self`, not `&self`: they update the instance's state, which the runtime loads before the event and saves after it",
    };
    let (
        Arguments {
            message: event_ty,
            with_ctx,
            output,
        },
        found,
    ) = check_method(cx, &method.sig, &receiver, "event", "event");
    if found {
        return (event_ty, None);
    }
    (event_ty, output.map(|output| (with_ctx, output)))
}

/// For each handled event, the function that reads its `correlate` field as
/// a key: `fn __convoy_correlate_N(event: &OrderPlaced) -> Option<String>`.
///
/// `correlation()` calls them, so they are the one place the field is read
/// and each problem is reported once. (A separate never-run check beside a
/// field read in `correlation()` would report every missing field twice.)
/// Spanned at the user's `"field"` literal: a missing field is rustc's E0609
/// "no field `order_ref` on type `&OrderPlaced`" (with the available fields,
/// or a similar one), a field of another type is "`f64` cannot be a
/// partition key".
pub(crate) fn correlation_fns(pm: &ProcessManager<'_>) -> TokenStream {
    pm.handled
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let span = h.correlate.lit.span();
            let read = correlation_fn(i);
            let field = &h.correlate.ident;
            let ty = h.ty;
            // The bound lives in a helper local to each function, so that
            // rustc's "required by this bound" note points at the same
            // literal as the error.
            quote_spanned! {span=>
                #[doc(hidden)]
                #[allow(clippy::all)]
                fn #read(__convoy_event: &#ty) -> ::core::option::Option<::std::string::String> {
                    fn __convoy_assert_key<
                        __K: ?::core::marker::Sized + ::convoy_runtime::PartitionKey,
                    >(
                        __convoy_key: &__K,
                    ) -> ::core::option::Option<::std::string::String> {
                        ::convoy_runtime::PartitionKey::to_partition_key(__convoy_key)
                    }
                    __convoy_assert_key(&__convoy_event.#field)
                }
            }
        })
        .collect()
}

/// The name of the `i`-th correlation function.
pub(crate) fn correlation_fn(i: usize) -> Ident {
    format_ident!("__convoy_correlate_{}", i)
}

#[cfg(test)]
mod tests {
    use quote::quote;
    use syn::parse_quote;

    use super::*;
    use crate::ctxt::messages;

    fn errors(args: TokenStream, item: Item) -> Vec<String> {
        messages(|cx| {
            let args = cx.ok(Args::parse(args));
            validate(cx, args.as_ref(), &item).map(drop)
        })
    }

    #[test]
    fn valid_impl_block() {
        let item: Item = parse_quote! {
            impl Fulfilment {
                #[handle(start, correlate = "order_id")]
                async fn placed(&mut self, e: OrderPlaced, ctx: &Context) -> Result<(), HandlerError> { Ok(()) }
                #[handle(correlate = "order_ref")]
                async fn paid(&mut self, e: PaymentCaptured) -> Result<(), HandlerError> { Ok(()) }
                #[handle(end, correlate = "order_ref")]
                async fn shipped(&mut self, e: OrderShipped, ctx: &Context) -> Result<(), MyError> { Ok(()) }
                fn helper(&self) {}
            }
        };
        let cx = Ctxt::new();
        let args = Args::parse(quote!(sequential_by = true)).expect("args");
        let pm = validate(&cx, Some(&args), &item).expect("valid");
        cx.check().expect("no errors");
        assert_eq!(pm.name, "Fulfilment");
        assert!(pm.sequential);
        let summary: Vec<_> = pm
            .handled
            .iter()
            .map(|h| {
                (
                    h.method.to_string(),
                    h.correlate.name.clone(),
                    h.start,
                    h.end,
                    h.with_ctx,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("placed".into(), "order_id".into(), true, false, true),
                ("paid".into(), "order_ref".into(), false, false, false),
                ("shipped".into(), "order_ref".into(), false, true, true),
            ]
        );
    }

    #[test]
    fn missing_correlate_names_the_event() {
        let item: Item = parse_quote! {
            impl Fulfilment {
                #[handle(start)]
                async fn placed(&mut self, e: OrderPlaced) -> Result<(), HandlerError> { Ok(()) }
                #[handle]
                fn paid(&mut self, e: PaymentCaptured) -> Result<(), HandlerError> { Ok(()) }
            }
        };
        let e = errors(quote!(), item);
        assert_eq!(
            e,
            [
                "add `correlate = \"field\"` to `#[handle]`, naming the field of `OrderPlaced` that carries the correlation value: for example `#[handle(start, correlate = \"order_id\")]`",
                "`#[handle]` methods must be `async`: `async fn paid(&mut self, event: OrderPlaced, ctx: &Context) -> Result<(), HandlerError>`",
                "add `correlate = \"field\"` to `#[handle]`, naming the field of `PaymentCaptured` that carries the correlation value: for example `#[handle(correlate = \"order_id\")]`",
            ]
        );
    }

    #[test]
    fn every_bad_method_is_reported() {
        let item: Item = parse_quote! {
            impl Fulfilment {
                #[handle(correlate = "a")]
                async fn placed(&self, e: OrderPlaced) -> Result<(), HandlerError> { Ok(()) }
                #[handle(correlate = "a")]
                async fn paid(self, e: &PaymentCaptured) -> Result<(), HandlerError> { Ok(()) }
                #[handle(correlate = "a")]
                async fn shipped(&mut self, e: OrderShipped, ctx: &Context, x: u8) {}
                #[handle(correlate = "a")]
                #[handle(correlate = "b")]
                async fn twice(&mut self, e: OrderCancelled) -> Result<(), HandlerError> { Ok(()) }
            }
        };
        let e = errors(quote!(sequential_by = true), item);
        assert_eq!(e.len(), 6, "{e:#?}");
        assert!(e[0].contains("take `&mut self`, not `&self`"), "{e:#?}");
        assert!(
            e[1].starts_with("`#[handle]` methods of a process manager take `&mut self`: "),
            "{e:#?}"
        );
        assert_eq!(e[2], "the event is passed by value: remove the `&`");
        assert!(e[3].starts_with("too many arguments"), "{e:#?}");
        assert!(e[4].starts_with("`#[handle]` methods return"), "{e:#?}");
        assert_eq!(e[5], "`#[handle]` given more than once");
    }

    #[test]
    fn duplicates_generics_and_forms() {
        let item: Item = parse_quote! {
            impl Fulfilment {
                #[handle(start, correlate = "order_id")]
                async fn a(&mut self, e: OrderPlaced) -> Result<(), HandlerError> { Ok(()) }
                #[handle(correlate = "order_id")]
                async fn b(&mut self, e: OrderPlaced) -> Result<(), HandlerError> { Ok(()) }
            }
        };
        assert_eq!(
            errors(quote!(), item),
            [
                "`OrderPlaced` is handled twice by `Fulfilment`; each event type is handled once per process manager"
            ]
        );

        let item: Item = parse_quote! {
            impl<T> Fulfilment<T> {
                #[handle(correlate = "order_id")]
                async fn a(&mut self, e: OrderPlaced) -> Result<(), HandlerError> { Ok(()) }
            }
        };
        assert_eq!(
            errors(quote!(), item),
            ["a process manager cannot be generic"]
        );

        let item: Item = parse_quote! {
            impl Fulfilment<u8> {
                #[handle(correlate = "order_id")]
                async fn a(&mut self, e: OrderPlaced) -> Result<(), HandlerError> { Ok(()) }
            }
        };
        assert_eq!(
            errors(quote!(), item),
            ["a process manager cannot be generic"]
        );

        let item: Item = parse_quote!(impl Fulfilment {});
        let e = errors(quote!(), item);
        assert!(
            e[0].starts_with("`#[process_manager]` needs at least one `#[handle]` method"),
            "{e:#?}"
        );

        let item: Item = parse_quote!(
            struct Fulfilment;
        );
        let e = errors(quote!(), item);
        assert!(
            e[0].starts_with("`#[process_manager]` goes on the `impl` block of the process manager's state struct (not on the struct itself)"),
            "{e:#?}"
        );

        let item: Item = parse_quote! {
            impl Default for Fulfilment {
                #[handle(correlate = "order_id")]
                async fn a(&mut self, e: OrderPlaced) -> Result<(), HandlerError> { Ok(()) }
            }
        };
        let e = errors(quote!(), item);
        assert!(e[0].contains("not on a trait impl"), "{e:#?}");
    }

    #[test]
    fn argument_errors_and_method_errors_are_reported_together() {
        let item: Item = parse_quote! {
            impl Fulfilment {
                #[handle(correlate = "order_id")]
                async fn a(&self, e: OrderPlaced) -> Result<(), HandlerError> { Ok(()) }
            }
        };
        let e = errors(quote!(sequential_by = "order_id"), item);
        assert_eq!(e.len(), 2, "{e:#?}");
        assert!(e[0].starts_with("`sequential_by` on a process manager is `true` or `false`"));
        assert!(e[1].contains("not `&self`"));
    }
}
