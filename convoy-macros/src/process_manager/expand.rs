//! Code generation for `#[process_manager]`. Only ever sees a validated
//! [`ProcessManager`].

use proc_macro2::TokenStream;
use quote::quote;
use syn::Item;

use super::check::{self, ProcessManager};
use crate::impl_block::{
    dispatch_fn, dispatch_stub, handled_const_names, handled_consts, nameable_self_ty,
};
use crate::tokens::{dispatch_branch, into_result_spanned};

/// The `ProcessManager` impl, its registration and the correlation
/// functions, all inside one `const _: () = { .. };`.
pub(crate) fn process_manager(pm: &ProcessManager<'_>) -> TokenStream {
    let self_ty = pm.self_ty;
    let name = &pm.name;
    let sequential = pm.sequential;

    let consts = handled_const_names("EVENT", pm.handled.len());
    let resolved = handled_consts(&consts, pm.handled.iter().map(|h| h.ty), "handled_event");

    let handles = pm.handled.iter().zip(&consts).map(|(h, c)| {
        let correlate = &h.correlate.name;
        let (start, end) = (h.start, h.end);
        quote! {
            ::convoy_runtime::__private::PmHandle {
                message: #c.descriptor,
                correlate: #correlate,
                start: #start,
                end: #end,
            }
        }
    });

    let correlations = pm
        .handled
        .iter()
        .zip(&consts)
        .enumerate()
        .map(|(i, (h, c))| {
            let ty = h.ty;
            let read = check::correlation_fn(i);
            quote! {
                if __convoy_envelope.type_name == #c.descriptor.type_name {
                    let __convoy_message: #ty = (#c.decode)(__convoy_envelope)?;
                    return ::core::result::Result::Ok(#read(&__convoy_message));
                }
            }
        });

    let branches = pm.handled.iter().zip(&consts).map(|(h, c)| {
        let ty = h.ty;
        let method = h.method;
        let ctx = h.with_ctx.then(|| quote!(, __convoy_ctx));
        let call = quote!(Self::#method(self, __convoy_message #ctx).await);
        dispatch_branch(ty, c, call, into_result_spanned(h.output), method.span())
    });

    let dispatch = dispatch_fn(true, branches);
    let correlation_fns = check::correlation_fns(pm);

    quote! {
        #[doc(hidden)]
        #[allow(non_upper_case_globals, non_snake_case, unused_qualifications, clippy::all)]
        const _: () = {
            #resolved

            static __CONVOY_DESCRIPTOR: ::convoy_runtime::__private::ProcessManagerDescriptor =
                ::convoy_runtime::__private::ProcessManagerDescriptor {
                    name: ::core::concat!(::core::module_path!(), "::", #name),
                    sequential: #sequential,
                    handles: &[#(#handles),*],
                };

            // Registered through the static rather than the trait, so that
            // a state type missing one of the trait's supertraits (`Default`,
            // the serde derives) is reported once, at the impl.
            ::convoy_runtime::__private::inventory::submit! {
                ::convoy_runtime::__private::ProcessManagerRegistration(&__CONVOY_DESCRIPTOR)
            }

            #[automatically_derived]
            impl ::convoy_runtime::ProcessManager for #self_ty {
                const DESCRIPTOR: &'static ::convoy_runtime::__private::ProcessManagerDescriptor =
                    &__CONVOY_DESCRIPTOR;

                fn correlation(
                    __convoy_envelope: &::convoy_runtime::Envelope,
                ) -> ::core::result::Result<
                    ::core::option::Option<::std::string::String>,
                    ::convoy_runtime::HandlerError,
                > {
                    #(#correlations)*
                    ::core::result::Result::Ok(::core::option::Option::None)
                }

                #dispatch
            }

            #correlation_fns
        };
    }
}

/// A stub `ProcessManager` impl emitted beside the errors of an invalid
/// declaration, so that using the process manager elsewhere is not
/// reported as well. Nothing when the state type cannot be named.
pub(crate) fn fallback(item: &Item) -> TokenStream {
    let Some(self_ty) = (match item {
        Item::Impl(imp) => nameable_self_ty(imp),
        _ => None,
    }) else {
        return TokenStream::new();
    };
    let dispatch = dispatch_stub(true);
    quote! {
        impl ::convoy_runtime::ProcessManager for #self_ty {
            const DESCRIPTOR: &'static ::convoy_runtime::__private::ProcessManagerDescriptor =
                &::convoy_runtime::__private::ProcessManagerDescriptor {
                    name: "",
                    sequential: false,
                    handles: &[],
                };

            fn correlation(
                _: &::convoy_runtime::Envelope,
            ) -> ::core::result::Result<
                ::core::option::Option<::std::string::String>,
                ::convoy_runtime::HandlerError,
            > {
                ::core::unreachable!()
            }

            #dispatch
        }
    }
}

#[cfg(test)]
mod tests {
    use proc_macro2::TokenStream;
    use quote::quote;

    use crate::process_manager::expand as expand_pm;

    fn expanded(args: TokenStream, item: TokenStream) -> String {
        expand_pm(args, item).to_string()
    }

    fn fulfilment() -> TokenStream {
        quote! {
            impl Fulfilment {
                #[handle(start, correlate = "order_id")]
                async fn placed(&mut self, e: OrderPlaced, ctx: &Context) -> Result<(), HandlerError> { Ok(()) }
                #[handle(correlate = "order_ref")]
                async fn paid(&mut self, e: PaymentCaptured) -> Result<(), HandlerError> { Ok(()) }
                #[handle(end, correlate = "order_ref")]
                async fn shipped(&mut self, e: OrderShipped, ctx: &Context) -> Result<(), MyError> { Ok(()) }
            }
        }
    }

    #[test]
    fn expansion() {
        let out = expanded(quote!(sequential_by = true), fulfilment());
        assert!(!out.contains("# [handle"), "{out}");
        assert!(!out.contains("compile_error"), "{out}");
        assert!(
            out.contains("impl :: convoy_runtime :: ProcessManager for Fulfilment"),
            "{out}"
        );
        assert!(out.contains("sequential : true"), "{out}");
        assert!(out.contains("message : __CONVOY_EVENT_0 . descriptor , correlate : \"order_id\" , start : true , end : false"), "{out}");
        assert!(out.contains("message : __CONVOY_EVENT_2 . descriptor , correlate : \"order_ref\" , start : false , end : true"), "{out}");
        assert!(
            out.contains("Self :: placed (self , __convoy_message , __convoy_ctx) . await"),
            "{out}"
        );
        assert!(
            out.contains("Self :: paid (self , __convoy_message) . await"),
            "{out}"
        );
        assert!(out.contains("fn __convoy_correlate_1 (__convoy_event : & PaymentCaptured) -> :: core :: option :: Option < :: std :: string :: String > {"), "{out}");
        assert!(
            out.contains("__convoy_assert_key (& __convoy_event . order_ref) }"),
            "{out}"
        );
        assert!(
            out.contains("return :: core :: result :: Result :: Ok (__convoy_correlate_1 (& __convoy_message))"),
            "{out}"
        );
        assert!(
            out.contains("ProcessManagerRegistration (& __CONVOY_DESCRIPTOR)"),
            "{out}"
        );
        assert!(
            out.contains("const DESCRIPTOR : & 'static :: convoy_runtime :: __private :: ProcessManagerDescriptor = & __CONVOY_DESCRIPTOR ;"),
            "{out}"
        );
        assert!(out.contains("inventory :: submit !"), "{out}");
    }

    #[test]
    fn sequential_by_defaults_to_false() {
        for args in [quote!(), quote!(sequential_by = false)] {
            let out = expanded(args, fulfilment());
            assert!(out.contains("sequential : false"), "{out}");
        }
    }

    #[test]
    fn errors_keep_the_item_and_stub_the_impl() {
        let out = expanded(quote!(sequential_by = "order_id"), fulfilment());
        assert!(out.contains("impl Fulfilment { async fn placed"), "{out}");
        assert!(!out.contains("# [handle"), "{out}");
        assert!(out.contains("compile_error !"), "{out}");
        assert!(out.contains("unreachable !"), "{out}");
        assert!(!out.contains("submit"), "{out}");
    }

    #[test]
    fn unparsable_items_are_returned_with_the_error() {
        let out = expanded(quote!(), quote!(impl Fulfilment for));
        assert!(out.contains("compile_error !"), "{out}");
    }
}
