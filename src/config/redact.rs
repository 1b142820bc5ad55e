//! Secrets kept out of output: what `check-config` prints, what a log may quote.

use super::{Config, KafkaConfig};

impl Config {
    /// The configuration as JSON with secrets masked, for `check-config`.
    pub(crate) fn redacted(&self) -> serde_json::Value {
        let mut copy = self.clone();
        copy.store.redis.url = redact_url(&copy.store.redis.url);
        for node in copy.store.redis.cluster_nodes.iter_mut() {
            *node = redact_url(node);
        }
        if copy.store.scylla.password.is_some() {
            copy.store.scylla.password = Some("***".to_owned());
        }
        for (key, value) in copy.kafka.properties.iter_mut() {
            if is_secret_key(key) {
                *value = "***".to_owned();
            }
        }
        serde_json::to_value(&copy).unwrap_or(serde_json::Value::Null)
    }
}

/// Whether a librdkafka property holds a secret: passwords and passphrases (`sasl.password`,
/// `ssl.key.password`, `ssl.keystore.password`, `*.passphrase`), secrets and tokens
/// (`sasl.oauthbearer.client.secret`, anything with `token`), the OAuth bearer configuration
/// (`sasl.oauthbearer.config` carries credentials), inline private keys (`ssl.key.pem`,
/// `ssl_key`), and anything else named like one. Erring on the side of masking costs nothing.
pub fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "passwd",
        "passphrase",
        "secret",
        "token",
        "credential",
        "oauthbearer.config",
        "key.pem",
        "ssl_key",
        "private",
    ]
    .iter()
    .any(|needle| key.contains(needle))
}

/// `text` with every secret value of the Kafka properties replaced by `***`: librdkafka's error
/// for a refused property quotes the value, which must never reach a log or a terminal.
pub fn redact_secrets(text: &str, kafka: &KafkaConfig) -> String {
    let mut out = text.to_owned();
    for (key, value) in &kafka.properties {
        if is_secret_key(key) && !value.is_empty() {
            out = out.replace(value.as_str(), "***");
        }
    }
    out
}

pub use crate::url_redact::redact_url;
