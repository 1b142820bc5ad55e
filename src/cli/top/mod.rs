//! `materializer top`: a live view of running replicas from their `/metrics` and `/readyz`,
//! refreshed every second — per replica readiness (and what makes it false), records/s by
//! outcome, dead letters/s by reason, store errors/s and store call latency; per partition the
//! lag in records and seconds, the commit rate and blocked mailboxes, worst first. A replica that
//! stops answering stays on screen as down, with its last known partitions.
//!
//! With `--once`, and off a terminal, `top` prints one snapshot (text, or JSON with
//! `--output json`, the default off a terminal) (two scrapes an interval apart, so
//! rates are known) for scripts.

mod discover;
pub(super) mod scrape;
mod snapshot;
mod view;

use std::io::IsTerminal;

use super::fail_with;
use crate::model::Exit;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use crate::config::Config;
use snapshot::{build, Filter, Order, Replica};

#[derive(Debug, Args)]
pub struct TopArgs {
    /// The replicas' HTTP addresses (`host:port`, as `http.listen`; `http://host:port` works
    /// too). A name that resolves to several addresses (a headless Service) stands for every
    /// one of them, resolved again every 5 s. Without any, the configuration's `http.listen`.
    /// Repeatable, as in `tap`, `explain` and `verify`.
    #[arg(long = "daemon", value_name = "ADDR")]
    pub daemons: Vec<String>,
    /// The old spelling: addresses as arguments (accepted with a warning for one release).
    #[arg(value_name = "ADDR", hide = true)]
    pub replicas: Vec<String>,
    /// Milliseconds between refreshes.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub interval_ms: u64,
    /// Print one snapshot (two scrapes an interval apart) and exit: 0 when every replica
    /// answered, 2 when one did not (what `top` does off a terminal too).
    #[arg(long)]
    pub once: bool,
    /// The old spelling of `--output json` (accepted with a warning for one release).
    #[arg(long, hide = true)]
    pub json: bool,
}

use crate::wall_clock::now_ms;

/// Scrapes every replica at once.
async fn refresh(replicas: &mut [Replica], timeout: Duration) {
    let results =
        futures::future::join_all(replicas.iter().map(|r| scrape::scrape(&r.address, timeout)))
            .await;
    for (replica, result) in replicas.iter_mut().zip(results) {
        replica.record(result);
    }
}

pub(super) async fn run(config: &Config, args: &TopArgs) -> ExitCode {
    if !args.replicas.is_empty() {
        super::report::warn(
            "replica addresses as arguments are `--daemon ADDR` now; the old form goes in the next release",
        );
    }
    let named: Vec<String> = args.daemons.iter().chain(&args.replicas).cloned().collect();
    let given = if named.is_empty() {
        vec![config.http.listen.clone()]
    } else {
        named
    };
    let mut replicas: Vec<Replica> = discover::expand(&given)
        .await
        .into_iter()
        .map(Replica::new)
        .collect();
    let interval = Duration::from_millis(args.interval_ms);
    let timeout = interval.clamp(Duration::from_millis(500), Duration::from_secs(2));
    if args.once || !std::io::stdout().is_terminal() {
        refresh(&mut replicas, timeout).await;
        tokio::time::sleep(interval).await;
        refresh(&mut replicas, timeout).await;
        let snapshot = build(&replicas, Order::default(), Filter::All, now_ms());
        let unanswered: Vec<String> = replicas
            .iter()
            .filter_map(|r| r.error.as_ref().map(|e| format!("{}: {e}", r.address)))
            .collect();
        // The snapshot shows them down; the status says to look again later (SPEC 8.2: 2).
        let failure = (!unanswered.is_empty()).then(|| {
            (
                "unavailable",
                format!("replicas did not answer: {}", unanswered.join("; ")),
            )
        });
        if super::report::json() {
            super::run::print_summary(&snapshot, failure.clone());
        } else {
            print!("{}", view::text(&snapshot, Order::default(), Filter::All));
            if let Some((_, detail)) = &failure {
                eprintln!("error: {detail}");
            }
        }
        return match failure {
            None => ExitCode::SUCCESS,
            Some(_) => Exit::Retry.into(),
        };
    }
    let mut terminal = match ratatui::try_init() {
        Ok(terminal) => terminal,
        Err(e) => {
            return fail_with(
                Exit::Finding,
                "terminal",
                format!("cannot take over the terminal: {e}"),
            )
        }
    };
    let result = live(&mut terminal, &given, &mut replicas, interval, timeout).await;
    ratatui::restore();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail_with(Exit::Finding, "terminal", e),
    }
}

/// Refreshes every `interval` and answers keys in between until `q`, Esc or Ctrl-C.
async fn live(
    terminal: &mut ratatui::DefaultTerminal,
    given: &[String],
    replicas: &mut Vec<Replica>,
    interval: Duration,
    timeout: Duration,
) -> std::io::Result<()> {
    let (mut order, mut filter) = (Order::default(), Filter::default());
    let mut resolved = Instant::now();
    loop {
        if resolved.elapsed() >= discover::RESOLVE_EVERY {
            discover::follow(replicas, discover::expand(given).await);
            resolved = Instant::now();
        }
        refresh(replicas, timeout).await;
        let due = Instant::now() + interval;
        let mut snapshot = build(replicas, order, filter, now_ms());
        loop {
            terminal.draw(|frame| view::draw(frame, &snapshot, order, filter))?;
            let left = due.saturating_duration_since(Instant::now());
            // Waiting for a key blocks this thread only: the runtime's other workers go on.
            if !tokio::task::block_in_place(|| event::poll(left))? {
                break;
            }
            if let Event::Key(key) = event::read()? {
                if key.kind != KeyEventKind::Press {
                    continue;
                }
                match key.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => {
                        return Ok(())
                    }
                    KeyCode::Char('s') => order = order.next(),
                    KeyCode::Char('f') => filter = filter.next(),
                    _ => {}
                }
                snapshot = build(replicas, order, filter, now_ms());
            }
        }
    }
}
