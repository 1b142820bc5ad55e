//! The domain model: identifiers, event groups, retention arithmetic, outcomes and errors.
//!
//! This module imports nothing else of the crate: the store backends, ingest and the CLI all speak
//! these types, so a rule written here holds everywhere.

pub mod error;
pub mod exit;
pub mod group;
pub mod ids;
pub mod outcome;
pub mod retention;
pub mod rules;
pub mod validate;
pub mod written;

pub use error::{ConflictKind, CorruptKind, CursorExpired, ErrorClass, RejectKind, StoreError};
pub use exit::Exit;
pub use group::{Event, EventGroup, LogId, Payload, SourcePosition};
pub use ids::{MailboxId, UserId, UserIdError, MAX_MAILBOX_SEQ};
pub use outcome::{
    ActiveDay, AppendOutcome, DeliveryOutcome, MailboxInspection, PromoteOutcome, ScanPage,
    ScanRequest, ScannedGroup, TruncateOutcome,
};
pub use retention::{RetentionPolicy, RetentionPolicyError, DAY_MS, DAY_SECS};
pub use written::{WriteMark, WriteToken};
