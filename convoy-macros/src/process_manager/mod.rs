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

use proc_macro2::TokenStream;

use crate::impl_block;

/// Expands `#[process_manager(args)] item`.
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    impl_block::expand(
        item,
        "process manager",
        |cx, parsed| {
            let args = cx.ok(attr::Args::parse(args));
            let pm = check::validate(cx, args.as_ref(), parsed)?;
            Some(expand::process_manager(&pm))
        },
        expand::fallback,
    )
}
