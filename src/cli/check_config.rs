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
//! - `kafka topic cleanup.policy`: the dispatch topic's effective `cleanup.policy`, read with
//!   DescribeConfigs (SPEC 7.1): a compacted topic FAILs, because it removes the only recovery
//!   path (a repair from the log), and so does a policy that cannot be read.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::metadata::Metadata;
use rdkafka::types::RDKafkaErrorCode;

use super::open_store;
use crate::config::{Backend, Config};
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
        eprintln!("error: invalid configuration: {e}");
        return ExitCode::FAILURE;
    }
    let memory = check_memory(config, crate::daemon::memory_limit::limit());
    if !args.connect {
        if let Err(problem) = &memory.result {
            eprintln!("error: invalid configuration: {problem}");
            return ExitCode::FAILURE;
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
    let failed = checks.iter().filter(|c| c.result.is_err()).count();
    println!(
        "{} of {} checks passed{}",
        checks.len() - failed,
        checks.len(),
        if failed == 0 {
            ""
        } else {
            "; fix the FAIL lines"
        }
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Whether a catch-up's peak memory (README "Memory") fits this process's cgroup limit, read
/// where `check-config` runs: in the pod (an init container) it is the pod's.
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
    }
}

fn print_line(check: Option<&Check>) {
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
            return vec![Check {
                name,
                result: Err(format!("{target}: {e}")),
            }]
        }
        Err(_) => {
            return vec![Check {
                name,
                result: Err(format!("{target}: no answer within {limit:?}")),
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
    let mut checks = vec![Check { name, result }];
    if backend != Backend::Memory {
        checks.push(check_grants(config, &opened).await);
    }
    if let Some(redis) = opened.redis() {
        checks.push(check_eviction(redis, config.store.redis.allow_eviction).await);
    }
    checks
}

/// The store user's or role's permissions, probed without changing anything
/// ([`crate::store::OpenedStore::missing_grants`]): a missing one FAILs, named.
async fn check_grants(config: &Config, opened: &crate::store::OpenedStore) -> Check {
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
        }],
    }
}

fn kafka_checks(kafka: &crate::config::KafkaConfig) -> Vec<Check> {
    let brokers_name = format!("kafka brokers {}", kafka.brokers);
    let mut client =
        crate::daemon::kafka::base_config(kafka, crate::daemon::kafka::ClientRole::Standalone);
    // A metadata request must never create the topic it asks about.
    client.set("allow.auto.create.topics", "false");
    let consumer: BaseConsumer = match client.create() {
        Ok(consumer) => consumer,
        Err(e) => {
            return vec![Check {
                name: brokers_name,
                result: Err(format!("cannot create a client: {e}")),
            }]
        }
    };
    let fetch = |topic: &str| consumer.fetch_metadata(Some(topic), KAFKA_TIMEOUT);
    let first = fetch(&kafka.topic);
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
        },
        Err(e) => Check {
            name: brokers_name,
            result: Err(broker_failure(e)),
        },
    };
    if first.is_err() {
        return vec![brokers];
    }
    let topic = topic_check(
        "kafka topic",
        &kafka.topic,
        &first,
        "the daemon would have nothing to consume",
    );
    let dlq = topic_check(
        "kafka dead-letter topic",
        &kafka.dlq_topic,
        &fetch(&kafka.dlq_topic),
        "dead letters could not be written and records would wait",
    );
    vec![brokers, topic, dlq]
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
    }
}

fn broker_failure(e: &KafkaError) -> String {
    format!(
        "no metadata within {KAFKA_TIMEOUT:?}: {e} (check kafka.brokers, the network and kafka.properties TLS/SASL settings)"
    )
}

fn topic_check(
    what: &str,
    topic: &str,
    metadata: &Result<Metadata, KafkaError>,
    consequence: &str,
) -> Check {
    let name = format!("{what} {topic}");
    use crate::daemon::health::TopicView;
    let result = match metadata {
        Err(e) => Err(broker_failure(e)),
        // The same reading of the metadata as the daemon's readiness probe.
        Ok(metadata) => match TopicView::of(metadata, topic) {
            TopicView::Missing => Err(format!(
                "UnknownTopicOrPartition (Broker: Unknown topic or partition): it does not exist; create it ({consequence})"
            )),
            TopicView::Error(code @ RDKafkaErrorCode::TopicAuthorizationFailed) => Err(format!(
                "{code:?}: {code}: the client may not describe or read it; grant Describe and Read on it ({consequence})"
            )),
            TopicView::Error(code) => Err(format!(
                "{code:?}: {code}; create it or grant access to it ({consequence})"
            )),
            TopicView::Partitions(0) => Err(format!("has no partitions ({consequence})")),
            TopicView::Partitions(n) => Ok(format!("{n} partition(s)")),
        },
    };
    Check { name, result }
}
