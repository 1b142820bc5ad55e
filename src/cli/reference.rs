//! What is generated from the clap definition and the example configuration, so no copy of
//! either is written by hand: shell completions (`materializer completions <shell>`), man pages
//! (`materializer man --dir DIR`, run by the image build), and the two references in
//! `docs/reference/` (`materializer reference cli|config`), whose committed copies a test holds
//! to what this prints.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, CommandFactory, Subcommand, ValueEnum};

use super::{fail_with, Cli};
use crate::model::Exit;

/// `materializer completions <shell>`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `materializer man --dir DIR`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Directory the pages are written to (created if missing): materializer.1 and one page a
    /// subcommand (materializer-apply.1, materializer-dlq-list.1, ...).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
}

/// `materializer reference <what>`.
#[derive(Debug, Args)]
pub struct ReferenceArgs {
    #[command(subcommand)]
    pub what: Reference,
}

#[derive(Debug, Clone, Copy, Subcommand, ValueEnum)]
pub enum Reference {
    /// docs/reference/cli.md: every command's help.
    Cli,
    /// docs/reference/config.md: every configuration key and environment variable.
    Config,
}

pub(super) fn completions(args: &CompletionsArgs) -> ExitCode {
    let mut command = Cli::command();
    clap_complete::generate(
        args.shell,
        &mut command,
        "materializer",
        &mut std::io::stdout(),
    );
    ExitCode::SUCCESS
}

pub(super) fn man(args: &ManArgs) -> ExitCode {
    match write_man_pages(&args.dir) {
        Ok(written) => {
            super::print_json(&serde_json::json!({
                "dir": args.dir.display().to_string(),
                "pages": written,
            }));
            ExitCode::SUCCESS
        }
        Err(e) => fail_with(
            Exit::Finding,
            "io",
            format!("man pages in {}: {e}", args.dir.display()),
        ),
    }
}

pub(super) fn reference(args: &ReferenceArgs) -> ExitCode {
    print!(
        "{}",
        match args.what {
            Reference::Cli => cli_reference(),
            Reference::Config => config_reference(),
        }
    );
    ExitCode::SUCCESS
}

/// Writes one page for the binary and one for every subcommand, nested ones included.
fn write_man_pages(dir: &Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    let mut command = Cli::command();
    command.build();
    let mut written = 0;
    let mut stack = vec![(String::from("materializer"), command)];
    while let Some((name, command)) = stack.pop() {
        if command.is_hide_set() {
            continue;
        }
        let mut page = Vec::new();
        clap_mangen::Man::new(command.clone().name(name.clone())).render(&mut page)?;
        std::fs::write(dir.join(format!("{name}.1")), page)?;
        written += 1;
        for sub in command.get_subcommands() {
            if sub.get_name() != "help" {
                stack.push((format!("{name}-{}", sub.get_name()), sub.clone()));
            }
        }
    }
    Ok(written)
}

/// Every visible command path with its long help, in the order `--help` lists them.
pub(crate) fn cli_reference() -> String {
    let mut out = String::from(
        "# CLI reference\n\n\
         Generated from the command line's definition (`materializer reference cli`); a test \
         fails when this copy differs. The exit table and the output switch are the same for \
         every command: docs/commands.md, \"One contract for every command\".\n",
    );
    let mut command = Cli::command();
    command.build();
    fn walk(out: &mut String, path: &str, command: &mut clap::Command) {
        out.push_str(&format!("\n## `{path}`\n\n```text\n"));
        let help = command.render_long_help().to_string();
        for line in help.lines() {
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out.push_str("```\n");
        let names: Vec<String> = command
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
            .map(|s| s.get_name().to_owned())
            .collect();
        for name in names {
            if let Some(sub) = command.find_subcommand_mut(&name) {
                walk(out, &format!("{path} {name}"), sub);
            }
        }
    }
    walk(&mut out, "materializer", &mut command);
    out
}

/// The example configuration (every key with its default and what it does) and the
/// environment variables that override it.
pub(crate) fn config_reference() -> String {
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from `config/materializer.example.toml` and the list of environment \
         variables the binary reads (`materializer reference config`); a test fails when this \
         copy differs. Precedence: the file < the environment < command-line flags. Unknown \
         keys are refused.\n\n## Environment variables\n\n",
    );
    for (name, _) in crate::config::env::ENV {
        out.push_str(&format!("- `{name}`\n"));
    }
    out.push_str("\n## Every key, with its default\n\n```toml\n");
    out.push_str(EXAMPLE_CONFIG.trim_end());
    out.push_str("\n```\n");
    out
}

/// The example configuration shipped with the product.
const EXAMPLE_CONFIG: &str = include_str!("../../config/materializer.example.toml");

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed references are what the binary prints; rerun the command the message
    /// names when a flag, a help text or a configuration key changes.
    #[test]
    fn the_committed_references_are_generated_ones() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        for (file, generated, what) in [
            ("docs/reference/cli.md", cli_reference(), "cli"),
            ("docs/reference/config.md", config_reference(), "config"),
        ] {
            let committed = std::fs::read_to_string(root.join(file)).unwrap_or_default();
            assert!(
                committed == generated,
                "{file} differs from the generated reference: run \
                 `cargo run --quiet -- reference {what} > {file}`"
            );
        }
    }

    #[test]
    fn a_man_page_for_every_command() {
        let dir = std::env::temp_dir().join(format!("mm-man-{}", std::process::id()));
        let written = write_man_pages(&dir).expect("written");
        assert!(dir.join("materializer.1").exists());
        assert!(dir.join("materializer-dlq-redrive.1").exists());
        assert!(written > 20, "{written}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
