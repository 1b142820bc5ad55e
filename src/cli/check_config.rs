//! `materializer check-config [--connect]`.
//!
//! Without `--connect`: the configuration is parsed and validated (librdkafka checks every
//! pass-through property) and printed as JSON with secrets masked.
//!
//! Both refuse a configuration whose in-flight budget cannot fit the memory limit of the cgroup
//! they run in (see `daemon::memory_limit`; in a pod's init container, the pod's limit).
//!
//! With `--connect`: after the same validation, every dependency is reached the way the daemon
//! reaches it, one line per check (`ok` or `FAIL`, what was checked, what was found or what to
//! do), then a summary line; exit 1 when any check fails. Meant for a deployment's pre-flight
//! (an init container, a CI job) and for an operator wondering why a pod is not ready:
//! - `store`: the configured backend, connected with the configured TLS and credentials. Redis:
//!   `PING`, the server version (>= 7.0 for the scripts) and `SCRIPT LOAD` of every Lua script
//!   (on every master in Cluster mode). Scylla: the session, the keyspace and every table and
//!   column the backend needs; like the daemon's start, a missing keyspace is created, a
//!   mismatched one refused. Memory: nothing to reach (a snapshot file is loaded).
//! - `kafka brokers`, `kafka topic`, `kafka dead-letter topic`: cluster metadata fetched with the
//!   configured properties (TLS, SASL); each topic must exist, with its partition count shown.
//!   Nothing is produced, consumed or committed.
//! - `kafka ACL`: one line per Kafka ACL the daemon needs (`daemon::kafka_grants`: Read and
//!   DescribeConfigs on the topic, Read on the group, Write on the dead-letter topic), read from
//!   the operations the broker says the configured principal may perform (a describe that asks
//!   for them); a missing one FAILs with the `kafka-acls` command that grants it. Nothing is
//!   produced, consumed, joined or committed for it either. A TLS or SASL refusal of the broker
//!   connection is named on the `kafka brokers` line (librdkafka reports it only to its error
//!   callback).
//! - `kafka topic cleanup.policy`: the dispatch topic's effective `cleanup.policy`, read with
//!   DescribeConfigs (SPEC 7.1): a compacted topic FAILs, because it removes the only recovery
//!   path (a repair from the log), and so does a policy that cannot be read.

use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clap::Args;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::metadata::Metadata;
use rdkafka::types::RDKafkaErrorCode;

use super::{fail_with, open_store};
use crate::config::{Backend, Config};
use crate::model::Exit;
use crate::store::redis::scripts::Scripts;
use crate::store::redis::RedisStore;

/// How long one broker metadata request may take before the check fails.
const KAFKA_TIMEOUT: Duration = Duration::from_secs(10);
/// Oldest Redis the scripts run on (SPEC 1).
const MIN_REDIS_MAJOR: u32 = 7;

#[derive(Debug, Args)]
pub struct CheckConfigArgs {
    /// Also reach the store and the brokers and report each check; exit 1 if one fails.
    #[arg(long)]
    pub connect: bool,
}

/// One check's verdict: what was checked and what was found (or what to do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Check {
    pub name: String,
    pub result: Result<String, String>,
    /// The failure is a server that did not answer (exit 2: retry), not a setting to fix.
    pub unreachable: bool,
}

impl Check {
    fn line(&self) -> String {
        match &self.result {
            Ok(found) => format!("ok    {}: {found}", self.name),
            Err(problem) => format!("FAIL  {}: {problem}", self.name),
        }
    }
}

pub(super) async fn run(config: &Config, args: &CheckConfigArgs) -> ExitCode {
    if let Err(e) = crate::daemon::kafka::validate_properties(&config.kafka) {
        return fail_with(
            Exit::Usage,
            "invalid_config",
            format!("invalid configuration: {e}"),
        );
    }
    let memory = check_memory(config, crate::daemon::memory_limit::limit());
    if !args.connect {
        if let Err(problem) = &memory.result {
            return fail_with(
                Exit::Usage,
                "invalid_config",
                format!("invalid configuration: {problem}"),
            );
        }
        println!("{}", config.redacted());
        return ExitCode::SUCCESS;
    }
    let mut checks = vec![Check {
        name: "config".to_owned(),
        result: Ok(format!(
            "valid ({} store, topic {}, dead-letter topic {}, group {})",
            config.store.backend.as_str(),
            config.kafka.topic,
            config.kafka.dlq_topic,
            config.kafka.group_id
        )),
        unreachable: false,
    }];
    print_line(checks.last());
    checks.push(memory);
    print_line(checks.last());
    for check in check_store(config).await {
        checks.push(check);
        print_line(checks.last());
    }
    let topic_line = format!("kafka topic {}", config.kafka.topic);
    let mut topic_ok = false;
    for check in check_kafka(config).await {
        topic_ok |= check.name == topic_line && check.result.is_ok();
        checks.push(check);
        print_line(checks.last());
    }
    if topic_ok {
        checks.push(check_policy(config).await);
        print_line(checks.last());
    }
    finish(&checks)
}

