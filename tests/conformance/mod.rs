//! The store conformance suite: SPEC section 4 and the regression list of section 10, written once
//! against the `MailboxStore` trait.
//!
//! A backend plugs in with a [`Harness`] that makes isolated [`Fixture`]s (a store, a way to move
//! its clock, a way to damage it) and one call of [`conformance_tests!`], which expands to one
//! `#[tokio::test]` per case. Backend differences are capabilities of the fixture, never copies of
//! a test.
//!
//! Where each part of the SPEC is checked (cases in `cases.rs` and `repair.rs`, run on memory,
//! Redis standalone, Redis Cluster, Redis with a replica and Scylla):
//!
//! | SPEC | cases |
//! |---|---|
//! | 4.1 validation | `duplicate_ordinal_rejected`, `largest_group_inserts_replaces_and_scans_whole`, `payload_round_trips_as_canonical_json`, `ordinals_above_two_to_the_31_keep_identity_and_order` |
//! | 4.2 step 2, future window | `future_window_rejects_and_leaves_no_key` |
//! | 4.2 step 3, epochs | `epoch_move_deletes_the_old_epoch`, `stale_epoch_writes_nothing` |
//! | 4.2 format, meta | `v3_meta_rejected_with_nothing_modified` |
//! | 4.2 replays | `identical_replay_is_unchanged`, `identical_replay_repairs_a_ttl_less_identity_index`, `same_day_replacement_of_the_whole_group`, `cross_day_conflict`, `cross_day_conflict_for_expired_input`, `expired_replay_merges_the_gap` |
//! | 4.2 steps 7-8, identity and span | `identity_missing_below_seqbucket_max_seq_is_corrupt`, `span_exceeded_rejects_and_changes_nothing` |
//! | 4.2 under concurrency and in batches | `concurrent_appends_to_one_mailbox`, `append_many_answers_each_group_like_append`, `append_many_spread_over_many_users_answers_each`, `append_run_answers_each_group_like_append`, `append_runs_spread_over_many_users_answer_each` |
//! | 4.3 truncate | `trim_outcome_and_trim_never_lowers`, `truncate_removes_whole_groups_and_keeps_empty_day_proofs`, `truncate_on_unknown_user_is_durable`, `natural_ttl_kept_apart_from_explicit_trim` |
//! | 4.4 scan | `memory_epoch_check_and_reverse_range`, `scan_epoch_check_comes_before_the_reverse_range`, `scan_pages_whole_groups_in_seq_order`, `expired_cursor_gap`, `expiry_between_check_and_read`, `scan_reads_buckets_older_than_max_day_minus_retention`, `scans_beside_same_day_replaces_never_skip_a_group`, `index_lost_is_corrupt`, `meta_lost_is_corrupt`, `a_live_day_that_lost_its_events_is_corrupt` |
//! | 4.5 promote | `active_proof_compaction`, `compacted_days_are_counted_by_the_store`, `bad_proof_two_phase_promote_changes_nothing`, `thirty_two_consecutive_day_buckets`, `long_offline_recovery` |
//! | 4.6 boundedness | `metadata_stays_bounded_over_a_year` |
//! | 4 as a whole, random | `randomized_histories_keep_the_invariants` (`history.rs`: every backend against the memory reference), `randomized_histories_agree_in_runs_and_one_by_one` (each history one by one and in runs) |
//! | 7.1 repair | `repair_*` (`repair.rs`; `repair_randomized_staged_histories_agree_in_runs_and_one_by_one`: random histories staged one by one and in runs) |
//! | 7.2 zombies and log identity | `late_write_of_an_older_position_is_superseded`, `a_later_write_of_another_seq_never_fences_a_replace`, `a_cut_over_to_a_new_log_replaces_same_day_content`, `a_retry_whose_answer_was_lost_answers_as_the_lost_attempt_did` |
//! | 7.3 any one piece lost | `every_lost_piece_answers_the_truth_or_corrupt` (`loss.rs`: a generated matrix of pieces x states x operations against the memory reference) |
//! | 7.2 positions as `explain` shows them | `seq_positions_name_each_live_seqs_stored_version`, `seq_positions_leave_out_expired_seqs` |
//!
//! The suite runs in the `store` test binary (`tests/store/`), one module per backend and
//! topology. Outside it: the Redis layout of SPEC 5 and identity TTLs (`tests/store/redis.rs`),
//! batch boundaries of `apply`, `replay` and the daemon (`tests/cli/batches.rs`), the daemon's
//! section 7 (`tests/daemon/`) and the CLI's sections 7.1 and 8 (`tests/cli/`).
#![allow(dead_code)]

