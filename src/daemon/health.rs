//! Readiness probes: the store answers a ping and the broker answers a metadata request, every
//! two seconds. `/readyz` (and `materializer_ready`) turn false while either fails, and while the
//! engine reports any of the other conditions `Health` holds: a stalled partition (or a consumer
//! that failed fatally), dead letters that keep failing (or a dead-letter producer that failed
//! fatally), and a transient store write failure in the last few seconds (a store that answers
//! pings but refuses writes).
//!
//! The same metadata answer says whether the replica can consume anything at all
//! ([`subscription`]): a subscribed topic that does not exist, cannot be read or has no
//! partitions, or a group that gave this replica no assignment (not even an empty one) within
//! `kafka.assignment_timeout_ms`, turns readiness false with the reason and the topic named; it
//! turns true again by itself when the cause goes away. A replica assigned nothing because the
//! group has more members than partitions is idle, which is normal: ready, and `/readyz` says so.
//! The gauges `assigned_partitions`, `topic_partitions` and `subscription_available` carry the
//! same facts to the alert rules.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::metadata::Metadata;
use rdkafka::types::RDKafkaErrorCode;

use super::events::{Event, StoreEvicting, StoreOpenSlots, StoreRedirects, Subscription};
use super::http::Health;
use super::kafka::DaemonContext;
use crate::store::MailboxStore;

/// How often the probes run, and how long each may take.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_secs(2);

/// What the probes need to know besides the clients.
#[derive(Debug, Clone)]
pub struct ProbeSettings {
    pub topic: String,
    pub group: String,
    pub dlq_topic: String,
    /// The ACLs the daemon needs (`kafka_grants::daemon_acls`), re-asked every
    /// [`GRANTS_RECHECK`].
    pub(crate) acls: Vec<super::kafka_grants::Acl>,
    /// `kafka.assignment_timeout_ms`.
    pub assignment_timeout: Duration,
}

/// Runs the probes until aborted.
pub fn spawn(
    store: Arc<dyn MailboxStore>,
    consumer: Arc<BaseConsumer<DaemonContext>>,
    settings: ProbeSettings,
    health: Arc<Health>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last_line: Option<(bool, Option<String>)> = None;
        let mut last_grants: Option<Option<String>> = None;
        let mut grants_checked: Option<std::time::Instant> = None;
        // The topics' ACLs as the broker last answered (asked every `GRANTS_RECHECK`); the
        // group's are read from the group's own answers at every probe.
        let mut topics_answer: Option<Vec<super::kafka_grants::Authorized>> = None;
        loop {
            // No ACL to ask about (the demo's mock cluster, which answers no DescribeAcls).
            let asks = !settings.acls.is_empty();
            if asks && grants_checked.is_none_or(|at| at.elapsed() >= GRANTS_RECHECK) {
                grants_checked = Some(std::time::Instant::now());
                if let Some(answer) = topics_acls(&consumer, &settings).await {
                    topics_answer = Some(answer);
                }
            }
            if let Some(topics) = topics_answer.as_deref().filter(|_| asks) {
                let missing = missing_acls(&settings, topics);
                if last_grants.as_ref() != Some(&missing) {
                    match &missing {
                        Some(line) => tracing::error!("not ready: {line}"),
                        None if last_grants.is_some() => {
                            tracing::info!("every Kafka ACL the daemon needs is granted again")
                        }
                        None => {}
                    }
                    last_grants = Some(missing.clone());
                }
                health.set_kafka_grants(missing.is_some(), missing);
            }
            let store_ok = matches!(
                tokio::time::timeout(PROBE_INTERVAL, store.ping()).await,
                Ok(Ok(()))
            );
            if store_ok != health.store_ok() {
                tracing::info!(store_ok, "store readiness changed");
            }
            health.set_store(store_ok);
            let metadata = {
                let consumer = consumer.clone();
                let topic = settings.topic.clone();
                tokio::task::spawn_blocking(move || {
                    consumer.fetch_metadata(Some(&topic), PROBE_INTERVAL).ok()
                })
                .await
                .ok()
                .flatten()
            };
            let broker_ok = metadata.is_some();
            if broker_ok != health.broker_ok() {
                tracing::info!(broker_ok, "broker readiness changed");
            }
            health.set_broker(broker_ok);
            // An unreachable broker says nothing about the topic: the last verdict stands.
            if let Some(metadata) = metadata {
                let context = consumer.context();
                let (assigned, waiting_for) = context.assignment();
                let topic = TopicView::of(&metadata, &settings.topic);
                let verdict = subscription(&settings, &topic, assigned, waiting_for);
                Subscription {
                    available: !verdict.failing,
                    topic_partitions: topic.partitions(),
                    assigned,
                }
                .emit();
                let now = (verdict.failing, verdict.line.clone());
                if last_line.as_ref() != Some(&now) {
                    match (&verdict.line, verdict.failing) {
                        (Some(line), true) => {
                            tracing::error!(topic = %settings.topic, "subscription unavailable: {line}")
                        }
                        (Some(line), false) => tracing::info!(topic = %settings.topic, "{line}"),
                        (None, _) if last_line.is_some() => {
                            tracing::info!(topic = %settings.topic, assigned, "subscription ok: partitions assigned")
                        }
                        (None, _) => {}
                    }
                    last_line = Some(now);
                }
                health.set_subscription(verdict.failing, verdict.line);
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    })
}

