//! Every Kafka compression codec a producer may use (gzip, snappy, lz4, zstd) is readable by the
//! daemon. The records are produced by a real, independent producer (`kcat -z <codec>`, built on
//! Debian's own librdkafka) to the real broker, then consumed by a `materializer run` process into
//! its memory store, which is read back from the snapshot it saves on SIGTERM.

use crate::support;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use mailbox_materializer::model::{MailboxId, RetentionPolicy, ScanRequest, UserId};
use mailbox_materializer::store::memory::MemoryStore;
use mailbox_materializer::store::{MailboxStore, SystemClock};
use support::kafka::{bootstrap, create_topic, wait_for, Daemon, DaemonSetup};

const CODECS: [&str; 4] = ["gzip", "snappy", "lz4", "zstd"];
const PARTITIONS: i32 = 2;
/// Records per codec and partition: several, so each codec's batch really is a compressed batch
/// of more than one record.
const PER_PARTITION: u64 = 5;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn user(codec: &str, partition: i32, i: u64) -> String {
    format!("{codec}-p{partition}-u{i}")
}

fn record(codec: &str, partition: i32, i: u64, committed_at: u64) -> String {
    format!(
        r#"{{"dispatch_id":"{codec}/{partition}/{i}","group_id":"codecs","committed_at":{committed_at},"deliveries":[{{"user_id":"{}","epoch":1,"mailbox_seq":{},"events":[{{"event_ordinal":0,"payload":{{"codec":"{codec}","i":{i}}}}}]}}]}}"#,
        user(codec, partition, i),
        i + 1
    )
}

/// Produces `lines` to one partition with `kcat -z codec` (one compressed batch).
fn kcat_produce(topic: &str, partition: i32, codec: &str, lines: &[String]) {
    let mut child = Command::new("kcat")
        .args(["-b", &bootstrap(), "-P", "-t", topic, "-z", codec])
        .args(["-p", &partition.to_string()])
        // Wait for every acknowledgement before exiting; fail on a delivery error.
        .args(["-X", "linger.ms=50", "-T"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat is required (scripts/install-services installs Debian's kcat)");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("kcat stdin");
        for line in lines {
            writeln!(stdin, "{line}").expect("write to kcat");
        }
    }
    let out = child.wait_with_output().expect("kcat output");
    assert!(
        out.status.success(),
        "kcat -z {codec} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn records_of_every_codec_are_consumed() {
    let setup = DaemonSetup::new("codecs", None);
    create_topic(&setup.topic, PARTITIONS).await;
    create_topic(&setup.dlq_topic, 1).await;
    let committed_at = now_ms();
    for codec in CODECS {
        for partition in 0..PARTITIONS {
            let lines: Vec<String> = (0..PER_PARTITION)
                .map(|i| record(codec, partition, i, committed_at))
                .collect();
            kcat_produce(&setup.topic, partition, codec, &lines);
        }
    }
    let total = (CODECS.len() as u64 * PARTITIONS as u64 * PER_PARTITION) as f64;

    let mut daemon = Daemon::start(&setup);
    wait_for(
        "every compressed record applied",
        Duration::from_secs(60),
        || {
            daemon
                .metrics()
                .get("materializer_records_total{outcome=\"applied\"}")
                >= total
        },
        || format!("{}\n{}", daemon.metrics().text, daemon.log()),
    );
    let metrics = daemon.metrics();
    assert_eq!(
        metrics.get("materializer_groups_total{outcome=\"inserted\"}"),
        total
    );
    assert_eq!(metrics.sum("materializer_dlq_total"), 0.0);
    let log = daemon.log();
    assert!(
        !log.contains("NotImplemented") && !log.contains("consumer error"),
        "the daemon could not read a codec:\n{log}"
    );
    let status = daemon.terminate(Duration::from_secs(30));
    assert!(status.success(), "SIGTERM exits 0: {status:?}");

    let store = MemoryStore::new(RetentionPolicy::default(), Arc::new(SystemClock));
    store
        .load_snapshot(&setup.snapshot())
        .expect("the daemon saved its memory store on exit");
    for codec in CODECS {
        for partition in 0..PARTITIONS {
            for i in 0..PER_PARTITION {
                let id = user(codec, partition, i);
                let mailbox = MailboxId::new(UserId::parse(&id).expect("user id"), 1);
                let page = store
                    .range_scan(
                        &mailbox,
                        ScanRequest {
                            after_seq: 0,
                            until_seq: None,
                            limit_groups: 10,
                        },
                    )
                    .await
                    .expect("scan");
                assert_eq!(page.groups.len(), 1, "{id}: {page:?}");
                assert_eq!(page.groups[0].mailbox_seq, i + 1);
                assert_eq!(
                    page.groups[0].events[0].payload.as_str(),
                    format!(r#"{{"codec":"{codec}","i":{i}}}"#),
                    "{id}"
                );
            }
        }
    }
}
