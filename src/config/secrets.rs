//! Secrets read from files at start: Kubernetes mounts a secret as a file, and a password kept
//! there never appears in the process's arguments or environment (`ps`, `/proc/<pid>/environ`,
//! a pod spec). Each `*_file` key is read once, in [`Config::load`], into the key it stands for,
//! so everything after (validation, redaction, the store and the brokers) sees one password
//! however it was given. The file's content is the secret, without its trailing line end.

use std::path::Path;

use super::{invalid, Config, ConfigError};

impl Config {
    /// Reads `store.redis.password_file`, `store.scylla.password_file` and
    /// `[kafka.property_files]` with `read`; an unreadable or empty file, or a secret given both
    /// ways, is an error naming the key.
    pub(crate) fn read_secret_files(
        &mut self,
        read: impl Fn(&Path) -> std::io::Result<String>,
    ) -> Result<(), ConfigError> {
        let secret = |key: &str, path: &Path| -> Result<String, ConfigError> {
            let text = read(path)
                .map_err(|e| invalid(key, format!("cannot read {}: {e}", path.display())))?;
            let value = text.trim_end_matches(['\n', '\r']);
            if value.is_empty() {
                return Err(invalid(key, format!("{} is empty", path.display())));
            }
            Ok(value.to_owned())
        };
        if let Some(path) = self.store.redis.password_file.clone() {
            let key = "store.redis.password_file";
            let password = secret(key, &path)?;
            self.store.redis.url = with_password(&self.store.redis.url, &password)
                .map_err(|message| invalid(key, message))?;
        }
        if let Some(path) = self.store.scylla.password_file.clone() {
            let key = "store.scylla.password_file";
            if self.store.scylla.password.is_some() {
                return Err(invalid(
                    key,
                    "store.scylla.password (or MATERIALIZER_SCYLLA_PASSWORD) is set too; give the \
                     password one way",
                ));
            }
            self.store.scylla.password = Some(secret(key, &path)?);
        }
        for (property, path) in self.kafka.property_files.clone() {
            let key = format!("kafka.property_files.\"{property}\"");
            if self.kafka.properties.contains_key(&property) {
                return Err(invalid(
                    &key,
                    format!("kafka.properties sets \"{property}\" too; give it one way"),
                ));
            }
            let value = secret(&key, &path)?;
            self.kafka.properties.insert(property, value);
        }
        Ok(())
    }
}

/// `url` with `password` in its credentials: `redis://user@host` -> `redis://user:pw@host`,
/// `redis://host` -> `redis://:pw@host` (the `default` user). The password is percent-encoded
/// (the client decodes it), so any character may be in it.
fn with_password(url: &str, password: &str) -> Result<String, String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!(
            "the Redis URL has no scheme ({})",
            super::redact_url(url)
        ));
    };
    if !matches!(scheme, "redis" | "rediss") {
        return Err(format!(
            "needs a redis:// or rediss:// URL; a {scheme}:// URL carries its password itself"
        ));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (user, host) = match authority.rsplit_once('@') {
        Some((credentials, host)) => {
            if credentials.contains(':') {
                return Err(
                    "the Redis URL carries a password too; give the password one way".to_owned(),
                );
            }
            (credentials, host)
        }
        None => ("", authority),
    };
    Ok(format!(
        "{scheme}://{user}:{}@{host}{path}",
        percent_encode(password)
    ))
}

