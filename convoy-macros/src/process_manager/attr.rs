//! Parsing of `#[process_manager(sequential_by = true)]` and of the
//! `#[handle(start, end, correlate = "field")]` method marker.
//!
//! Parsing fails fast at the first problem inside one attribute, spanned on
//! the smallest wrong token.

use proc_macro2::TokenStream;
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Attribute, Ident, LitBool, Meta, Token};

use crate::impl_block::{QuotedField, quoted_field};
use crate::symbol::{self, PART_OF, SEQUENTIAL_BY, Symbol};
use crate::tokens::{not_yet, rest_of_value, wrong_value};

/// `correlate = "field"` in `#[handle(..)]`.
pub(crate) const CORRELATE: Symbol = Symbol("correlate");
/// `start` in `#[handle(..)]`.
pub(crate) const START: Symbol = Symbol("start");
/// `end` in `#[handle(..)]`.
pub(crate) const END: Symbol = Symbol("end");

/// The arguments of `#[process_manager(..)]`.
pub(crate) const PROCESS_MANAGER_ARGS: &[Symbol] = &[SEQUENTIAL_BY];
/// The arguments of `#[handle(..)]` on a process manager.
pub(crate) const HANDLE_ARGS: &[Symbol] = &[START, END, CORRELATE];

mod kw {
    syn::custom_keyword!(sequential_by);
    syn::custom_keyword!(start);
    syn::custom_keyword!(end);
    syn::custom_keyword!(correlate);
}

/// The arguments of `#[process_manager(..)]`.
pub(crate) struct Args {
    /// `sequential_by = true | false`; `None` when not given (false).
    pub(crate) sequential_by: Option<LitBool>,
}

impl Args {
    /// Parses the arguments of `#[process_manager(..)]`.
    pub(crate) fn parse(tokens: TokenStream) -> syn::Result<Args> {
        parse_args.parse2(tokens)
    }

    /// Whether instances are serialized per correlation value.
    pub(crate) fn sequential(&self) -> bool {
        self.sequential_by.as_ref().is_some_and(LitBool::value)
    }
}

fn parse_args(input: ParseStream<'_>) -> syn::Result<Args> {
    let mut sequential_by = None;
    while !input.is_empty() {
        let lookahead = input.lookahead1();
        if lookahead.peek(kw::sequential_by) {
            let key: kw::sequential_by = input.parse()?;
            not_yet(&sequential_by, key.span, SEQUENTIAL_BY)?;
            input.parse::<Token![=]>()?;
            sequential_by = Some(sequential_value(input)?);
        } else if input.peek(Ident::peek_any) {
            let unknown = input.call(Ident::parse_any)?;
            return Err(unknown_argument(&unknown));
        } else {
            return Err(lookahead.error());
        }
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    Ok(Args { sequential_by })
}

/// The error for an unknown argument of `#[process_manager(..)]`; names the
/// right place for the arguments of the handler attributes.
fn unknown_argument(unknown: &Ident) -> syn::Error {
    let message = if unknown == PART_OF {
        "a process manager has no `part_of`: it subscribes to the category of each event it handles"
    } else if unknown == CORRELATE {
        "`correlate` goes on each handler method, for example `#[handle(correlate = \"order_id\")]`"
    } else {
        return symbol::unknown_argument_at(unknown, PROCESS_MANAGER_ARGS);
    };
    syn::Error::new(unknown.span(), message)
}

/// Parses the value of `sequential_by`: `true` or `false`.
fn sequential_value(input: ParseStream<'_>) -> syn::Result<LitBool> {
    if input.peek(LitBool) {
        return input.parse();
    }
    Err(wrong_value(
        input,
        "`sequential_by` on a process manager is `true` or `false`: it partitions each subscribed category by the field its `correlate` names",
    ))
}

/// The parsed arguments of one `#[handle(..)]` marker.
pub(crate) struct HandleAttrs<'a> {
    /// The marker, for errors about it as a whole.
    pub(crate) attr: &'a Attribute,
    /// `start`: the event creates the instance.
    pub(crate) start: bool,
    /// `end`: the event completes the instance.
    pub(crate) end: bool,
    /// `correlate = "field"`: the correlation field.
    pub(crate) correlate: Option<QuotedField>,
}

