//! The configuration's unit tests: parsing, overrides, validation and masking.

use super::*;

#[test]
fn secret_properties_are_recognised_and_their_values_redacted_from_text() {
    for key in [
        "sasl.password",
        "ssl.key.password",
        "ssl.keystore.password",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.config",
        "ssl.key.pem",
        "my.api.token",
        "some.passphrase",
    ] {
        assert!(is_secret_key(key), "{key}");
    }
    assert!(!is_secret_key("security.protocol"));
    let mut kafka = KafkaConfig::default();
    kafka
        .properties
        .insert("ssl.key.password".into(), "hunter2".into());
    assert_eq!(
        redact_secrets("Invalid value \"hunter2\" for property", &kafka),
        "Invalid value \"***\" for property"
    );
}

#[test]
fn empty_config_is_the_memory_default() {
    let c = Config::from_toml("").unwrap();
    c.validate().unwrap();
    assert_eq!(c.store.backend, Backend::Memory);
    assert_eq!(c.retention.policy(), RetentionPolicy::default());
}

#[test]
fn the_example_file_parses_and_validates() {
    let text = include_str!("../../config/materializer.example.toml");
    let c = Config::from_toml(text).unwrap();
    c.validate().unwrap();
}

#[test]
fn redis_wait_is_off_by_default_and_validated() {
    let c = Config::from_toml("[store.redis]\nwait_replicas = 2\nwait_timeout_ms = 250\n").unwrap();
    c.validate().unwrap();
    assert_eq!(
        (c.store.redis.wait_replicas, c.store.redis.wait_timeout_ms),
        (2, 250)
    );
    let d = Config::default();
    assert_eq!(
        (d.store.redis.wait_replicas, d.store.redis.wait_timeout_ms),
        (0, 1_000)
    );
    for (toml, key) in [
        (
            "wait_replicas = 1\nwait_timeout_ms = 5000\ncommand_timeout_ms = 5000",
            "store.redis.wait_timeout_ms",
        ),
        ("wait_replicas = 65", "store.redis.wait_replicas"),
    ] {
        let c = Config::from_toml(&format!("[store.redis]\n{toml}\n")).unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains(key), "{toml}: {e}");
    }
    // Without replicas to wait for, the WAIT timeout does not bind the command timeout.
    Config::from_toml("[store.redis]\ncommand_timeout_ms = 500\n")
        .unwrap()
        .validate()
        .unwrap();
    let e = Config::from_toml("[store.redis]\nwait_replicas = -1\n").unwrap_err();
    assert!(e.to_string().contains("wait_replicas"), "{e}");
}

#[test]
fn scylla_appends_in_flight_are_bounded_at_both_ends() {
    assert_eq!(
        Config::default().store.scylla.max_in_flight_appends,
        DEFAULT_SCYLLA_APPENDS_IN_FLIGHT
    );
    for (value, valid) in [
        (0, false),
        (1, true),
        (MAX_SCYLLA_APPENDS_IN_FLIGHT, true),
        (MAX_SCYLLA_APPENDS_IN_FLIGHT + 1, false),
    ] {
        let c = Config::from_toml(&format!(
            "[store.scylla]\nmax_in_flight_appends = {value}\n"
        ))
        .unwrap();
        match c.validate() {
            Ok(()) => assert!(valid, "{value} accepted"),
            Err(e) => {
                assert!(!valid, "{value} refused: {e}");
                assert!(
                    e.to_string().contains("store.scylla.max_in_flight_appends"),
                    "{e}"
                );
            }
        }
    }
}

#[test]
fn unknown_keys_are_refused() {
    let e = Config::from_toml("[store]\nbakend = \"redis\"\n").unwrap_err();
    assert!(e.to_string().contains("bakend"), "{e}");
}

#[test]
fn errors_name_the_key() {
    let mut c = Config::default();
    c.store.redis.url = "http://x".into();
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .starts_with("store.redis.url"));
    let mut c = Config::default();
    c.retention.days = 0;
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("retention.days"));
    let mut c = Config::default();
    c.kafka.dlq_topic = c.kafka.topic.clone();
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .starts_with("kafka.dlq_topic"));
    let mut c = Config::default();
    c.http.listen = "nowhere".into();
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .starts_with("http.listen"));
}

#[test]
fn scylla_consistency_below_local_quorum_is_refused() {
    for weak in [
        "ANY",
        "ONE",
        "TWO",
        "THREE",
        "LOCAL_ONE",
        "EACH_QUORUM",
        "SERIAL",
        "one",
    ] {
        let mut c = Config::default();
        c.store.scylla.consistency = weak.into();
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("store.scylla.consistency") && e.contains("LOCAL_QUORUM"),
            "{weak}: {e}"
        );
    }
    for strong in CONSISTENCY_NAMES {
        let mut c = Config::default();
        c.store.scylla.consistency = (*strong).into();
        c.validate().unwrap();
    }
    for bad in ["QUORUM", "ONE", "LOCAL_QUORUM", ""] {
        let mut c = Config::default();
        c.store.scylla.serial_consistency = bad.into();
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("store.scylla.serial_consistency") && e.contains("SERIAL"),
            "{bad}: {e}"
        );
    }
    let mut c = Config::default();
    c.store.scylla.serial_consistency = "LOCAL_SERIAL".into();
    c.validate().unwrap();
}

