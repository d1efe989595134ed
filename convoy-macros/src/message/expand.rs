//! Code generation for the message derives. Only ever sees validated input.

use proc_macro2::TokenStream;
use quote::{ToTokens, quote, quote_spanned};
use syn::Ident;
use syn::ext::IdentExt;
use syn::spanned::Spanned;

use super::{Aggregate, Kind, Message};

/// `impl Aggregate`.
pub(super) fn aggregate(aggregate: &Aggregate<'_>) -> TokenStream {
    let ident = aggregate.ident;
    let category = &aggregate.category;
    let partition_key = aggregate.partition_key.as_ref().map(|key| {
        quote! {
            const PARTITION_KEY: ::core::option::Option<&'static str> =
                ::core::option::Option::Some(#key);
        }
    });
    quote! {
        #[automatically_derived]
        impl ::convoy_runtime::Aggregate for #ident {
            const CATEGORY: &'static str = #category;
            #partition_key
        }
    }
}

/// `impl Message`, `impl Event`/`impl Command`, and the registration.
pub(super) fn message(message: &Message<'_>) -> TokenStream {
    let ident = message.ident;
    let rust_name = ident.unraw().to_string();
    let type_name = &message.type_name;
    let part_of = &message.part_of;
    let kind = message_kind(message.kind);
    let kind_trait = message.kind.message_trait();
    let names: Vec<String> = message
        .fields
        .iter()
        .map(|f| f.unraw().to_string())
        .collect();

    // Spanned at the user's path, so a type that is not an aggregate is
    // reported there, with the message of `Aggregate`'s
    // `#[diagnostic::on_unimplemented]`.
    let aggregate = quote_spanned! {part_of.span()=>
        type Aggregate = #part_of;
    };

    let partition_key = if message.fields.is_empty() {
        quote! {
            let _ = __convoy_field;
            ::core::option::Option::None
        }
    } else {
        let arms = message.fields.iter().zip(&names).map(|(field, name)| {
            quote! {
                #name => (&::convoy_runtime::__private::KeyProbe(&self.#field)).probe_key(),
            }
        });
        quote! {
            // Autoref specialisation: `ViaPartitionKey` applies to key types,
            // `ViaFallback` (one more reference away) to every other type.
            #[allow(unused_imports)]
            use ::convoy_runtime::__private::{ViaFallback as _, ViaPartitionKey as _};
            match __convoy_field {
                #(#arms)*
                _ => ::core::option::Option::None,
            }
        }
    };

    let is_event = message.kind == Kind::Event;
    // An event of an aggregate that declares its partition key must carry
    // the field: asserted at compile time, at the user's `part_of`.
    let key_check = is_event.then(|| {
        let text = format!(
            "`{rust_name}` lacks the partition key field that its aggregate `{}` declares (`#[aggregate(partition_key = ..)]`): add the field, or make it part of another aggregate",
            part_of.to_token_stream().to_string().replace(' ', "")
        );
        quote_spanned! {part_of.span()=>
            const _: () = ::core::assert!(
                ::convoy_runtime::__private::has_declared_key(
                    ::convoy_runtime::__private::declared_key_of::<#ident>(true),
                    &[#(#names),*],
                ),
                #text
            );
        }
    });

    let kind_body = match (message.kind, &message.reply) {
        (Kind::Event, _) => TokenStream::new(),
        (Kind::Command, Some(reply)) => quote_spanned! {reply.span()=> type Reply = #reply; },
        (Kind::Command, None) => quote!(
            type Reply = ();
        ),
    };

    // One error, at the user's type, when it lacks the serde derives (the
    // impl below compiles either way: its JSON goes through the same probe).
    let serde_check = quote_spanned! {ident.span()=>
        #[allow(dead_code)]
        fn __convoy_requires_serde() {
            #[allow(unused_imports)]
            use ::convoy_runtime::__private::{ViaNoSerde as _, ViaSerde as _};
            ::convoy_runtime::__private::require_serde::<#ident, _>(
                (&::convoy_runtime::__private::SerdeProbe::<#ident>::new()).serde_check(),
            );
        }
    };

    quote! {
        #[doc(hidden)]
        #[allow(non_upper_case_globals, unused_qualifications, clippy::needless_borrow)]
        const _: () = {
            #serde_check

            #key_check

            #[automatically_derived]
            impl ::convoy_runtime::Message for #ident {
                #aggregate
                const DESCRIPTOR: &'static ::convoy_runtime::__private::MessageDescriptor =
                    &::convoy_runtime::__private::MessageDescriptor {
                        type_name: #type_name,
                        rust_path: ::core::concat!(::core::module_path!(), "::", #rust_name),
                        kind: #kind,
                        category: ::convoy_runtime::__private::category_of::<Self>(),
                        fields: &[#(#names),*],
                        partition_key: ::convoy_runtime::__private::declared_key_of::<Self>(#is_event),
                    };

                fn partition_key(
                    &self,
                    __convoy_field: &str,
                ) -> ::core::option::Option<::core::option::Option<::std::string::String>> {
                    #partition_key
                }

                fn to_json(
                    &self,
                ) -> ::core::result::Result<::std::string::String, ::convoy_runtime::__private::JsonError> {
                    #[allow(unused_imports)]
                    use ::convoy_runtime::__private::{ViaNoSerde as _, ViaSerde as _};
                    (&::convoy_runtime::__private::SerdeProbe::<Self>::new()).encode_json(self)
                }

                fn from_json(
                    json: &str,
                ) -> ::core::result::Result<Self, ::convoy_runtime::__private::JsonError> {
                    #[allow(unused_imports)]
                    use ::convoy_runtime::__private::{ViaNoSerde as _, ViaSerde as _};
                    (&::convoy_runtime::__private::SerdeProbe::<Self>::new()).decode_json(json)
                }
            }

            #[automatically_derived]
            impl #kind_trait for #ident {
                #kind_body
            }

            ::convoy_runtime::__private::inventory::submit! {
                ::convoy_runtime::__private::MessageRegistration(
                    <#ident as ::convoy_runtime::Message>::DESCRIPTOR
                )
            }
        };
    }
}

/// Stub `impl Aggregate` emitted beside the errors of an invalid derive.
pub(super) fn aggregate_fallback(ident: &Ident) -> TokenStream {
    quote! {
        impl ::convoy_runtime::Aggregate for #ident {
            const CATEGORY: &'static str = "";
        }
    }
}

/// Stub message impls emitted beside the errors of an invalid derive, so
/// handlers naming the type do not report it again. Never registered.
pub(super) fn message_fallback(ident: &Ident, kind: Kind) -> TokenStream {
    let rust_name = ident.unraw().to_string();
    let message_kind = message_kind(kind);
    let kind_trait = kind.message_trait();
    let kind_body = match kind {
        Kind::Event => TokenStream::new(),
        Kind::Command => quote!(
            type Reply = ();
        ),
    };
    quote! {
        const _: () = {
            impl ::convoy_runtime::Message for #ident {
                type Aggregate = ::convoy_runtime::__private::UnknownAggregate;
                const DESCRIPTOR: &'static ::convoy_runtime::__private::MessageDescriptor =
                    &::convoy_runtime::__private::MessageDescriptor {
                        type_name: #rust_name,
                        rust_path: #rust_name,
                        kind: #message_kind,
                        category: "",
                        fields: &[],
                        partition_key: ::core::option::Option::None,
                    };

                fn partition_key(
                    &self,
                    _: &str,
                ) -> ::core::option::Option<::core::option::Option<::std::string::String>> {
                    ::core::option::Option::None
                }

                fn to_json(
                    &self,
                ) -> ::core::result::Result<::std::string::String, ::convoy_runtime::__private::JsonError> {
                    ::convoy_runtime::__private::no_json()
                }

                fn from_json(
                    _: &str,
                ) -> ::core::result::Result<Self, ::convoy_runtime::__private::JsonError> {
                    ::convoy_runtime::__private::no_json()
                }
            }

            impl #kind_trait for #ident {
                #kind_body
            }
        };
    }
}

