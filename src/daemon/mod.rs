//! The daemon (SPEC section 7): a consumer group on the dispatch topic, materializing every
//! record into the store in per-mailbox source order, committing only what is final and durable.
//!
//! The path of one record:
//!
//! 1. [`intake`] — the poll thread copies it out of librdkafka, decodes it, and hands it to the
//!    engine in a batch (a channel of two), after the rebalance events that came before it.
//! 2. [`engine`] — charges it against the partition's byte budget and hands it to the drive loop
//!    ([`crate::ingest::drive`], shared with `apply`, `replay` and `dlq redrive`): admitted into
//!    its partition's window ([`crate::ingest::pipeline`]), its deliveries join their users'
//!    lanes, each lane's waiting appends of one mailbox go out as one run in a batch of store
//!    calls ([`crate::ingest::runner`]), and each answer becomes an action through
//!    [`crate::disposition`] (advance, dead-letter, block, retry, abort a repair). What the
//!    table leaves open (block, retry) the daemon's policy answers: retry after a backoff.
//! 3. [`dead_letter`] builds the dead letter of a refused or malformed record to fit the
//!    producer's limit; `engine/letters.rs` sends it without blocking the loop and retries while
//!    the producer refuses; the record is final when the broker acknowledges it.
//! 4. [`engine`] again — final records leave the window in source order; the watermark (the first
//!    record not yet final) is stored, and librdkafka's auto-commit commits it ([`kafka`]); a
//!    revoke and the shutdown commit it synchronously.
//! 5. [`telemetry`] — each of these events is counted, logged and shown in `/metrics`
//!    ([`metrics`], [`http`]); [`health`] probes the store and the broker for `/readyz`;
//!    [`topic_policy`] warns while the topic is compacted (no repair could rebuild from it).
//!
//! [`run`] is the composition root: it builds the consumer, the producer, the poll thread, the
//! probes and the engine from the configuration, once.
//!
//! - **Order.** A user's deliveries run in offset order, one run at a time (up to
//!   [`crate::ingest::RUN_MAX_GROUPS`] consecutive appends of one mailbox in one store call,
//!   answered one by one); users run concurrently.
//! - **Offsets.** The committed offset of a partition is its contiguous watermark: every record
//!   below it has every delivery written durably (or dead-lettered with an acknowledged dead
//!   letter).
//! - **Retries.** Transient store errors and repair fences are retried with jittered, capped
//!   exponential backoff ([`crate::retry`]); a corrupt mailbox is retried the same way until an
//!   operator repairs it, and only that user's lane waits. Neither is ever skipped.
//! - **Rebalance.** On revoke the rebalance callback hands the partitions to the engine
//!   (`engine/handover.rs`): what is not yet sent is cancelled, the store calls and dead letters
//!   already sent are served until they finish or the hand-over deadline passes, and the callback
//!   then commits the final watermarks synchronously. A lost assignment abandons the work and
//!   commits nothing; a write already sent may still land, which idempotent replay and the
//!   zombie fence (SPEC 7.2) make harmless for the next owner. A newly assigned partition always
//!   starts resumed.
//! - **Shutdown.** SIGTERM/SIGINT: stop fetching, drain until the deadline, commit, leave.

pub mod broker_link;
pub(crate) mod dead_letter;
pub mod engine;
pub(crate) mod events;
pub(crate) mod fetch_waker;
pub mod health;
pub mod http;
pub mod intake;
pub mod kafka;
pub(crate) mod kafka_ffi;
pub(crate) mod kafka_grants;
pub mod liveness;
pub(crate) mod log_identity;
pub(crate) mod logging;
pub mod memory_limit;
pub mod metrics;
pub(crate) mod outage;
pub(crate) mod partition_growth;
pub(crate) mod records_lost;
pub mod tap;
pub(crate) mod telemetry;
pub mod topic_policy;

use std::sync::Arc;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureProducer;
use tokio::sync::watch;

use crate::config::Config;
use crate::store::MailboxStore;

pub use engine::RunReport;
pub use telemetry::{Progress, ProgressCounts};