/// The verdict of `check-config --connect`: the summary line (text) or the one object (JSON),
/// and SPEC 8.2's status: 0 every check passed, 2 a server did not answer (retry), 1 a setting
/// to fix.
fn finish(checks: &[Check]) -> ExitCode {
    let failed: Vec<&Check> = checks.iter().filter(|c| c.result.is_err()).collect();
    let exit = if failed.is_empty() {
        Exit::Done
    } else if failed.iter().any(|c| c.unreachable) {
        Exit::Retry
    } else {
        Exit::Finding
    };
    let passed = checks.len() - failed.len();
    if super::report::json() {
        let mut value = serde_json::json!({
            "checks": checks.iter().map(|c| serde_json::json!({
                "name": c.name,
                "ok": c.result.is_ok(),
                "detail": match &c.result { Ok(found) => found, Err(problem) => problem },
            })).collect::<Vec<_>>(),
            "passed": passed,
            "failed": failed.len(),
        });
        if !failed.is_empty() {
            let kind = if exit == Exit::Retry {
                "unavailable"
            } else {
                "check_failed"
            };
            let detail: Vec<String> = failed
                .iter()
                .map(|c| {
                    format!(
                        "{}: {}",
                        c.name,
                        c.result.as_ref().err().map_or("", String::as_str)
                    )
                })
                .collect();
            value["error"] = serde_json::json!({"kind": kind, "detail": detail.join("; ")});
        }
        super::print_json(&value);
    } else {
        println!(
            "{} of {} checks passed{}",
            passed,
            checks.len(),
            if failed.is_empty() {
                ""
            } else {
                "; fix the FAIL lines"
            }
        );
        if !failed.is_empty() {
            let names: Vec<&str> = failed.iter().map(|c| c.name.as_str()).collect();
            eprintln!("error: checks failed: {}", names.join(", "));
        }
    }
    exit.into()
}

/// Whether a store's connection error is its answer refusing us (authentication, ACL), not
/// silence: the clients give these as text only.
fn is_refusal(error: &str) -> bool {
    let error = error.to_lowercase();
    [
        "noperm",
        "no permissions",
        "wrongpass",
        "authentication",
        "unauthorized",
        "permission",
        "schema mismatch",
    ]
    .iter()
    .any(|word| error.contains(word))
}

/// Whether a catch-up's peak memory (docs/operations.md "Memory") fits this process's cgroup
/// limit, read where `check-config` runs: in the pod (an init container) it is the pod's.
pub(crate) fn check_memory(config: &Config, limit: Option<u64>) -> Check {
    use crate::daemon::memory_limit;
    let result = match limit {
        None => Ok(format!(
            "no memory limit here; a catch-up may take {} MiB",
            memory_limit::required_bytes(&config.kafka) >> 20
        )),
        Some(limit) => memory_limit::check(&config.kafka, limit).map(|peak| {
            format!(
                "a catch-up may take {} MiB of the {} MiB limit",
                peak >> 20,
                limit >> 20
            )
        }),
    };
    Check {
        name: "memory".to_owned(),
        result,
        unreachable: false,
    }
}

/// A check's line as soon as it is known (text output only: JSON prints one object at the end).
fn print_line(check: Option<&Check>) {
    if super::report::json() {
        return;
    }
    if let Some(check) = check {
        println!("{}", check.line());
    }
}

