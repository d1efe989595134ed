//! What the attribute macros on an impl block with `#[handle]` methods
//! (`#[event_handler]` / `#[command_handler]` in `handler/`,
//! `#[process_manager]` in `process_manager/`) share: the expansion
//! frame, the `#[handle]` markers, the checks of the impl block's header
//! and items, and the pieces of generated code both emit.
//!
//! Each macro passes its own wording; the messages stay the macro's.

use std::collections::BTreeSet;
use std::fmt::Display;

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::ParseStream;
use syn::{
    Attribute, Generics, Ident, ImplItem, ImplItemFn, Item, ItemImpl, LitStr, PathArguments, Type,
};

use crate::ctxt::Ctxt;
use crate::symbol::HANDLE;
use crate::tokens::{field_ident, span_range, wrong_value};

/// Expands an attribute macro on `item`: `generate` parses the macro's
/// arguments, validates them with the item into `cx` and returns the
/// generated code when the declaration is valid. Whatever happens the
/// user's item is emitted again (without its `#[handle]` markers); on
/// errors, with `fallback`'s stub impl beside them. `what` names the
/// declaration in the message of a rejection without an error (a bug).
pub(crate) fn expand(
    item: TokenStream,
    what: &str,
    generate: impl FnOnce(&Ctxt, &Item) -> Option<TokenStream>,
    fallback: impl FnOnce(&Item) -> TokenStream,
) -> TokenStream {
    let parsed: Item = match syn::parse2(item.clone()) {
        Ok(parsed) => parsed,
        Err(error) => {
            let mut out = item;
            out.extend(error.into_compile_error());
            return out;
        }
    };
    let cx = Ctxt::new();
    let generated = generate(&cx, &parsed);
    let user_item = strip_handle_markers(parsed.clone());
    match (cx.check(), generated) {
        (Ok(()), Some(generated)) => quote!(#user_item #generated),
        (Err(error), _) => {
            let fallback = fallback(&parsed);
            let error = error.into_compile_error();
            quote!(#user_item #fallback #error)
        }
        (Ok(()), None) => {
            let error = syn::Error::new(
                Span::call_site(),
                format!("convoy-macros bug: {what} rejected without an error"),
            )
            .into_compile_error();
            quote!(#user_item #error)
        }
    }
}

/// The item without its `#[handle]` markers (which are not real attributes).
fn strip_handle_markers(mut item: Item) -> Item {
    if let Item::Impl(imp) = &mut item {
        for impl_item in &mut imp.items {
            let attrs = match impl_item {
                ImplItem::Fn(f) => &mut f.attrs,
                ImplItem::Const(c) => &mut c.attrs,
                ImplItem::Type(t) => &mut t.attrs,
                ImplItem::Macro(m) => &mut m.attrs,
                _ => continue,
            };
            attrs.retain(|a| !is_handle(a));
        }
    }
    item
}

/// Whether `attr` is `#[handle]` (in any form).
pub(crate) fn is_handle(attr: &Attribute) -> bool {
    attr.path() == HANDLE
}

/// The first `#[handle]` marker of `attrs`, if any, after `check_first`
/// looked at it; each further marker is reported.
pub(crate) fn handle_marker<'a>(
    cx: &Ctxt,
    attrs: &'a [Attribute],
    check_first: impl FnOnce(&'a Attribute),
) -> Option<&'a Attribute> {
    let mut markers = attrs.iter().filter(|a| is_handle(a));
    let first = markers.next()?;
    check_first(first);
    for extra in markers {
        cx.error_spanned_by(extra, "`#[handle]` given more than once");
    }
    Some(first)
}

/// A field named in double quotes: `sequential_by = "client_id"`,
/// `correlate = "order_id"`.
pub(crate) struct QuotedField {
    /// The field as an identifier carrying the literal's span, so that
    /// rustc's errors about the field point at the user's string.
    pub(crate) ident: Ident,
    /// The field's name (`type` for `r#type`).
    pub(crate) name: String,
    /// The literal as written.
    pub(crate) lit: LitStr,
}

/// Parses a field name in double quotes; any other value fails with
/// `message`, spanned on the value.
pub(crate) fn quoted_field(
    input: ParseStream<'_>,
    message: impl Display,
) -> syn::Result<QuotedField> {
    if !input.peek(LitStr) {
        return Err(wrong_value(input, message));
    }
    let lit: LitStr = input.parse()?;
    let ident = lit.parse_with(field_ident).map_err(|_| {
        syn::Error::new(lit.span(), "expected a single field name in double quotes")
    })?;
    Ok(QuotedField {
        name: ident.unraw().to_string(),
        ident,
        lit,
    })
}

/// The messages of one macro about an impl block's header.
pub(crate) struct Header<'m> {
    /// The block is a trait impl.
    pub(crate) trait_impl: &'m str,
    /// The block is `unsafe`.
    pub(crate) unsafe_impl: &'m str,
    /// The block or its self type is generic.
    pub(crate) generic: &'m str,
    /// The self type is not a plain path.
    pub(crate) not_named: &'m str,
}

/// Checks the header of `imp`: an inherent, safe, non-generic impl of a
/// named type. Returns the type's name (`ClientLedger` of
/// `ledger::ClientLedger`) when it has one.
pub(crate) fn check_header(cx: &Ctxt, imp: &ItemImpl, header: &Header<'_>) -> Option<String> {
    if let Some((trait_path, _)) = &imp.trait_ {
        cx.error_spanned_by(trait_path, header.trait_impl);
    }
    if let Some(unsafety) = &imp.unsafety {
        cx.error_spanned_by(unsafety, header.unsafe_impl);
    }
    let generic = !imp.generics.params.is_empty();
    reject_generics(cx, &imp.generics, header.generic);
    self_type_name(cx, &imp.self_ty, !generic, header)
}

/// Reports generic parameters or a where clause.
pub(crate) fn reject_generics(cx: &Ctxt, generics: &Generics, message: &str) {
    if !generics.params.is_empty() {
        cx.error_spanned_by(generics, message);
    } else if let Some(where_clause) = &generics.where_clause {
        cx.error_spanned_by(where_clause, message);
    }
}

/// The name of an impl block's self type, which must be a plain path.
/// Generic arguments are reported when `report_arguments` (not when the
/// impl's own generics were already reported).
fn self_type_name(
    cx: &Ctxt,
    ty: &Type,
    report_arguments: bool,
    header: &Header<'_>,
) -> Option<String> {
    if let Type::Path(path) = ty
        && path.qself.is_none()
    {
        let last = path.path.segments.last()?;
        if let PathArguments::None = last.arguments {
            return Some(last.ident.unraw().to_string());
        }
        if report_arguments {
            cx.error_spanned_by(&last.arguments, header.generic);
        }
        return None;
    }
    cx.error_spanned_by(ty, header.not_named);
    None
}

/// Calls `method` with each method of `imp`, in order, and reports a
/// `#[handle]` marker on any other item.
pub(crate) fn for_each_method<'a>(
    cx: &Ctxt,
    imp: &'a ItemImpl,
    mut method: impl FnMut(&'a ImplItemFn),
) {
    for impl_item in &imp.items {
        match impl_item {
            ImplItem::Fn(f) => method(f),
            ImplItem::Const(c) => reject_marker(cx, &c.attrs),
            ImplItem::Type(t) => reject_marker(cx, &t.attrs),
            ImplItem::Macro(m) => reject_marker(cx, &m.attrs),
            _ => {}
        }
    }
}

/// Reports `#[handle]` on something that is not a method.
fn reject_marker(cx: &Ctxt, attrs: &[Attribute]) {
    for marker in attrs.iter().filter(|a| is_handle(a)) {
        cx.error_spanned_by(marker, "`#[handle]` goes on an async method");
    }
}

/// Reports a type handled twice by `owner`, at the second occurrence:
/// "`T` is handled twice by `owner`; each {`once_per`}".
pub(crate) fn reject_duplicates<'a>(
    cx: &Ctxt,
    owner: &str,
    types: impl IntoIterator<Item = &'a Type>,
    once_per: &str,
) {
    let mut seen = BTreeSet::new();
    for ty in types {
        if !seen.insert(ty.to_token_stream().to_string()) {
            cx.error_spanned_by(
                ty,
                format!(
                    "`{}` is handled twice by `{owner}`; each {once_per}",
                    written(ty)
                ),
            );
        }
    }
}