pub mod cases;
pub mod history;
pub mod loss;
pub mod memory;
pub mod redis;
pub mod repair;
pub mod scylla;

use std::sync::Arc;

use async_trait::async_trait;
use mailbox_materializer::model::{
    Event, EventGroup, MailboxId, Payload, RetentionPolicy, UserId, DAY_MS, DAY_SECS,
};
use mailbox_materializer::store::fault::Corruption;
use mailbox_materializer::store::MailboxStore;

/// 2027-03-15T12:00:00Z: the clock every case starts at.
pub const NOW0: u64 = 1_805_112_000;
/// The Unix day of [`NOW0`].
pub const TODAY0: u64 = NOW0 / DAY_SECS;

/// One isolated store under test, with the handles a case needs to drive it.
#[async_trait]
pub trait Fixture: Send + Sync {
    fn store(&self) -> Arc<dyn MailboxStore>;
    /// Moves the store's time authority to `now_secs` (forwards only in practice).
    async fn set_now(&self, now_secs: u64);
    /// Makes the next scan move the clock to `now_secs` between its read and its post-read check.
    async fn jump_during_next_scan(&self, now_secs: u64);
    /// Damages one mailbox; false when the mailbox has nothing of that kind to damage.
    async fn corrupt(&self, mailbox: &MailboxId, corruption: Corruption) -> bool;
    /// A byte-exact fingerprint of everything stored for `user` (all epochs), used to prove that a
    /// refused operation modified nothing. Backends without a raw dump return the inspection.
    async fn fingerprint(&self, user: &UserId) -> String;
}

/// Makes fixtures for one backend.
#[async_trait]
pub trait Harness: Send + Sync {
    async fn fixture(&self, policy: RetentionPolicy, now_secs: u64) -> Box<dyn Fixture>;
}