/// How often the daemon asks the broker again which of its ACLs it holds.
const GRANTS_RECHECK: Duration = Duration::from_secs(30);

/// The `/readyz` line naming the Kafka ACLs the daemon lacks (`None`: none lacking), from the
/// topics' last answer and the group's own answers. Only the ACLs without
/// which records cannot flow count: `Read` on the topic and the group, `Write` on the dead-letter
/// topic; a missing `DescribeConfigs` only refuses repairs, which the compaction watch reports.
fn missing_acls(
    settings: &ProbeSettings,
    topics: &[super::kafka_grants::Authorized],
) -> Option<String> {
    use super::kafka_grants::{verdicts, GroupAnswers, Operation, Verdict};
    // The group from the group's own answers (never a DescribeConsumerGroups from the daemon:
    // `kafka_grants` says why).
    let group = GroupAnswers::authorized();
    let names = [settings.topic.as_str(), settings.dlq_topic.as_str()];
    let missing: Vec<String> = settings
        .acls
        .iter()
        .zip(verdicts(&settings.acls, &names, topics, &group))
        .filter(|(acl, verdict)| {
            *verdict == Verdict::Missing && acl.operation != Operation::DescribeConfigs
        })
        .map(|(acl, _)| {
            format!(
                "{} is missing ({}): {}",
                acl.named(),
                acl.fix(),
                acl.without
            )
        })
        .collect();
    (!missing.is_empty()).then(|| missing.join("; "))
}

/// The topics' ACLs as the broker answers DescribeTopics (`None`: no answer; the broker probe
/// reports that).
async fn topics_acls(
    consumer: &Arc<BaseConsumer<DaemonContext>>,
    settings: &ProbeSettings,
) -> Option<Vec<super::kafka_grants::Authorized>> {
    let consumer = consumer.clone();
    let (topic, dlq) = (settings.topic.clone(), settings.dlq_topic.clone());
    tokio::task::spawn_blocking(move || {
        super::kafka_grants::authorized_topics(
            consumer.client(),
            &[&topic, &dlq],
            PROBE_INTERVAL * 5,
        )
    })
    .await
    .ok()?
    .ok()
}

/// How often the daemon reads every Redis master again ([`watch_redis_masters`]).
const MASTERS_RECHECK: Duration = Duration::from_secs(10);

