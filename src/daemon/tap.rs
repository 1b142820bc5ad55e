//! The live decisions of a running daemon, for `materializer tap` (`/debug/tap`).
//!
//! Every final delivery is offered to the tap, as one small event; only when a client listens
//! is it built at all (one atomic read otherwise). Clients read from a broadcast ring of
//! [`TAP_BUFFER`] events: a client that falls behind loses the oldest ones and is told how many
//! (`{"dropped": N}`), the pipeline never waits for a reader. At most [`MAX_TAP_CLIENTS`] listen
//! at once, each filtered on its own side (users, outcomes, a partition).

use std::sync::Arc;

use serde::Serialize;
use tokio::sync::broadcast;

/// Events held for the slowest client before it loses the oldest.
pub(crate) const TAP_BUFFER: usize = 4096;
/// Clients listening at once; more are answered 503.
pub(crate) const MAX_TAP_CLIENTS: usize = 8;

/// One final delivery, as `tap` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct TapEvent {
    pub partition: i32,
    pub offset: i64,
    pub user_id: String,
    pub epoch: u32,
    /// The group's seq (a `truncate_before` delivery: the seq it trims before).
    pub mailbox_seq: u64,
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<&'static str>,
}

/// The broadcast ring the engine publishes into and `/debug/tap` clients read.
#[derive(Debug)]
pub struct Tap {
    sender: broadcast::Sender<Arc<TapEvent>>,
}

impl Default for Tap {
    fn default() -> Self {
        Self {
            sender: broadcast::channel(TAP_BUFFER).0,
        }
    }
}

impl Tap {
    /// Whether anyone listens: the engine builds no event otherwise.
    pub(crate) fn active(&self) -> bool {
        self.sender.receiver_count() > 0
    }

    pub(crate) fn publish(&self, event: TapEvent) {
        // No receiver left between the check and now: nothing to do.
        let _ = self.sender.send(Arc::new(event));
    }

    /// A new client, or `None` when [`MAX_TAP_CLIENTS`] already listen.
    pub(crate) fn subscribe(&self) -> Option<broadcast::Receiver<Arc<TapEvent>>> {
        (self.sender.receiver_count() < MAX_TAP_CLIENTS).then(|| self.sender.subscribe())
    }
}

/// What one client asked for (`/debug/tap?user=U&outcome=O&partition=P`, each repeatable but
/// the partition); empty lists take everything.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct TapFilter {
    pub users: Vec<String>,
    pub outcomes: Vec<String>,
    pub partition: Option<i32>,
}

impl TapFilter {
    /// Parses a query string (`a=b&c=d`, percent-encoded); an unknown key or a bad partition
    /// is an error naming it.
    pub(crate) fn parse(query: &str) -> Result<Self, String> {
        let mut filter = Self::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value)?;
            match key {
                "user" => filter.users.push(value),
                "outcome" => filter.outcomes.push(value),
                "partition" => {
                    filter.partition = Some(
                        value
                            .parse()
                            .map_err(|_| format!("partition {value:?} is not a number"))?,
                    )
                }
                other => return Err(format!("unknown parameter {other:?}")),
            }
        }
        Ok(filter)
    }

    pub(crate) fn admits(&self, event: &TapEvent) -> bool {
        (self.users.is_empty() || self.users.contains(&event.user_id))
            && (self.outcomes.is_empty() || self.outcomes.iter().any(|o| o == event.outcome))
            && self.partition.is_none_or(|p| p == event.partition)
    }
}

pub(crate) use crate::config::secrets::percent_encode;

fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = text
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("bad escape in {text:?}"))?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| format!("{text:?} is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(user: &str, outcome: &'static str, partition: i32) -> TapEvent {
        TapEvent {
            partition,
            offset: 1,
            user_id: user.to_owned(),
            epoch: 1,
            mailbox_seq: 1,
            outcome,
            error_kind: None,
        }
    }

    #[test]
    fn a_filter_takes_what_it_names_and_round_trips_encoded_users() {
        let user = "u 1/ä&=";
        let filter = TapFilter::parse(&format!(
            "user={}&user=b&outcome=inserted&partition=2",
            percent_encode(user)
        ))
        .unwrap();
        assert_eq!(filter.users, [user, "b"]);
        assert!(filter.admits(&event(user, "inserted", 2)));
        assert!(!filter.admits(&event(user, "replaced", 2)));
        assert!(!filter.admits(&event(user, "inserted", 1)));
        assert!(!filter.admits(&event("c", "inserted", 2)));
        assert!(TapFilter::parse("")
            .unwrap()
            .admits(&event("x", "corrupt", 9)));
        assert!(TapFilter::parse("colour=red").is_err());
        assert!(TapFilter::parse("partition=x").is_err());
    }

    #[test]
    fn clients_are_bounded_and_a_slow_one_is_told_what_it_lost() {
        let tap = Tap::default();
        assert!(!tap.active());
        let mut readers: Vec<_> = (0..MAX_TAP_CLIENTS)
            .filter_map(|_| tap.subscribe())
            .collect();
        assert_eq!(readers.len(), MAX_TAP_CLIENTS);
        assert!(tap.subscribe().is_none());
        assert!(tap.active());
        for _ in 0..TAP_BUFFER + 10 {
            tap.publish(event("u", "inserted", 0));
        }
        match readers[0].try_recv() {
            Err(broadcast::error::TryRecvError::Lagged(n)) => assert_eq!(n, 10),
            other => panic!("{other:?}"),
        }
    }
}