use engine::{Engine, EngineSettings};
use http::Health;
use intake::Intake;
use kafka::DaemonContext;
use telemetry::Telemetry;

/// Why the daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error("cannot start the poll thread: {0}")]
    Thread(#[from] std::io::Error),
    #[error("stopped: {0}")]
    Stopped(String),
}

/// What a caller hands the daemon besides its configuration.
pub struct DaemonOptions {
    /// Flips to true to start the drain (SIGTERM, SIGINT, or the demo when it is done).
    pub shutdown: watch::Receiver<bool>,
    pub progress: Arc<Progress>,
    pub health: Arc<Health>,
    /// Commit offsets to the group. False for a store that does not outlive the process (the
    /// memory store): a restart must re-read the log, since nothing it wrote survived.
    pub commit_offsets: bool,
    /// Set by the demo: the broker is librdkafka's mock cluster, which answers no admin request
    /// (DescribeTopics, DescribeAcls), so the log is named by this identity and the ACL probe is
    /// off; a wait on either would only time out. `None` (a real broker): the identity is read
    /// on each assignment, and records wait while it cannot be read (SPEC 7.3).
    pub mock_log: Option<crate::model::LogId>,
    /// Test machinery: called with the dead-letter producer once it exists, so a test can make
    /// librdkafka raise a fatal error on it (`rd_kafka_test_fatal_error`).
    #[cfg(feature = "failpoints")]
    pub on_producer: Option<ProducerHook>,
}

/// See [`DaemonOptions::on_producer`].
#[cfg(feature = "failpoints")]
pub type ProducerHook = Arc<dyn Fn(&DlqProducer) + Send + Sync>;

/// The dead-letter producer: its connection failures are logged through [`broker_link`].
pub type DlqProducer = FutureProducer<broker_link::LinkContext>;

/// Runs the daemon until `options.shutdown` flips and the drain ends.
pub async fn run(
    config: &Config,
    store: Arc<dyn MailboxStore>,
    options: DaemonOptions,
) -> Result<RunReport, DaemonError> {
    let topic = config.kafka.topic.clone();
    let settings = EngineSettings::from_config(config, options.commit_offsets);
    let limit = memory_limit::limit();
    events::Event::emit(events::WindowBudget {
        bytes: settings.max_bytes,
        memory_limit: limit,
    });
    if let Some(limit) = limit {
        match memory_limit::check(&config.kafka, limit) {
            Ok(peak) => tracing::info!(
                limit_mib = limit >> 20,
                peak_mib = peak >> 20,
                "the in-flight budget fits the memory limit"
            ),
            // Not fatal: the operator may know better (a record size far below the budget's
            // worst case), but an OOM kill during a catch-up is what this warns of.
            Err(problem) => tracing::error!("{problem}"),
        }
    }
    let context = DaemonContext::new(
        &topic,
        options.health.clone(),
        Engine::handover_wait(settings.shutdown_deadline),
    );
    let assigned_notify = context.assigned_notify();
    let (handover, handovers) = tokio::sync::mpsc::unbounded_channel();
    context.hand_over_to(handover);
    let consumer: Arc<BaseConsumer<DaemonContext>> = Arc::new(
        kafka::consumer_config(&config.kafka, options.commit_offsets)
            .create_with_context(context)?,
    );
    let producer: DlqProducer =
        kafka::producer_config(&config.kafka).create_with_context(broker_link::LinkContext)?;
    #[cfg(feature = "failpoints")]
    if let Some(hook) = &options.on_producer {
        hook(&producer);
    }
    check_store_data(&store, &consumer, &topic, &options).await;
    consumer.subscribe(&[topic.as_str()])?;
    tracing::info!(
        topic = %topic,
        group = %config.kafka.group_id,
        backend = store.backend(),
        "consuming"
    );
    let (intake, records) = Intake::start(
        consumer.clone(),
        config.decode_options(),
        options.mock_log.clone(),
        config.kafka.on_records_lost,
        // Without commits (the memory store) there is no committed offset to wait for.
        options
            .commit_offsets
            .then(|| std::time::Duration::from_millis(config.kafka.growth_allowance_ms)),
        (options.commit_offsets && store.keeps_applied())
            .then(|| (store.clone(), tokio::runtime::Handle::current())),
    )?;
    let probes = health::spawn(
        store.clone(),
        consumer.clone(),
        health::ProbeSettings {
            topic: topic.clone(),
            group: config.kafka.group_id.clone(),
            dlq_topic: config.kafka.dlq_topic.clone(),
            acls: if options.mock_log.is_some() {
                Vec::new()
            } else {
                kafka_grants::daemon_acls(&config.kafka)
            },
            assignment_timeout: std::time::Duration::from_millis(
                config.kafka.assignment_timeout_ms,
            ),
        },
        options.health.clone(),
    );
    let policy_watch = topic_policy::watch(config.kafka.clone(), assigned_notify);
    let engine = Engine::new(
        settings,
        consumer.clone(),
        producer,
        store.clone(),
        Telemetry::new(store.backend(), options.progress, options.health),
    );
    let report = engine.run(records, handovers, options.shutdown).await;
    probes.abort();
    policy_watch.abort();

    // The poll thread stops (its hand-over channel is gone), the stored watermarks are committed,
    // and the consumer leaves the group — all blocking librdkafka calls, off the async workers.
    let commit_offsets = options.commit_offsets;
    let closing = tokio::task::spawn_blocking(move || {
        intake.stop();
        if commit_offsets {
            if let Err(e) = consumer.commit_consumer_state(CommitMode::Sync) {
                // Nothing stored since the last commit is not a failure.
                if !matches!(
                    e.rdkafka_error_code(),
                    Some(rdkafka::types::RDKafkaErrorCode::NoOffset)
                ) {
                    tracing::warn!(error = %e, "final commit failed; the next owner re-reads from the last commit");
                }
            }
        }
        consumer.unsubscribe();
        drop(consumer);
    });
    let _ = closing.await;
    tracing::info!(committed = ?report.committed, abandoned = report.abandoned_records, "stopped");
    match &report.failure {
        Some(reason) => Err(DaemonError::Stopped(reason.clone())),
        None => Ok(report),
    }
}

