//! Procedural macros of convoy (stub; being written).
use proc_macro::TokenStream;

/// Stub.
#[proc_macro_derive(Aggregate, attributes(aggregate))]
pub fn derive_aggregate(_input: TokenStream) -> TokenStream {
    TokenStream::new()
}
/// Stub.
#[proc_macro_derive(Event, attributes(event))]
pub fn derive_event(_input: TokenStream) -> TokenStream {
    TokenStream::new()
}
/// Stub.
#[proc_macro_derive(Command, attributes(command))]
pub fn derive_command(_input: TokenStream) -> TokenStream {
    TokenStream::new()
}
/// Stub.
#[proc_macro_attribute]
pub fn event_handler(_args: TokenStream, item: TokenStream) -> TokenStream {
    item
}
/// Stub.
#[proc_macro_attribute]
pub fn command_handler(_args: TokenStream, item: TokenStream) -> TokenStream {
    item
}