/// `MessageKind::Event` / `MessageKind::Command`.
fn message_kind(kind: Kind) -> TokenStream {
    match kind {
        Kind::Event => quote!(::convoy_runtime::__private::MessageKind::Event),
        Kind::Command => quote!(::convoy_runtime::__private::MessageKind::Command),
    }
}

#[cfg(test)]
mod tests {
    use syn::{DeriveInput, parse_quote};

    use crate::message::{Kind, derive_aggregate, derive_message};

    #[test]
    fn event_expansion_names_fields_and_registers() {
        let input: DeriveInput = parse_quote! {
            #[event(part_of = Order, name = "Placed")]
            struct OrderPlaced { order_id: String, r#type: u8 }
        };
        let out = derive_message(&input, Kind::Event).to_string();
        assert!(
            out.contains("impl :: convoy_runtime :: Message for OrderPlaced"),
            "{out}"
        );
        assert!(
            out.contains("impl :: convoy_runtime :: Event for OrderPlaced"),
            "{out}"
        );
        assert!(out.contains("type Aggregate = Order ;"), "{out}");
        assert!(out.contains("type_name : \"Placed\""), "{out}");
        assert!(
            out.contains("fields : & [\"order_id\" , \"type\"]"),
            "{out}"
        );
        assert!(out.contains("\"type\" => (& :: convoy_runtime :: __private :: KeyProbe (& self . r#type)) . probe_key ()"), "{out}");
        assert!(out.contains("inventory :: submit !"), "{out}");
        assert!(!out.contains("compile_error"), "{out}");
    }

    #[test]
    fn invalid_message_emits_errors_and_stub_impls() {
        let input: DeriveInput = parse_quote!(
            struct Ship {
                id: u64,
            }
        );
        let out = derive_message(&input, Kind::Command).to_string();
        assert!(out.contains("compile_error !"), "{out}");
        assert!(out.contains("missing `#[command(part_of = ...)]`"), "{out}");
        assert!(
            out.contains("impl :: convoy_runtime :: Command for Ship"),
            "{out}"
        );
        assert!(!out.contains("submit"), "{out}");
    }

    #[test]
    fn aggregate_expansion() {
        let input: DeriveInput = parse_quote!(
            struct OrderLine;
        );
        let out = derive_aggregate(&input).to_string();
        assert!(
            out.contains("const CATEGORY : & 'static str = \"order_line\" ;"),
            "{out}"
        );
    }
}
