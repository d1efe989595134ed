//! Code generation for `#[event_handler]` and `#[command_handler]`. Only
//! ever sees a validated [`Handler`].

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::Item;

use super::check::{self, Call, Handler};
use crate::impl_block::{
    dispatch_fn, dispatch_stub, handled_const_names, handled_consts, nameable_self_ty,
};
use crate::message::Kind;
use crate::tokens::{
    dispatch_branch, into_command_result_spanned, into_result_spanned, reply_type, span_range,
};

/// The handler trait impl, its descriptor and registration, and the
/// compile-time checks, all inside one `const _: () = { .. };`.
pub(crate) fn handler(handler: &Handler<'_>) -> TokenStream {
    let self_ty = &handler.self_ty;
    let descriptor_name = match &handler.explicit_name {
        Some(explicit) => quote!(#explicit),
        None => {
            let name = &handler.name;
            quote!(::core::concat!(::core::module_path!(), "::", #name))
        }
    };
    let handler_kind = handler_kind(handler.kind);
    let handler_trait = handler_trait(handler.kind);
    let resolve = match handler.kind {
        Kind::Event => "handled_event",
        Kind::Command => "handled_command",
    };

    // `<Order as Aggregate>::CATEGORY`, spanned across the user's path so a
    // type that is not an aggregate is reported there.
    let part_of = handler.part_of;
    let (first, last) = span_range(part_of);
    let category_head = quote_spanned!(first=> <);
    let category_tail = quote_spanned!(last=> as ::convoy_runtime::Aggregate>::CATEGORY);
    let category = quote!(#category_head #part_of #category_tail);

    let sequential_by = match handler.sequential_by {
        Some(key) => {
            let name = &key.name;
            quote!(::core::option::Option::Some(#name))
        }
        None => quote!(::core::option::Option::None),
    };

    let dead_letter_poison = handler.dead_letter_poison;
    let consts = handled_const_names("MESSAGE", handler.handled.len());
    let resolved = handled_consts(&consts, handler.handled.iter().map(|h| h.ty), resolve);

    let branches = handler.handled.iter().zip(&consts).map(|(h, c)| {
        let ty = h.ty;
        let call = match &h.call {
            Call::Method {
                ident, with_ctx, ..
            } => {
                let ctx = with_ctx.then(|| quote!(, __convoy_ctx));
                quote!(Self::#ident(self, __convoy_message #ctx).await)
            }
            Call::HandleTrait => {
                // Spanned across the entry of `handles = [..]`: a missing
                // `Handle<T>` impl is reported there.
                let (first, last) = span_range(ty);
                let head = quote_spanned!(first=> <Self as ::convoy_runtime::Handle<);
                let tail =
                    quote_spanned!(last=> >>::handle(self, __convoy_message, __convoy_ctx).await);
                quote!(#head #ty #tail)
            }
        };
        let into_result = match (&h.call, handler.kind) {
            (Call::Method { output, .. }, Kind::Event) => into_result_spanned(output),
            (Call::Method { output, .. }, Kind::Command) => into_command_result_spanned(output, ty),
            (Call::HandleTrait, Kind::Event) => {
                quote!(::convoy_runtime::__private::into_handler_result(
                    __convoy_result
                ))
            }
            (Call::HandleTrait, Kind::Command) => {
                let reply = reply_type(ty);
                quote!(::convoy_runtime::__private::into_command_result(
                    #reply,
                    __convoy_result,
                    __convoy_ctx
                ))
            }
        };
        let box_span = match &h.call {
            Call::Method { ident, .. } => ident.span(),
            Call::HandleTrait => Span::call_site(),
        };
        dispatch_branch(ty, c, call, into_result, box_span)
    });

    let dispatch = dispatch_fn(false, branches);
    let checks = check::field_checks(handler);
    let part_of_checks = check::part_of_checks(handler, &consts);
    let declared_key_check = check::declared_key_check(handler, &consts);

    quote! {
        #[doc(hidden)]
        #[allow(non_upper_case_globals, non_snake_case, unused_qualifications, clippy::all)]
        const _: () = {
            #resolved

            const __CONVOY_CATEGORY: &'static str = #category;
            #part_of_checks
            #declared_key_check

            static __CONVOY_DESCRIPTOR: ::convoy_runtime::__private::HandlerDescriptor =
                ::convoy_runtime::__private::HandlerDescriptor {
                    name: #descriptor_name,
                    kind: #handler_kind,
                    category: __CONVOY_CATEGORY,
                    sequential_by: #sequential_by,
                    handles: &[#(#consts.descriptor),*],
                    dead_letter_poison: #dead_letter_poison,
                };

            ::convoy_runtime::__private::inventory::submit! {
                ::convoy_runtime::__private::HandlerRegistration(&__CONVOY_DESCRIPTOR)
            }

            #[automatically_derived]
            impl #handler_trait for #self_ty {
                fn descriptor(&self) -> &'static ::convoy_runtime::__private::HandlerDescriptor {
                    &__CONVOY_DESCRIPTOR
                }

                #dispatch
            }

            #checks
        };
    }
}

/// A stub handler impl emitted beside the errors of an invalid declaration,
/// so that registering the handler (`.handler(ClientLedger { .. })`) is not
/// reported as well. Nothing when the handler type cannot be named.
pub(crate) fn fallback(kind: Kind, item: &Item) -> TokenStream {
    let self_ty = match item {
        Item::Impl(imp) => nameable_self_ty(imp),
        Item::Struct(st) if st.generics.params.is_empty() => Some(st.ident.to_token_stream()),
        _ => None,
    };
    let Some(self_ty) = self_ty else {
        return TokenStream::new();
    };
    let handler_trait = handler_trait(kind);
    let dispatch = dispatch_stub(false);
    quote! {
        impl #handler_trait for #self_ty {
            fn descriptor(&self) -> &'static ::convoy_runtime::__private::HandlerDescriptor {
                ::core::unreachable!()
            }

            #dispatch
        }
    }
}

/// `HandlerKind::Event` / `HandlerKind::Command`.
fn handler_kind(kind: Kind) -> TokenStream {
    match kind {
        Kind::Event => quote!(::convoy_runtime::__private::HandlerKind::Event),
        Kind::Command => quote!(::convoy_runtime::__private::HandlerKind::Command),
    }
}

/// `EventHandler` / `CommandHandler`.
fn handler_trait(kind: Kind) -> TokenStream {
    match kind {
        Kind::Event => quote!(::convoy_runtime::EventHandler),
        Kind::Command => quote!(::convoy_runtime::CommandHandler),
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use crate::handler::expand as expand_handler;
    use crate::message::Kind;

    fn expanded(
        kind: Kind,
        args: proc_macro2::TokenStream,
        item: proc_macro2::TokenStream,
    ) -> String {
        expand_handler(kind, args, item).to_string()
    }

    #[test]
    fn impl_block_expansion() {
        let out = expanded(
            Kind::Event,
            quote!(part_of = Order, sequential_by = "client_id"),
            quote! {
                impl ClientLedger {
                    #[handle]
                    async fn placed(&self, e: OrderPlaced, ctx: &Context) -> Result<(), HandlerError> { Ok(()) }
                    #[handle]
                    async fn shipped(&self, e: OrderShipped) -> Result<(), HandlerError> { Ok(()) }
                }
            },
        );
        assert!(!out.contains("# [handle]"), "{out}");
        assert!(!out.contains("compile_error"), "{out}");
        assert!(
            out.contains("impl :: convoy_runtime :: EventHandler for ClientLedger"),
            "{out}"
        );
        assert!(
            out.contains("kind : :: convoy_runtime :: __private :: HandlerKind :: Event"),
            "{out}"
        );
        assert!(
            out.contains("sequential_by : :: core :: option :: Option :: Some (\"client_id\")"),
            "{out}"
        );
        assert!(
            out.contains("Self :: placed (self , __convoy_message , __convoy_ctx) . await"),
            "{out}"
        );
        assert!(
            out.contains("Self :: shipped (self , __convoy_message) . await"),
            "{out}"
        );
        assert!(out.contains("fn __convoy_check_key_1 (__convoy_event : & OrderShipped) { __convoy_assert_key (& __convoy_event . client_id) }"), "{out}");
        assert!(out.contains("category : __CONVOY_CATEGORY"), "{out}");
        assert!(out.contains("const _ : () = :: core :: assert ! (:: convoy_runtime :: __private :: same_category (__CONVOY_MESSAGE_1 . descriptor . category , __CONVOY_CATEGORY) , \"`OrderShipped` is not part of `Order`, the aggregate of this handler: use `part_of = ` the aggregate of `OrderShipped` (its `#[event(part_of = ..)]`), or handle it in a second handler\")"), "{out}");
        assert!(out.contains("inventory :: submit !"), "{out}");
    }

    #[test]
    fn an_explicit_name_replaces_the_module_path() {
        let out = expanded(
            Kind::Event,
            quote!(part_of = Order, name = "ledger-projector"),
            quote! {
                impl ClientLedger {
                    #[handle]
                    async fn placed(&self, e: OrderPlaced) -> Result<(), HandlerError> { Ok(()) }
                }
            },
        );
        assert!(out.contains("name : \"ledger-projector\""), "{out}");
        assert!(!out.contains("module_path"), "{out}");
        for bad in ["", "a:b", "a b", "{x}", "é"] {
            let out = expanded(
                Kind::Event,
                quote!(part_of = Order, name = #bad),
                quote! {
                    impl ClientLedger {
                        #[handle]
                        async fn placed(&self, e: OrderPlaced) -> Result<(), HandlerError> { Ok(()) }
                    }
                },
            );
            assert!(out.contains("compile_error !"), "{bad:?}: {out}");
            assert!(out.contains("the handler's `name`"), "{bad:?}: {out}");
        }
    }

    #[test]
    fn command_methods_keep_their_reply() {
        let out = expanded(
            Kind::Command,
            quote!(part_of = Order),
            quote! {
                impl Desk {
                    #[handle]
                    async fn place(&self, c: PlaceOrder) -> Result<OrderId, HandlerError> { todo!() }
                }
            },
        );
        assert!(
            out.contains("ReplyProbe :: < PlaceOrder > :: NEW) . reply_type () } , :: core :: convert :: identity (__convoy_result) , __convoy_ctx)"),
            "{out}"
        );
    }

    #[test]
    fn struct_expansion_dispatches_through_handle() {
        let out = expanded(
            Kind::Command,
            quote!(part_of = Order, handles = [PlaceOrder]),
            quote!(
                struct Orders {
                    db: Db,
                }
            ),
        );
        assert!(
            out.contains("impl :: convoy_runtime :: CommandHandler for Orders"),
            "{out}"
        );
        assert!(out.contains("< Self as :: convoy_runtime :: Handle < PlaceOrder >> :: handle (self , __convoy_message , __convoy_ctx) . await"), "{out}");
        assert!(
            out.contains("sequential_by : :: core :: option :: Option :: None"),
            "{out}"
        );
        assert!(!out.contains("__convoy_check_key"), "{out}");
    }

    #[test]
    fn errors_keep_the_item_and_stub_the_impl() {
        let out = expanded(
            Kind::Event,
            quote!(part_of = Order, sequential_by = true),
            quote! {
                impl ClientLedger {
                    #[handle]
                    async fn placed(&self, e: OrderPlaced) -> Result<(), HandlerError> { Ok(()) }
                }
            },
        );
        assert!(out.contains("impl ClientLedger { async fn placed"), "{out}");
        assert!(out.contains("compile_error !"), "{out}");
        assert!(out.contains("unreachable !"), "{out}");
        assert!(!out.contains("submit"), "{out}");
    }

    #[test]
    fn unparsable_items_are_returned_with_the_error() {
        let out = expanded(
            Kind::Event,
            quote!(part_of = Order),
            quote!(impl ClientLedger for),
        );
        assert!(out.contains("compile_error !"), "{out}");
    }
}
