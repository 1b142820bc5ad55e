//! Ingest: from a record's bytes to its deliveries' outcomes, shared by every front end.
//!
//! - [`decode`]: bytes to a [`DispatchRecord`] or a typed [`DecodeError`] naming the field.
//! - [`apply`]: a record's [`Delivery`]s and the function that runs one delivery against a store
//!   ([`apply_delivery`]: the runner's truncates go through it; appends go in batches through
//!   [`MailboxStore::append_runs`](crate::store::MailboxStore::append_runs)).
//! - [`pipeline`]: the ordering core — a bounded window per source, a lane per user, the
//!   watermark — and each record's lifecycle from admitted to committable.
//! - [`runner`]: the store calls in flight, one attempt each.
//! - [`drive`]: the drive loop over both — admit, start, read each answer through
//!   [`crate::disposition`], retry or complete, dead-letter, final — with each front end's
//!   [`drive::Policy`] deciding only what the table leaves to it (wait, report, give up).
//!
//! The daemon, `materializer apply`, `materializer replay` and `materializer dlq redrive` decode
//! their records through [`decode`] and run them through [`drive`], so a record has one meaning
//! whichever door it comes through.

pub mod apply;
pub mod decode;
pub mod drive;
pub(crate) mod pipeline;
pub mod runner;

pub use pipeline::{RUN_MAX_BYTES, RUN_MAX_GROUPS};

pub use apply::{apply_delivery, apply_record, Delivery, DeliveryOutcome, DeliveryResult};
pub use decode::{
    decode, decode_record, DecodeError, DecodeOptions, Decoded, DispatchRecord, MalformedKind,
};
