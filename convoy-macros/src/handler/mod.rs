//! `#[event_handler]` and `#[command_handler]`: parse the arguments
//! (`attr`), validate them with the item (`check`), generate the code
//! (`expand`).
//!
//! Whatever happens, the user's item is emitted again (without the
//! `#[handle]` markers), so that one mistake in the attribute does not turn
//! into errors everywhere the handler type is used.

mod attr;
mod check;
mod expand;

use proc_macro2::TokenStream;
use quote::quote;
use syn::{ImplItem, Item};

use crate::ctxt::Ctxt;
use crate::message::Kind;

/// Expands `#[event_handler(args)] item` (`kind` = event) or
/// `#[command_handler(args)] item`.
pub(crate) fn expand(kind: Kind, args: TokenStream, item: TokenStream) -> TokenStream {
    let parsed: Item = match syn::parse2(item.clone()) {
        Ok(parsed) => parsed,
        Err(error) => {
            let mut out = item;
            out.extend(error.into_compile_error());
            return out;
        }
    };
    let cx = Ctxt::new();
    let args = cx.ok(attr::Args::parse(kind, args));
    let handler = check::validate(&cx, kind, args.as_ref(), &parsed);
    let user_item = strip_handle_markers(parsed.clone());
    match (cx.check(), handler) {
        (Ok(()), Some(handler)) => {
            let generated = expand::handler(&handler);
            quote!(#user_item #generated)
        }
        (Err(error), _) => {
            let fallback = expand::fallback(kind, &parsed);
            let error = error.into_compile_error();
            quote!(#user_item #fallback #error)
        }
        (Ok(()), None) => {
            let error = syn::Error::new(
                proc_macro2::Span::call_site(),
                "convoy-macros bug: handler rejected without an error",
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
            attrs.retain(|a| !attr::is_handle(a));
        }
    }
    item
}
