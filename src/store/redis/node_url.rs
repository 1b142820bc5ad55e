//! The URL of one cluster node, made from the configured one: a leaf both the connection
//! (`connection`) and the per-node router (`slot_router`) use, so neither needs the other for it.

/// The URL of one cluster node: the configured URL with its host and port replaced, so scheme
/// and credentials carry over.
pub(super) fn node_url(configured: &str, address: &str) -> String {
    let (scheme, rest) = configured
        .split_once("://")
        .unwrap_or(("redis", configured));
    let credentials = rest
        .split_once('/')
        .map_or(rest, |(authority, _)| authority)
        .rsplit_once('@')
        .map(|(c, _)| format!("{c}@"))
        .unwrap_or_default();
    format!("{scheme}://{credentials}{address}")
}

#[cfg(test)]
mod tests {
    use super::node_url;

    #[test]
    fn node_urls_keep_scheme_and_credentials() {
        assert_eq!(
            node_url("rediss://u:pw@10.0.0.1:7000/0", "127.0.0.1:7001"),
            "rediss://u:pw@127.0.0.1:7001"
        );
        assert_eq!(
            node_url("redis://h:1", "127.0.0.1:7001"),
            "redis://127.0.0.1:7001"
        );
    }
}
