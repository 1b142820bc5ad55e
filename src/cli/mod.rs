//! The `materializer` command line (SPEC section 8).
//!
//! One operator contract for every command (SPEC 8.2), decided here once before any command
//! runs: the exit table ([`crate::model::Exit`]: 0 done, 1 a finding or refusal, 2 retry, 3
//! corrupt, 4 interrupted, 64 usage), the output switch and the one shape of a failure
//! ([`report`]), and the logging (`RUST_LOG`, `log.format`, `-v`/`-q`: [`logging_filter`]).

mod apply;
mod check_config;
mod demo;
mod dlq;
mod explain;
mod fix;
pub mod open_store;
mod output;
mod reference;
mod report;
mod run;
mod schema;
mod tap;
mod top;
mod verify;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{Backend, Config, Overrides};
use crate::daemon::events::{Event as _, StoreEvicting, StoreOpening};
use crate::model::{Exit, MailboxId, ScanRequest, StoreError, UserId, MAX_MAILBOX_SEQ};
use crate::store::MailboxStore;
pub use open_store::OpenedStore;

use output::TruncateLine;

pub(crate) use report::{bad_argument, fail_with, Output};

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
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "MATERIALIZER_CONFIG",
        hide_env_values = true
    )]
    pub config: Option<PathBuf>,
    /// Storage backend, overriding the configuration.
    #[arg(long, global = true, help_heading = "Store", value_enum)]
    pub store: Option<BackendArg>,
    /// Memory store snapshot file shared by separate invocations (memory backend only).
    #[arg(long, global = true, help_heading = "Store", value_name = "FILE")]
    pub memory_snapshot: Option<PathBuf>,
    /// Redis URL (redis:// or rediss://), overriding the configuration.
    #[arg(long, global = true, help_heading = "Store", value_name = "URL")]
    pub redis_url: Option<String>,
    /// Scylla contact points, comma-separated, overriding the configuration.
    #[arg(
        long,
        global = true,
        help_heading = "Store",
        value_name = "HOST:PORT[,..]",
        value_delimiter = ','
    )]
    pub scylla_nodes: Option<Vec<String>>,
    /// Scylla keyspace, overriding the configuration.
    #[arg(long, global = true, help_heading = "Store", value_name = "NAME")]
    pub scylla_keyspace: Option<String>,
    /// Output: `json` (one object a line on stdout, errors included) or `text`. Default: text on
    /// a terminal where the command has a text form, JSON otherwise.
    #[arg(long, global = true, value_enum, value_name = "FORMAT")]
    pub output: Option<Output>,
    /// More log lines on stderr (-v info, -vv debug, -vvv trace); RUST_LOG wins over both.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only errors in the log on stderr.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
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
    Promote(PromoteArgs),
    /// Walk every mailbox of a Redis store (every master in Cluster mode) and promote each,
    /// rate-limited, compacting cold mailboxes' expired proofs; on every backend, remove the
    /// staging copies of crashed repairs whose fence lapsed. Prints a JSON summary.
    Patrol(PatrolArgs),
    /// Run a synthetic dispatch log (replays, conflicts, expired and malformed input) through an
    /// in-process Kafka mock cluster and the daemon into a memory store; print a table of outcomes
    /// (one JSON object with --output json, the default off a terminal).
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
    /// Keys: s sort, f filter, q quit. With --once or off a terminal: one snapshot.
    Top(top::TopArgs),
    /// Scrub: read a range of one partition, derive each user's mailbox from it (the memory
    /// store as the reference) and compare with the store, read-only. One JSON line per mailbox
    /// that is not a match, then a summary. Exit 0 nothing differs, 1 something does, 2
    /// unreachable, 3 a mailbox is corrupt, 4 interrupted.
    Verify(verify::VerifyArgs),
    /// After a wiped store or master (SPEC 7.3: `/readyz` `store data: lost`), accept the loss:
    /// writes the store's data markers again, so the waiting writes go on from what the store
    /// holds now. Rebuilding from the log instead is resetting the consumer group's offsets to
    /// the log's start (docs/operations.md). Prints one JSON object.
    AcceptStoreLoss,
    /// Print a shell's completion script: `materializer completions bash >
    /// /etc/bash_completion.d/materializer` (bash, zsh, fish, elvish, powershell).
    Completions(reference::CompletionsArgs),
    /// Write the man pages (one for the binary, one a subcommand) into a directory.
    Man(reference::ManArgs),
    /// Print docs/reference/cli.md or docs/reference/config.md as generated from this binary.
    #[command(hide = true)]
    Reference(reference::ReferenceArgs),
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
    /// Progress on stderr: a count redrawn on a terminal, a line every 5 s otherwise, or none.
    #[arg(long, value_enum, default_value_t = run::ProgressArg::Auto)]
    pub progress: run::ProgressArg,
    /// Count what the pass would compact and collect (expired days by this machine's clock,
    /// crashed repairs' staging copies by the store's own rule), changing nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct PromoteArgs {
    #[command(flatten)]
    pub mailbox: MailboxArgs,
    /// Print what the promote would compact now (by this machine's clock), changing nothing.
    #[arg(long)]
    pub dry_run: bool,
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
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: u32,
}

