//! `#[derive(Aggregate)]`, `#[derive(Event)]` and `#[derive(Command)]`.
//!
//! [`Aggregate::from_syn`] and [`Message::from_syn`] parse and validate the
//! derive input into a small model; `expand` turns a valid model into the
//! trait impls and the `inventory` registration. When the input is invalid,
//! the errors are emitted with stub impls, so that a mistake in the derive
//! is reported once and not again at every handler that names the type.

mod attr;
mod expand;

use proc_macro2::TokenStream;
use quote::quote;
use syn::ext::IdentExt;
use syn::{Data, DeriveInput, Fields, Ident, Path};

use crate::ctxt::Ctxt;
use crate::symbol::{COMMAND, EVENT, Symbol};

pub(crate) use attr::aggregate_path;

/// Event or command: the two kinds of message, and of handler.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `#[derive(Event)]`, `#[event_handler]`.
    Event,
    /// `#[derive(Command)]`, `#[command_handler]`.
    Command,
}

impl Kind {
    /// The helper attribute of the derive: `event` or `command`.
    pub(crate) fn attr(self) -> Symbol {
        match self {
            Kind::Event => EVENT,
            Kind::Command => COMMAND,
        }
    }

    /// `event` or `command`, for messages.
    pub(crate) fn noun(self) -> &'static str {
        match self {
            Kind::Event => "event",
            Kind::Command => "command",
        }
    }

    /// The derive's name: `Event` or `Command`.
    pub(crate) fn derive_name(self) -> &'static str {
        match self {
            Kind::Event => "Event",
            Kind::Command => "Command",
        }
    }

    /// The runtime trait implemented by messages of this kind.
    pub(crate) fn message_trait(self) -> TokenStream {
        match self {
            Kind::Event => quote!(::convoy_runtime::Event),
            Kind::Command => quote!(::convoy_runtime::Command),
        }
    }
}

/// A validated `#[derive(Aggregate)]` input.
pub(crate) struct Aggregate<'a> {
    /// The aggregate type.
    pub(crate) ident: &'a Ident,
    /// Its stream category.
    pub(crate) category: String,
    /// The partition key field its events carry, when declared.
    pub(crate) partition_key: Option<String>,
}

/// A validated `#[derive(Event)]` / `#[derive(Command)]` input.
pub(crate) struct Message<'a> {
    /// Event or command.
    pub(crate) kind: Kind,
    /// The message type.
    pub(crate) ident: &'a Ident,
    /// The aggregate it is `part_of`, as written.
    pub(crate) part_of: Path,
    /// The wire type name.
    pub(crate) type_name: String,
    /// Its fields, in declaration order.
    pub(crate) fields: Vec<&'a Ident>,
    /// What its command handler returns (`reply = T`; commands only).
    pub(crate) reply: Option<syn::Type>,
}

/// Expands `#[derive(Aggregate)]`.
pub(crate) fn derive_aggregate(input: &DeriveInput) -> TokenStream {
    match Aggregate::from_syn(input) {
        Ok(aggregate) => expand::aggregate(&aggregate),
        Err(error) => {
            let mut out = error.into_compile_error();
            if input.generics.params.is_empty() {
                out.extend(expand::aggregate_fallback(&input.ident));
            }
            out
        }
    }
}

/// Expands `#[derive(Event)]` (`kind` = event) or `#[derive(Command)]`.
pub(crate) fn derive_message(input: &DeriveInput, kind: Kind) -> TokenStream {
    match Message::from_syn(input, kind) {
        Ok(message) => expand::message(&message),
        Err(error) => {
            let mut out = error.into_compile_error();
            if input.generics.params.is_empty() {
                out.extend(expand::message_fallback(&input.ident, kind));
            }
            out
        }
    }
}

