//! `#[process_manager]`: parse the arguments and the `#[handle(..)]`
//! markers (`attr`), validate them with the impl block (`check`), generate
//! the code (`expand`).
//!
//! Whatever happens, the user's item is emitted again (without the
//! `#[handle]` markers), so that one mistake in the attribute does not turn
//! into errors everywhere the state type is used.

mod attr;
mod check;
mod expand;

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{ImplItem, Item};

use crate::ctxt::Ctxt;

/// Expands `#[process_manager(args)] item`.
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let parsed: Item = match syn::parse2(item.clone()) {
        Ok(parsed) => parsed,
        Err(error) => {
            let mut out = item;
            out.extend(error.into_compile_error());
            return out;
        }
    };
    let cx = Ctxt::new();
    let args = cx.ok(attr::Args::parse(args));
    let pm = check::validate(&cx, args.as_ref(), &parsed);
    let user_item = strip_handle_markers(parsed.clone());
    match (cx.check(), pm) {
        (Ok(()), Some(pm)) => {
            let generated = expand::process_manager(&pm);
            quote!(#user_item #generated)
        }
        (Err(error), _) => {
            let fallback = expand::fallback(&parsed);
            let error = error.into_compile_error();
            quote!(#user_item #fallback #error)
        }
        (Ok(()), None) => {
            let error = syn::Error::new(
                Span::call_site(),
                "convoy-macros bug: process manager rejected without an error",
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
