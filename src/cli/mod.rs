//! The `materializer` command line (SPEC section 8).
//!
//! Exit status, for every command: 0 success; 1 the command's own error (a scan error, an
//! invalid configuration); 2 the store was unreachable or the command line is wrong; 3 `apply`
//! met a corrupt mailbox.

mod apply;
mod check_config;
mod demo;
mod dlq;
mod explain;
mod fix;
pub mod open_store;
mod output;
mod run;
mod schema;
mod tap;
mod top;
mod verify;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{Backend, Config, Overrides};
use crate::model::{MailboxId, ScanRequest, StoreError, UserId, MAX_MAILBOX_SEQ};
use crate::store::MailboxStore;
pub use open_store::OpenedStore;

use output::{ErrorEnvelope, TruncateLine};

/// Exit status: the store could not be reached (or the command line is wrong).
pub(crate) const EXIT_UNAVAILABLE: u8 = 2;
/// Exit status of `apply`: a delivery hit a corrupt mailbox.
pub(crate) const EXIT_CORRUPT: u8 = 3;

/// Materializes a dispatch log into per-user mailboxes.
#[derive(Debug, Parser)]
#[command(
    name = "materializer",
    version = concat!(env!("CARGO_PKG_VERSION"), " (revision ", env!("MATERIALIZER_REVISION"), ")"),
    about,
    long_about = None
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes.
#[derive(Debug, Args)]
pub(crate) struct GlobalArgs {
    /// TOML configuration file (see config/materializer.example.toml). Without it the defaults
    /// apply, with the memory store.
    #[arg(long, global = true, value_name = "FILE", env = "MATERIALIZER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Storage backend, overriding the configuration.
    #[arg(long, global = true, value_enum)]
    pub store: Option<BackendArg>,
    /// Memory store snapshot file shared by separate invocations (memory backend only).
    #[arg(long, global = true, value_name = "FILE")]
    pub memory_snapshot: Option<PathBuf>,
    /// Redis URL (redis:// or rediss://), overriding the configuration.
    #[arg(long, global = true, value_name = "URL")]
    pub redis_url: Option<String>,
    /// Scylla contact points, comma-separated, overriding the configuration.
    #[arg(
        long,
        global = true,
        value_name = "HOST:PORT[,..]",
        value_delimiter = ','
    )]
    pub scylla_nodes: Option<Vec<String>>,
    /// Scylla keyspace, overriding the configuration.
    #[arg(long, global = true, value_name = "NAME")]
    pub scylla_keyspace: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum BackendArg {
    Memory,
    Redis,
    Scylla,
}

