//! Ingest: decoding dispatch records and applying them to a store.
//!
//! The CLI's `apply` and the daemon share [`apply::apply_record`], so a record has one meaning
//! whichever door it comes through.

pub mod apply;
pub mod decode;

pub use apply::{apply_delivery, apply_record, Delivery, DeliveryOutcome, DeliveryResult};
pub use decode::{
    decode, decode_record, DecodeError, DecodeOptions, Decoded, DispatchRecord, MalformedKind,
};