#[derive(Debug, Args)]
pub struct TruncateArgs {
    #[command(flatten)]
    pub mailbox: MailboxArgs,
    /// First seq to keep; everything below is deleted.
    #[arg(long, value_name = "S", value_parser = clap::value_parser!(u64).range(1..=MAX_MAILBOX_SEQ))]
    pub before: u64,
    /// Change nothing: print the trim the mailbox would have and how many live groups would go.
    #[arg(long)]
    pub dry_run: bool,
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

/// Whether `args` (the program name first) parse as a command line of this binary, by the
/// same definition `main` parses with: the test of the documentation's shell blocks holds every
/// invocation written there to the flags of today, without running it.
#[doc(hidden)]
pub fn check_arguments(args: &[String]) -> Result<(), String> {
    match Cli::try_parse_from(args) {
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
    help_without_store_flags();
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e, &args),
    };
    report::choose(
        cli.global.output.or_else(|| old_json_flag(&cli.command)),
        has_text_form(&cli.command),
    );
    warn_old_spellings(&cli.command, &args);
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
            return fail_with(
                Exit::Usage,
                "invalid_config",
                format!("invalid configuration: {e}"),
            )
        }
    };
    crate::daemon::logging::init(&crate::config::LogConfig {
        format: config.log.format.clone(),
        filter: logging_filter(&cli.command, &config, cli.global.verbose, cli.global.quiet),
    });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return fail_with(
                Exit::Retry,
                "runtime",
                format!("cannot start the async runtime: {e}"),
            )
        }
    };
    runtime.block_on(run(cli.command, config))
}

/// A command line that did not parse: help and `--version` print and exit 0; anything else is a
/// usage error (exit 64, never worth retrying), clap's explanation on stderr and, in JSON, the
/// error object on stdout too.
fn usage_error(e: clap::Error, args: &[String]) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    let _ = e.print();
    if report::choose(report::flag_in(args), true) == Output::Json {
        let rendered = e.render().to_string();
        let detail = match e.kind() {
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                "a command is required (materializer --help lists them)".to_owned()
            }
            _ => rendered
                .lines()
                .next()
                .map(|l| l.strip_prefix("error: ").unwrap_or(l).to_owned())
                .unwrap_or_default(),
        };
        print_json(&serde_json::json!({"error": {"kind": "usage", "detail": detail}}));
    }
    Exit::Usage.into()
}

/// `explain --json` and `top --json`, the old spellings of `--output json`: accepted, with a
/// warning, for one release.
fn old_json_flag(command: &Command) -> Option<Output> {
    let old = match command {
        Command::Explain(args) => args.json,
        Command::Top(args) => args.json,
        _ => false,
    };
    old.then(|| {
        report::warn("--json is `--output json` now; --json goes in the next release");
        Output::Json
    })
}