#[test]
fn scylla_tls_and_local_dc_are_checked() {
    let c = Config::from_toml(
        "[store.scylla]\nlocal_dc = \"dc1\"\n[store.scylla.tls]\nverify = true\n",
    )
    .unwrap();
    c.validate().unwrap();
    let tls = c.store.scylla.tls.as_ref().unwrap();
    assert!(tls.enabled && tls.verify && tls.ca_file.is_none());
    assert_eq!(c.store.scylla.local_dc, "dc1");

    let mut c = Config::default();
    c.store.scylla.tls = Some(ScyllaTlsConfig {
        ca_file: Some(PathBuf::from("/nonexistent/ca.pem")),
        ..Default::default()
    });
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.starts_with("store.scylla.tls.ca_file") && e.contains("/nonexistent/ca.pem"),
        "{e}"
    );

    let mut c = Config::default();
    c.store.scylla.tls = Some(ScyllaTlsConfig {
        cert_file: Some(PathBuf::from("Cargo.toml")),
        ..Default::default()
    });
    let e = c.validate().unwrap_err().to_string();
    assert!(e.starts_with("store.scylla.tls.cert_file"), "{e}");

    let mut c = Config::default();
    c.apply_env(|name| {
        (name == "MATERIALIZER_SCYLLA_TLS_CA_FILE").then(|| "Cargo.toml".to_owned())
    })
    .unwrap();
    assert_eq!(
        c.store.scylla.tls.as_ref().and_then(|t| t.ca_file.clone()),
        Some(PathBuf::from("Cargo.toml"))
    );
    c.validate().unwrap();
}

#[test]
fn retention_beyond_the_backends_ttl_limit_is_refused_for_every_backend() {
    for backend in [Backend::Memory, Backend::Redis, Backend::Scylla] {
        let mut c = Config::default();
        c.store.backend = backend;
        c.retention.days = 3_650;
        c.retention.future_window_days = 3_649;
        c.validate().unwrap();
        c.retention.future_window_days = 3_650;
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("retention.days") && e.contains("retention.future_window_days"),
            "{e}"
        );
    }
}

#[test]
fn environment_then_flags_override_the_file() {
    let mut c = Config::default();
    c.apply_env(|name| match name {
        "MATERIALIZER_STORE" => Some("redis".into()),
        "MATERIALIZER_REDIS_URL" => Some("redis://env:1".into()),
        _ => None,
    })
    .unwrap();
    assert_eq!(c.store.backend, Backend::Redis);
    c.apply_overrides(&Overrides {
        redis_url: Some("redis://flag:2".into()),
        ..Default::default()
    });
    assert_eq!(c.store.redis.url, "redis://flag:2");
}

#[test]
fn unknown_fields_are_lenient_unless_strict_fields() {
    let c = Config::from_toml("").unwrap();
    assert!(!c.decode_options().strict_fields);
    let c = Config::from_toml("[ingest]\nstrict_fields = true\n").unwrap();
    assert!(c.decode_options().strict_fields);
    assert_eq!(
        c.decode_options().max_record_bytes,
        c.kafka.max_record_bytes
    );
    let mut c = Config::default();
    c.apply_env(|name| (name == "MATERIALIZER_INGEST_STRICT_FIELDS").then(|| "true".into()))
        .unwrap();
    assert!(c.ingest.strict_fields);
    let e = c
        .apply_env(|name| (name == "MATERIALIZER_INGEST_STRICT_FIELDS").then(|| "yes".into()))
        .unwrap_err();
    assert!(e.to_string().starts_with("ingest.strict_fields"), "{e}");
    assert!(Config::from_toml("[ingest]\nstrict = true\n").is_err());
}

#[test]
fn secrets_are_masked() {
    assert_eq!(redact_url("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
    assert_eq!(redact_url("rediss://pw@h:1"), "rediss://***@h:1");
    assert_eq!(redact_url("redis://h:1"), "redis://h:1");
    let mut c = Config::default();
    c.store.redis.url = "redis://u:hunter2@h:1".into();
    assert!(!format!("{c:?}").contains("hunter2"));
    assert!(!c.redacted().to_string().contains("hunter2"));
}

#[test]
fn every_environment_variable_is_documented_in_the_readme_and_applied() {
    let readme = include_str!("../../docs/configuration.md");
    for (name, _) in ENV {
        assert!(
            readme.contains(&format!("`{name}`")),
            "{name} is not in docs/configuration.md"
        );
    }
    // Each variable changes the configuration it is applied to (a setter that does nothing
    // would pass the docs/configuration.md check alone).
    for (name, _) in ENV {
        let value = match *name {
            "MATERIALIZER_STORE" => "redis",
            "MATERIALIZER_INGEST_STRICT_FIELDS" => "true",
            "MATERIALIZER_LOG_FORMAT" => "json",
            _ => "127.0.0.1:1",
        };
        let mut config = Config::default();
        config
            .apply_env(|n| (n == *name).then(|| value.to_owned()))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_ne!(
            serde_json::to_value(&config).ok(),
            serde_json::to_value(Config::default()).ok(),
            "{name} changed nothing"
        );
    }
}
