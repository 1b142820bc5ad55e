//! Ingest: from a record's bytes to its deliveries' outcomes, shared by every front end.
//!
//! - [`decode`]: bytes to a [`DispatchRecord`] or a typed [`DecodeError`] naming the field.
//! - [`apply`]: a record's [`Delivery`]s and the function that runs one delivery against a store
//!   ([`apply_delivery`]: the runner's truncates go through it; appends go in batches through
//!   [`MailboxStore::append_many`](crate::store::MailboxStore::append_many)).
//! - [`pipeline`]: the ordering core — a bounded window per source, a lane per user, the
//!   watermark — and each record's lifecycle from admitted to committable.
//! - [`runner`]: the store calls in flight, one attempt each.
//!
//! The daemon, `materializer apply`, `materializer replay` and the demo all decode, order and run
//! their records through [`decode`], [`pipeline`] and [`runner`], with [`crate::disposition`]
//! deciding what each result means, so a record has one meaning whichever door it comes through.

pub mod apply;
pub mod decode;
pub mod pipeline;
pub mod runner;

pub use apply::{apply_delivery, apply_record, Delivery, DeliveryOutcome, DeliveryResult};
pub use decode::{
    decode, decode_record, DecodeError, DecodeOptions, Decoded, DispatchRecord, MalformedKind,
};
