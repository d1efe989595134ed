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

use crate::impl_block;
use crate::message::Kind;

/// Expands `#[event_handler(args)] item` (`kind` = event) or
/// `#[command_handler(args)] item`.
pub(crate) fn expand(kind: Kind, args: TokenStream, item: TokenStream) -> TokenStream {
    impl_block::expand(
        item,
        "handler",
        |cx, parsed| {
            let args = cx.ok(attr::Args::parse(kind, args));
            let handler = check::validate(cx, kind, args.as_ref(), parsed)?;
            Some(expand::handler(&handler))
        },
        |parsed| expand::fallback(kind, parsed),
    )
}