async fn check_store(config: &Config) -> Vec<Check> {
    let backend = config.store.backend;
    let name = format!("store ({})", backend.as_str());
    let target = match backend {
        Backend::Memory => "in-process".to_owned(),
        Backend::Redis => crate::config::redact_url(&config.store.redis.url),
        Backend::Scylla => format!(
            "{} keyspace {}",
            config.store.scylla.nodes.join(","),
            config.store.scylla.keyspace
        ),
    };
    // The store's own timeouts bound the attempt; this is a backstop for a server that accepts
    // connections and never answers.
    let limit = Duration::from_millis(
        config
            .store
            .redis
            .connect_timeout_ms
            .max(config.store.scylla.connect_timeout_ms),
    ) * 3;
    let started = Instant::now();
    let opened = match tokio::time::timeout(limit, open_store(config)).await {
        Ok(Ok(opened)) => opened,
        Ok(Err(e)) => {
            // A server that answered "no" (a password, a permission) is a setting to fix; one
            // that did not answer is worth asking again.
            let refused = is_refusal(&e);
            return vec![Check {
                name,
                result: Err(format!("{target}: {e}")),
                unreachable: !refused,
            }];
        }
        Err(_) => {
            return vec![Check {
                name,
                result: Err(format!("{target}: no answer within {limit:?}")),
                unreachable: true,
            }]
        }
    };
    let result = match backend {
        Backend::Memory => Ok(match &config.store.memory.snapshot {
            Some(path) => format!(
                "in-process; snapshot {} loaded (nothing else to reach)",
                path.display()
            ),
            None => "in-process; nothing to reach".to_owned(),
        }),
        Backend::Redis => match opened.redis() {
            Some(store) => redis_details(store)
                .await
                .map(|details| format!("{target}: {details}"))
                .map_err(|e| format!("{target}: {e}")),
            None => Err("the Redis store did not open".to_owned()),
        },
        Backend::Scylla => Ok(format!(
            "{target}: connected in {} ms; every table and column present, statements prepared",
            started.elapsed().as_millis()
        )),
    };
    let mut checks = vec![Check {
        name,
        result,
        unreachable: false,
    }];
    if backend != Backend::Memory {
        checks.push(check_grants(config, &opened).await);
    }
    if let Some(redis) = opened.redis() {
        checks.push(check_eviction(redis, config.store.redis.allow_eviction).await);
    }
    checks
}

/// The store user's or role's permissions, probed without changing anything
/// ([`crate::cli::OpenedStore::missing_grants`]): a missing one FAILs, named.
async fn check_grants(config: &Config, opened: &crate::cli::OpenedStore) -> Check {
    let backend = config.store.backend;
    let result = match opened.missing_grants().await {
        Err(e) => Err(format!("cannot probe the grants: {e}")),
        Ok(missing) if missing.is_empty() => Ok(match backend {
            Backend::Redis => format!(
                "the ACL user may run every command the product sends, on the keys {}:*",
                config.store.redis.key_prefix
            ),
            _ => format!(
                "the role may read and write every table of keyspace {}",
                config.store.scylla.keyspace
            ),
        }),
        Ok(missing) => Err(super::missing_grants_message(backend, &missing)),
    };
    Check {
        name: format!("store grants ({})", backend.as_str()),
        result,
        unreachable: false,
    }
}

/// Every master's `maxmemory-policy` (SPEC 5): anything but `noeviction` FAILs unless
/// `store.redis.allow_eviction` accepts it.
async fn check_eviction(redis: &RedisStore, allow_eviction: bool) -> Check {
    use crate::store::redis::eviction::{verdict, Verdict, NO_EVICTION};
    let result = match redis.eviction_policies().await {
        Err(e) => Err(format!("cannot read maxmemory-policy: {e}")),
        Ok(policies) => match verdict(&policies, allow_eviction) {
            Verdict::Safe { masters } => Ok(format!(
                "maxmemory-policy {NO_EVICTION} on {masters} master(s): no key is ever evicted"
            )),
            Verdict::Allowed(warning) => Ok(format!("WARNING {warning}")),
            Verdict::Refused(refusal) => Err(refusal),
        },
    };
    Check {
        name: "store eviction (redis)".to_owned(),
        result,
        unreachable: false,
    }
}

