//! Small parsing and span helpers shared by the attribute macros
//! (`handler/` and `process_manager/`).

use std::fmt::Display;

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::ToTokens;
use syn::Ident;
use syn::ext::IdentExt;
use syn::parse::ParseStream;

use crate::symbol::Symbol;

/// Fails at `key` when the argument `name` was already given.
pub(crate) fn not_yet<T>(slot: &Option<T>, key: Span, name: Symbol) -> syn::Result<()> {
    match slot {
        Some(_) => Err(syn::Error::new(
            key,
            format!("`{name}` given more than once"),
        )),
        None => Ok(()),
    }
}

/// Parses a field name, the content of a `"field"` literal; a keyword
/// (`"type"`) becomes a raw identifier (`r#type`), as the field is declared.
pub(crate) fn field_ident(input: ParseStream<'_>) -> syn::Result<Ident> {
    let ident = input.call(Ident::parse_any)?;
    let name = ident.to_string();
    if name.starts_with("r#") || syn::parse_str::<Ident>(&name).is_ok() {
        return Ok(ident);
    }
    match name.as_str() {
        "self" | "Self" | "super" | "crate" | "_" => Err(input.error("not a field name")),
        _ => Ok(Ident::new_raw(&name, ident.span())),
    }
}

/// The tokens up to the next top-level comma: a value of the wrong shape,
/// consumed whole so that the error covers all of it.
pub(crate) fn rest_of_value(input: ParseStream<'_>) -> syn::Result<TokenStream> {
    let mut value = TokenStream::new();
    while !input.is_empty() && !input.peek(syn::Token![,]) {
        value.extend([input.parse::<TokenTree>()?]);
    }
    Ok(value)
}

/// The error for a value of the wrong shape: `message`, spanned on the
/// value up to the next top-level comma (consumed), or at the end of the
/// input when the value is missing.
pub(crate) fn wrong_value(input: ParseStream<'_>, message: impl Display) -> syn::Error {
    match rest_of_value(input) {
        Ok(value) if value.is_empty() => input.error(message),
        Ok(value) => syn::Error::new_spanned(value, message),
        Err(error) => error,
    }
}

/// `into_handler_result(__convoy_result)` spanned across a method's
/// declared return type `output`, so that an error type that does not
/// convert into `HandlerError` is reported there. (`identity(..)` only gives
/// the argument a span running from the type's first token to its last.)
pub(crate) fn into_result_spanned(output: impl ToTokens) -> TokenStream {
    let (first, last) = span_range(output);
    let into = quote::quote_spanned!(first=> ::convoy_runtime::__private::into_handler_result);
    let identity = quote::quote_spanned!(first=> ::core::convert::identity);
    let args = quote::quote_spanned!(last=> (__convoy_result));
    quote::quote!(#into(#identity #args))
}

/// `into_command_result(<the reply type of command>, __convoy_result,
/// __convoy_ctx)` spanned across a command handler method's return type
/// `output` (as [`into_result_spanned`]), so that a return type whose `Ok`
/// is not the command's `Reply` is reported there.
pub(crate) fn into_command_result_spanned(
    output: impl ToTokens,
    command: impl ToTokens,
) -> TokenStream {
    let (first, last) = span_range(output);
    let into = quote::quote_spanned!(first=> ::convoy_runtime::__private::into_command_result);
    let identity = quote::quote_spanned!(first=> ::core::convert::identity);
    let args = quote::quote_spanned!(last=> (__convoy_result));
    let reply = reply_type(command);
    quote::quote!(#into(#reply, #identity #args, __convoy_ctx))
}

/// A `PhantomData` of the reply type of `command` (`()` when it is not a
/// command, which is reported elsewhere).
pub(crate) fn reply_type(command: impl ToTokens) -> TokenStream {
    quote::quote!({
        #[allow(unused_imports)]
        use ::convoy_runtime::__private::{ViaCommandReply as _, ViaNoReply as _};
        (&::convoy_runtime::__private::ReplyProbe::<#command>::NEW).reply_type()
    })
}

/// One branch of a generated `dispatch`: when the envelope carries the type
/// of `descriptor_const` (a `Handled` const), decode it as `ty`, run `call`
/// (an expression using `__convoy_message`) and convert its result with
/// `into_result`, as one boxed future spanned at `box_span` (for a method,
/// its name, so that a handler future that is not `Send` is reported there,
/// with rustc's note on the offending `.await`).
pub(crate) fn dispatch_branch(
    ty: impl ToTokens,
    descriptor_const: impl ToTokens,
    call: TokenStream,
    into_result: TokenStream,
    box_span: Span,
) -> TokenStream {
    let c = descriptor_const;
    let body = quote::quote! {
        let __convoy_message: #ty = (#c.decode)(__convoy_envelope)?;
        let __convoy_result = #call;
        #into_result
    };
    let boxed = quote::quote_spanned!(box_span=> ::std::boxed::Box::pin(async move { #body }));
    quote::quote! {
        if __convoy_envelope.type_name == #c.descriptor.type_name {
            return #boxed;
        }
    }
}

/// The spans of the first and last token of `tokens`. Generated tokens
/// placed before a user's type get the first span and those after it the
/// last, so that rustc, which joins spans itself, underlines exactly the
/// user's tokens (stable proc macros cannot join spans).
pub(crate) fn span_range(tokens: impl ToTokens) -> (Span, Span) {
    let mut spans = tokens.into_token_stream().into_iter().map(|t| t.span());
    let first = spans.next().unwrap_or_else(Span::call_site);
    let last = spans.last().unwrap_or(first);
    (first, last)
}

#[cfg(test)]
mod tests {
    use quote::quote;
    use syn::parse::Parser;

    use super::*;

    #[test]
    fn field_names() {
        let parse = |s: &str| field_ident.parse_str(s).map(|i| i.to_string());
        assert_eq!(parse("order_id").expect("plain"), "order_id");
        assert_eq!(parse("type").expect("keyword"), "r#type");
        assert_eq!(parse("r#type").expect("raw"), "r#type");
        for bad in ["self", "crate", "_", "a b", "a.b", "0"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rest_of_value_stops_at_the_comma() {
        let parser = |input: ParseStream<'_>| {
            let value = rest_of_value(input)?;
            let rest: TokenStream = input.parse()?;
            Ok((value.to_string(), rest.to_string()))
        };
        let (value, rest) = parser.parse2(quote!(a::b<c, d>, e)).expect("parses");
        // Tokens are not trees of generics: the value stops at the first comma.
        assert_eq!(value, "a :: b < c");
        assert_eq!(rest, ", d > , e");
        let (value, rest) = parser.parse2(quote!((x, y) z)).expect("parses");
        assert_eq!(value, "(x , y) z");
        assert_eq!(rest, "");
    }

    #[test]
    fn duplicates_fail_at_the_second_key() {
        const KEY: Symbol = Symbol("key");
        assert!(not_yet(&None::<()>, Span::call_site(), KEY).is_ok());
        let err = not_yet(&Some(()), Span::call_site(), KEY).expect_err("duplicate");
        assert_eq!(err.to_string(), "`key` given more than once");
    }
}