/// Percent-encodes everything but RFC 3986's unreserved characters (a URL's credentials, a
/// query value).
pub(crate) fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use super::*;

    fn files(entries: &[(&str, &str)]) -> impl Fn(&Path) -> std::io::Result<String> {
        let map: BTreeMap<PathBuf, String> = entries
            .iter()
            .map(|(p, v)| (PathBuf::from(p), (*v).to_owned()))
            .collect();
        move |path| {
            map.get(path).cloned().ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory")
            })
        }
    }

    #[test]
    fn a_redis_password_file_goes_into_the_urls_credentials_encoded() {
        let mut config = Config::default();
        config.store.redis.url = "rediss://materializer@redis.internal:6380/2".to_owned();
        config.store.redis.password_file = Some("/run/secrets/redis".into());
        config
            .read_secret_files(files(&[("/run/secrets/redis", "p@ss:w/rd%\n")]))
            .unwrap();
        assert_eq!(
            config.store.redis.url,
            "rediss://materializer:p%40ss%3Aw%2Frd%25@redis.internal:6380/2"
        );
        let url = redis::parse_redis_url(&config.store.redis.url).unwrap();
        let info = redis::IntoConnectionInfo::into_connection_info(url).unwrap();
        assert_eq!(info.redis_settings().password(), Some("p@ss:w/rd%"));
        assert_eq!(info.redis_settings().username(), Some("materializer"));
    }

    #[test]
    fn a_redis_url_without_user_gets_the_default_users_password() {
        let mut config = Config::default();
        config.store.redis.password_file = Some("/s".into());
        config
            .read_secret_files(files(&[("/s", "pw\r\n")]))
            .unwrap();
        assert_eq!(config.store.redis.url, "redis://:pw@127.0.0.1:6379");
    }

    #[test]
    fn a_secret_given_twice_or_unreadable_or_empty_is_refused_naming_the_key() {
        let mut config = Config::default();
        config.store.redis.url = "redis://u:inline@h:1".to_owned();
        config.store.redis.password_file = Some("/s".into());
        let e = config
            .read_secret_files(files(&[("/s", "pw")]))
            .unwrap_err();
        assert!(
            e.to_string().starts_with("store.redis.password_file: "),
            "{e}"
        );

        let mut config = Config::default();
        config.store.scylla.password = Some("inline".into());
        config.store.scylla.password_file = Some("/s".into());
        let e = config
            .read_secret_files(files(&[("/s", "pw")]))
            .unwrap_err();
        assert!(
            e.to_string().starts_with("store.scylla.password_file: "),
            "{e}"
        );

        let mut config = Config::default();
        config.store.scylla.password_file = Some("/missing".into());
        let e = config.read_secret_files(files(&[])).unwrap_err();
        assert!(e.to_string().contains("cannot read /missing"), "{e}");

        let mut config = Config::default();
        config.store.scylla.password_file = Some("/empty".into());
        let e = config
            .read_secret_files(files(&[("/empty", "\n")]))
            .unwrap_err();
        assert!(e.to_string().contains("/empty is empty"), "{e}");

        let mut config = Config::default();
        config
            .kafka
            .properties
            .insert("sasl.password".into(), "x".into());
        config
            .kafka
            .property_files
            .insert("sasl.password".into(), "/s".into());
        let e = config
            .read_secret_files(files(&[("/s", "pw")]))
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("kafka.property_files.\"sasl.password\": "),
            "{e}"
        );
    }

    #[test]
    fn file_secrets_land_where_inline_ones_do_and_stay_masked() {
        let mut config = Config::default();
        config.store.scylla.username = Some("runtime".into());
        config.store.scylla.password_file = Some("/scylla".into());
        config
            .kafka
            .property_files
            .insert("sasl.password".into(), "/kafka".into());
        config
            .read_secret_files(files(&[
                ("/scylla", "cql-secret\n"),
                ("/kafka", "sasl-secret\n"),
            ]))
            .unwrap();
        assert_eq!(config.store.scylla.password.as_deref(), Some("cql-secret"));
        assert_eq!(
            config
                .kafka
                .properties
                .get("sasl.password")
                .map(String::as_str),
            Some("sasl-secret")
        );
        let shown = format!("{config:?} {}", config.redacted());
        assert!(
            !shown.contains("cql-secret") && !shown.contains("sasl-secret"),
            "{shown}"
        );
    }
}