/// Re-reads every Redis master every [`MASTERS_RECHECK`], one pass over them for two readiness
/// conditions. A read that fails changes neither (the store probe reports an unreachable store).
///
/// - `maxmemory-policy` (SPEC 5): a policy changed to an evicting one while the daemon runs
///   turns readiness false (`store policy:` names the policy and the master), or, under
///   `store.redis.allow_eviction`, keeps warning; `materializer_store_evicting` follows.
/// - On a cluster, slots a reshard left open (SPEC 7.2): a slot reported migrating or importing
///   on two reads in a row (a healthy rebalance moves each slot within seconds, so one sighting
///   is routine) turns readiness false with the slots named (`store slots:`), logged once; it
///   clears by itself once the operator closes them (`redis-cli --cluster fix`). Only the users
///   of those slots wait meanwhile (their scripts are answered `TRYAGAIN`); the others flow.
pub fn watch_redis_masters(
    store: Arc<crate::store::redis::RedisStore>,
    allow_eviction: bool,
    health: Arc<Health>,
) -> tokio::task::JoinHandle<()> {
    use crate::store::redis::eviction::{full_line, verdict, NodePolicy, Verdict};
    use crate::store::redis::open_slots::OpenSlot;
    if let Some(start) = store.cluster_redirects() {
        tokio::spawn(report_redirects(Arc::downgrade(&store), start));
    }
    tokio::spawn(async move {
        let mut last: Option<Verdict> = None;
        let mut last_full: Option<String> = None;
        let mut seen: Vec<OpenSlot> = Vec::new();
        let mut reported: Vec<OpenSlot> = Vec::new();
        loop {
            if let Ok((policies, open)) = store.master_readings().await {
                // SPEC 7.3: a full master refuses every write that adds data (OOM, retried);
                // readiness says so, naming it, until memory is freed or the limit raised.
                let full = full_line(&policies);
                let failing = policies.iter().any(NodePolicy::full);
                if full.is_some() != last_full.is_some() {
                    match &full {
                        Some(line) if failing => tracing::error!("not ready: {line}"),
                        Some(line) => tracing::warn!("{line}"),
                        None => tracing::info!("no Redis master is near its maxmemory any more"),
                    }
                }
                health.set_store_memory(failing, full.clone());
                last_full = full;
                let now = verdict(&policies, allow_eviction);
                StoreEvicting(now.evicting()).emit();
                let changed = last.as_ref() != Some(&now);
                match &now {
                    Verdict::Safe { .. } => {
                        if changed && last.is_some() {
                            tracing::info!("Redis evicts no keys any more (maxmemory-policy noeviction on every master)");
                        }
                        health.set_store_policy(false, None);
                    }
                    Verdict::Allowed(warning) => {
                        if changed {
                            tracing::warn!("{warning}");
                        }
                        health
                            .set_store_policy(false, Some(format!("evicting, allowed: {warning}")));
                    }
                    Verdict::Refused(refusal) => {
                        if changed {
                            tracing::error!("not ready: {refusal}");
                        }
                        health.set_store_policy(true, Some(refusal.clone()));
                    }
                }
                last = Some(now);

                let stuck: Vec<OpenSlot> =
                    open.iter().filter(|s| seen.contains(s)).cloned().collect();
                // A slot is open on both its ends (migrating on one, importing on the other).
                let mut slots: Vec<_> = stuck.iter().map(|s| s.slot).collect();
                slots.sort_unstable();
                slots.dedup();
                StoreOpenSlots(slots.len()).emit();
                if stuck.is_empty() {
                    if !reported.is_empty() {
                        tracing::info!("no Redis Cluster slot is left open any more");
                    }
                    health.set_store_slots(false, None);
                } else {
                    let named: Vec<String> = stuck.iter().map(ToString::to_string).collect();
                    let line = format!(
                        "{} left open by an interrupted reshard (its users wait): run redis-cli --cluster fix",
                        named.join("; ")
                    );
                    if stuck != reported {
                        tracing::error!("not ready: {line}");
                    }
                    health.set_store_slots(true, Some(line));
                }
                reported = stuck;
                seen = open;
            }
            tokio::time::sleep(MASTERS_RECHECK).await;
        }
    })
}

/// Exports the Redis Cluster redirections the store counted and sums up each
/// [`MASTERS_RECHECK`] that had any in one INFO line: a rebalance is routine, so it is told
/// once per period, never once per delivery. Ends with the store.
async fn report_redirects(
    store: std::sync::Weak<crate::store::redis::RedisStore>,
    mut before: [u64; 5],
) {
    use crate::store::redis::REDIRECT_KINDS;
    let totals = |counts: [u64; 5]| -> Vec<(&'static str, u64)> {
        REDIRECT_KINDS.iter().copied().zip(counts).collect()
    };
    StoreRedirects {
        totals: &totals(before),
    }
    .emit();
    loop {
        tokio::time::sleep(MASTERS_RECHECK).await;
        let Some(now) = store.upgrade().and_then(|s| s.cluster_redirects()) else {
            return;
        };
        let since: Vec<String> = REDIRECT_KINDS
            .iter()
            .zip(now.iter().zip(before.iter()))
            .filter(|(_, (now, before))| now > before)
            .map(|(kind, (now, before))| format!("{kind} {}", now - before))
            .collect();
        if !since.is_empty() {
            tracing::info!(
                "Redis Cluster redirections in the last {}s, each request sent again alone: {}",
                MASTERS_RECHECK.as_secs(),
                since.join(", ")
            );
        }
        StoreRedirects {
            totals: &totals(now),
        }
        .emit();
        before = now;
    }
}

/// What the brokers' metadata says of the subscribed topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TopicView {
    /// Not in the metadata, or `UnknownTopicOrPartition`.
    Missing,
    /// Another error for the topic (e.g. `TopicAuthorizationFailed`).
    Error(RDKafkaErrorCode),
    Partitions(usize),
}