impl<'a> HandleAttrs<'a> {
    /// Parses one `#[handle]`, `#[handle(..)]` marker.
    pub(crate) fn parse(attr: &'a Attribute) -> syn::Result<HandleAttrs<'a>> {
        let mut out = HandleAttrs {
            attr,
            start: false,
            end: false,
            correlate: None,
        };
        match &attr.meta {
            Meta::Path(_) => {}
            Meta::List(list) => {
                list.parse_args_with(|input: ParseStream<'_>| parse_handle(&mut out, input))?
            }
            Meta::NameValue(nv) => {
                return Err(syn::Error::new_spanned(
                    &nv.value,
                    "`#[handle]` on a process manager takes its arguments in parentheses, for example `#[handle(start, correlate = \"order_id\")]`",
                ));
            }
        }
        Ok(out)
    }
}

fn parse_handle(out: &mut HandleAttrs<'_>, input: ParseStream<'_>) -> syn::Result<()> {
    let mut start = None;
    let mut end = None;
    while !input.is_empty() {
        let lookahead = input.lookahead1();
        if lookahead.peek(kw::start) {
            let key: kw::start = input.parse()?;
            not_yet(&start, key.span, START)?;
            no_value(input, START)?;
            start = Some(key.span);
        } else if lookahead.peek(kw::end) {
            let key: kw::end = input.parse()?;
            not_yet(&end, key.span, END)?;
            no_value(input, END)?;
            end = Some(key.span);
        } else if lookahead.peek(kw::correlate) {
            let key: kw::correlate = input.parse()?;
            not_yet(&out.correlate, key.span, CORRELATE)?;
            input.parse::<Token![=]>()?;
            out.correlate = Some(correlate_field(input)?);
        } else if input.peek(Ident::peek_any) {
            let unknown = input.call(Ident::parse_any)?;
            return Err(symbol::unknown_argument_at(&unknown, HANDLE_ARGS));
        } else {
            return Err(lookahead.error());
        }
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    out.start = start.is_some();
    out.end = end.is_some();
    Ok(())
}

/// Rejects `start = ..`: `start` and `end` are flags.
fn no_value(input: ParseStream<'_>, key: Symbol) -> syn::Result<()> {
    if !input.peek(Token![=]) {
        return Ok(());
    }
    let eq: Token![=] = input.parse()?;
    let value = rest_of_value(input)?;
    Err(syn::Error::new_spanned(
        quote::quote!(#eq #value),
        format!("`{key}` takes no value: write `#[handle({key}, correlate = \"...\")]`"),
    ))
}

/// Parses the value of `correlate`: a field name in double quotes.
fn correlate_field(input: ParseStream<'_>) -> syn::Result<QuotedField> {
    quoted_field(
        input,
        "`correlate` takes a field name in double quotes, for example `correlate = \"order_id\"`",
    )
}

#[cfg(test)]
mod tests {
    use quote::quote;
    use syn::parse_quote;

    use super::*;

    fn args(tokens: TokenStream) -> Result<Args, String> {
        Args::parse(tokens).map_err(|e| e.to_string())
    }

    fn args_error(tokens: TokenStream) -> String {
        match args(tokens) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e,
        }
    }

    fn handle(attr: Attribute) -> Result<(bool, bool, Option<String>), String> {
        HandleAttrs::parse(&attr)
            .map(|h| (h.start, h.end, h.correlate.map(|c| c.ident.to_string())))
            .map_err(|e| e.to_string())
    }

    fn handle_error(attr: Attribute) -> String {
        match handle(attr) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e,
        }
    }

    const NOT_A_BOOL: &str = "`sequential_by` on a process manager is `true` or `false`: it partitions each subscribed category by the field its `correlate` names";

    #[test]
    fn sequential_by_is_a_bool_and_optional() {
        assert!(args(quote!()).expect("empty").sequential_by.is_none());
        assert!(!args(quote!()).expect("empty").sequential());
        assert!(
            args(quote!(sequential_by = true))
                .expect("true")
                .sequential()
        );
        assert!(
            !args(quote!(sequential_by = false))
                .expect("false")
                .sequential()
        );
        assert!(
            args(quote!(sequential_by = true,))
                .expect("trailing comma")
                .sequential()
        );
    }

    #[test]
    fn sequential_by_rejects_other_values() {
        for bad in [
            quote!(sequential_by = "order_id"),
            quote!(sequential_by = order_id),
            quote!(sequential_by = 1),
            quote!(sequential_by = True),
            quote!(sequential_by = a::b, sequential_by = true),
        ] {
            assert_eq!(args_error(bad.clone()), NOT_A_BOOL, "{bad}");
        }
        assert!(args_error(quote!(sequential_by =)).ends_with(NOT_A_BOOL));
        assert_eq!(args_error(quote!(sequential_by)), "expected `=`");
    }

    #[test]
    fn a_string_is_reported_at_the_literal() {
        let tokens: TokenStream = "sequential_by = \"order_id\"".parse().expect("tokens");
        let lit_span = tokens
            .clone()
            .into_iter()
            .nth(2)
            .expect("the literal")
            .span();
        let err = Args::parse(tokens).err().expect("a string");
        assert_eq!(format!("{:?}", err.span()), format!("{lit_span:?}"));
    }

    #[test]
    fn duplicates_and_unknown_arguments() {
        assert_eq!(
            args_error(quote!(sequential_by = true, sequential_by = false)),
            "`sequential_by` given more than once"
        );
        assert_eq!(
            args_error(quote!(sequental_by = true)),
            "unknown argument `sequental_by`; did you mean `sequential_by`?"
        );
        assert_eq!(
            args_error(quote!(key = true)),
            "unknown argument `key`; expected `sequential_by`"
        );
        assert_eq!(
            args_error(quote!(part_of = Order)),
            "a process manager has no `part_of`: it subscribes to the category of each event it handles"
        );
        assert_eq!(
            args_error(quote!(correlate = "order_id")),
            "`correlate` goes on each handler method, for example `#[handle(correlate = \"order_id\")]`"
        );
        assert_eq!(args_error(quote!("x")), "expected `sequential_by`");
        assert_eq!(
            args_error(quote!(sequential_by = true sequential_by)),
            "expected `,`"
        );
    }

    #[test]
    fn handle_markers() {
        assert_eq!(handle(parse_quote!(#[handle])), Ok((false, false, None)));
        assert_eq!(
            handle(parse_quote!(#[handle(start, correlate = "order_id")])),
            Ok((true, false, Some("order_id".into())))
        );
        assert_eq!(
            handle(parse_quote!(#[handle(correlate = "order_ref", end)])),
            Ok((false, true, Some("order_ref".into())))
        );
        assert_eq!(
            handle(parse_quote!(#[handle(start, end, correlate = "type",)])),
            Ok((true, true, Some("r#type".into())))
        );
        assert_eq!(
            handle(parse_quote!(#[handle(end)])),
            Ok((false, true, None))
        );
    }

    #[test]
    fn handle_marker_errors() {
        assert_eq!(
            handle_error(parse_quote!(#[handle(start, start, correlate = "a")])),
            "`start` given more than once"
        );
        assert_eq!(
            handle_error(parse_quote!(#[handle(correlate = "a", correlate = "b")])),
            "`correlate` given more than once"
        );
        assert_eq!(
            handle_error(parse_quote!(#[handle(corelate = "a")])),
            "unknown argument `corelate`; did you mean `correlate`?"
        );
        assert_eq!(
            handle_error(parse_quote!(#[handle(begin)])),
            "unknown argument `begin`; expected `start`, `end` or `correlate`"
        );
        assert_eq!(
            handle_error(parse_quote!(#[handle(correlate = order_id)])),
            "`correlate` takes a field name in double quotes, for example `correlate = \"order_id\"`"
        );
        assert_eq!(
            handle_error(parse_quote!(#[handle(correlate = "order id")])),
            "expected a single field name in double quotes"
        );
        assert_eq!(
            handle_error(parse_quote!(#[handle(start = true)])),
            "`start` takes no value: write `#[handle(start, correlate = \"...\")]`"
        );
        assert_eq!(
            handle_error(parse_quote!(#[handle = "order_id"])),
            "`#[handle]` on a process manager takes its arguments in parentheses, for example `#[handle(start, correlate = \"order_id\")]`"
        );
        assert_eq!(
            handle_error(parse_quote!(#[handle("order_id")])),
            "expected one of: `start`, `end`, `correlate`"
        );
    }
}
