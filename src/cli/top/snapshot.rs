//! What `top` shows, computed from two scrapes of each replica: rates from counter deltas,
//! store call quantiles from histogram bucket deltas, lag per partition; and the order and
//! filter the operator chose.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::scrape::{Sample, Scrape};

/// Everything on screen at one refresh (and `--once --output json`'s object).
#[derive(Debug, Clone, Serialize)]
pub(super) struct Snapshot {
    /// Wall-clock time of the refresh, ms since the epoch.
    pub taken_at_ms: u64,
    pub replicas: Vec<ReplicaView>,
    /// Every replica's partitions, worst first by the chosen order.
    pub partitions: Vec<PartitionView>,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct ReplicaView {
    pub replica: String,
    /// `ready`, `not_ready` or `down`.
    pub state: &'static str,
    /// Why: the `/readyz` conditions that are not ok, or the scrape's error.
    pub why: Vec<String>,
    /// Seconds since the replica last answered, while it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub down_for_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Records made final per second, by outcome (`applied`, `dead_lettered`, `malformed`).
    pub records_per_second: BTreeMap<String, f64>,
    /// Dead letters per second, by reason.
    pub dead_letters_per_second: BTreeMap<String, f64>,
    /// Store errors per second, by kind.
    pub store_errors_per_second: BTreeMap<String, f64>,
    /// Median and 99th percentile of the store's append calls over the interval, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_call_p50_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_call_p99_seconds: Option<f64>,
    /// Mailboxes failing closed, over all partitions.
    pub blocked_mailboxes: i64,
}

#[derive(Debug, Clone, Serialize)]
pub(super) struct PartitionView {
    pub replica: String,
    pub partition: i32,
    /// Records behind the partition's end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag_records: Option<i64>,
    /// Seconds since the newest final record was produced (0 when nothing is behind).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<f64>,
    /// The committed offset's advance per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub committed_per_second: Option<f64>,
    pub blocked_mailboxes: i64,
    pub unreadable: bool,
    /// Why it is blocked, from the replica's `/debug/blocked`: the first blocked mailbox's error
    /// kind, user and offset (empty when none, or the replica does not serve it).
    pub why: String,
}

/// The order of the partition rows (`s` cycles).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Order {
    #[default]
    LagRecords,
    LagSeconds,
    Blocked,
    Partition,
}

impl Order {
    pub(super) fn next(self) -> Self {
        match self {
            Self::LagRecords => Self::LagSeconds,
            Self::LagSeconds => Self::Blocked,
            Self::Blocked => Self::Partition,
            Self::Partition => Self::LagRecords,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Self::LagRecords => "lag",
            Self::LagSeconds => "lag seconds",
            Self::Blocked => "blocked",
            Self::Partition => "replica/partition",
        }
    }
}

/// Which partition rows are shown (`f` cycles).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Filter {
    #[default]
    All,
    Behind,
    Blocked,
    NotReady,
}

impl Filter {
    pub(super) fn next(self) -> Self {
        match self {
            Self::All => Self::Behind,
            Self::Behind => Self::Blocked,
            Self::Blocked => Self::NotReady,
            Self::NotReady => Self::All,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::Behind => "behind",
            Self::Blocked => "blocked",
            Self::NotReady => "replicas not ready",
        }
    }
}

/// A replica as `top` knows it across refreshes.
#[derive(Debug, Clone)]
pub(super) struct Replica {
    pub address: String,
    /// The last two answers (rates need two).
    pub previous: Option<Scrape>,
    pub latest: Option<Scrape>,
    /// The last scrape's error, and when the replica last answered.
    pub error: Option<String>,
    pub last_answer: Option<std::time::Instant>,
    pub first_failure: Option<std::time::Instant>,
}

impl Replica {
    pub(super) fn new(address: String) -> Self {
        Self {
            address,
            previous: None,
            latest: None,
            error: None,
            last_answer: None,
            first_failure: None,
        }
    }

    /// Records the outcome of a scrape.
    pub(super) fn record(&mut self, result: Result<Scrape, String>) {
        match result {
            Ok(scrape) => {
                self.last_answer = Some(scrape.at);
                self.previous = self.latest.take();
                self.latest = Some(scrape);
                self.error = None;
                self.first_failure = None;
            }
            Err(error) => {
                self.error = Some(error);
                self.first_failure
                    .get_or_insert_with(std::time::Instant::now);
            }
        }
    }
}