impl From<BackendArg> for Backend {
    fn from(b: BackendArg) -> Self {
        match b {
            BackendArg::Memory => Backend::Memory,
            BackendArg::Redis => Backend::Redis,
            BackendArg::Scylla => Backend::Scylla,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate the configuration and print it (secrets masked) as JSON; with --connect, reach
    /// the store and the brokers and report each check instead.
    CheckConfig(check_config::CheckConfigArgs),
    /// Apply dispatch records (one JSON object a line) straight to the store, printing one JSON
    /// line per delivery.
    Apply(ApplyArgs),
    /// Read a page of a mailbox as one JSON object.
    Scan(ScanArgs),
    /// Print a mailbox's metadata as one JSON object (no promote runs first).
    Inspect(MailboxArgs),
    /// Raise a mailbox's trim: every group below --before is deleted.
    Truncate(TruncateArgs),
    /// Compact a mailbox's expired days into its gap boundary and print the result.
    Promote(MailboxArgs),
    /// Walk every mailbox of a Redis store (every master in Cluster mode) and promote each,
    /// rate-limited, compacting cold mailboxes' expired proofs; on every backend, remove the
    /// staging copies of crashed repairs whose fence lapsed. Prints a JSON summary.
    Patrol(PatrolArgs),
    /// Run a synthetic dispatch log (replays, conflicts, expired and malformed input) through an
    /// in-process Kafka mock cluster and the daemon into a memory store; print a table of outcomes.
    Demo(demo::DemoArgs),
    /// The daemon: consume the dispatch topic in the consumer group and materialize it into the
    /// store, serving /metrics, /healthz and /readyz. SIGTERM/SIGINT drain and exit 0.
    Run,
    /// Re-read one partition from an offset or a time with its own assignment (no group commits)
    /// and apply it again; prints a JSON summary. Exit 3 if a mailbox stays corrupt.
    Replay(run::ReplayArgs),
    /// The dead-letter topic: list and show its letters, and re-drive their records once the
    /// cause is fixed.
    Dlq(dlq::DlqArgs),
    /// The store's schema: `apply` creates or migrates it (the only command that needs DDL
    /// grants), `check` reports what is missing. Only the Scylla backend has one.
    Schema(schema::SchemaArgs),
    /// One mailbox as an operator needs it: its state, whether it reads, whether a running
    /// replica holds it blocked (and why, where), and the exact command that fixes it.
    /// Exit 0 healthy, 3 corrupt, 2 unreachable.
    Explain(explain::ExplainArgs),
    /// Stream the live decisions of running replicas, one JSON line per final delivery
    /// (`http.debug_endpoints` on there), filtered by user, outcome or partition.
    Tap(tap::TapArgs),
    /// A live view of running replicas from their /metrics and /readyz: readiness and why,
    /// records/s, dead letters/s, store errors and latency, lag per partition (worst first).
    /// Keys: s sort, f filter, q quit. Off a terminal: --once [--json].
    Top(top::TopArgs),
    /// Scrub: read a range of one partition, derive each user's mailbox from it (the memory
    /// store as the reference) and compare with the store, read-only. One JSON line per mailbox
    /// that is not a match, then a summary. Exit 0 nothing differs, 1 something does, 2
    /// unreachable.
    Verify(verify::VerifyArgs),
    /// After a wiped store or master (SPEC 7.3: `/readyz` `store data: lost`), accept the loss:
    /// writes the store's data markers again, so the waiting writes go on from what the store
    /// holds now. Rebuilding from the log instead is resetting the consumer group's offsets to
    /// the log's start (README). Prints one JSON object.
    AcceptStoreLoss,
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// File of records, or - for standard input.
    #[arg(default_value = "-", value_name = "FILE|-")]
    pub input: String,
    /// Largest record accepted, in bytes; a longer line is malformed (oversized).
    #[arg(long, default_value_t = crate::ingest::decode::DEFAULT_MAX_RECORD_BYTES)]
    pub max_record_bytes: usize,
}

#[derive(Debug, Args)]
pub struct PatrolArgs {
    /// Most mailboxes promoted per second (default: store.redis.patrol_rate_per_second).
    #[arg(long, value_name = "N")]
    pub rate: Option<u32>,
}

#[derive(Debug, Args)]
pub struct MailboxArgs {
    /// The user id.
    #[arg(long, value_name = "U")]
    pub user: String,
    /// The mailbox epoch.
    #[arg(long, value_name = "E")]
    pub epoch: u32,
}

#[derive(Debug, Args)]
pub struct ScanArgs {
    #[command(flatten)]
    pub mailbox: MailboxArgs,
    /// The cursor: only seqs above it are returned.
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub after: u64,
    /// Inclusive upper bound.
    #[arg(long, value_name = "S")]
    pub until: Option<u64>,
    /// Most groups returned (1..=10000).
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub limit: u32,
}

#[derive(Debug, Args)]
pub struct TruncateArgs {
    #[command(flatten)]
    pub mailbox: MailboxArgs,
    /// First seq to keep; everything below is deleted.
    #[arg(long, value_name = "S", value_parser = clap::value_parser!(u64).range(1..=MAX_MAILBOX_SEQ))]
    pub before: u64,
}

/// The commands that never open the store: their help leaves the store flags out.
const STORELESS: [&str; 4] = [
    "materializer top",
    "materializer tap",
    "materializer dlq list",
    "materializer dlq show",
];

/// The store flags: global, so that `materializer --store redis apply` and
/// `materializer apply --store redis` both work, and so listed in every command's help.
const STORE_FLAGS: [&str; 5] = [
    "store",
    "memory_snapshot",
    "redis_url",
    "scylla_nodes",
    "scylla_keyspace",
];

/// Prints the help of a command that never opens the store without the store flags, and exits;
/// returns for everything else. clap shows a global flag in every command's help and cannot
/// hide one per command, so a help request is parsed once by a copy of the command line whose
/// store flags are hidden, and its help is kept only when it is one of [`STORELESS`]. Nothing
/// else is parsed this way: the real parse follows.
fn help_without_store_flags() {
    let mut command = <Cli as clap::CommandFactory>::command();
    for flag in STORE_FLAGS {
        command = command.mut_arg(flag, |arg| arg.hide(true));
    }
    let Err(help) = command.try_get_matches_from(std::env::args_os()) else {
        return;
    };
    if help.kind() != clap::error::ErrorKind::DisplayHelp {
        return;
    }
    let text = help.render().to_string();
    let storeless = text
        .lines()
        .find_map(|l| l.strip_prefix("Usage: "))
        .is_some_and(|usage| {
            STORELESS
                .iter()
                .any(|c| usage == *c || usage.starts_with(&format!("{c} ")))
        });
    if storeless {
        help.exit();
    }
}

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
    help_without_store_flags();
    let cli = Cli::parse();
    let overrides = Overrides {
        backend: cli.global.store.map(Backend::from),
        memory_snapshot: cli.global.memory_snapshot.clone(),
        redis_url: cli.global.redis_url.clone(),
        scylla_nodes: cli.global.scylla_nodes.clone(),
        scylla_keyspace: cli.global.scylla_keyspace.clone(),
    };
    let config = match Config::load(cli.global.config.as_deref(), &overrides) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: invalid configuration: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(cli.command, config))
}