/// Flags renamed so that one name means one thing (SPEC 8.2), still accepted for one release:
/// each use is warned about on stderr.
fn warn_old_spellings(command: &Command, args: &[String]) {
    let given = |flag: &str| {
        args.iter()
            .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
    };
    if given("--source-partition") {
        report::warn(
            "--source-partition is `--partition` now; the old spelling goes in the next release",
        );
    }
    if let Command::Dlq(dlq) = command {
        if dlq.shows() && given("--partition") {
            report::warn(
                "dlq show --partition is `--dlq-partition` now (`--partition` names a dispatch-topic partition everywhere else); the old spelling goes in the next release",
            );
        }
    }
}

/// Whether a command has a human text form (the default on a terminal): the rest print JSON
/// either way.
fn has_text_form(command: &Command) -> bool {
    match command {
        Command::CheckConfig(args) => args.connect,
        Command::Demo(_) | Command::Explain(_) | Command::Top(_) => true,
        _ => false,
    }
}

/// The log filter of a command: `RUST_LOG` wins (in [`crate::daemon::logging::init`]), then
/// `-q` (errors only) or `-v` (info, debug, trace), then the command's own default: the
/// configured `log.filter` for the daemon, warnings only for the commands whose output is the
/// point (the demo's table also silences librdkafka, whose mock cluster reports a lost
/// connection at exit).
fn logging_filter(command: &Command, config: &Config, verbose: u8, quiet: bool) -> String {
    let demo = matches!(command, Command::Demo(_));
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) if matches!(command, Command::Run) => return config.log.filter.clone(),
        (false, 0) if demo => {
            return "warn,librdkafka=off,mailbox_materializer::daemon::kafka=off".to_owned()
        }
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        (false, _) => "trace",
    };
    if demo {
        format!("{level},librdkafka=off")
    } else {
        level.to_owned()
    }
}

/// Runs a command; a signal (SIGINT/SIGTERM) ends one that does not answer signals itself with
/// exit 4 (SPEC 8.2). Dropping the command's future at the signal is safe by construction: each
/// store call it had under way is one atomic script or statement, and what it printed so far is
/// flushed as its writers drop. The daemon drains (exit 0), `replay` and `verify` stop between
/// records and say so in their summary, `tap` ends its stream, `top` restores the terminal, and
/// `demo --serve` stops serving: each handles the signal itself.
async fn run(command: Command, config: Config) -> ExitCode {
    let own_signals = match &command {
        Command::Run
        | Command::Replay(_)
        | Command::Verify(_)
        | Command::Tap(_)
        | Command::Top(_) => true,
        Command::Demo(args) => args.serve,
        _ => false,
    };
    if own_signals {
        return execute(command, config).await;
    }
    tokio::select! {
        code = execute(command, config) => code,
        () = run::termination() => fail_with(
            Exit::Interrupted,
            "interrupted",
            "interrupted by a signal before the end",
        ),
    }
}

