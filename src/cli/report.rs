//! How every command reports (SPEC 8.2): the one output switch and the one shape of a failure.
//!
//! `--output json|text` is decided once, at start ([`choose`]): the flag, else text on a
//! terminal for a command that has a text form, JSON otherwise. In JSON a failure is one object
//! `{"error": {"kind": ..., "detail": ...}}` on stdout whatever failed (store, broker, replica,
//! arguments), so a script reads one stream; in text it is `error: ...` on stderr. The status is
//! SPEC 8.2's table ([`Exit`]).

use std::fmt::Display;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::OnceLock;

use serde::Serialize;

use crate::model::{Exit, StoreError};

/// The output switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Output {
    /// One JSON object a line on stdout, errors included.
    Json,
    /// The command's human form; errors as `error: ...` on stderr.
    Text,
}

static OUTPUT: OnceLock<Output> = OnceLock::new();

/// Decides the output of this process once: the flag, else text on a terminal where the
/// command has a text form, JSON otherwise. Later calls keep the first decision.
pub(crate) fn choose(flag: Option<Output>, has_text_form: bool) -> Output {
    let default = if has_text_form && std::io::stdout().is_terminal() {
        Output::Text
    } else {
        Output::Json
    };
    *OUTPUT.get_or_init(|| flag.unwrap_or(default))
}

/// The output decided at start (JSON before anything decided it).
pub(crate) fn output() -> Output {
    OUTPUT.get().copied().unwrap_or(Output::Json)
}

/// Whether the command prints JSON.
pub(crate) fn json() -> bool {
    output() == Output::Json
}

#[derive(Serialize)]
struct Envelope<'a> {
    error: Failure<'a>,
}

#[derive(Serialize)]
struct Failure<'a> {
    kind: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
    detail: String,
}

/// Reports a failure and answers the status it ends the command with.
pub(crate) fn fail_with(exit: Exit, kind: &str, detail: impl Display) -> ExitCode {
    print_failure(kind, None, &detail.to_string());
    exit.into()
}

/// [`fail_with`] for a bad argument: kind `usage`, the flag named, exit 64.
pub(crate) fn bad_argument(field: &str, detail: impl Display) -> ExitCode {
    print_failure("usage", Some(field), &format!("{field}: {detail}"));
    Exit::Usage.into()
}

/// Reports a failure without ending anything (a command that goes on, or ends with a status
/// of its own summary).
pub(crate) fn print_failure(kind: &str, field: Option<&str>, detail: &str) {
    match output() {
        Output::Json => super::print_json(&Envelope {
            error: Failure {
                kind,
                field,
                detail: detail.to_owned(),
            },
        }),
        Output::Text => eprintln!("error: {detail}"),
    }
}

/// Ends a command on a store error: SPEC 8.1's `{"error": ...}` (kind, and the reason,
/// boundary, cursor or epoch a script needs) in JSON, `error: ...` in text; the status by the
/// error's class.
pub(crate) fn store_failure(e: &StoreError) -> ExitCode {
    match output() {
        Output::Json => super::print_json(&super::output::ErrorEnvelope::from(e)),
        Output::Text => eprintln!("error: {e}"),
    }
    Exit::of_class(e.class()).into()
}

/// A warning: always on stderr (never in the way of stdout's JSON).
pub(crate) fn warn(message: impl Display) {
    eprintln!("warning: {message}");
}

/// The output flag as given on the raw command line, for a command line that did not parse
/// (its error must still come out in the form asked for).
pub(crate) fn flag_in(args: &[String]) -> Option<Output> {
    let mut words = args.iter();
    while let Some(word) = words.next() {
        let value = match word.strip_prefix("--output") {
            Some("") => words.next().map(String::as_str),
            Some(rest) => rest.strip_prefix('='),
            None => None,
        };
        match value {
            Some("json") => return Some(Output::Json),
            Some("text") => return Some(Output::Text),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split(' ').map(str::to_owned).collect()
    }

    #[test]
    fn the_output_flag_is_found_in_a_command_line_that_did_not_parse() {
        assert_eq!(
            flag_in(&words("materializer scan --bogus --output json")),
            Some(Output::Json)
        );
        assert_eq!(
            flag_in(&words("materializer --output=text scan --bogus")),
            Some(Output::Text)
        );
        assert_eq!(flag_in(&words("materializer scan --output")), None);
        assert_eq!(flag_in(&words("materializer scan --outputs json")), None);
    }
}
