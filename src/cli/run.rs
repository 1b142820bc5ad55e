//! `materializer run` (the daemon) and `materializer replay`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio::sync::watch;

use super::{
    bad_argument, fail_with, open_store_for_command, open_store_to_write, print_json, OpenFailure,
    OpenedStore,
};
use crate::config::{Backend, Config};
use crate::daemon::events::{Event as _, Starting};
use crate::daemon::http::{self, Health};
use crate::daemon::{self, metrics, DaemonOptions, Progress};
use crate::model::{Exit, UserId};
use crate::operator::replay::{parse_time_ms, ProgressMode, ReplayRequest, ReplayStart};

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The partition (shard) to re-read.
    #[arg(long, value_name = "P")]
    pub partition: i32,
    /// First offset to re-read.
    #[arg(
        long,
        value_name = "X",
        conflicts_with = "from_time",
        required_unless_present = "from_time"
    )]
    pub from_offset: Option<i64>,
    /// First record at or after this time: milliseconds since the epoch, an RFC 3339 date-time
    /// (2026-02-03T04:05:06Z, 2026-02-03T05:05:06.5+01:00), or a duration ago (24h, 90m).
    #[arg(long, value_name = "T", value_parser = parse_time_ms)]
    pub from_time: Option<i64>,
    /// Last offset re-read (inclusive); default: the partition's end when the replay starts.
    #[arg(long, value_name = "Y")]
    pub to_offset: Option<i64>,
    /// Only this user's deliveries are applied (repeatable); default: every delivery.
    #[arg(long = "user", value_name = "U")]
    pub users: Vec<String>,
    /// Rebuild the named users' mailboxes from the log: fenced (a running daemon's writes to
    /// them wait), built aside, and swapped in atomically at the end. Refused before anything
    /// is touched when the range cannot hold the whole history the daemon committed.
    #[arg(long, requires = "users")]
    pub reset_mailboxes: bool,
    /// Read and decode only; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Replay from the log start when retention already deleted the requested start (a rebuild
    /// then lacks the deleted records).
    #[arg(long)]
    pub allow_partial_history: bool,
    /// Swap a named user even when the range holds no record of it (its mailboxes end up empty).
    #[arg(long, requires = "reset_mailboxes")]
    pub allow_empty: bool,
    /// Go on although the users the replay writes have records on other partitions of the
    /// topic (a growth of the topic moved them there): without it such a replay is refused,
    /// naming the partitions and the order to replay them in, the lowest first.
    #[arg(long)]
    pub allow_other_partitions: bool,
    /// Lease of the repair fences, in seconds: if this process dies mid-repair, the daemon's
    /// writes to the named users wait at most this long. Renewed every third of it.
    #[arg(long, value_name = "SECS", default_value_t = crate::store::repair::REPAIR_LEASE.as_secs(), value_parser = clap::value_parser!(u64).range(3..=3600))]
    pub fence_lease_secs: u64,
    /// Take over the fence this holder (`repair-<host>-<pid>-...`, as a refusal names it)
    /// holds, when its process is provably gone: it ran on this host and no process of its pid
    /// exists. Its staging copy is removed first. Refused for a holder still running or of
    /// another host (repeatable).
    #[arg(
        long = "take-over-fence",
        value_name = "HOLDER",
        requires = "reset_mailboxes"
    )]
    pub take_over_fence: Vec<String>,
    /// Progress on stderr: a bar on a terminal, a line every 5 s otherwise, or none.
    #[arg(long, value_enum, default_value_t = ProgressArg::Auto)]
    pub progress: ProgressArg,
    /// Serve /metrics on this address while the replay runs (`materializer_replay_records_total`
    /// and the store's counters), for a Prometheus scrape of a replay Job; the JSON summary on
    /// stdout stays the record of the whole run.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgressArg {
    Auto,
    Bar,
    Lines,
    Off,
}

impl ProgressArg {
    /// What `--progress` asks for (`auto`: a bar on a terminal, lines otherwise).
    pub(super) fn mode(self) -> ProgressMode {
        match self {
            Self::Auto => ProgressMode::for_stderr(),
            Self::Bar => ProgressMode::Bar,
            Self::Lines => ProgressMode::Lines,
            Self::Off => ProgressMode::Off,
        }
    }
}