/// SPEC 7.3, a wiped store: reads the store's data markers (`redis::store_marker`) before the
/// first write. A store without a marker or any key of the product is new, or wiped while no
/// process watched; the consumer group's committed offsets tell the two apart: under a group that
/// committed, every call waits (`store_lost`, readiness false) until an operator acts.
async fn check_store_data(
    store: &Arc<dyn MailboxStore>,
    consumer: &Arc<BaseConsumer<DaemonContext>>,
    topic: &str,
    options: &DaemonOptions,
) {
    let markers = match store.load_data_markers().await {
        Ok(Some(markers)) => markers,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(error = %e, "the store's data markers could not be read: a store wiped before this start is not detected (one wiped while running still is, as slots whose marker this process writes)");
            return;
        }
    };
    match markers {
        (0, false) if options.commit_offsets => {
            let consumer = consumer.clone();
            let topic_name = topic.to_owned();
            let committed = tokio::task::spawn_blocking(move || {
                kafka::group_has_committed(&consumer, &topic_name)
            })
            .await
            .unwrap_or(Ok(false));
            match committed {
                Ok(true) => {
                    store.expect_data_everywhere();
                    options.health.store_lost(&format!(
                        "the store holds no data of this product while consumer group offsets of topic {topic} are committed: it was wiped (FLUSHALL, a restart without persistence, a failover to an empty replica) or the daemon points at another store; writes wait until an operator rebuilds from the log or runs `materializer accept-store-loss`"
                    ));
                }
                Ok(false) => tracing::info!("the store is new (no data, no committed offset): its markers are written as mailboxes are"),
                Err(e) => tracing::warn!(error = %e, "the group's committed offsets could not be read: an empty store is taken as new"),
            }
        }
        (0, _) => tracing::info!("the store holds data without markers (written by an earlier release): each slot's marker is written with its next write"),
        (found, _) => tracing::info!(slots = found, "store data markers read: a slot whose marker disappears (a wiped store or master) makes its writes wait"),
    }
}
