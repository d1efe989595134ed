//! Parsing of `#[aggregate(..)]`, `#[event(..)]` and `#[command(..)]`.
//!
//! Problems inside one attribute fail fast; problems in different
//! attributes are all reported (through [`Ctxt`]).

use syn::parse::ParseStream;
use syn::{Attribute, LitStr, Path, Type};

use crate::ctxt::Ctxt;
use crate::symbol::{self, AGGREGATE, CATEGORY, NAME, PART_OF, PARTITION_KEY, REPLY, Symbol};

/// The options of `#[aggregate(..)]`.
#[derive(Default)]
pub(crate) struct AggregateAttrs {
    /// `category = "order"`.
    pub(crate) category: Option<LitStr>,
    /// `partition_key = "client_id"`.
    pub(crate) partition_key: Option<LitStr>,
}

/// The options of `#[event(..)]` or `#[command(..)]`.
#[derive(Default)]
pub(crate) struct MessageAttrs {
    /// `part_of = Order`.
    pub(crate) part_of: Option<Path>,
    /// `name = "OrderPlacedV2"`.
    pub(crate) name: Option<LitStr>,
    /// `reply = OrderId` (commands only), with the key's span.
    pub(crate) reply: Option<(proc_macro2::Span, Type)>,
}

impl AggregateAttrs {
    /// Reads every `#[aggregate(..)]` attribute among `attrs`.
    pub(crate) fn from_attrs(cx: &Ctxt, attrs: &[Attribute]) -> Self {
        let mut out = AggregateAttrs::default();
        for attr in attrs.iter().filter(|a| a.path() == AGGREGATE) {
            let parsed = attr.parse_nested_meta(|meta| {
                if meta.path == CATEGORY {
                    let lit = string_value(meta.value()?, CATEGORY)?;
                    set_once(&mut out.category, lit, &meta.path, CATEGORY)
                } else if meta.path == PARTITION_KEY {
                    let lit = string_value(meta.value()?, PARTITION_KEY)?;
                    set_once(&mut out.partition_key, lit, &meta.path, PARTITION_KEY)
                } else {
                    Err(unknown(&meta.path, symbol::AGGREGATE_ARGS))
                }
            });
            cx.ok(parsed);
        }
        out
    }
}

impl MessageAttrs {
    /// Reads every `#[<attr>(..)]` attribute among `attrs` (`attr` is
    /// `event` or `command`).
    pub(crate) fn from_attrs(cx: &Ctxt, attrs: &[Attribute], attr_name: Symbol) -> Self {
        let mut out = MessageAttrs::default();
        for attr in attrs.iter().filter(|a| a.path() == attr_name) {
            let parsed = attr.parse_nested_meta(|meta| {
                if meta.path == PART_OF {
                    let path = aggregate_path(meta.value()?)?;
                    set_once(&mut out.part_of, path, &meta.path, PART_OF)
                } else if meta.path == NAME {
                    let lit = string_value(meta.value()?, NAME)?;
                    set_once(&mut out.name, lit, &meta.path, NAME)
                } else if meta.path == REPLY {
                    let key = syn::spanned::Spanned::span(&meta.path);
                    let ty: Type = meta.value()?.parse().map_err(|e| {
                        syn::Error::new(
                            e.span(),
                            "`reply` takes the type the command handler returns, for example `reply = OrderId`",
                        )
                    })?;
                    set_once(&mut out.reply, (key, ty), &meta.path, REPLY)
                } else {
                    Err(unknown(&meta.path, symbol::MESSAGE_ARGS))
                }
            });
            cx.ok(parsed);
        }
        out
    }
}

/// Parses the aggregate type after `part_of =`.
pub(crate) fn aggregate_path(input: ParseStream<'_>) -> syn::Result<Path> {
    if input.peek(LitStr) {
        let lit: LitStr = input.parse()?;
        return Err(syn::Error::new(
            lit.span(),
            "`part_of` takes the aggregate type, not a string: for example `part_of = Order`",
        ));
    }
    input.parse::<Path>().map_err(|error| {
        syn::Error::new(
            error.span(),
            "expected the aggregate type after `part_of =`, for example `part_of = Order`",
        )
    })
}

/// Parses a string literal value of the argument `key`.
fn string_value(input: ParseStream<'_>, key: Symbol) -> syn::Result<LitStr> {
    input.parse::<LitStr>().map_err(|error| {
        syn::Error::new(
            error.span(),
            format!("`{key}` takes a string literal, for example `{key} = \"...\"`"),
        )
    })
}

/// Stores `value` in `slot`, or reports a duplicate at `key`.
fn set_once<T>(slot: &mut Option<T>, value: T, key: &Path, name: Symbol) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new_spanned(
            key,
            format!("`{name}` given more than once"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

/// The error for an unknown argument `path`.
fn unknown(path: &Path, valid: &[Symbol]) -> syn::Error {
    let written = quote::quote!(#path).to_string().replace(' ', "");
    syn::Error::new_spanned(path, symbol::unknown_argument(&written, valid))
}

#[cfg(test)]
mod tests {
    use syn::parse_quote;

    use super::*;
    use crate::symbol::EVENT;

    fn message_errors(attrs: &[Attribute]) -> Vec<String> {
        let cx = Ctxt::new();
        let _ = MessageAttrs::from_attrs(&cx, attrs, EVENT);
        match cx.check() {
            Ok(()) => Vec::new(),
            Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn reads_part_of_and_name() {
        let cx = Ctxt::new();
        let attrs: Vec<Attribute> =
            vec![parse_quote!(#[event(part_of = crate::Order, name = "Placed")])];
        let parsed = MessageAttrs::from_attrs(&cx, &attrs, EVENT);
        cx.check().expect("valid");
        let part_of = parsed.part_of.expect("part_of");
        assert_eq!(quote::quote!(#part_of).to_string(), "crate :: Order");
        assert_eq!(parsed.name.expect("name").value(), "Placed");
    }

    #[test]
    fn reports_problems_of_each_attribute() {
        let attrs: Vec<Attribute> = vec![
            parse_quote!(#[event(part_of = "order")]),
            parse_quote!(#[event(nmae = "X")]),
            parse_quote!(#[event(name = "A", name = "B")]),
        ];
        assert_eq!(
            message_errors(&attrs),
            [
                "`part_of` takes the aggregate type, not a string: for example `part_of = Order`",
                "unknown argument `nmae`; did you mean `name`?",
                "`name` given more than once",
            ]
        );
    }

    #[test]
    fn category_must_be_a_string() {
        let cx = Ctxt::new();
        let attrs: Vec<Attribute> = vec![parse_quote!(#[aggregate(category = order)])];
        let _ = AggregateAttrs::from_attrs(&cx, &attrs);
        let err = cx.check().expect_err("not a string");
        assert_eq!(
            err.to_string(),
            "`category` takes a string literal, for example `category = \"...\"`"
        );
    }
}
