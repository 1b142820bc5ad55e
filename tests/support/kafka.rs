//! A real Kafka broker for the daemon's tests, and the daemon process itself.
//!
//! The broker is the single KRaft node `scripts/kafka start` runs (scripts/test starts it and
//! exports `KAFKA_BOOTSTRAP`). A missing broker is a loud failure, never a skip. Each test uses
//! its own topics and consumer group, so tests share the broker without seeing each other.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

/// The broker's bootstrap address.
pub fn bootstrap() -> String {
    std::env::var("KAFKA_BOOTSTRAP").unwrap_or_else(|_| {
        panic!("KAFKA_BOOTSTRAP is not set: run the tests with scripts/test, which starts Kafka (scripts/kafka start)")
    })
}

/// A name unique to this test run.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}-{}-{nanos:x}", std::process::id())
}

/// Creates `name` with `partitions` partitions and the broker's default replication factor (1 on
/// `scripts/kafka`, 3 on `scripts/kafka-cluster`).
pub async fn create_topic(name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin client");
    let results = admin
        .create_topics(
            &[NewTopic::new(name, partitions, TopicReplication::Fixed(-1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
        )
        .await
        .expect("create topic (is Kafka running? scripts/kafka start)");
    for result in results {
        result.expect("topic created");
    }
    let name = name.to_owned();
    tokio::task::spawn_blocking(move || wait_visible(&name, partitions))
        .await
        .expect("wait for the topic");
}

/// Waits until a broker's metadata shows `name` with `partitions` partitions, each with a
/// leader. The controller answers a creation before every broker has applied it (KRaft brokers
/// read the metadata log on their own), so on a loaded machine a client asking at once may still
/// be told the topic does not exist: a test's first reader is not what it is testing.
fn wait_visible(name: &str, partitions: i32) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("metadata client");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = consumer
            .fetch_metadata(Some(name), Duration::from_secs(5))
            .ok()
            .is_some_and(|metadata| {
                metadata.topics().iter().any(|topic| {
                    topic.name() == name
                        && topic.error().is_none()
                        && topic.partitions().len() == partitions as usize
                        && topic.partitions().iter().all(|p| p.leader() >= 0)
                })
            });
        if ready {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "topic {name} not visible with {partitions} partitions after 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Produces `(partition, payload)` records in order, each partition's in the order given, and
/// returns the offset of each.
pub async fn produce(topic: &str, records: &[(i32, Vec<u8>)]) -> Vec<i64> {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    let mut acks = Vec::new();
    for (partition, payload) in records {
        let key = format!("shard-{partition}");
        let ack = producer
            .send_result(
                FutureRecord::to(topic)
                    .partition(*partition)
                    .key(&key)
                    .payload(&payload[..]),
            )
            .map_err(|(e, _)| e)
            .expect("enqueue");
        acks.push(ack);
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
    let mut offsets = Vec::new();
    for ack in acks {
        let delivery = ack.await.expect("ack").expect("delivered");
        offsets.push(delivery.offset);
    }
    offsets
}

/// One dead letter as read back.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
}

/// Every message of a one-partition topic, from the beginning to its end now.
pub fn read_all(topic: &str) -> Vec<DeadLetter> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let (_, high) = consumer
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .unwrap_or((0, 0));
    let mut out = Vec::new();
    if high == 0 {
        return out;
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .expect("tpl");
    consumer.assign(&tpl).expect("assign");
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            let message = message.expect("message");
            let mut headers = BTreeMap::new();
            if let Some(h) = message.headers() {
                for header in h.iter() {
                    headers.insert(
                        header.key.to_owned(),
                        header
                            .value
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                            .unwrap_or_default(),
                    );
                }
            }
            out.push(DeadLetter {
                payload: message.payload().unwrap_or_default().to_vec(),
                headers,
            });
            if message.offset() + 1 >= high {
                break;
            }
        }
    }
    out
}

/// The group's committed offsets for `partitions` of `topic` (-1 when none).
pub fn committed(group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    // A coordinator that is moving or starting (a broker restart) answers with a retriable
    // error for a while: ask again, within a bound.
    let deadline = Instant::now() + Duration::from_secs(60);
    let found = loop {
        match consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)) {
            Ok(found) => break found,
            Err(e) if Instant::now() < deadline => {
                eprintln!("committed offsets not available yet ({e}); asking again");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("committed offsets: {e}"),
        }
    };
    (0..partitions)
        .map(
            |p| match found.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => -1,
            },
        )
        .collect()
}

