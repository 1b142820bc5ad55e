//! Which replicas `top` shows: the addresses given, each DNS name among them expanded to every
//! address it resolves to (a headless Service: one per ready pod), resolved again every
//! [`RESOLVE_EVERY`] so a rolled pod appears and a gone one leaves. Behind a ClusterIP Service a
//! name resolves to one address and each scrape reaches a random pod: rates computed from two of
//! them are garbage, so docs/commands.md ("top") points at the headless Service.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use super::scrape::authority;
use super::snapshot::Replica;

/// How often names are resolved again in the live view.
pub(super) const RESOLVE_EVERY: Duration = Duration::from_secs(5);

/// The addresses to scrape: an IP address as given; a name resolving to several addresses,
/// each of them (`ip:port`); a name resolving to one address or none, as given (the scrape
/// reports what is wrong with it).
pub(super) async fn expand(given: &[String]) -> Vec<String> {
    expand_with(given, |host_port| async move {
        match tokio::net::lookup_host(host_port.as_str()).await {
            Ok(addrs) => addrs.map(|a| a.to_string()).collect(),
            Err(_) => BTreeSet::new(),
        }
    })
    .await
}

/// [`expand`] with the resolver given (`host:port` -> `ip:port`s).
async fn expand_with<F, Fut>(given: &[String], resolve: F) -> Vec<String>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = BTreeSet<String>>,
{
    let mut out: Vec<String> = Vec::new();
    for address in given {
        let host_port = authority(address);
        let host = host_port
            .rsplit_once(':')
            .map_or(host_port, |(host, _)| host)
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.parse::<IpAddr>().is_ok() {
            push(&mut out, address.clone());
            continue;
        }
        let resolved = resolve(host_port.to_owned()).await;
        if resolved.len() > 1 {
            for a in resolved {
                push(&mut out, a);
            }
        } else {
            push(&mut out, address.clone());
        }
    }
    out
}

fn push(out: &mut Vec<String>, address: String) {
    if !out.contains(&address) {
        out.push(address);
    }
}

/// `replicas` made to follow `addresses`: a replica still there keeps its history, a new one is
/// added, one no longer resolved is dropped.
pub(super) fn follow(replicas: &mut Vec<Replica>, addresses: Vec<String>) {
    let mut kept: Vec<Replica> = Vec::with_capacity(addresses.len());
    for address in addresses {
        match replicas.iter().position(|r| r.address == address) {
            Some(i) => kept.push(replicas.swap_remove(i)),
            None => kept.push(Replica::new(address)),
        }
    }
    *replicas = kept;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_name_of_several_addresses_stands_for_each_and_ips_stay_as_given() {
        let given = vec![
            "10.0.0.9:9898".to_owned(),
            "http://materializer-headless:9898/metrics".to_owned(),
            "single:9898".to_owned(),
            "nowhere:9898".to_owned(),
        ];
        let out = expand_with(&given, |host_port| async move {
            let ips: &[&str] = match host_port.as_str() {
                "materializer-headless:9898" => {
                    &["10.0.0.1:9898", "10.0.0.2:9898", "10.0.0.3:9898"]
                }
                "single:9898" => &["10.0.0.7:9898"],
                _ => &[],
            };
            ips.iter().map(|s| (*s).to_owned()).collect()
        })
        .await;
        assert_eq!(
            out,
            [
                "10.0.0.9:9898",
                "10.0.0.1:9898",
                "10.0.0.2:9898",
                "10.0.0.3:9898",
                "single:9898",
                "nowhere:9898"
            ]
        );
        // The real resolver: an IP literal is never looked up.
        assert_eq!(expand(&["127.0.0.1:1".to_owned()]).await, ["127.0.0.1:1"]);
    }

    #[test]
    fn following_keeps_history_adds_and_drops() {
        let mut replicas = vec![
            Replica::new("a:1".to_owned()),
            Replica::new("b:1".to_owned()),
        ];
        replicas[0].error = Some("kept".to_owned());
        follow(&mut replicas, vec!["a:1".to_owned(), "c:1".to_owned()]);
        let addresses: Vec<&str> = replicas.iter().map(|r| r.address.as_str()).collect();
        assert_eq!(addresses, ["a:1", "c:1"]);
        assert_eq!(replicas[0].error.as_deref(), Some("kept"));
    }
}
