//! `materializer schema apply|check`: the store's schema as a step of its own.
//!
//! Only the Scylla backend has a schema (a keyspace, three tables, columns later releases
//! added). `apply` is the one command that sends DDL, run with a role that may create and alter
//! the keyspace (a deployment's pre-install/pre-upgrade hook); the daemon and every other
//! command then only read `system_schema` at connect, so their role needs no DDL grant
//! (`store.scylla.create_schema = false` makes them refuse an incomplete schema instead of
//! creating it). `check` reads and reports, changing nothing.
//!
//! Output: one JSON object, `{"backend", "keyspace", "complete", "missing"}` (`check`), or
//! `{"backend", "keyspace", "complete", "created"}` (`apply`: what was missing before). Exit 0
//! when the schema is complete, 1 when `check` finds something missing, 2 when the store could
//! not be reached or refused (a mismatched column, a missing grant: the error names it).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::json;

use super::fail_with;
use super::open_store::scylla_settings;
use crate::config::{Backend, Config};
use crate::model::Exit;
use crate::store::scylla;

#[derive(Debug, Args)]
pub struct SchemaArgs {
    #[command(subcommand)]
    pub action: SchemaAction,
}

#[derive(Debug, Clone, Copy, Subcommand)]
pub enum SchemaAction {
    /// Create the keyspace and tables and add the columns this release needs (idempotent; the
    /// only command that needs DDL grants).
    Apply,
    /// Report what the schema lacks without changing anything; exit 1 when something is missing.
    Check,
}

pub(super) async fn run(config: &Config, args: &SchemaArgs) -> ExitCode {
    if config.store.backend != Backend::Scylla {
        println!(
            "{}",
            json!({
                "backend": config.store.backend.as_str(),
                "complete": true,
                "note": "this backend has no schema to create",
            })
        );
        return ExitCode::SUCCESS;
    }
    let settings = scylla_settings(&config.store.scylla);
    let keyspace = settings.keyspace.clone();
    match args.action {
        SchemaAction::Apply => match scylla::apply_schema(&settings).await {
            Ok(created) => {
                println!(
                    "{}",
                    json!({"backend": "scylla", "keyspace": keyspace, "complete": true, "created": created})
                );
                ExitCode::SUCCESS
            }
            Err(e) => fail_with(
                Exit::Retry,
                "unavailable",
                format!("schema apply on keyspace {keyspace}: {e}"),
            ),
        },
        SchemaAction::Check => match scylla::check_schema(&settings).await {
            Ok(missing) => {
                let complete = missing.is_empty();
                println!(
                    "{}",
                    json!({"backend": "scylla", "keyspace": keyspace, "complete": complete, "missing": missing})
                );
                if complete {
                    ExitCode::SUCCESS
                } else {
                    Exit::Finding.into()
                }
            }
            Err(e) => fail_with(
                Exit::Retry,
                "unavailable",
                format!("schema check on keyspace {keyspace}: {e}"),
            ),
        },
    }
}