/// PING (already answered by the connect), the server version, and every script loaded.
async fn redis_details(store: &RedisStore) -> Result<String, String> {
    let mut conn = store.conn();
    // On a cluster the client asks every node and answers a map node -> text.
    let info: redis::Value = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .map_err(|e| format!("INFO server: {e}"))?;
    let texts: Vec<String> =
        match info {
            redis::Value::Map(nodes) => nodes
                .into_iter()
                .filter_map(|(_, text)| redis::from_redis_value::<String>(text).ok())
                .collect(),
            other => vec![redis::from_redis_value::<String>(other)
                .map_err(|e| format!("INFO server: {e}"))?],
        };
    let mut versions: Vec<String> = texts
        .iter()
        .map(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("redis_version:"))
                .map(str::trim)
                .unwrap_or("unknown")
                .to_owned()
        })
        .collect();
    versions.sort();
    versions.dedup();
    for version in &versions {
        let major = version
            .split('.')
            .next()
            .and_then(|m| m.parse::<u32>().ok());
        if major.is_some_and(|m| m < MIN_REDIS_MAJOR) {
            return Err(format!(
                "Redis {version} is too old: the scripts need Redis >= {MIN_REDIS_MAJOR}.0"
            ));
        }
    }
    let version = versions.join(", ");
    let scripts = Scripts::new();
    let all = [
        ("append", &scripts.append),
        ("truncate", &scripts.truncate),
        ("promote", &scripts.promote),
        ("scan_begin", &scripts.scan_begin),
        ("scan_end", &scripts.scan_end),
        ("inspect", &scripts.inspect),
    ];
    for (name, script) in all {
        let sha: String = script
            .prepare_invoke()
            .load_async(&mut conn)
            .await
            .map_err(|e| format!("SCRIPT LOAD {name}: {e}"))?;
        if sha != script.get_hash() {
            return Err(format!(
                "SCRIPT LOAD {name}: the server returned {sha}, expected {}",
                script.get_hash()
            ));
        }
    }
    Ok(format!(
        "PING answered, Redis {version}, {} scripts loaded",
        all.len()
    ))
}

async fn check_kafka(config: &Config) -> Vec<Check> {
    let kafka = config.kafka.clone();
    // librdkafka's metadata calls block: run them off the async workers.
    let task = tokio::task::spawn_blocking(move || kafka_checks(&kafka));
    match task.await {
        Ok(checks) => checks,
        Err(e) => vec![Check {
            name: "kafka".to_owned(),
            result: Err(format!("the metadata check did not finish: {e}")),
            unreachable: true,
        }],
    }
}