/// The snapshot of `replicas` in the chosen order and filter.
pub(super) fn build(replicas: &[Replica], order: Order, filter: Filter, now_ms: u64) -> Snapshot {
    let mut views = Vec::new();
    let mut partitions = Vec::new();
    for replica in replicas {
        let (view, rows) = replica_view(replica, now_ms);
        let shown = match filter {
            Filter::NotReady => view.state != "ready",
            _ => true,
        };
        if shown {
            partitions.extend(rows.into_iter().filter(|p| match filter {
                Filter::Behind => p.lag_records.is_some_and(|l| l > 0),
                Filter::Blocked => p.blocked_mailboxes > 0,
                Filter::All | Filter::NotReady => true,
            }));
        }
        views.push(view);
    }
    sort(&mut partitions, order);
    Snapshot {
        taken_at_ms: now_ms,
        replicas: views,
        partitions,
    }
}

fn sort(rows: &mut [PartitionView], order: Order) {
    let key = |p: &PartitionView| (p.replica.clone(), p.partition);
    match order {
        Order::LagRecords => rows.sort_by(|a, b| {
            b.lag_records
                .cmp(&a.lag_records)
                .then_with(|| key(a).cmp(&key(b)))
        }),
        Order::LagSeconds => rows.sort_by(|a, b| {
            b.lag_seconds
                .unwrap_or(-1.0)
                .total_cmp(&a.lag_seconds.unwrap_or(-1.0))
                .then_with(|| key(a).cmp(&key(b)))
        }),
        Order::Blocked => rows.sort_by(|a, b| {
            b.blocked_mailboxes
                .cmp(&a.blocked_mailboxes)
                .then_with(|| key(a).cmp(&key(b)))
        }),
        Order::Partition => rows.sort_by_key(key),
    }
}

fn replica_view(replica: &Replica, now_ms: u64) -> (ReplicaView, Vec<PartitionView>) {
    let mut view = ReplicaView {
        replica: replica.address.clone(),
        state: "down",
        why: Vec::new(),
        down_for_seconds: None,
        backend: None,
        records_per_second: BTreeMap::new(),
        dead_letters_per_second: BTreeMap::new(),
        store_errors_per_second: BTreeMap::new(),
        store_call_p50_seconds: None,
        store_call_p99_seconds: None,
        blocked_mailboxes: 0,
    };
    if let Some(error) = &replica.error {
        view.why.push(error.clone());
        view.down_for_seconds = Some(
            replica
                .last_answer
                .or(replica.first_failure)
                .map_or(0, |t| t.elapsed().as_secs()),
        );
        // A replica that stopped answering keeps its last known partitions, marked as such.
        let rows = replica
            .latest
            .as_ref()
            .map(|s| partition_rows(&replica.address, s, None, now_ms))
            .unwrap_or_default();
        return (view, rows);
    }
    let Some(latest) = &replica.latest else {
        view.why.push("not scraped yet".to_owned());
        return (view, Vec::new());
    };
    view.state = if latest.ready { "ready" } else { "not_ready" };
    view.why.clone_from(&latest.not_ready);
    view.backend = latest
        .samples
        .iter()
        .find(|s| s.name == "materializer_build_info")
        .and_then(|s| s.label("backend").map(str::to_owned));
    if let Some(previous) = &replica.previous {
        let dt = latest.at.saturating_duration_since(previous.at);
        view.records_per_second = rates(
            previous,
            latest,
            dt,
            "materializer_records_total",
            "outcome",
        );
        view.dead_letters_per_second =
            rates(previous, latest, dt, "materializer_dlq_total", "reason");
        view.store_errors_per_second = rates(
            previous,
            latest,
            dt,
            "materializer_store_errors_total",
            "kind",
        );
        let buckets = bucket_deltas(previous, latest);
        view.store_call_p50_seconds = quantile(&buckets, 0.5);
        view.store_call_p99_seconds = quantile(&buckets, 0.99);
    }
    let rows = partition_rows(&replica.address, latest, replica.previous.as_ref(), now_ms);
    view.blocked_mailboxes = rows.iter().map(|p| p.blocked_mailboxes).sum();
    (view, rows)
}