async fn execute(command: Command, config: Config) -> ExitCode {
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
        Command::Completions(args) => return reference::completions(args),
        Command::Man(args) => return reference::man(args),
        Command::Reference(args) => return reference::reference(args),
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
                return fail_with(Exit::Retry, "unavailable", message);
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
        | Command::Tap(_)
        | Command::Completions(_)
        | Command::Man(_)
        | Command::Reference(_) => ExitCode::SUCCESS,
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
            return fail_with(Exit::Retry, "snapshot", e);
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
    /// Reports the failure and answers the exit status.
    pub(crate) fn report(&self) -> ExitCode {
        match self {
            Self::Unavailable(message) => fail_with(Exit::Retry, "unavailable", message),
            Self::Refused(message) => {
                fail_with(Exit::Finding, "refused", format!("refused: {message}"))
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
    StoreEvicting(verdict.evicting()).emit();
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
             `ACL SETUSER <user> {}`; docs/grants.md has the whole list)",
            missing.join(" "),
            missing.join(" ")
        ),
        _ => format!(
            "the CQL role may not do what this product needs: {} (docs/grants.md has the \
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
        report::warn(warning);
    }
    Ok(opened)
}

/// [`open_store`] for a command that only reads (`explain`, `verify`): an unreachable store is
/// said on stderr and ends the command with exit 2.
pub(crate) async fn open_store_to_read(config: &Config) -> Result<OpenedStore, ExitCode> {
    open_store(config).await.map_err(|e| {
        fail_with(
            Exit::Retry,
            "unavailable",
            format!("the store is unreachable: {e}"),
        )
    })
}

/// Builds the configured backend ([`open_store::open`]), naming it in `build_info` first so a
/// daemon waiting for its store already says what it runs (a no-op without the metrics recorder).
pub(crate) async fn open_store(config: &Config) -> Result<OpenedStore, String> {
    StoreOpening(config.store.backend.as_str()).emit();
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
        .map_err(|e| bad_argument("--user", e))
}

/// Ends a command on a store error ([`report::store_failure`]).
fn fail(e: &StoreError) -> ExitCode {
    report::store_failure(e)
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
    if args.dry_run {
        return truncate_dry_run(store, &mailbox, args.before).await;
    }
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

/// `truncate --dry-run`: reads only (inspect, then scans of the seqs the trim would pass).
async fn truncate_dry_run(store: &dyn MailboxStore, mailbox: &MailboxId, before: u64) -> ExitCode {
    let inspection = match store.inspect(mailbox).await {
        Ok(inspection) => inspection,
        Err(e) => return fail(&e),
    };
    let current = inspection.user_trim_seq;
    // Seqs below the trim are gone and `resume_after` of a trimmed cursor is trim - 1: the
    // first live seq is above both it and the expired gap.
    let mut after = current
        .saturating_sub(1)
        .max(inspection.expired_gap_boundary);
    let mut groups = 0u64;
    while after + 1 < before {
        let request = ScanRequest {
            after_seq: after,
            until_seq: Some(before - 1),
            limit_groups: 1000,
        };
        match store.range_scan(mailbox, request).await {
            Ok(page) => {
                groups += page.groups.len() as u64;
                if !page.has_more || page.up_to <= after {
                    break;
                }
                after = page.up_to;
            }
            Err(e) => return fail(&e),
        }
    }
    print_json(&serde_json::json!({
        "dry_run": true,
        "user_trim_seq": current.max(before),
        "current_user_trim_seq": current,
        "groups_deleted": groups,
    }));
    ExitCode::SUCCESS
}

async fn patrol(config: &Config, opened: &OpenedStore, args: &PatrolArgs) -> ExitCode {
    let Some(store) = opened.redis() else {
        // Scylla rows and memory mailboxes expire by the store's own clock, so only the
        // leftovers of crashed repairs need a walk there.
        return match opened.store.repair_collect_garbage(args.dry_run).await {
            Ok(collected) => {
                let mut report = serde_json::json!({
                    "backend": config.store.backend.as_str(),
                    "staging_collected": collected,
                });
                if args.dry_run {
                    report["dry_run"] = true.into();
                }
                print_json(&report);
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        };
    };
    let rate = args
        .rate
        .unwrap_or(config.store.redis.patrol_rate_per_second);
    let mut progress =
        crate::operator::replay::Progress::count("patrol", "mailboxes", args.progress.mode());
    let patrolled = store
        .patrol_with(rate, args.dry_run, |report| {
            progress.note(format!(
                "expired days {}, corrupt {}, unavailable {}",
                report.expired_days, report.corrupt, report.unavailable
            ));
            progress.read(1);
        })
        .await;
    progress.finish();
    match patrolled {
        Ok(report) => {
            print_json(&report);
            if report.corrupt > 0 {
                Exit::Corrupt.into()
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => fail(&e),
    }
}

async fn promote(store: &dyn MailboxStore, args: &PromoteArgs) -> ExitCode {
    let mailbox = match mailbox_of(&args.mailbox) {
        Ok(m) => m,
        Err(code) => return code,
    };
    if args.dry_run {
        return match store.promote_preview(&mailbox).await {
            Ok(outcome) => {
                let mut report = serde_json::to_value(outcome).unwrap_or_default();
                report["dry_run"] = true.into();
                print_json(&report);
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        };
    }
    match store.promote(&mailbox).await {
        Ok(outcome) => {
            print_json(&outcome);
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}