/// Everything a daemon's config file says.
#[derive(Debug, Clone)]
pub struct DaemonSetup {
    pub dir: PathBuf,
    pub topic: String,
    pub dlq_topic: String,
    pub group: String,
    /// `None`: the memory store, persisted to `dir/snapshot.json` on a graceful exit.
    pub redis_url: Option<String>,
    /// Seed URLs of a Redis Cluster (the store instead of `redis_url`).
    pub redis_cluster: Option<Vec<String>>,
    /// `(contact points, keyspace)`: the Scylla store instead.
    pub scylla: Option<(String, String)>,
    /// The keyspace's replication map on Scylla (SimpleStrategy with one replica when `None`).
    pub scylla_replication: Option<String>,
    pub max_in_flight: usize,
    /// Extra lines for the `[kafka]` section (`key = value`).
    pub kafka_extra: Vec<String>,
    /// The classic group's session settings (`"name" = "value"` lines): short, so a frozen
    /// replica leaves its group within seconds. Empty for KIP-848 groups, whose session the
    /// broker sets.
    pub group_properties: Vec<String>,
    /// Extra librdkafka properties (`"name" = "value"` lines).
    pub properties_extra: Vec<String>,
    /// Extra sections at the end of the file (`[retention]` ...).
    pub sections_extra: Vec<String>,
    /// Lines appended to the store's section (`[store.redis]`, `[store.scylla]`, ...).
    pub store_extra: Vec<String>,
    /// Lines appended to the `[http]` section.
    pub http_extra: Vec<String>,
}

impl DaemonSetup {
    pub fn new(name: &str, redis_url: Option<String>) -> Self {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(unique(name));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Self {
            dir,
            topic: unique(&format!("{name}-dispatch")),
            dlq_topic: unique(&format!("{name}-dlq")),
            group: unique(&format!("{name}-group")),
            redis_url,
            redis_cluster: None,
            scylla: None,
            scylla_replication: None,
            max_in_flight: 64,
            kafka_extra: Vec::new(),
            group_properties: vec![
                "\"session.timeout.ms\" = \"6000\"".to_owned(),
                "\"heartbeat.interval.ms\" = \"500\"".to_owned(),
            ],
            properties_extra: Vec::new(),
            sections_extra: Vec::new(),
            store_extra: Vec::new(),
            http_extra: Vec::new(),
        }
    }

    /// The config of a daemon run inside the test process: this setup's broker and names,
    /// everything else at its default.
    pub fn config(&self) -> mailbox_materializer::config::Config {
        let mut config = mailbox_materializer::config::Config::default();
        config.kafka.brokers = bootstrap();
        config.kafka.topic = self.topic.clone();
        config.kafka.dlq_topic = self.dlq_topic.clone();
        config.kafka.group_id = self.group.clone();
        config
    }

    pub fn snapshot(&self) -> PathBuf {
        self.dir.join("snapshot.json")
    }

    /// Writes the config for an instance listening on `http_port`.
    pub fn config_file(&self, http_port: u16) -> PathBuf {
        let store = match (&self.scylla, &self.redis_url) {
            _ if self.redis_cluster.is_some() => {
                let urls = self.redis_cluster.as_deref().unwrap_or_default();
                let rest: Vec<String> = urls[1..].iter().map(|u| format!("\"{u}\"")).collect();
                format!("[store]\nbackend = \"redis\"\n[store.redis]\nurl = \"{}\"\ncluster = true\ncluster_nodes = [{}]\ncommand_timeout_ms = 1000\nconnect_timeout_ms = 1000\n", urls[0], rest.join(", "))
            }
            (Some((nodes, keyspace)), _) => format!(
                "[store]\nbackend = \"scylla\"\n[store.scylla]\nnodes = [\"{nodes}\"]\nkeyspace = \"{keyspace}\"\nreplication = \"{}\"\n",
                self.scylla_replication.as_deref().unwrap_or("{'class': 'SimpleStrategy', 'replication_factor': 1}")
            ),
            (None, Some(url)) => format!("[store]\nbackend = \"redis\"\n[store.redis]\nurl = \"{url}\"\ncommand_timeout_ms = 1000\nconnect_timeout_ms = 1000\n"),
            (None, None) => format!(
                "[store]\nbackend = \"memory\"\n[store.memory]\nsnapshot = \"{}\"\n",
                self.snapshot().display()
            ),
        };
        let store = format!("{store}{}\n", self.store_extra.join("\n"));
        let text = format!(
            "{store}
[kafka]
brokers = \"{brokers}\"
topic = \"{topic}\"
group_id = \"{group}\"
dlq_topic = \"{dlq}\"
max_in_flight_records = {max_in_flight}
commit_interval_ms = 100
retry_initial_ms = 50
retry_max_ms = 500
shutdown_deadline_ms = 5000
statistics_interval_ms = 500
{kafka_extra}
[kafka.properties]
{group_properties}
\"topic.metadata.refresh.interval.ms\" = \"1000\"
{properties_extra}
[http]
listen = \"127.0.0.1:{http_port}\"
{http_extra}
{sections_extra}
",
            brokers = bootstrap(),
            topic = self.topic,
            group = self.group,
            dlq = self.dlq_topic,
            max_in_flight = self.max_in_flight,
            kafka_extra = self.kafka_extra.join("\n"),
            group_properties = self.group_properties.join("\n"),
            properties_extra = self.properties_extra.join("\n"),
            sections_extra = self.sections_extra.join("\n"),
            http_extra = self.http_extra.join("\n"),
        );
        let path = self.dir.join(format!("materializer-{http_port}.toml"));
        std::fs::write(&path, text).expect("write config");
        path
    }
}

