//! Least privilege on Redis, tested live: a Redis ACL user with exactly the rules of
//! docs/grants.md ("Grants") runs the daemon end to end, `replay --reset-mailboxes`,
//! `dlq redrive` and `patrol`, and cannot reach another prefix's keys; a user missing any one
//! rule makes `check-config --connect` print a FAIL line naming it, and the daemon wait not ready
//! with the rule on `/readyz`: no record dead-lettered, none skipped, every one applied once the
//! rule is granted.

use crate::support;

use std::path::Path;
use std::time::Duration;

use mailbox_materializer::store::redis::grants::acl_rules;
use support::cli::{repair, run_materializer};
use support::kafka::{create_topic, http_get, produce, read_all, wait_for, Daemon, DaemonSetup};
use support::redis_server::{free_port, Clock, Listen, RedisServer};
use support::reference::{group_record, redis_store, scan_seqs};

/// The `ACL SETUSER` lines of docs/grants.md ("Grants"), in order: standalone, then a
/// cluster with `WAIT`.
fn readme_acl_lines() -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/grants.md"))
            .expect("docs/grants.md");
    readme
        .lines()
        .filter(|l| l.starts_with("ACL SETUSER materializer on >PASSWORD "))
        .map(str::to_owned)
        .collect()
}

/// The standalone rules of docs/grants.md (everything after the password).
fn readme_rules() -> Vec<String> {
    let lines = readme_acl_lines();
    lines[0]
        .trim_start_matches("ACL SETUSER materializer on >PASSWORD ")
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Sets user `materializer` (password `secret`) to exactly `rules` (reset first).
fn set_user(server: &RedisServer, rules: &[String]) {
    let reply = server.raw(&format!(
        "ACL SETUSER materializer reset on >secret {}",
        rules.join(" ")
    ));
    assert!(reply.starts_with("+OK"), "ACL SETUSER: {reply}");
}

fn acl_url(server: &RedisServer) -> String {
    let port = server.port().expect("a TCP server");
    format!("redis://materializer:secret@127.0.0.1:{port}")
}

fn admin_url(server: &RedisServer) -> String {
    format!("redis://127.0.0.1:{}", server.port().expect("a TCP server"))
}

#[test]
fn the_readmes_redis_acl_lines_are_the_ones_the_product_probes() {
    let lines = readme_acl_lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(
        lines[0],
        format!(
            "ACL SETUSER materializer on >PASSWORD {}",
            acl_rules("mm", false, false)
        )
    );
    assert_eq!(
        lines[1],
        format!(
            "ACL SETUSER materializer on >PASSWORD {}",
            acl_rules("mm", true, true)
        )
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_and_the_commands_run_with_exactly_the_readmes_redis_acl() {
    let server = RedisServer::start(Clock::Real, Listen::Tcp(free_port()), &[]);
    set_user(&server, &readme_rules());
    // The password comes from a file, as a mounted secret does: the URL names only the user.
    let port = server.port().expect("a TCP server");
    let mut setup = DaemonSetup::new(
        "acl-redis",
        Some(format!("redis://materializer@127.0.0.1:{port}")),
    );
    let password_file = setup.dir.join("redis-password");
    std::fs::write(&password_file, "secret\n").expect("write the password file");
    setup.store_extra = vec![format!("password_file = \"{}\"", password_file.display())];
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let mut records: Vec<(i32, Vec<u8>)> = Vec::new();
    for seq in 1..=5 {
        records.push((0, group_record("alice", seq, "a")));
        records.push((0, group_record("bob", seq, "b")));
    }
    // A same-day replace and a record 40 days ahead (dead-lettered: future_created_at).
    records.push((0, group_record("alice", 3, "a-replaced")));
    let ahead = serde_json::json!({
        "dispatch_id": "carol/1", "group_id": "g",
        "committed_at": support::reference::now_ms() + 40 * 86_400_000,
        "deliveries": [{"user_id": "carol", "epoch": 1, "mailbox_seq": 1,
            "events": [{"event_ordinal": 0, "payload": {"body": "c"}}]}]
    });
    records.push((0, ahead.to_string().into_bytes()));
    produce(&setup.topic, &records).await;

    let mut daemon = Daemon::start(&setup);
    wait_for(
        "every record final",
        Duration::from_secs(60),
        || daemon.metrics().sum("materializer_records_total") >= 12.0,
        || daemon.log(),
    );
    let metrics = daemon.metrics();
    assert_eq!(
        metrics.get("materializer_groups_total{outcome=\"inserted\"}"),
        10.0
    );
    assert_eq!(
        metrics.get("materializer_groups_total{outcome=\"replaced\"}"),
        1.0
    );
    assert_eq!(read_all(&setup.dlq_topic).len(), 1, "only carol's record");
    let config = setup.config_file(free_port());

    // A repair of alice's mailbox from the log while the daemon runs.
    let summary = repair(&config, 0, "alice");
    assert_eq!(
        summary["swapped_users"],
        serde_json::json!(["alice"]),
        "{summary}"
    );
    let store = redis_store(&admin_url(&server)).await;
    assert_eq!(scan_seqs(&store, "alice").await, vec![1, 2, 3, 4, 5]);
    assert_eq!(scan_seqs(&store, "bob").await, vec![1, 2, 3, 4, 5]);

    // A re-drive reads the dead letter and applies it again (still 40 days ahead: rejected
    // again, by the store's script, which ran under the same user).
    let config_arg = config.to_str().expect("utf-8 path");
    let out = run_materializer(
        &[
            "--config",
            config_arg,
            "dlq",
            "redrive",
            "--kind",
            "future_created_at",
        ],
        None,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("ACL") && !stderr.to_lowercase().contains("noperm"),
        "{stderr}"
    );
    assert!(stdout.contains("future_created_at"), "{stdout}\n{stderr}");

    let out = run_materializer(&["--config", config_arg, "patrol"], None);
    assert!(
        out.status.success(),
        "patrol: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let patrol: serde_json::Value = serde_json::from_slice(&out.stdout).expect("patrol JSON");
    assert!(patrol["visited"].as_u64() >= Some(2), "{patrol}");

    let out = run_materializer(
        &[
            "--config",
            config_arg,
            "check-config",
            "--connect",
            "--output",
            "text",
        ],
        None,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("ok    store grants (redis)"), "{stdout}");

    // Another prefix stays out of reach.
    server.raw("SET other:secret 1");
    let client = redis::Client::open(acl_url(&server)).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect as materializer");
    let denied: redis::RedisResult<Option<String>> = redis::cmd("GET")
        .arg("other:secret")
        .query_async(&mut conn)
        .await;
    let error = denied.expect_err("another prefix's key is denied");
    assert!(
        error.to_string().to_lowercase().contains("no permissions"),
        "{error}"
    );

    // The password is in no process argument and no log line.
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", daemon.child.id())).expect("cmdline");
    assert!(!String::from_utf8_lossy(&cmdline).contains("secret"));
    assert!(daemon.terminate(Duration::from_secs(30)).success());
    assert!(!daemon.log().contains("NOPERM"), "{}", daemon.log());
    assert!(!daemon.log().contains("secret"), "{}", daemon.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_redis_acl_rule_is_named_and_the_daemon_waits_for_it() {
    let server = RedisServer::start(Clock::Real, Listen::Tcp(free_port()), &[]);
    let rules = readme_rules();
    let setup = DaemonSetup::new("acl-redis-missing", Some(acl_url(&server)));
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let config = setup.config_file(free_port());
    let config_arg = config.to_str().expect("utf-8 path");

    // Each rule the user needs, taken away alone: check-config names exactly it.
    let needed: Vec<&String> = rules
        .iter()
        .filter(|r| r.starts_with('+') || r.starts_with('~'))
        .collect();
    assert!(needed.len() > 20, "{rules:?}");
    for rule in &needed {
        let without: Vec<String> = rules.iter().filter(|r| r != rule).cloned().collect();
        set_user(&server, &without);
        let out = run_materializer(
            &[
                "--config",
                config_arg,
                "check-config",
                "--connect",
                "--output",
                "text",
            ],
            None,
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        // The probe names the rule; a user who may not even PING fails the connection itself,
        // and Redis's own refusal names the command.
        let named = |l: &&str| {
            l.starts_with("FAIL  store")
                && (l.contains(&format!("add the rules {rule} "))
                    || l.contains(&format!("run the '{}' command", &rule[1..])))
        };
        let fail = stdout
            .lines()
            .find(named)
            .unwrap_or_else(|| panic!("no FAIL line naming {rule}:\n{stdout}"));
        assert_eq!(out.status.code(), Some(1), "{stdout}");
        println!("without {rule}: {fail}");
    }

    // The daemon without +zadd: not ready, the rule named, nothing dead-lettered or skipped.
    let without: Vec<String> = rules.iter().filter(|r| *r != "+zadd").cloned().collect();
    set_user(&server, &without);
    let records: Vec<(i32, Vec<u8>)> = (1..=5)
        .map(|seq| (0, group_record("dave", seq, "d")))
        .collect();
    produce(&setup.topic, &records).await;
    let daemon = Daemon::start(&setup);
    wait_for(
        "readyz names +zadd",
        Duration::from_secs(30),
        || {
            http_get(daemon.http_port, "/readyz")
                .is_some_and(|(status, body)| status == 503 && body.contains("+zadd"))
        },
        || daemon.log(),
    );
    wait_for(
        "the log names +zadd",
        Duration::from_secs(30),
        || daemon.log().contains("add the rules +zadd"),
        || daemon.log(),
    );
    assert_eq!(daemon.metrics().sum("materializer_records_total"), 0.0);
    set_user(&server, &rules);
    wait_for(
        "every record applied",
        Duration::from_secs(60),
        || {
            daemon
                .metrics()
                .get("materializer_groups_total{outcome=\"inserted\"}")
                == 5.0
        },
        || daemon.log(),
    );
    wait_for(
        "ready",
        Duration::from_secs(30),
        || daemon.ready_status() == Some(200),
        || daemon.log(),
    );
    assert!(
        read_all(&setup.dlq_topic).is_empty(),
        "nothing dead-lettered"
    );
    let store = redis_store(&admin_url(&server)).await;
    assert_eq!(scan_seqs(&store, "dave").await, vec![1, 2, 3, 4, 5]);
}

/// The CQL block of docs/grants.md ("Grants"): its statements, `...` passwords replaced by
/// `password`.
fn readme_cql() -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/grants.md"))
            .expect("docs/grants.md");
    let start = readme
        .find("```sql\nCREATE KEYSPACE mailbox")
        .expect("the CQL block");
    let block = &readme[start + "```sql\n".len()..];
    let block = &block[..block.find("```").expect("its end")];
    block
        .lines()
        .map(|l| l.split("--").next().unwrap_or_default().trim())
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.trim_end_matches(';')
                .replace("'...'", "'password'")
                .replace("'dc1': 3", "'datacenter1': 1")
        })
        .collect()
}

/// A session as `user`, retried while the server finishes setting up its default superuser.
async fn cql_session(node: &str, user: &str, password: &str) -> scylla::client::session::Session {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let built = scylla::client::session_builder::SessionBuilder::new()
            .known_node(node)
            .user(user, password)
            .build()
            .await;
        match built {
            Ok(session) => return session,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("no CQL session as {user} yet ({e}); retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => panic!("no CQL session as {user}: {e}"),
        }
    }
}

/// Least privilege on a CQL server with `PasswordAuthenticator` and `CassandraAuthorizer`: the
/// schema role of docs/grants.md creates the schema with `schema apply`; the runtime role, with
/// exactly the grants of docs/grants.md and `create_schema = false`, runs the daemon, a repair and
/// `check-config`; it may not change the schema; a runtime role without `MODIFY` is named by
/// `check-config --connect`; before the schema exists the daemon waits, not ready, naming it.
#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_and_the_commands_run_with_exactly_the_readmes_cql_grants() {
    let server = support::cassandra::PrivateCassandra::start(
        "auth",
        (29642, 27600, 27699),
        "authenticator: PasswordAuthenticator\nauthorizer: CassandraAuthorizer\nrole_manager: CassandraRoleManager\nroles_validity: 0ms\npermissions_validity: 0ms\ncredentials_validity: 0ms",
    );
    let node = server.contact_point();
    let admin = cql_session(&node, "cassandra", "cassandra").await;
    for statement in readme_cql() {
        admin
            .query_unpaged(statement.clone(), ())
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    // A runtime role that may read but not write.
    admin
        .query_unpaged(
            "CREATE ROLE reader WITH LOGIN = true AND PASSWORD = 'password'",
            (),
        )
        .await
        .expect("create reader");

    let mut setup = DaemonSetup::new("acl-cql", None);
    setup.scylla = Some((node.clone(), "mailbox".to_owned()));
    setup.store_extra = vec!["create_schema = false".to_owned()];
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let records: Vec<(i32, Vec<u8>)> = (1..=5)
        .flat_map(|seq| {
            [
                (0, group_record("erin", seq, "e")),
                (0, group_record("finn", seq, "f")),
            ]
        })
        .collect();
    produce(&setup.topic, &records).await;
    // Each role's password from a file (a mounted secret).
    let password_file = setup.dir.join("cql-password");
    std::fs::write(&password_file, "password\n").expect("write the password file");
    let password_file = password_file.to_str().expect("utf-8 path").to_owned();
    let as_role = |role: &'static str| {
        vec![
            ("MATERIALIZER_SCYLLA_USERNAME", role.to_owned()),
            ("MATERIALIZER_SCYLLA_PASSWORD_FILE", password_file.clone()),
        ]
    };
    let config = setup.config_file(free_port());
    let config_arg = config.to_str().expect("utf-8 path").to_owned();
    let materializer = |role: &'static str, args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_materializer"))
            .arg("--config")
            .arg(&config_arg)
            .args(args)
            .envs(as_role(role))
            .output()
            .expect("materializer runs")
    };

    // Before the schema exists the daemon (runtime role) waits, not ready, naming what is missing.
    let env = as_role("materializer");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let daemon = Daemon::start_with_env(&setup, &env);
    wait_for(
        "readyz names the missing tables",
        Duration::from_secs(60),
        || {
            http_get(daemon.http_port, "/readyz").is_some_and(|(status, body)| {
                status == 503 && body.contains("missing table mailbox.user_mailbox")
            })
        },
        || daemon.log(),
    );
    // The runtime role may not create it.
    let out = materializer("materializer", &["schema", "apply"]);
    // Off a terminal the error is SPEC 8.2's JSON object on stdout.
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("permission"), "{said}");
    println!("schema apply as the runtime role: {said}");
    // The schema role does; the waiting daemon then applies every record.
    let out = materializer("materializer_schema", &["schema", "apply"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = materializer("materializer", &["schema", "check"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    wait_for(
        "every record applied",
        Duration::from_secs(90),
        || {
            daemon
                .metrics()
                .get("materializer_groups_total{outcome=\"inserted\"}")
                == 10.0
        },
        || daemon.log(),
    );
    assert!(
        read_all(&setup.dlq_topic).is_empty(),
        "nothing dead-lettered"
    );

    let out = materializer(
        "materializer",
        &["check-config", "--connect", "--output", "text"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("ok    store grants (scylla)"), "{stdout}");
    let out = materializer(
        "materializer",
        &[
            "replay",
            "--partition",
            "0",
            "--from-offset",
            "0",
            "--user",
            "erin",
            "--reset-mailboxes",
            "--progress",
            "off",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("summary");
    assert_eq!(
        summary["swapped_users"],
        serde_json::json!(["erin"]),
        "{summary}"
    );
    let out = materializer("materializer", &["scan", "--user", "erin", "--epoch", "1"]);
    let page: serde_json::Value = serde_json::from_slice(&out.stdout).expect("scan JSON");
    assert_eq!(page["groups"].as_array().map(Vec::len), Some(5), "{page}");

    // A role without MODIFY is named.
    admin
        .query_unpaged("GRANT SELECT ON KEYSPACE mailbox TO reader", ())
        .await
        .expect("grant select");
    let out = materializer("reader", &["check-config", "--connect", "--output", "text"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let fail = stdout
        .lines()
        .find(|l| l.starts_with("FAIL  store grants (scylla)"))
        .unwrap_or_else(|| panic!("no grants FAIL line:\n{stdout}"));
    assert!(fail.contains("MODIFY"), "{fail}");
    println!("without MODIFY: {fail}");
    let out = materializer("reader", &["apply", "-"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stdout).contains("MODIFY"));
}

/// The cluster line of docs/grants.md on a 3-master Redis Cluster: `apply` of users spread over
/// every master runs under it, and the probe runs on every master (ACLs are per node): a rule taken
/// away on one node only is still named.
#[tokio::test(flavor = "multi_thread")]
async fn a_redis_cluster_runs_with_the_readmes_cluster_acl_and_each_node_is_probed() {
    let cluster = support::redis_server::RedisCluster::start(Clock::Real);
    let lines = readme_acl_lines();
    let rules: Vec<String> = lines[1]
        .trim_start_matches("ACL SETUSER materializer on >PASSWORD ")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    for node in &cluster.nodes {
        set_user(node, &rules);
    }
    let seeds: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| {
            format!(
                "redis://materializer:secret@127.0.0.1:{}",
                n.port().expect("tcp")
            )
        })
        .collect();
    let setup = DaemonSetup::new("acl-cluster", None);
    let config = setup.dir.join("cluster.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"redis\"\n[store.redis]\nurl = \"{}\"\ncluster = true\ncluster_nodes = [\"{}\", \"{}\"]\nwait_replicas = 0\n[kafka]\nbrokers = \"{}\"\ntopic = \"{}\"\ndlq_topic = \"{}\"\n",
            seeds[0],
            seeds[1],
            seeds[2],
            support::kafka::bootstrap(),
            setup.topic,
            setup.dlq_topic,
        ),
    )
    .expect("write config");
    create_topic(&setup.topic, 1).await;
    create_topic(&setup.dlq_topic, 1).await;
    let config_arg = config.to_str().expect("utf-8 path");
    let grants_line = |out: &std::process::Output| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.contains("store grants (redis)"))
            .unwrap_or_default()
            .to_owned()
    };

    let out = run_materializer(
        &[
            "--config",
            config_arg,
            "check-config",
            "--connect",
            "--output",
            "text",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(grants_line(&out).starts_with("ok"), "{}", grants_line(&out));
    let input = support::cli::numbered_dispatches("acl", 300, support::reference::now_ms());
    let out = run_materializer(&["--config", config_arg, "apply", "-"], Some(&input));
    support::cli::assert_one_outcome_per_line(&out, 300, "inserted");

    // +zadd taken away on the third node only.
    let without: Vec<String> = rules.iter().filter(|r| *r != "+zadd").cloned().collect();
    set_user(&cluster.nodes[2], &without);
    let out = run_materializer(
        &[
            "--config",
            config_arg,
            "check-config",
            "--connect",
            "--output",
            "text",
        ],
        None,
    );
    let line = grants_line(&out);
    assert!(
        line.starts_with("FAIL") && line.contains("add the rules +zadd "),
        "{line}"
    );
    println!("+zadd missing on one node: {line}");
    let out = run_materializer(&["--config", config_arg, "apply", "-"], Some(&input));
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("+zadd"));
}