/// Expands to one test per conformance case for the harness built by `$make`.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@cases $make;
            memory_epoch_check_and_reverse_range,
            epoch_move_deletes_the_old_epoch,
            stale_epoch_writes_nothing,
            natural_ttl_kept_apart_from_explicit_trim,
            duplicate_ordinal_rejected,
            same_day_replacement_of_the_whole_group,
            identical_replay_is_unchanged,
            identical_replay_repairs_a_ttl_less_identity_index,
            largest_group_inserts_replaces_and_scans_whole,
            cross_day_conflict,
            cross_day_conflict_for_expired_input,
            expired_replay_merges_the_gap,
            expired_cursor_gap,
            active_proof_compaction,
            compacted_days_are_counted_by_the_store,
            thirty_two_consecutive_day_buckets,
            long_offline_recovery,
            expiry_between_check_and_read,
            future_window_rejects_and_leaves_no_key,
            span_exceeded_rejects_and_changes_nothing,
            v3_meta_rejected_with_nothing_modified,
            index_lost_is_corrupt,
            meta_lost_is_corrupt,
            a_live_day_that_lost_its_events_is_corrupt,
            identity_missing_below_seqbucket_max_seq_is_corrupt,
            bad_proof_two_phase_promote_changes_nothing,
            scan_reads_buckets_older_than_max_day_minus_retention,
            trim_outcome_and_trim_never_lowers,
            truncate_removes_whole_groups_and_keeps_empty_day_proofs,
            truncate_on_unknown_user_is_durable,
            scan_pages_whole_groups_in_seq_order,
            payload_round_trips_as_canonical_json,
            concurrent_appends_to_one_mailbox,
            metadata_stays_bounded_over_a_year,
            randomized_histories_keep_the_invariants,
            repair_fence_holds_live_writes_and_swap_replaces,
            repair_abort_leaves_the_live_mailbox_untouched,
            repair_second_repair_is_refused,
            repair_writes_only_its_own_user,
            repair_lost_lease_aborts_without_swap,
            repair_heals_a_corrupt_mailbox,
            repair_rebuilds_epoch_moves_and_replaces_every_epoch,
            repair_staging_follows_the_append_rules,
            repair_garbage_of_a_crashed_repair_is_collected,
            repair_runs_answer_each_group_like_repair_append,
            repair_randomized_staged_histories_agree_in_runs_and_one_by_one,
            append_many_answers_each_group_like_append,
            append_run_answers_each_group_like_append,
            append_runs_spread_over_many_users_answer_each,
            randomized_histories_agree_in_runs_and_one_by_one,
            append_many_spread_over_many_users_answers_each,
            late_write_of_an_older_position_is_superseded,
            a_retry_whose_answer_was_lost_answers_as_the_lost_attempt_did,
        seq_positions_name_each_live_seqs_stored_version,
        seq_positions_leave_out_expired_seqs,
            a_later_write_of_another_seq_never_fences_a_replace,
            a_cut_over_to_a_new_log_replaces_same_day_content,
            scans_beside_same_day_replaces_never_skip_a_group,
            ordinals_above_two_to_the_31_keep_identity_and_order,
            scan_epoch_check_comes_before_the_reverse_range,
            every_lost_piece_answers_the_truth_or_corrupt,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness: std::sync::Arc<dyn $crate::conformance::Harness> =
                    std::sync::Arc::new($make);
                $crate::conformance::cases::$case(&harness).await;
            }
        )*
    };
}

// ---- helpers shared by the cases ----

pub fn user(name: &str) -> UserId {
    UserId::parse(name).expect("test user ids are valid")
}

pub fn mailbox(name: &str, epoch: u32) -> MailboxId {
    MailboxId::new(user(name), epoch)
}

/// `created_at` (ms) at an hour into `day`.
pub fn at_day(day: u64) -> u64 {
    day * DAY_MS + 3_600_000
}

/// A group of `n` events whose payloads carry `tag`, so two tags give different content.
/// `g` as the daemon reads it from a log: at `offset` of partition 0 of the log `log-a`, with
/// the write token `token` of that reading (`model::written`).
pub fn from_log(mut g: EventGroup, offset: i64, token: u64) -> EventGroup {
    let log = mailbox_materializer::model::LogId::topic_id("log-a").expect("log id");
    g.source = Some(mailbox_materializer::model::SourcePosition::new(
        log, 0, offset,
    ));
    g.token = Some(mailbox_materializer::model::WriteToken::from_raw(token));
    g
}

pub fn group(mb: &MailboxId, seq: u64, day: u64, n: u32, tag: &str) -> EventGroup {
    EventGroup {
        mailbox: mb.clone(),
        mailbox_seq: seq,
        created_at: at_day(day),
        events: (0..n)
            .map(|i| Event {
                event_ordinal: i,
                payload: Payload::from_value(&serde_json::json!({"tag": tag, "i": i})),
            })
            .collect(),
        source: None,
        token: None,
    }
}

/// A scan hook that runs `jump` (moving the fixture's clock) the first time it is called and
/// then uninstalls itself through `clear`, so only the next scan is affected.
pub fn one_shot_hook(
    jump: impl Fn() + Send + Sync + 'static,
    clear: impl Fn() + Send + Sync + 'static,
) -> mailbox_materializer::store::PhaseHook {
    Arc::new(move || {
        jump();
        clear();
        Box::pin(async {})
    })
}

/// The default policy.
pub fn policy() -> RetentionPolicy {
    RetentionPolicy::default()
}

/// The second at which `day` has expired under `policy`.
pub fn expiry_of(policy: &RetentionPolicy, day: u64) -> u64 {
    policy.expires_at(day)
}
