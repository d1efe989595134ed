//! Parsing of the handler attributes' arguments,
//! `#[event_handler(part_of = Order, sequential_by = "client_id", handles = [..])]`,
//! and of the `#[handle]` method marker.
//!
//! Parsing fails fast at the first problem inside the arguments, spanned on
//! the smallest wrong token.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::{Attribute, Ident, LitStr, Meta, Path, Token, Type, token};

use crate::ctxt::Ctxt;
use crate::impl_block::{self, QuotedField, quoted_field};
use crate::message::{Kind, aggregate_path};
use crate::symbol::{self, HANDLER_ARGS, HANDLES, NAME, ON_POISON, PART_OF, SEQUENTIAL_BY};
use crate::tokens::{not_yet, wrong_value};

mod kw {
    syn::custom_keyword!(part_of);
    syn::custom_keyword!(sequential_by);
    syn::custom_keyword!(handles);
    syn::custom_keyword!(name);
    syn::custom_keyword!(on_poison);
}

/// The arguments of a handler attribute.
pub(crate) struct Args {
    /// `part_of = Order`: the aggregate whose messages are handled.
    pub(crate) part_of: Path,
    /// `sequential_by = "client_id"`: the partition key field.
    pub(crate) sequential_by: Option<QuotedField>,
    /// `handles = [OrderPlaced, OrderShipped]` (struct form only).
    pub(crate) handles: Option<Handles>,
    /// `name = "ledger-projector"`: the handler's stable name (checked in
    /// `check`).
    pub(crate) name: Option<LitStr>,
    /// `on_poison = "dead_letter"` (`true`) or `"halt"` (`false`, the
    /// default), with the literal.
    pub(crate) on_poison: Option<(bool, LitStr)>,
}

/// `handles = [A, B]`.
pub(crate) struct Handles {
    /// The `handles` keyword, for errors about the argument as a whole.
    pub(crate) key: Span,
    /// The brackets, for errors about the list as a whole.
    pub(crate) brackets: token::Bracket,
    /// The handled message types, in order.
    pub(crate) types: Punctuated<Type, Token![,]>,
}