/// A `materializer run` process, killed when dropped.
pub struct Daemon {
    pub child: Child,
    pub http_port: u16,
    log: PathBuf,
}

impl Daemon {
    pub fn start(setup: &DaemonSetup) -> Self {
        Self::start_with_env(setup, &[])
    }

    /// [`start`](Self::start) with extra environment variables (failpoints).
    pub fn start_with_env(setup: &DaemonSetup, env: &[(&str, &str)]) -> Self {
        let http_port = super::redis_server::free_port();
        let config = setup.config_file(http_port);
        let log = setup.dir.join(format!("daemon-{http_port}.log"));
        let log_file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_materializer"))
            .arg("run")
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info,librdkafka=warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("start materializer run");
        let daemon = Self {
            child,
            http_port,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while http_get(daemon.http_port, "/healthz").is_none() {
            assert!(
                Instant::now() < deadline,
                "daemon did not serve /healthz within 30 s; log:\n{}",
                daemon.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        daemon
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn metrics(&self) -> Metrics {
        Metrics::parse(&http_get(self.http_port, "/metrics").map_or(String::new(), |r| r.1))
    }

    /// `/readyz` status code.
    pub fn ready_status(&self) -> Option<u16> {
        http_get(self.http_port, "/readyz").map(|r| r.0)
    }

    /// Freezes the process (SIGSTOP): it keeps its connections but answers nothing.
    pub fn freeze(&self) {
        signal(self.child.id(), "-STOP");
    }

    /// Lets a frozen process go on (SIGCONT).
    pub fn thaw(&self) {
        signal(self.child.id(), "-CONT");
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits for the exit status, at most `within`.
    pub fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill -TERM");
        assert!(status.success(), "kill -TERM failed");
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "daemon did not exit within {within:?} of SIGTERM; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {signal} {pid} failed");
}

/// A raw HTTP GET on loopback: `(status, body)`, or `None` when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

/// A parsed Prometheus scrape: `name{labels}` -> value.
#[derive(Debug, Default, Clone)]
pub struct Metrics {
    pub text: String,
    pub samples: HashMap<String, f64>,
}

impl Metrics {
    pub fn parse(text: &str) -> Self {
        let mut samples = HashMap::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            if let Some((name, value)) = line.rsplit_once(' ') {
                if let Ok(value) = value.parse::<f64>() {
                    samples.insert(name.to_owned(), value);
                }
            }
        }
        Self {
            text: text.to_owned(),
            samples,
        }
    }

    /// A sample by name and labels written as in the exposition, e.g.
    /// `materializer_groups_total{outcome="inserted"}`; 0 when absent.
    pub fn get(&self, key: &str) -> f64 {
        self.samples.get(key).copied().unwrap_or(0.0)
    }

    /// Sum of every sample of a metric name.
    pub fn sum(&self, name: &str) -> f64 {
        self.samples
            .iter()
            .filter(|(k, _)| *k == name || k.starts_with(&format!("{name}{{")))
            .map(|(_, v)| v)
            .sum()
    }
}

/// Polls `check` until it is true or `timeout` passes; panics with `what` and `context()`.
pub fn wait_for(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> bool,
    context: impl Fn() -> String,
) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `promtool check metrics` on a scrape; panics when promtool is missing, cannot parse it,
/// or reports any finding at all (SPEC 9 names every metric so that promlint has nothing to
/// object to).
pub fn promtool_check(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is required (scripts/install-services installs Debian's prometheus)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write scrape");
    let out = child.wait_with_output().expect("promtool output");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let findings: Vec<&str> = report
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert!(
        out.status.success() && findings.is_empty(),
        "promtool check metrics found something in the scrape:\n{}\n--- scrape ---\n{text}",
        findings.join("\n")
    );
}

pub fn path_str(path: &Path) -> String {
    path.display().to_string()
}