impl<'a> Aggregate<'a> {
    /// Parses and validates the derive input.
    pub(crate) fn from_syn(input: &'a DeriveInput) -> syn::Result<Self> {
        let cx = Ctxt::new();
        let attrs = attr::AggregateAttrs::from_attrs(&cx, &input.attrs);
        if !input.generics.params.is_empty() || input.generics.where_clause.is_some() {
            cx.error_spanned_by(&input.generics, "convoy aggregates cannot be generic");
        }
        let category = match &attrs.category {
            Some(lit) => {
                let value = lit.value();
                if let Err(problem) = check_category(&value) {
                    cx.error_at(lit.span(), problem);
                }
                value
            }
            None => {
                let value = snake_case(&input.ident.unraw().to_string());
                if let Err(problem) = check_category(&value) {
                    cx.error_at(
                        input.ident.span(),
                        format!("the category defaults to `{value}`, the type name in snake case, and {problem}"),
                    );
                }
                value
            }
        };
        let partition_key = attrs.partition_key.as_ref().and_then(|lit| {
            match lit.parse_with(crate::tokens::field_ident) {
                Ok(ident) => Some(ident.unraw().to_string()),
                Err(_) => {
                    cx.error_at(
                        lit.span(),
                        "`partition_key` takes a field name in double quotes, for example `partition_key = \"client_id\"`",
                    );
                    None
                }
            }
        });
        cx.check()?;
        Ok(Aggregate {
            ident: &input.ident,
            category,
            partition_key,
        })
    }
}

impl<'a> Message<'a> {
    /// Parses and validates the derive input.
    pub(crate) fn from_syn(input: &'a DeriveInput, kind: Kind) -> syn::Result<Self> {
        let cx = Ctxt::new();
        let attrs = attr::MessageAttrs::from_attrs(&cx, &input.attrs, kind.attr());
        if !input.generics.params.is_empty() || input.generics.where_clause.is_some() {
            cx.error_spanned_by(&input.generics, "convoy messages cannot be generic");
        }
        let fields = named_fields(&cx, input, kind);
        let type_name = match &attrs.name {
            Some(lit) => {
                let value = lit.value();
                if value.trim().is_empty() {
                    cx.error_at(lit.span(), "`name` must not be empty");
                }
                value
            }
            None => input.ident.unraw().to_string(),
        };
        if let (Kind::Event, Some((key, _))) = (kind, &attrs.reply) {
            cx.error_at(
                *key,
                "`reply` is for commands: an event is published, not answered; remove it, or derive `Command`",
            );
        }
        if attrs.part_of.is_none() {
            let noun = kind.noun();
            let attr = kind.attr();
            cx.error_at(
                input.ident.span(),
                format!(
                    "missing `#[{attr}(part_of = ...)]`: name the aggregate this {noun} belongs to, for example `#[{attr}(part_of = Order)]`"
                ),
            );
        }
        cx.check()?;
        Ok(Message {
            kind,
            ident: &input.ident,
            part_of: attrs.part_of.expect("checked above"),
            type_name,
            fields: fields.unwrap_or_default(),
            reply: attrs.reply.map(|(_, ty)| ty),
        })
    }
}

/// The named fields of a struct, or an error at what makes it something else.
fn named_fields<'a>(cx: &Ctxt, input: &'a DeriveInput, kind: Kind) -> Option<Vec<&'a Ident>> {
    let message = format!(
        "`#[derive({})]` needs a struct with named fields (`sequential_by` names one of them)",
        kind.derive_name()
    );
    match &input.data {
        Data::Struct(data) => match &data.fields {
            Fields::Named(named) => Some(
                named
                    .named
                    .iter()
                    .filter_map(|f| f.ident.as_ref())
                    .collect(),
            ),
            Fields::Unnamed(unnamed) => {
                cx.error_spanned_by(unnamed, message);
                None
            }
            Fields::Unit => {
                cx.error_at(input.ident.span(), message);
                None
            }
        },
        Data::Enum(data) => {
            cx.error_spanned_by(data.enum_token, message);
            None
        }
        Data::Union(data) => {
            cx.error_spanned_by(data.union_token, message);
            None
        }
    }
}

/// The first segment of convoy's own Redis keys (the runtime's
/// `key::OWN_PREFIX`): no category may be named so.
const RESERVED_CATEGORY: &str = "convoy";