/// `--user` values as user ids; a malformed one is refused naming it (exit 64, nothing touched).
pub(super) fn parse_users(raw: &[String]) -> Result<Vec<UserId>, ExitCode> {
    raw.iter()
        .map(|raw| UserId::parse(raw).map_err(|e| bad_argument("--user", format!("{raw:?}: {e}"))))
        .collect()
}

/// Resolves on SIGTERM or SIGINT.
pub(super) async fn termination() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Connects to the store, retrying with backoff until it answers or a signal arrives: a daemon
/// started before its store comes up waits (not ready) instead of crash-looping. `Err` is the
/// exit status: 0 after a signal (the daemon's drain), 1 for a store refused (a Redis that
/// evicts keys).
async fn connect_store(config: &Config, health: &Health) -> Result<OpenedStore, ExitCode> {
    let retry = config.kafka.backoff();
    let mut attempt = 0;
    let signal = termination();
    tokio::pin!(signal);
    loop {
        match open_store_to_write(config).await {
            Ok((opened, warning)) => {
                if let Some(warning) = warning {
                    tracing::warn!("{warning}");
                }
                health.set_store_waiting(None);
                return Ok(opened);
            }
            Err(OpenFailure::Refused(refusal)) => {
                tracing::error!("refused to start: {refusal}");
                return Err(fail_with(
                    Exit::Finding,
                    "refused",
                    format!("refused to start: {refusal}"),
                ));
            }
            Err(OpenFailure::Unavailable(e)) => {
                tracing::warn!(error = %e, attempt, "store not usable yet; retrying");
                health.set_store_waiting(Some(e));
                tokio::select! {
                    _ = tokio::time::sleep(retry.delay(attempt)) => {}
                    _ = &mut signal => return Err(ExitCode::SUCCESS),
                }
                attempt += 1;
            }
        }
    }
}

pub(super) async fn daemon(config: &Config) -> ExitCode {
    if let Err(e) = crate::daemon::kafka::validate_properties(&config.kafka) {
        tracing::error!(error = %e, "invalid configuration");
        return fail_with(
            Exit::Usage,
            "invalid_config",
            format!("invalid configuration: {e}"),
        );
    }
    if let Err(e) = metrics::install() {
        tracing::error!(error = %e, "metrics recorder");
        return fail_with(Exit::Retry, "metrics", format!("metrics recorder: {e}"));
    }
    Starting.emit();
    let health = Arc::new(Health::default());
    health
        .liveness
        .set_timeout(Duration::from_millis(config.http.liveness_timeout_ms));
    health.serve_debug_endpoints(config.http.debug_endpoints);
    match http::serve(&config.http.listen, health.clone()).await {
        Ok(addr) => tracing::info!(%addr, "serving /metrics, /healthz, /readyz"),
        Err(e) => {
            tracing::error!(listen = %config.http.listen, error = %e, "cannot bind http.listen");
            return fail_with(
                Exit::Retry,
                "unavailable",
                format!("cannot bind http.listen {}: {e}", config.http.listen),
            );
        }
    }
    let opened = match connect_store(config, &health).await {
        Ok(opened) => opened,
        Err(code) => return code,
    };
    if let Some(redis) = opened.redis() {
        if let Some(warning) = redis.unreplicated_writes_warning().await {
            tracing::warn!("{warning}");
        }
    }
    let masters_watch = opened.redis().map(|redis| {
        crate::daemon::health::watch_redis_masters(
            redis.clone(),
            config.store.redis.allow_eviction,
            health.clone(),
        )
    });
    let commit_offsets = config.store.backend != Backend::Memory;
    if !commit_offsets {
        tracing::warn!(
            "memory store: its content dies with the process, so no offset is committed and a restart re-reads the log"
        );
    }
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    tokio::spawn(async move {
        termination().await;
        tracing::info!("signal received: stopping");
        let _ = shutdown_tx.send(true);
    });
    let options = DaemonOptions {
        shutdown: shutdown_rx,
        progress: Arc::new(Progress::default()),
        health,
        commit_offsets,
        mock_log: None,
        #[cfg(feature = "failpoints")]
        on_producer: None,
    };
    let result = daemon::run(config, opened.store.clone(), options).await;
    if let Some(watch) = masters_watch {
        watch.abort();
    }
    if let Err(e) = opened.persist() {
        tracing::error!(error = %e, "memory snapshot not saved");
    }
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            // A client creation error may quote a property's value: never a secret.
            let error = crate::config::redact_secrets(&e.to_string(), &config.kafka);
            tracing::error!(%error, "daemon failed");
            fail_with(Exit::Retry, "daemon", format!("daemon failed: {error}"))
        }
    }
}