/// Tokens as the user wrote them, without the spaces of token printing.
pub(crate) fn written(tokens: impl ToTokens) -> String {
    tokens.to_token_stream().to_string().replace(' ', "")
}

/// The span of the keyword that starts an item, for "wrong kind of item".
pub(crate) fn item_keyword_span(item: &Item) -> Span {
    match item {
        Item::Struct(i) => i.struct_token.span,
        Item::Enum(i) => i.enum_token.span,
        Item::Fn(i) => i.sig.fn_token.span,
        Item::Trait(i) => i.trait_token.span,
        Item::Union(i) => i.union_token.span,
        Item::Mod(i) => i.mod_token.span,
        Item::Type(i) => i.type_token.span,
        Item::Const(i) => i.const_token.span,
        Item::Static(i) => i.static_token.span,
        _ => Span::call_site(),
    }
}

/// `__CONVOY_{what}_0`, `__CONVOY_{what}_1`, ..: the names of the `n`
/// `Handled` constants of the generated code.
pub(crate) fn handled_const_names(what: &str, n: usize) -> Vec<Ident> {
    (0..n)
        .map(|i| format_ident!("__CONVOY_{}_{}", what, i))
        .collect()
}

/// One `const __CONVOY_.._i: Handled<T> = resolve::<T>();` per handled
/// type: the only place that requires `T` to be a message of the right
/// kind (`resolve` is `handled_event` or `handled_command`), spanned
/// across the user's type so that a type of the wrong kind is reported
/// there, once.
pub(crate) fn handled_consts<'a>(
    consts: &[Ident],
    types: impl IntoIterator<Item = &'a Type>,
    resolve: &str,
) -> TokenStream {
    types
        .into_iter()
        .zip(consts)
        .map(|(ty, c)| {
            let (first, last) = span_range(ty);
            let resolve = Ident::new(resolve, first);
            let head = quote_spanned!(first=> ::convoy_runtime::__private::#resolve::<);
            let tail = quote_spanned!(last=> >());
            quote! {
                const #c: ::convoy_runtime::__private::Handled<#ty> = #head #ty #tail;
            }
        })
        .collect()
}

/// The `dispatch` method of a generated impl, taking `&self` (or
/// `&mut self` when `mutable`): `branches` (each returning when the
/// envelope is its type), then `Dispatched::NotHandled`.
pub(crate) fn dispatch_fn(
    mutable: bool,
    branches: impl IntoIterator<Item = TokenStream>,
) -> TokenStream {
    let signature = dispatch_signature(mutable, quote!(__convoy_envelope), quote!(__convoy_ctx));
    let branches = branches.into_iter();
    quote! {
        #signature {
            #(#branches)*
            ::std::boxed::Box::pin(::core::future::ready(::core::result::Result::Ok(
                ::convoy_runtime::__private::Dispatched::NotHandled,
            )))
        }
    }
}