impl Args {
    /// Parses the arguments of `#[event_handler(..)]` (`kind` = event) or
    /// `#[command_handler(..)]`.
    pub(crate) fn parse(kind: Kind, tokens: TokenStream) -> syn::Result<Args> {
        (|input: ParseStream<'_>| parse_args(kind, input)).parse2(tokens)
    }
}

fn parse_args(kind: Kind, input: ParseStream<'_>) -> syn::Result<Args> {
    let mut part_of = None;
    let mut sequential_by = None;
    let mut handles = None;
    let mut name = None;
    let mut on_poison = None;
    while !input.is_empty() {
        let lookahead = input.lookahead1();
        if lookahead.peek(kw::part_of) {
            let key: kw::part_of = input.parse()?;
            not_yet(&part_of, key.span, PART_OF)?;
            input.parse::<Token![=]>()?;
            part_of = Some(aggregate_path(input)?);
        } else if lookahead.peek(kw::sequential_by) {
            let key: kw::sequential_by = input.parse()?;
            not_yet(&sequential_by, key.span, SEQUENTIAL_BY)?;
            input.parse::<Token![=]>()?;
            sequential_by = Some(key_field(kind, input)?);
        } else if lookahead.peek(kw::handles) {
            let key: kw::handles = input.parse()?;
            not_yet(&handles, key.span, HANDLES)?;
            input.parse::<Token![=]>()?;
            handles = Some(handled_types(key.span, input)?);
        } else if lookahead.peek(kw::name) {
            let key: kw::name = input.parse()?;
            not_yet(&name, key.span, NAME)?;
            input.parse::<Token![=]>()?;
            if !input.peek(LitStr) {
                return Err(wrong_value(
                    input,
                    "`name` takes the handler's name in double quotes, for example `name = \"ledger-projector\"`",
                ));
            }
            name = Some(input.parse()?);
        } else if lookahead.peek(kw::on_poison) {
            let key: kw::on_poison = input.parse()?;
            not_yet(&on_poison, key.span, ON_POISON)?;
            input.parse::<Token![=]>()?;
            on_poison = Some(poison_policy(kind, key.span, input)?);
        } else if input.peek(Ident::peek_any) {
            let unknown = input.call(Ident::parse_any)?;
            return Err(symbol::unknown_argument_at(&unknown, HANDLER_ARGS));
        } else {
            return Err(lookahead.error());
        }
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    let Some(part_of) = part_of else {
        let noun = kind.noun();
        return Err(syn::Error::new(
            Span::call_site(),
            format!(
                "missing `part_of = ...`: name the aggregate whose {noun}s this handler consumes, for example `part_of = Order`"
            ),
        ));
    };
    Ok(Args {
        part_of,
        sequential_by,
        handles,
        name,
        on_poison,
    })
}

/// Parses the value of `on_poison`: `"halt"` or `"dead_letter"` (event
/// handlers only: a command is answered, never halted).
fn poison_policy(kind: Kind, key: Span, input: ParseStream<'_>) -> syn::Result<(bool, LitStr)> {
    let message = "`on_poison` is \"halt\" (the default: the key waits for an operator) or \"dead_letter\" (the head goes to the key's dead letters with a recorded gap and the key goes on)";
    if kind == Kind::Command {
        return Err(syn::Error::new(
            key,
            "`on_poison` is for event handlers: a command handler answers its caller and never halts",
        ));
    }
    if !input.peek(LitStr) {
        return Err(wrong_value(input, message));
    }
    let lit: LitStr = input.parse()?;
    match lit.value().as_str() {
        "halt" => Ok((false, lit)),
        "dead_letter" => Ok((true, lit)),
        _ => Err(syn::Error::new(lit.span(), message)),
    }
}

/// Parses the value of `sequential_by`: a field name in double quotes.
fn key_field(kind: Kind, input: ParseStream<'_>) -> syn::Result<QuotedField> {
    let handler = match kind {
        Kind::Event => "an event handler",
        Kind::Command => "a command handler",
    };
    quoted_field(
        input,
        format!(
            "`sequential_by` on {handler} takes a field name in double quotes, for example `sequential_by = \"client_id\"`"
        ),
    )
}

/// Parses the value of `handles`: message types in brackets.
fn handled_types(key: Span, input: ParseStream<'_>) -> syn::Result<Handles> {
    if !input.peek(token::Bracket) {
        return Err(wrong_value(
            input,
            "`handles` takes a list of message types in brackets, for example `handles = [OrderPlaced, OrderShipped]`",
        ));
    }
    let content;
    let brackets = syn::bracketed!(content in input);
    let types = content.parse_terminated(Type::parse, Token![,])?;
    Ok(Handles {
        key,
        brackets,
        types,
    })
}

/// Whether `attrs` mark a handler method. A `#[handle]` with arguments or
/// given twice is reported.
pub(crate) fn handle_marker(cx: &Ctxt, attrs: &[Attribute]) -> bool {
    impl_block::handle_marker(cx, attrs, |first| {
        if !matches!(first.meta, Meta::Path(_)) {
            cx.error_spanned_by(
                &first.meta,
                "`#[handle]` takes no arguments on an event or command handler",
            );
        }
    })
    .is_some()
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::*;

    fn parse(kind: Kind, tokens: TokenStream) -> Result<Args, String> {
        Args::parse(kind, tokens).map_err(|e| e.to_string())
    }

    fn error(kind: Kind, tokens: TokenStream) -> String {
        match parse(kind, tokens) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e,
        }
    }

    #[test]
    fn parses_every_argument() {
        let args = parse(
            Kind::Event,
            quote!(
                part_of = crate::Order,
                sequential_by = "client_id",
                handles = [A, b::B],
            ),
        )
        .expect("valid");
        let part_of = &args.part_of;
        assert_eq!(quote!(#part_of).to_string(), "crate :: Order");
        let key = args.sequential_by.expect("key");
        assert_eq!(key.name, "client_id");
        assert_eq!(key.ident, "client_id");
        assert_eq!(key.lit.value(), "client_id");
        let handles = args.handles.expect("handles");
        assert_eq!(handles.types.len(), 2);
    }

    #[test]
    fn keyword_fields_become_raw_identifiers() {
        let args =
            parse(Kind::Event, quote!(part_of = Order, sequential_by = "type")).expect("valid");
        let key = args.sequential_by.expect("key");
        assert_eq!(key.ident.to_string(), "r#type");
        assert_eq!(key.name, "type");
        let args = parse(
            Kind::Event,
            quote!(part_of = Order, sequential_by = "r#type"),
        )
        .expect("valid");
        assert_eq!(args.sequential_by.expect("key").name, "type");
    }

    #[test]
    fn suggests_the_nearest_argument() {
        assert_eq!(
            error(
                Kind::Event,
                quote!(part_of = Order, sequental_by = "client_id")
            ),
            "unknown argument `sequental_by`; did you mean `sequential_by`?"
        );
        assert_eq!(
            error(Kind::Event, quote!(part_of = Order, key = "client_id")),
            "unknown argument `key`; expected `part_of`, `sequential_by`, `handles`, `name` or `on_poison`"
        );
    }

    #[test]
    fn rejects_duplicates_at_the_second_key() {
        assert_eq!(
            error(Kind::Event, quote!(part_of = Order, part_of = Order)),
            "`part_of` given more than once"
        );
    }

    #[test]
    fn sequential_by_takes_a_quoted_field_name() {
        let expected = "`sequential_by` on an event handler takes a field name in double quotes, for example `sequential_by = \"client_id\"`";
        assert_eq!(
            error(Kind::Event, quote!(part_of = Order, sequential_by = true)),
            expected
        );
        assert_eq!(
            error(
                Kind::Event,
                quote!(part_of = Order, sequential_by = client_id)
            ),
            expected
        );
        assert_eq!(
            error(Kind::Event, quote!(part_of = Order, sequential_by = 1)),
            expected
        );
        assert_eq!(
            error(
                Kind::Event,
                quote!(part_of = Order, sequential_by = a::b, handles = [A])
            ),
            expected
        );
        assert!(
            error(Kind::Command, quote!(part_of = Order, sequential_by = true))
                .contains("on a command handler")
        );
        for bad in ["client id", "a.b", "0", "", "self", "\"x\""] {
            assert_eq!(
                error(Kind::Event, quote!(part_of = Order, sequential_by = #bad)),
                "expected a single field name in double quotes",
                "{bad:?}"
            );
        }
    }

    #[test]
    fn part_of_is_required_and_a_type() {
        assert_eq!(
            error(Kind::Event, quote!(sequential_by = "client_id")),
            "missing `part_of = ...`: name the aggregate whose events this handler consumes, for example `part_of = Order`"
        );
        assert_eq!(
            error(Kind::Command, quote!(part_of = "order")),
            "`part_of` takes the aggregate type, not a string: for example `part_of = Order`"
        );
    }

    #[test]
    fn handles_takes_a_bracketed_list() {
        assert_eq!(
            error(Kind::Event, quote!(part_of = Order, handles = A)),
            "`handles` takes a list of message types in brackets, for example `handles = [OrderPlaced, OrderShipped]`"
        );
    }

    #[test]
    fn non_identifier_arguments_list_the_valid_ones() {
        assert_eq!(
            error(Kind::Event, quote!("order")),
            "expected one of: `part_of`, `sequential_by`, `handles`, `name`, `on_poison`"
        );
    }
}