/// Why `category` cannot be a stream category, if it cannot (the runtime's
/// `key::check_category` checks the same at init, for aggregates
/// implemented by hand).
fn check_category(category: &str) -> Result<(), &'static str> {
    if category.is_empty() {
        Err("the category must not be empty")
    } else if category.contains(':') {
        Err(
            "the category must not contain `:`; it is the first segment of stream names (`{category}:{key}`)",
        )
    } else if category
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        Err("the category must not contain whitespace")
    } else if category == RESERVED_CATEGORY {
        Err(
            "`convoy` is reserved: convoy's own keys (`convoy:lease:..`, the `convoy:audit` stream) start with it, so this category's partitions would be convoy's keys; choose another name, for example `#[aggregate(category = \"...\")]`",
        )
    } else {
        Ok(())
    }
}

/// `OrderLine` -> `order_line`, `HTTPRequest` -> `http_request`.
pub(crate) fn snake_case(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_uppercase() {
            let prev = i.checked_sub(1).map(|p| chars[p]);
            let next = chars.get(i + 1).copied();
            let boundary = match prev {
                None | Some('_') => false,
                Some(p) if p.is_lowercase() || p.is_ascii_digit() => true,
                Some(p) => p.is_uppercase() && next.is_some_and(char::is_lowercase),
            };
            if boundary {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use syn::parse_quote;

    use super::*;

    fn errors(result: syn::Result<impl Sized>) -> Vec<String> {
        match result {
            Ok(_) => Vec::new(),
            Err(e) => e.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn snake_case_categories() {
        assert_eq!(snake_case("Order"), "order");
        assert_eq!(snake_case("OrderLine"), "order_line");
        assert_eq!(snake_case("HTTPRequest"), "http_request");
        assert_eq!(snake_case("Order2Line"), "order2_line");
        assert_eq!(snake_case("already_snake"), "already_snake");
    }

    #[test]
    fn aggregate_category_defaults_and_overrides() {
        let input: DeriveInput = parse_quote!(
            struct OrderLine;
        );
        assert_eq!(
            Aggregate::from_syn(&input).expect("valid").category,
            "order_line"
        );
        let input: DeriveInput = parse_quote!(
            #[aggregate(category = "orders")]
            struct Order;
        );
        assert_eq!(
            Aggregate::from_syn(&input).expect("valid").category,
            "orders"
        );
        let input: DeriveInput = parse_quote!(
            #[aggregate(category = "a:b")]
            struct Order;
        );
        assert_eq!(
            errors(Aggregate::from_syn(&input)),
            [
                "the category must not contain `:`; it is the first segment of stream names (`{category}:{key}`)"
            ]
        );
    }

    #[test]
    fn the_category_convoy_is_reserved_named_or_defaulted() {
        let named: DeriveInput = parse_quote!(
            #[aggregate(category = "convoy")]
            struct Audit;
        );
        let defaulted: DeriveInput = parse_quote!(
            struct Convoy;
        );
        for input in [named, defaulted] {
            let errors = errors(Aggregate::from_syn(&input));
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(errors[0].contains("`convoy` is reserved"), "{errors:?}");
        }
        let input: DeriveInput = parse_quote!(
            struct Convoys;
        );
        assert_eq!(
            Aggregate::from_syn(&input).expect("valid").category,
            "convoys"
        );
    }

    #[test]
    fn message_model() {
        let input: DeriveInput = parse_quote! {
            #[event(part_of = Order)]
            struct OrderPlaced { order_id: String, r#type: u8 }
        };
        let m = Message::from_syn(&input, Kind::Event).expect("valid");
        assert_eq!(m.type_name, "OrderPlaced");
        let fields: Vec<String> = m.fields.iter().map(|f| f.unraw().to_string()).collect();
        assert_eq!(fields, ["order_id", "type"]);
    }

    #[test]
    fn message_problems_are_all_reported() {
        let input: DeriveInput = parse_quote! {
            #[command(name = "")]
            struct Ship<T>(T);
        };
        assert_eq!(
            errors(Message::from_syn(&input, Kind::Command)),
            [
                "convoy messages cannot be generic",
                "`#[derive(Command)]` needs a struct with named fields (`sequential_by` names one of them)",
                "`name` must not be empty",
                "missing `#[command(part_of = ...)]`: name the aggregate this command belongs to, for example `#[command(part_of = Order)]`",
            ]
        );
    }
}