fn find<'a>(scrape: &'a Scrape, name: &str) -> impl Iterator<Item = &'a Sample> {
    let name = name.to_owned();
    scrape.samples.iter().filter(move |s| s.name == name)
}

/// Per-second increase of counter `name` by `label` between two scrapes (a reset counts from 0).
fn rates(
    previous: &Scrape,
    latest: &Scrape,
    dt: Duration,
    name: &str,
    label: &str,
) -> BTreeMap<String, f64> {
    let secs = dt.as_secs_f64();
    let mut out = BTreeMap::new();
    if secs <= 0.0 {
        return out;
    }
    let before: BTreeMap<&str, f64> = find(previous, name)
        .filter_map(|s| Some((s.label(label)?, s.value)))
        .collect();
    for sample in find(latest, name) {
        let Some(key) = sample.label(label) else {
            continue;
        };
        let old = before.get(key).copied().unwrap_or(0.0);
        let delta = if sample.value >= old {
            sample.value - old
        } else {
            sample.value
        };
        *out.entry(key.to_owned()).or_default() += delta / secs;
    }
    out
}

/// The increase of each bucket (`le` -> count) of the append calls' histogram, all backends.
fn bucket_deltas(previous: &Scrape, latest: &Scrape) -> Vec<(f64, f64)> {
    let name = "materializer_store_call_duration_seconds_bucket";
    let le = |s: &Sample| -> Option<f64> {
        if s.label("op") != Some("append") {
            return None;
        }
        match s.label("le")? {
            "+Inf" => Some(f64::INFINITY),
            v => v.parse().ok(),
        }
    };
    let mut before: BTreeMap<u64, f64> = BTreeMap::new();
    for s in find(previous, name) {
        if let Some(bound) = le(s) {
            *before.entry(bound.to_bits()).or_default() += s.value;
        }
    }
    let mut now: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for s in find(latest, name) {
        if let Some(bound) = le(s) {
            now.entry(bound.to_bits()).or_insert((bound, 0.0)).1 += s.value;
        }
    }
    let mut out: Vec<(f64, f64)> = now
        .into_iter()
        .map(|(bits, (bound, count))| {
            let old = before.get(&bits).copied().unwrap_or(0.0);
            (bound, if count >= old { count - old } else { count })
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// `histogram_quantile` over cumulative `(le, count)` buckets: linear inside the bucket that
/// holds the rank; `None` without observations.
pub(super) fn quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(bound, count) in buckets {
        if count >= rank {
            if bound.is_infinite() {
                return Some(lower.0);
            }
            let width = count - lower.1;
            let within = if width > 0.0 {
                (rank - lower.1) / width
            } else {
                1.0
            };
            return Some(lower.0 + (bound - lower.0) * within);
        }
        lower = (bound, count);
    }
    Some(lower.0)
}

fn partition_rows(
    replica: &str,
    latest: &Scrape,
    previous: Option<&Scrape>,
    now_ms: u64,
) -> Vec<PartitionView> {
    let by_partition = |scrape: &Scrape, name: &str| -> BTreeMap<i32, f64> {
        find(scrape, name)
            .filter_map(|s| Some((s.label("partition")?.parse().ok()?, s.value)))
            .collect()
    };
    let lag = by_partition(latest, "materializer_consumer_lag");
    let newest = by_partition(latest, "materializer_last_record_timestamp_seconds");
    let blocked = by_partition(latest, "materializer_partition_blocked");
    let unreadable = by_partition(latest, "materializer_partition_unreadable");
    let committed = by_partition(latest, "materializer_committed_offset");
    let committed_before = previous.map(|p| by_partition(p, "materializer_committed_offset"));
    let dt = previous.map(|p| latest.at.saturating_duration_since(p.at).as_secs_f64());
    let mut partitions: Vec<i32> = lag.keys().chain(blocked.keys()).copied().collect();
    partitions.sort_unstable();
    partitions.dedup();
    partitions
        .into_iter()
        .map(|partition| {
            let lag_records = lag.get(&partition).map(|l| *l as i64);
            let lag_seconds = match (lag_records, newest.get(&partition)) {
                (Some(0), _) => Some(0.0),
                (_, Some(newest)) if *newest > 0.0 => {
                    Some((now_ms as f64 / 1000.0 - newest).max(0.0))
                }
                _ => None,
            };
            let committed_per_second = match (
                committed.get(&partition),
                committed_before.as_ref().and_then(|c| c.get(&partition)),
                dt,
            ) {
                (Some(now), Some(before), Some(dt)) if dt > 0.0 => {
                    Some(((now - before) / dt).max(0.0))
                }
                _ => None,
            };
            PartitionView {
                replica: replica.to_owned(),
                partition,
                lag_records,
                lag_seconds,
                committed_per_second,
                blocked_mailboxes: blocked.get(&partition).map_or(0, |b| *b as i64),
                unreadable: unreadable.get(&partition).is_some_and(|u| *u > 0.0),
                why: why(latest, partition),
            }
        })
        .collect()
}

/// The WHY cell of a partition: offsets the log deleted before they were read (`lost 3`, `held:
/// lost 3` while the partition waits for an operator, SPEC 7.3), then its first blocked mailbox
/// (`grown: waits for older partitions` while a partition that appeared with a growth of the
/// topic waits, SPEC 7.2), then its first blocked mailbox (`index_lost hot @8`), and how many
/// more.
fn why(latest: &Scrape, partition: i32) -> String {
    let this = partition.to_string();
    let of_partition = |name: &str| -> f64 {
        find(latest, name)
            .filter(|s| s.label("partition") == Some(this.as_str()))
            .map(|s| s.value)
            .sum()
    };
    let mut parts = Vec::new();
    let lost = of_partition("materializer_records_lost_total");
    if lost > 0.0 {
        let held = of_partition("materializer_partition_held_records_lost") > 0.0;
        parts.push(format!("{}lost {lost}", if held { "held: " } else { "" }));
    }
    if of_partition("materializer_partition_growth_waiting") > 0.0 {
        parts.push("grown: waits for older partitions".to_owned());
    }
    let mut here = latest.blocked.iter().filter(|b| b.partition == partition);
    if let Some(first) = here.next() {
        let more = here.count();
        let mut text = format!("{} {} @{}", first.kind, first.user_id, first.offset);
        if more > 0 {
            text.push_str(&format!(" +{more} more"));
        }
        parts.push(text);
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::scrape::parse;
    use super::*;

    fn scrape(at: Instant, text: &str, ready: bool) -> Scrape {
        Scrape {
            at,
            samples: parse(text),
            ready,
            not_ready: if ready {
                Vec::new()
            } else {
                vec!["store: unreachable".to_owned()]
            },
            blocked: Vec::new(),
        }
    }

    #[test]
    fn why_names_the_first_blocked_mailbox_of_the_partition_and_counts_the_others() {
        let mut latest = scrape(Instant::now(), "", true);
        let blocked = |partition: i32, user: &str, offset: i64| crate::daemon::http::Blocked {
            partition,
            user_id: user.to_owned(),
            epoch: 1,
            offset,
            kind: "index_lost".to_owned(),
            detail: String::new(),
            since_ms: 0,
        };
        latest.blocked = vec![blocked(0, "hot", 8), blocked(1, "a", 3), blocked(0, "b", 9)];
        assert_eq!(why(&latest, 0), "index_lost hot @8 +1 more");
        assert_eq!(why(&latest, 1), "index_lost a @3");
        assert_eq!(why(&latest, 2), "");
        latest.samples = parse(
            "materializer_records_lost_total{partition=\"1\",reason=\"committed_below_log_start\"} 3\n\
             materializer_records_lost_total{partition=\"2\",reason=\"offset_out_of_range\"} 4\n\
             materializer_partition_held_records_lost{partition=\"2\"} 1\n\
             materializer_partition_growth_waiting{partition=\"3\"} 1\n",
        );
        assert_eq!(why(&latest, 1), "lost 3; index_lost a @3");
        assert_eq!(why(&latest, 2), "held: lost 4");
        assert_eq!(why(&latest, 3), "grown: waits for older partitions");
    }

    #[test]
    fn rates_quantiles_and_the_worst_partition_first() {
        let t0 = Instant::now();
        let before = "materializer_records_total{outcome=\"applied\"} 100\n\
            materializer_committed_offset{partition=\"0\"} 50\n\
            materializer_store_call_duration_seconds_bucket{backend=\"redis\",op=\"append\",le=\"0.001\"} 0\n\
            materializer_store_call_duration_seconds_bucket{backend=\"redis\",op=\"append\",le=\"0.01\"} 0\n\
            materializer_store_call_duration_seconds_bucket{backend=\"redis\",op=\"append\",le=\"+Inf\"} 0\n";
        let after = "materializer_build_info{version=\"1\",backend=\"redis\"} 1\n\
            materializer_records_total{outcome=\"applied\"} 300\n\
            materializer_dlq_total{reason=\"conflict\"} 4\n\
            materializer_committed_offset{partition=\"0\"} 250\n\
            materializer_consumer_lag{partition=\"0\"} 5\n\
            materializer_consumer_lag{partition=\"1\"} 900\n\
            materializer_partition_blocked{partition=\"1\"} 2\n\
            materializer_store_call_duration_seconds_bucket{backend=\"redis\",op=\"append\",le=\"0.001\"} 50\n\
            materializer_store_call_duration_seconds_bucket{backend=\"redis\",op=\"append\",le=\"0.01\"} 100\n\
            materializer_store_call_duration_seconds_bucket{backend=\"redis\",op=\"append\",le=\"+Inf\"} 100\n";
        let mut replica = Replica::new("a:1".to_owned());
        replica.record(Ok(scrape(t0, before, true)));
        replica.record(Ok(scrape(t0 + Duration::from_secs(2), after, true)));
        let snapshot = build(&[replica], Order::default(), Filter::All, 0);
        let view = &snapshot.replicas[0];
        assert_eq!(view.state, "ready");
        assert_eq!(view.backend.as_deref(), Some("redis"));
        assert_eq!(view.records_per_second["applied"], 100.0);
        assert_eq!(view.dead_letters_per_second["conflict"], 2.0);
        assert_eq!(view.store_call_p50_seconds, Some(0.001));
        let p99 = view.store_call_p99_seconds.expect("p99");
        assert!((p99 - 0.00982).abs() < 1e-9, "{p99}");
        assert_eq!(view.blocked_mailboxes, 2);
        let rows: Vec<(i32, Option<i64>)> = snapshot
            .partitions
            .iter()
            .map(|p| (p.partition, p.lag_records))
            .collect();
        assert_eq!(rows, vec![(1, Some(900)), (0, Some(5))], "worst first");
        assert_eq!(snapshot.partitions[1].committed_per_second, Some(100.0));

        let blocked = build(
            &[snapshot_replica(t0, after)],
            Order::Partition,
            Filter::Blocked,
            0,
        );
        assert_eq!(blocked.partitions.len(), 1);
        assert_eq!(blocked.partitions[0].partition, 1);
    }

    fn snapshot_replica(t0: Instant, text: &str) -> Replica {
        let mut replica = Replica::new("a:1".to_owned());
        replica.record(Ok(scrape(t0, text, true)));
        replica
    }

    #[test]
    fn a_replica_that_stops_answering_is_shown_down_with_its_last_partitions() {
        let t0 = Instant::now();
        let mut replica = snapshot_replica(t0, "materializer_consumer_lag{partition=\"3\"} 7\n");
        replica.record(Err("connection refused".to_owned()));
        let snapshot = build(&[replica], Order::default(), Filter::All, 0);
        assert_eq!(snapshot.replicas[0].state, "down");
        assert_eq!(snapshot.replicas[0].why, vec!["connection refused"]);
        assert!(snapshot.replicas[0].down_for_seconds.is_some());
        assert_eq!(snapshot.partitions.len(), 1, "not dropped");
        let not_ready = build(
            &[snapshot_replica(t0, "")],
            Order::default(),
            Filter::NotReady,
            0,
        );
        assert!(not_ready.partitions.is_empty());
    }

    #[test]
    fn quantiles_follow_histogram_quantile() {
        assert_eq!(quantile(&[(1.0, 0.0), (f64::INFINITY, 0.0)], 0.5), None);
        let buckets = [(1.0, 10.0), (2.0, 20.0), (f64::INFINITY, 20.0)];
        assert_eq!(quantile(&buckets, 0.5), Some(1.0));
        assert_eq!(quantile(&buckets, 0.75), Some(1.5));
        let overflow = [(1.0, 0.0), (f64::INFINITY, 5.0)];
        assert_eq!(
            quantile(&overflow, 0.5),
            Some(1.0),
            "the largest finite bound"
        );
    }
}
