//! `materializer tap` against a running daemon: it streams exactly the decisions the memory
//! reference (`materializer apply` on a memory store) makes of the same records, in order, with
//! their partition and offset; a filtered tap sees only what it asked for; `/debug/tap` is not
//! served unless asked.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::cli::{json_lines, run_materializer};
use support::kafka::{create_topic, http_get, produce, Daemon, DaemonSetup};
use support::redis_server::free_port;
use support::reference::group_record;

/// Starts `materializer tap` with `args`; returns once it says it listens.
fn start_tap(config: &str, args: &[&str]) -> std::process::Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_materializer"))
        .args(["--config", config, "tap"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tap");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("tap says it listens");
    assert!(line.starts_with("tap: listening to "), "{line}");
    child
}

#[tokio::test(flavor = "multi_thread")]
async fn tap_streams_the_decisions_the_reference_makes() {
    let mut setup = DaemonSetup::new("tap", None);
    setup.http_extra = vec!["debug_endpoints = true".to_owned()];
    create_topic(&setup.topic, 1).await;
    let daemon = Daemon::start(&setup);
    let config = setup.config_file(free_port());
    let config = config.to_str().expect("utf-8 path").to_owned();
    let address = format!("127.0.0.1:{}", daemon.http_port);

    let mut records: Vec<Vec<u8>> = (1..=5).map(|seq| group_record("tina", seq, "t")).collect();
    records.push(group_record("tina", 3, "t-replaced"));
    records.push(group_record("tina", 2, "t"));
    records.push(group_record("uma", 1, "u"));
    let all = start_tap(&config, &["--daemon", &address, "--limit", "8"]);
    let replaced = start_tap(
        &config,
        &[
            "--daemon",
            &address,
            "--outcome",
            "replaced",
            "--limit",
            "1",
        ],
    );
    let offsets = produce(
        &setup.topic,
        &records.iter().map(|r| (0, r.clone())).collect::<Vec<_>>(),
    )
    .await;
    let all = all.wait_with_output().expect("tap ends at its limit");
    assert!(all.status.success());
    let mut tapped = json_lines(&all);
    // Each user's decisions come in its order; users' lanes run side by side, so the stream
    // interleaves them: compare in log order.
    let tina: Vec<u64> = tapped
        .iter()
        .filter(|t| t["user_id"] == "tina")
        .filter_map(|t| t["offset"].as_u64())
        .collect();
    assert!(tina.windows(2).all(|w| w[0] < w[1]), "{tapped:#?}");
    tapped.sort_by_key(|t| t["offset"].as_i64());

    // The reference: the same records through the memory store, in order.
    let input: String = records
        .iter()
        .map(|r| format!("{}\n", String::from_utf8_lossy(r)))
        .collect();
    let reference = json_lines(&run_materializer(
        &["--store", "memory", "apply", "-"],
        Some(&input),
    ));
    assert_eq!(tapped.len(), reference.len(), "{tapped:#?}");
    for ((tap, expected), offset) in tapped.iter().zip(&reference).zip(&offsets) {
        assert_eq!(tap["user_id"], expected["user_id"], "{tap}");
        assert_eq!(tap["mailbox_seq"], expected["mailbox_seq"], "{tap}");
        assert_eq!(tap["outcome"], expected["outcome"], "{tap}");
        assert_eq!(tap["offset"], *offset, "{tap}");
        assert_eq!(tap["partition"], 0, "{tap}");
        assert_eq!(tap["daemon"], address.as_str(), "{tap}");
    }
    let replaced = json_lines(&replaced.wait_with_output().expect("tap ends"));
    assert_eq!(replaced.len(), 1);
    assert_eq!(replaced[0]["outcome"], "replaced");
    assert_eq!(replaced[0]["mailbox_seq"], 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn tap_is_refused_unless_asked_and_names_an_unreachable_replica() {
    let setup = DaemonSetup::new("tap-off", None);
    create_topic(&setup.topic, 1).await;
    let daemon = Daemon::start(&setup);
    let (code, body) = http_get(daemon.http_port, "/debug/tap").expect("an answer");
    assert_eq!(code, 404, "{body}");
    let config = setup.config_file(free_port());
    let out = run_materializer(
        &[
            "--config",
            config.to_str().expect("utf-8"),
            "tap",
            "--daemon",
            &format!("127.0.0.1:{}", daemon.http_port),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("404"));
}