fn kafka_checks(kafka: &crate::config::KafkaConfig) -> Vec<Check> {
    let brokers_name = format!("kafka brokers {}", kafka.brokers);
    let mut client =
        crate::daemon::kafka::base_config(kafka, crate::daemon::kafka::ClientRole::Standalone);
    // A metadata request must never create the topic it asks about.
    client.set("allow.auto.create.topics", "false");
    let consumer: BaseConsumer<ClientErrors> =
        match client.create_with_context(ClientErrors::default()) {
            Ok(consumer) => consumer,
            Err(e) => {
                return vec![Check {
                    name: brokers_name,
                    result: Err(format!(
                        "cannot create a client: {}",
                        crate::config::redact_secrets(&e.to_string(), kafka)
                    )),
                    unreachable: false,
                }]
            }
        };
    let first = first_metadata(&consumer, &kafka.topic);
    let brokers = match &first {
        Ok(metadata) => Check {
            name: brokers_name,
            result: Ok(format!(
                "{} broker(s) answered metadata: {}",
                metadata.brokers().len(),
                metadata
                    .brokers()
                    .iter()
                    .map(|b| format!("{}:{}", b.host(), b.port()))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            unreachable: false,
        },
        Err(e) => {
            let (problem, unreachable) = broker_failure(e, consumer.context(), kafka);
            Check {
                name: brokers_name,
                result: Err(problem),
                unreachable,
            }
        }
    };
    if first.is_err() {
        return vec![brokers];
    }
    let topic = topic_check(
        "kafka topic",
        &kafka.topic,
        &first,
        "Read (which implies Describe)",
        "the daemon would have nothing to consume",
    );
    let dlq = topic_check(
        "kafka dead-letter topic",
        &kafka.dlq_topic,
        &consumer.fetch_metadata(Some(&kafka.dlq_topic), KAFKA_TIMEOUT),
        "Write (which implies Describe)",
        "dead letters could not be written and records would wait",
    );
    let mut checks = vec![brokers, topic, dlq];
    checks.extend(acl_checks(&consumer, kafka));
    checks
}

/// The errors the check's Kafka client reported through librdkafka's error callback. A broker
/// that refuses the connection (a TLS certificate not trusted, a SASL login refused) fails a
/// metadata request only with a generic transport error or a timeout: the cause is in these.
#[derive(Debug, Default)]
struct ClientErrors(Mutex<Vec<String>>);

impl ClientErrors {
    /// The distinct reasons reported so far, oldest first.
    fn reported(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether a reason says the broker refused this client for good (TLS or SASL): asking
    /// again until the timeout would only wait.
    fn refused(&self) -> bool {
        self.reported()
            .iter()
            .any(|r| connection_refusal(r).is_some())
    }

    /// Keeps a reason once (at most 16 distinct ones).
    fn keep(&self, reason: String) {
        let mut reported = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !reported.contains(&reason) && reported.len() < 16 {
            reported.push(reason);
        }
    }
}

impl ClientContext for ClientErrors {
    // Served by `poll` (see `first_metadata`).
    fn error(&self, error: KafkaError, reason: &str) {
        self.keep(if reason.is_empty() {
            error.to_string()
        } else {
            reason.to_owned()
        });
    }

    // Called from librdkafka's threads: its error-level lines carry the same reasons at once.
    fn log(&self, level: RDKafkaLogLevel, _fac: &str, message: &str) {
        if matches!(
            level,
            RDKafkaLogLevel::Emerg
                | RDKafkaLogLevel::Alert
                | RDKafkaLogLevel::Critical
                | RDKafkaLogLevel::Error
        ) {
            self.keep(message.to_owned());
        }
    }
}

impl ConsumerContext for ClientErrors {}

/// What a librdkafka error reason means for the operator when the broker refused the
/// connection itself, with the settings to check; `None` for any other reason.
fn connection_refusal(reason: &str) -> Option<&'static str> {
    if reason.contains("certificate verify failed") {
        Some("the broker's TLS certificate failed verification against the CA of kafka.properties ssl.ca.location (or the system's CAs): check ssl.ca.location")
    } else if reason.contains("SSL handshake failed") {
        Some("the TLS handshake with the broker failed: check kafka.properties security.protocol and the ssl.* settings")
    } else if reason.contains("SASL authentication error")
        || reason.contains("Authentication failed")
    {
        Some("the broker refused the SASL login: check kafka.properties sasl.mechanism, sasl.username and sasl.password")
    } else {
        None
    }
}

/// The first metadata request, asked again every second until [`KAFKA_TIMEOUT`]; a broker that
/// refused the connection (TLS, SASL) ends it at once.
fn first_metadata(
    consumer: &BaseConsumer<ClientErrors>,
    topic: &str,
) -> Result<Metadata, KafkaError> {
    let deadline = Instant::now() + KAFKA_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match consumer.fetch_metadata(Some(topic), left.min(Duration::from_secs(1))) {
            Ok(metadata) => return Ok(metadata),
            Err(e) => {
                // Serves the client's error events (nothing is assigned: no record is fetched).
                let _ = consumer.poll(Duration::ZERO);
                if Instant::now() >= deadline || consumer.context().refused() {
                    return Err(e);
                }
            }
        }
    }
}

/// The daemon's Kafka ACLs ([`crate::daemon::kafka_grants`]), one `kafka ACL` line each. An ACL
/// on a topic that does not exist, or on one the client may not even describe when the ACL does
/// not imply Describe, gets no line: the topic's own line FAILs, and the rest is told once it
/// is fixed.
fn acl_checks<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    kafka: &crate::config::KafkaConfig,
) -> Vec<Check> {
    use crate::daemon::kafka_grants::{self, ResourceKind, Verdict};
    let name = || "kafka ACL".to_owned();
    let acls = kafka_grants::daemon_acls(kafka);
    let topics = [kafka.topic.as_str(), kafka.dlq_topic.as_str()];
    let (described, group) = match kafka_grants::authorized(
        consumer.client(),
        &topics,
        &kafka.group_id,
        KAFKA_TIMEOUT,
    ) {
        Ok(answers) => answers,
        Err(e) => {
            return vec![Check {
                name: name(),
                result: Err(format!(
                    "cannot read the operations the broker grants this client: {e}"
                )),
                unreachable: false,
            }]
        }
    };
    let verdicts = kafka_grants::verdicts(&acls, &topics, &described, &group);
    acls.iter()
        .zip(verdicts)
        .filter_map(|(acl, verdict)| {
            let result = match verdict {
                Verdict::Granted => Ok(format!("{} is granted", acl.named())),
                Verdict::Missing => Err(format!(
                    "{} is missing ({}): {}",
                    acl.named(),
                    acl.fix(),
                    acl.without
                )),
                Verdict::NotReported => Ok(format!(
                    "WARNING {} not verified: the broker does not report the operations it grants (Kafka < 2.3)",
                    acl.named()
                )),
                Verdict::Hidden(_) if acl.kind == ResourceKind::Topic => return None,
                Verdict::Hidden(why) => Err(format!(
                    "cannot tell whether {} is granted: {why}",
                    acl.named()
                )),
            };
            Some(Check {
                name: name(),
                result,
                unreachable: false,
            })
        })
        .collect()
}