/// The `dispatch` method of a stub impl (never called).
pub(crate) fn dispatch_stub(mutable: bool) -> TokenStream {
    let signature = dispatch_signature(mutable, quote!(_), quote!(_));
    quote! {
        #signature {
            ::core::unreachable!()
        }
    }
}

fn dispatch_signature(mutable: bool, envelope: TokenStream, ctx: TokenStream) -> TokenStream {
    let receiver = if mutable {
        quote!(&'__convoy mut self)
    } else {
        quote!(&'__convoy self)
    };
    quote! {
        fn dispatch<'__convoy>(
            #receiver,
            #envelope: &'__convoy ::convoy_runtime::Envelope,
            #ctx: &'__convoy ::convoy_runtime::Context,
        ) -> ::convoy_runtime::__private::BoxFuture<
            '__convoy,
            ::core::result::Result<
                ::convoy_runtime::__private::Dispatched,
                ::convoy_runtime::HandlerError,
            >,
        >
    }
}

/// The self type of `imp` when a stub impl can name it: an inherent,
/// non-generic impl of a plain path without generic arguments.
pub(crate) fn nameable_self_ty(imp: &ItemImpl) -> Option<TokenStream> {
    if imp.trait_.is_some() || !imp.generics.params.is_empty() {
        return None;
    }
    match &*imp.self_ty {
        Type::Path(p)
            if p.qself.is_none()
                && p.path
                    .segments
                    .iter()
                    .all(|s| matches!(s.arguments, PathArguments::None)) =>
        {
            Some(p.to_token_stream())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;
    use syn::parse::Parser;
    use syn::parse_quote;

    use super::*;
    use crate::ctxt::messages;

    fn errors(check: impl FnOnce(&Ctxt)) -> Vec<String> {
        messages(|cx| {
            check(cx);
            Some(())
        })
    }

    const HEADER: Header<'static> = Header {
        trait_impl: "trait impl",
        unsafe_impl: "unsafe",
        generic: "generic",
        not_named: "not named",
    };

    #[test]
    fn header_problems_are_reported_together() {
        let imp: ItemImpl = parse_quote!(
            unsafe impl<T> Default for a::B<T> {}
        );
        let mut name = Some(String::new());
        let e = errors(|cx| name = check_header(cx, &imp, &HEADER));
        assert_eq!(e, ["trait impl", "unsafe", "generic"]);
        assert_eq!(name, None);
        let imp: ItemImpl = parse_quote!(impl a::r#B {});
        let e = errors(|cx| name = check_header(cx, &imp, &HEADER));
        assert!(e.is_empty(), "{e:?}");
        assert_eq!(name.as_deref(), Some("B"));
        let imp: ItemImpl = parse_quote!(impl [u8] {});
        assert_eq!(
            errors(|cx| {
                check_header(cx, &imp, &HEADER);
            }),
            ["not named"]
        );
    }

    #[test]
    fn markers_and_duplicates() {
        let imp: ItemImpl = parse_quote! {
            impl A {
                #[handle] const C: u8 = 0;
                #[handle] #[handle(x)] fn f(&self) {}
                fn g(&self) {}
            }
        };
        let mut marked = Vec::new();
        let e = errors(|cx| {
            for_each_method(cx, &imp, |m| {
                if handle_marker(cx, &m.attrs, |_| {}).is_some() {
                    marked.push(m.sig.ident.to_string());
                }
            })
        });
        assert_eq!(
            e,
            [
                "`#[handle]` goes on an async method",
                "`#[handle]` given more than once"
            ]
        );
        assert_eq!(marked, ["f"]);
        let types: Vec<Type> = vec![parse_quote!(a::B), parse_quote!(C), parse_quote!(a::B)];
        assert_eq!(
            errors(|cx| reject_duplicates(cx, "H", &types, "type once")),
            ["`a::B` is handled twice by `H`; each type once"]
        );
    }

    #[test]
    fn quoted_fields() {
        let parse = |tokens| (|input: ParseStream<'_>| quoted_field(input, "bad")).parse2(tokens);
        let field = parse(quote!("type")).expect("keyword");
        assert_eq!(
            (field.ident.to_string(), field.name),
            ("r#type".into(), "type".into())
        );
        assert_eq!(parse(quote!(x)).err().expect("ident").to_string(), "bad");
        assert_eq!(
            parse(quote!("a b")).err().expect("two words").to_string(),
            "expected a single field name in double quotes"
        );
    }

    #[test]
    fn only_plain_inherent_impls_get_a_stub() {
        let named = |imp: ItemImpl| nameable_self_ty(&imp).map(|t| t.to_string());
        assert_eq!(named(parse_quote!(impl a::B {})).as_deref(), Some("a :: B"));
        assert_eq!(named(parse_quote!(impl B<u8> {})), None);
        assert_eq!(
            named(parse_quote!(
                impl<T> B {}
            )),
            None
        );
        assert_eq!(named(parse_quote!(impl Default for B {})), None);
    }
}