async fn run(command: Command, config: Config) -> ExitCode {
    match &command {
        Command::CheckConfig(args) => return check_config::run(&config, args).await,
        Command::Demo(args) => return demo::run(&config, args).await,
        Command::Run => return run::daemon(&config).await,
        Command::Replay(args) => return run::replay(&config, args).await,
        Command::Dlq(args) => return dlq::run(&config, args).await,
        Command::Top(args) => return top::run(&config, args).await,
        Command::Schema(args) => return schema::run(&config, args).await,
        Command::Explain(args) => return explain::run(&config, args).await,
        Command::Verify(args) => return verify::run(&config, args).await,
        Command::Tap(args) => return tap::run(&config, args).await,
        _ => {}
    }
    let writes = matches!(
        command,
        Command::Apply(_)
            | Command::Truncate(_)
            | Command::Promote(_)
            | Command::Patrol(_)
            | Command::AcceptStoreLoss
    );
    let opened = if writes {
        match open_store_for_command(&config).await {
            Ok(opened) => opened,
            Err(failure) => return failure.report(),
        }
    } else {
        match open_store(&config).await {
            Ok(opened) => opened,
            Err(message) => {
                eprintln!("error: {message}");
                return ExitCode::from(EXIT_UNAVAILABLE);
            }
        }
    };
    if let Command::Patrol(args) = &command {
        return patrol(&config, &opened, args).await;
    }
    let store = opened.store.as_ref();
    let code = match &command {
        Command::CheckConfig(_)
        | Command::Demo(_)
        | Command::Patrol(_)
        | Command::Run
        | Command::Replay(_)
        | Command::Dlq(_)
        | Command::Top(_)
        | Command::Schema(_)
        | Command::Explain(_)
        | Command::Verify(_)
        | Command::Tap(_) => ExitCode::SUCCESS,
        Command::Apply(args) => apply::run(opened.store.clone(), args, &config).await,
        Command::Scan(args) => scan(store, args).await,
        Command::Inspect(args) => inspect(store, args).await,
        Command::Truncate(args) => truncate(store, args).await,
        Command::Promote(args) => promote(store, args).await,
        Command::AcceptStoreLoss => accept_store_loss(store).await,
    };
    if matches!(
        command,
        Command::Apply(_) | Command::Truncate(_) | Command::Promote(_)
    ) {
        if let Err(e) = opened.persist() {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    code
}

/// `materializer accept-store-loss`: see [`Command::AcceptStoreLoss`].
async fn accept_store_loss(store: &dyn MailboxStore) -> ExitCode {
    match store.accept_data_loss().await {
        Ok(Some(written)) => {
            println!(
                "{}",
                serde_json::json!({
                    "backend": store.backend(),
                    "markers_written": written,
                    "accepted": true,
                })
            );
            ExitCode::SUCCESS
        }
        Ok(None) => {
            println!(
                "{}",
                serde_json::json!({
                    "backend": store.backend(),
                    "markers_written": 0,
                    "accepted": false,
                    "reason": "this backend keeps no data markers: nothing waits on one",
                })
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

/// Why a store could not be opened for writing.
#[derive(Debug)]
pub(crate) enum OpenFailure {
    /// Not reachable (retry; exit 2).
    Unavailable(String),
    /// Reachable but refused: a Redis that evicts keys (exit 1).
    Refused(String),
}

impl OpenFailure {
    /// Prints the error on stderr and answers the exit status.
    pub(crate) fn report(&self) -> ExitCode {
        match self {
            Self::Unavailable(message) => {
                eprintln!("error: {message}");
                ExitCode::from(EXIT_UNAVAILABLE)
            }
            Self::Refused(message) => {
                eprintln!("error: refused: {message}");
                ExitCode::FAILURE
            }
        }
    }
}

/// [`open_store`] for the daemon and every command that writes: a Redis that evicts keys is
/// refused before anything is written (SPEC 5; the decision is
/// [`crate::store::redis::eviction::verdict`]). `Ok` carries the warning to show when
/// `store.redis.allow_eviction` accepts an evicting Redis.
pub(crate) async fn open_store_to_write(
    config: &Config,
) -> Result<(OpenedStore, Option<String>), OpenFailure> {
    use crate::store::redis::eviction::{verdict, Verdict};
    let opened = open_store(config).await.map_err(OpenFailure::Unavailable)?;
    let missing = opened
        .missing_grants()
        .await
        .map_err(|e| OpenFailure::Unavailable(format!("probing the store's grants: {e}")))?;
    if !missing.is_empty() {
        return Err(OpenFailure::Unavailable(missing_grants_message(
            config.store.backend,
            &missing,
        )));
    }
    let Some(redis) = opened.redis() else {
        return Ok((opened, None));
    };
    let policies = redis
        .eviction_policies()
        .await
        .map_err(|e| OpenFailure::Unavailable(format!("reading Redis's maxmemory-policy: {e}")))?;
    let verdict = verdict(&policies, config.store.redis.allow_eviction);
    crate::daemon::metrics::store_evicting(verdict.evicting());
    match verdict {
        Verdict::Safe { .. } => Ok((opened, None)),
        Verdict::Allowed(warning) => Ok((opened, Some(warning))),
        Verdict::Refused(refusal) => Err(OpenFailure::Refused(refusal)),
    }
}

/// What a store user or role lacks, as an operator reads it: the rules to add and where the
/// full list is.
pub(crate) fn missing_grants_message(backend: Backend, missing: &[String]) -> String {
    match backend {
        Backend::Redis => format!(
            "the Redis ACL user may not do what this product needs: add the rules {} (e.g. \
             `ACL SETUSER <user> {}`; README \"Grants\" has the whole list)",
            missing.join(" "),
            missing.join(" ")
        ),
        _ => format!(
            "the CQL role may not do what this product needs: {} (README \"Grants\" has the \
             GRANT statements)",
            missing.join("; ")
        ),
    }
}

/// [`open_store_to_write`] for a command: the warning of an accepted evicting Redis goes to
/// stderr.
pub(crate) async fn open_store_for_command(config: &Config) -> Result<OpenedStore, OpenFailure> {
    let (opened, warning) = open_store_to_write(config).await?;
    if let Some(warning) = warning {
        eprintln!("warning: {warning}");
    }
    Ok(opened)
}

/// [`open_store`] for a command that only reads (`explain`, `verify`): an unreachable store is
/// said on stderr and ends the command with exit 2.
pub(crate) async fn open_store_to_read(config: &Config) -> Result<OpenedStore, ExitCode> {
    open_store(config).await.map_err(|e| {
        eprintln!("error: the store is unreachable: {e}");
        ExitCode::from(EXIT_UNAVAILABLE)
    })
}

/// Builds the configured backend ([`open_store::open`]), naming it in `build_info` first so a
/// daemon waiting for its store already says what it runs (a no-op without the metrics recorder).
pub(crate) async fn open_store(config: &Config) -> Result<OpenedStore, String> {
    crate::daemon::metrics::backend(config.store.backend.as_str());
    open_store::open(config).await
}

pub(crate) fn print_json(value: &impl serde::Serialize) {
    match serde_json::to_string(value) {
        Ok(text) => println!("{text}"),
        Err(e) => eprintln!("error: cannot render output: {e}"),
    }
}

fn mailbox_of(args: &MailboxArgs) -> Result<MailboxId, ExitCode> {
    UserId::parse(&args.user)
        .map(|user| MailboxId::new(user, args.epoch))
        .map_err(|e| {
            eprintln!("error: --user: {e}");
            ExitCode::from(EXIT_UNAVAILABLE)
        })
}

/// Prints a store error as `{"error": ...}` and picks the exit status.
fn fail(e: &StoreError) -> ExitCode {
    print_json(&ErrorEnvelope::from(e));
    // SPEC 8.1: these commands exit 1 for an error they report, 2 for a retryable one (an
    // unreachable store, a user under repair).
    ExitCode::from(e.class().exit_status(false))
}

async fn scan(store: &dyn MailboxStore, args: &ScanArgs) -> ExitCode {
    let mailbox = match mailbox_of(&args.mailbox) {
        Ok(m) => m,
        Err(code) => return code,
    };
    let request = ScanRequest {
        after_seq: args.after,
        until_seq: args.until,
        limit_groups: args.limit,
    };
    match store.range_scan(&mailbox, request).await {
        Ok(page) => {
            print_json(&page);
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

async fn inspect(store: &dyn MailboxStore, args: &MailboxArgs) -> ExitCode {
    let mailbox = match mailbox_of(args) {
        Ok(m) => m,
        Err(code) => return code,
    };
    match store.inspect(&mailbox).await {
        Ok(inspection) => {
            print_json(&inspection);
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

async fn truncate(store: &dyn MailboxStore, args: &TruncateArgs) -> ExitCode {
    let mailbox = match mailbox_of(&args.mailbox) {
        Ok(m) => m,
        Err(code) => return code,
    };
    match store.truncate_before(&mailbox, args.before).await {
        Ok(outcome) => {
            print_json(&TruncateLine {
                user_trim_seq: outcome.user_trim_seq,
            });
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

async fn patrol(config: &Config, opened: &OpenedStore, args: &PatrolArgs) -> ExitCode {
    let Some(store) = opened.redis() else {
        // Scylla rows and memory mailboxes expire by the store's own clock, so only the
        // leftovers of crashed repairs need a walk there.
        return match opened.store.repair_collect_garbage().await {
            Ok(collected) => {
                print_json(&serde_json::json!({
                    "backend": config.store.backend.as_str(),
                    "staging_collected": collected,
                }));
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        };
    };
    let rate = args
        .rate
        .unwrap_or(config.store.redis.patrol_rate_per_second);
    match store.patrol(rate).await {
        Ok(report) => {
            print_json(&report);
            if report.corrupt > 0 {
                ExitCode::from(EXIT_CORRUPT)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => fail(&e),
    }
}

async fn promote(store: &dyn MailboxStore, args: &MailboxArgs) -> ExitCode {
    let mailbox = match mailbox_of(args) {
        Ok(m) => m,
        Err(code) => return code,
    };
    match store.promote(&mailbox).await {
        Ok(outcome) => {
            print_json(&outcome);
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}