impl TopicView {
    pub(crate) fn of(metadata: &Metadata, topic: &str) -> Self {
        let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Self::Missing;
        };
        match found.error().map(RDKafkaErrorCode::from) {
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => Self::Missing,
            Some(code) => Self::Error(code),
            None => Self::Partitions(found.partitions().len()),
        }
    }

    fn partitions(&self) -> usize {
        match self {
            Self::Partitions(n) => *n,
            _ => 0,
        }
    }
}

/// The subscription's verdict: whether readiness fails, and the `/readyz` line when it is not
/// plain `ok`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub failing: bool,
    pub line: Option<String>,
}

/// Decides the `subscription:` line of `/readyz` from the topic's metadata, how many partitions
/// this replica holds, and how long it has waited for an assignment (`None`: it holds one,
/// possibly empty).
pub(crate) fn subscription(
    settings: &ProbeSettings,
    topic: &TopicView,
    assigned: usize,
    waiting_for: Option<Duration>,
) -> Verdict {
    let name = &settings.topic;
    let failing = |line: String| Verdict {
        failing: true,
        line: Some(line),
    };
    match topic {
        TopicView::Missing => failing(format!(
            "topic {name} does not exist: nothing is consumed; create it or correct kafka.topic (consuming starts within seconds of its creation)"
        )),
        TopicView::Error(code) => failing(format!(
            "topic {name} cannot be consumed: {code:?}: {code} (check the Read and Describe permissions on it)"
        )),
        TopicView::Partitions(0) => failing(format!(
            "topic {name} has no partitions: nothing is consumed"
        )),
        TopicView::Partitions(n) => match waiting_for {
            Some(waited) if waited >= settings.assignment_timeout => failing(format!(
                "no partition assignment {} s after joining group {} while topic {name} has {n} partition(s): the group's rebalance does not complete (see the consumer's errors in the log)",
                waited.as_secs(),
                settings.group
            )),
            None if assigned == 0 => Verdict {
                failing: false,
                line: Some(format!(
                    "idle: none of topic {name}'s {n} partition(s) is assigned here (the group has more members than partitions)"
                )),
            },
            _ => Verdict {
                failing: false,
                line: None,
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ProbeSettings {
        ProbeSettings {
            topic: "dispatch".to_owned(),
            group: "mm".to_owned(),
            dlq_topic: "dispatch.dlq".to_owned(),
            acls: Vec::new(),
            assignment_timeout: Duration::from_secs(120),
        }
    }

    #[test]
    fn a_missing_unreadable_or_empty_topic_fails_and_names_the_topic() {
        for (view, words) in [
            (TopicView::Missing, "does not exist"),
            (
                TopicView::Error(RDKafkaErrorCode::TopicAuthorizationFailed),
                "TopicAuthorizationFailed",
            ),
            (TopicView::Partitions(0), "has no partitions"),
        ] {
            // Whatever the assignment says: the topic decides first.
            for (assigned, waiting) in [(0, None), (2, None), (0, Some(Duration::ZERO))] {
                let verdict = subscription(&settings(), &view, assigned, waiting);
                assert!(verdict.failing, "{view:?}");
                let line = verdict.line.unwrap_or_default();
                assert!(
                    line.contains("topic dispatch") && line.contains(words),
                    "{line}"
                );
            }
        }
    }

    #[test]
    fn no_assignment_fails_only_after_the_timeout() {
        let topic = TopicView::Partitions(3);
        let before = subscription(&settings(), &topic, 0, Some(Duration::from_secs(119)));
        assert_eq!(
            before,
            Verdict {
                failing: false,
                line: None
            }
        );
        let after = subscription(&settings(), &topic, 0, Some(Duration::from_secs(120)));
        assert!(after.failing);
        let line = after.line.unwrap_or_default();
        assert!(
            line.contains("group mm") && line.contains("3 partition(s)"),
            "{line}"
        );
    }

    /// More members than partitions: this replica holds an empty assignment. Normal, so ready,
    /// and `/readyz` says why it does nothing.
    #[test]
    fn an_empty_assignment_is_idle_and_ready() {
        let verdict = subscription(&settings(), &TopicView::Partitions(3), 0, None);
        assert!(!verdict.failing);
        assert!(verdict.line.unwrap_or_default().starts_with("idle: "));
        let holding = subscription(&settings(), &TopicView::Partitions(3), 1, None);
        assert_eq!(
            holding,
            Verdict {
                failing: false,
                line: None
            }
        );
    }
}