/// The dispatch topic's `cleanup.policy`: compacted (or unreadable) FAILs, see
/// [`crate::daemon::topic_policy`].
async fn check_policy(config: &Config) -> Check {
    use crate::daemon::topic_policy;
    let topic = &config.kafka.topic;
    let result = match topic_policy::read(&config.kafka, topic, KAFKA_TIMEOUT).await {
        Ok(policy) if policy.is_compacted() => Err(policy.consequence(topic)),
        Ok(policy) => Ok(format!(
            "{}: records leave the log only by retention, so a repair can rebuild a mailbox from it",
            policy.value()
        )),
        Err(e) => Err(format!(
            "{e}; without it nobody can tell whether the topic is compacted, and repairs are refused"
        )),
    };
    Check {
        name: format!("kafka topic {} {topic}", topic_policy::CLEANUP_POLICY),
        result,
        unreachable: false,
    }
}

/// Why no metadata came: the request's error, and what the client reported of the broker's
/// refusal (TLS, SASL) or else its last error, secrets masked.
fn broker_failure(
    e: &KafkaError,
    errors: &ClientErrors,
    kafka: &crate::config::KafkaConfig,
) -> (String, bool) {
    let reported = errors.reported();
    let refusal = reported
        .iter()
        .find_map(|r| connection_refusal(r).map(|meaning| (r, meaning)));
    let text = match (refusal, reported.last()) {
        (Some((reason, meaning)), _) => format!("no metadata: {e}: {meaning} (librdkafka: {reason})"),
        (None, Some(reason)) => format!(
            "no metadata within {KAFKA_TIMEOUT:?}: {e} (librdkafka: {reason}) (check kafka.brokers, the network and kafka.properties TLS/SASL settings)"
        ),
        (None, None) => format!(
            "no metadata within {KAFKA_TIMEOUT:?}: {e} (check kafka.brokers, the network and kafka.properties TLS/SASL settings)"
        ),
    };
    (
        crate::config::redact_secrets(&text, kafka),
        refusal.is_none(),
    )
}

/// A topic's line from its metadata; `grant` is the ACL that lets the client describe it (the
/// one its client needs, which implies Describe).
fn topic_check(
    what: &str,
    topic: &str,
    metadata: &Result<Metadata, KafkaError>,
    grant: &str,
    consequence: &str,
) -> Check {
    let name = format!("{what} {topic}");
    use crate::daemon::health::TopicView;
    let result = match metadata {
        Err(e) => Err(format!(
            "no metadata within {KAFKA_TIMEOUT:?}: {e} (check kafka.brokers, the network and kafka.properties TLS/SASL settings)"
        )),
        // The same reading of the metadata as the daemon's readiness probe.
        Ok(metadata) => match TopicView::of(metadata, topic) {
            TopicView::Missing => Err(format!(
                "UnknownTopicOrPartition (Broker: Unknown topic or partition): it does not exist; create it ({consequence})"
            )),
            TopicView::Error(code @ RDKafkaErrorCode::TopicAuthorizationFailed) => Err(format!(
                "{code:?}: {code}: the client may not describe it; grant {grant} on it ({consequence})"
            )),
            TopicView::Error(code) => Err(format!(
                "{code:?}: {code}; create it or grant access to it ({consequence})"
            )),
            TopicView::Partitions(0) => Err(format!("has no partitions ({consequence})")),
            TopicView::Partitions(n) => Ok(format!("{n} partition(s)")),
        },
    };
    Check {
        name,
        result,
        unreachable: false,
    }
}