pub(super) async fn replay(config: &Config, args: &ReplayArgs) -> ExitCode {
    let _ = metrics::install();
    if let Some(listen) = &args.listen {
        if let Err(e) = http::serve(listen, Arc::new(Health::default())).await {
            return fail_with(
                Exit::Retry,
                "unavailable",
                format!("--listen {listen}: {e}"),
            );
        }
    }
    let users = match parse_users(&args.users) {
        Ok(users) => users,
        Err(code) => return code,
    };
    let start = match (args.from_offset, args.from_time) {
        (Some(offset), _) => ReplayStart::Offset(offset),
        (None, Some(ms)) => ReplayStart::TimeMs(ms),
        (None, None) => {
            return bad_argument("--from-offset", "--from-offset or --from-time is required");
        }
    };
    let opened =
        match tokio::time::timeout(Duration::from_secs(30), open_store_for_command(config)).await {
            Ok(Ok(opened)) => opened,
            Ok(Err(OpenFailure::Refused(refusal))) => {
                let summary = crate::operator::replay::ReplaySummary {
                    partition: args.partition,
                    refused: Some(crate::operator::replay::Refusal {
                        reason: "store_evicting",
                        detail: refusal.clone(),
                    }),
                    ..Default::default()
                };
                print_summary(&summary, summary.failure());
                return summary.exit_status().into();
            }
            Ok(Err(failure)) => return failure.report(),
            Err(_) => {
                return fail_with(
                    Exit::Retry,
                    "unavailable",
                    "the store did not answer within 30 s",
                );
            }
        };
    let request = ReplayRequest {
        partition: args.partition,
        start,
        to_offset: args.to_offset,
        users,
        reset_mailboxes: args.reset_mailboxes,
        dry_run: args.dry_run,
        allow_partial_history: args.allow_partial_history,
        allow_empty: args.allow_empty,
        allow_other_partitions: args.allow_other_partitions,
        progress: args.progress.mode(),
        lease: Duration::from_secs(args.fence_lease_secs),
        take_over: args.take_over_fence.clone(),
    };
    let (interrupt_tx, interrupt) = watch::channel(false);
    let signals = tokio::spawn(async move {
        termination().await;
        let _ = interrupt_tx.send(true);
    });
    let signalled = interrupt.clone();
    let mut summary =
        crate::operator::replay::replay(config, opened.store.clone(), &request, interrupt).await;
    signals.abort();
    summary.interrupted = summary.aborted.is_some() && *signalled.borrow();
    if let Err(e) = opened.persist() {
        return fail_with(Exit::Retry, "snapshot", e);
    }
    print_summary(&summary, summary.failure());
    summary.exit_status().into()
}

/// Prints a long command's summary: one JSON object on stdout whatever the output (it is what
/// scripts and Jobs read), carrying SPEC 8.2's `error` object when the command failed, whose
/// detail also goes to stderr in text for whoever watches.
pub(super) fn print_summary(
    summary: &impl serde::Serialize,
    failure: Option<(&'static str, String)>,
) {
    let mut value = serde_json::to_value(summary).unwrap_or_default();
    if let Some((kind, detail)) = &failure {
        value["error"] = serde_json::json!({"kind": kind, "detail": detail});
    }
    print_json(&value);
    if let (Some((_, detail)), false) = (failure, super::report::json()) {
        eprintln!("error: {detail}");
    }
}
