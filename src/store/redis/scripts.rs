//! The Lua scripts of `lua/`, embedded at build time with their shared includes, called with
//! EVALSHA and loaded on NOSCRIPT (redis-rs `Script`), and the reply codes they return.

use redis::Script;

const COMMON: &str = include_str!("../../../lua/includes/common.lua");
const META: &str = include_str!("../../../lua/includes/meta.lua");
const PROMOTE: &str = include_str!("../../../lua/includes/promote.lua");
const SCAN: &str = include_str!("../../../lua/includes/scan.lua");
const COPY: &str = include_str!("../../../lua/includes/copy.lua");

/// Every script, compiled once per store.
pub struct Scripts {
    pub append: Script,
    /// `lua/append_run.lua` around `lua/append.lua`'s body (see [`Scripts::append_run_source`]).
    pub append_run: Script,
    pub truncate: Script,
    pub promote: Script,
    pub scan_begin: Script,
    pub scan_end: Script,
    pub inspect: Script,
    pub repair_begin: Script,
    pub repair_renew: Script,
    pub repair_swap: Script,
    pub repair_abort: Script,
    pub repair_collect: Script,
    pub user_keys: Script,
    /// `lua/applied_record.lua`: the record of how far the store holds each partition.
    pub applied_record: Script,
}

const APPEND: &str = include_str!("../../../lua/append.lua");

/// What a run's groups share of the mailbox (`known` in `lua/append.lua`): defined once, before
/// `append_one`. A single append has none (`false`), so it builds no table it would not use.
const KNOWN: &str = "local known = {bucket_expiry = {}}";
const KNOWN_ALONE: &str = "local known = false";

/// How Redis (7.0+, the first with script flags) checks memory for a script (SPEC 7.3: no
/// write may take Redis past `maxmemory`). A script without a shebang is checked lazily: it may
/// run past `maxmemory` once its first write was a command Redis does not check for memory (the
/// append's first write is an `EXPIREAT`), so every script declares its flags.
#[derive(Debug, Clone, Copy)]
enum Memory {
    /// `#!lua`: a script that adds data is refused whole, before it runs, with `OOM` while the
    /// server is over `maxmemory` (the records wait and are retried: `OOM` is transient).
    Grows,
    /// `#!lua flags=allow-oom`: a script that reads, or only shrinks the mailbox (promote,
    /// truncate, a scan's promote, a repair's clean-up), runs when the server is full, so readers
    /// and an operator freeing memory are not locked out by the limit.
    Shrinks,
}

impl Memory {
    fn shebang(self) -> &'static str {
        match self {
            Self::Grows => "#!lua",
            Self::Shrinks => "#!lua flags=allow-oom",
        }
    }
}

/// A mailbox script's source: its shebang (see [`Memory`]), the shared helpers, the meta checks
/// and promote, then its body. Each script carries only the includes it calls: every definition
/// is a closure Redis builds on each call.
fn mailbox_source(memory: Memory, body: &str) -> String {
    format!("{}\n{COMMON}\n{META}\n{PROMOTE}\n{body}", memory.shebang())
}

fn mailbox_script(memory: Memory, body: &str) -> Script {
    Script::new(&mailbox_source(memory, body))
}

/// A repair script: its shebang, the shared helpers and the copy helpers, then its body.
fn repair_script(memory: Memory, body: &str) -> Script {
    Script::new(&format!("{}\n{COMMON}\n{COPY}\n{body}", memory.shebang()))
}

impl Scripts {
    pub fn new() -> Self {
        Self {
            append: Script::new(&Self::append_source()),
            append_run: Script::new(&Self::append_run_source()),
            truncate: mailbox_script(Memory::Shrinks, include_str!("../../../lua/truncate.lua")),
            promote: mailbox_script(Memory::Shrinks, include_str!("../../../lua/promote.lua")),
            scan_begin: mailbox_script(
                Memory::Shrinks,
                &format!("{SCAN}\n{}", include_str!("../../../lua/scan_begin.lua")),
            ),
            scan_end: mailbox_script(
                Memory::Shrinks,
                &format!("{SCAN}\n{}", include_str!("../../../lua/scan_end.lua")),
            ),
            inspect: Script::new(&format!(
                "{}\n{}",
                Memory::Shrinks.shebang(),
                include_str!("../../../lua/inspect.lua")
            )),
            repair_begin: repair_script(
                Memory::Grows,
                include_str!("../../../lua/repair_begin.lua"),
            ),
            repair_renew: repair_script(
                Memory::Grows,
                include_str!("../../../lua/repair_renew.lua"),
            ),
            repair_swap: repair_script(Memory::Grows, include_str!("../../../lua/repair_swap.lua")),
            repair_abort: repair_script(
                Memory::Shrinks,
                include_str!("../../../lua/repair_abort.lua"),
            ),
            repair_collect: repair_script(
                Memory::Shrinks,
                include_str!("../../../lua/repair_collect.lua"),
            ),
            user_keys: repair_script(Memory::Shrinks, include_str!("../../../lua/user_keys.lua")),
            applied_record: Script::new(&format!(
                "{}\n{}",
                Memory::Grows.shebang(),
                include_str!("../../../lua/applied_record.lua")
            )),
        }
    }

    /// The full source of the append script, as loaded (for benchmarks that call it by hand).
    pub fn append_source() -> String {
        mailbox_source(Memory::Grows, &format!("{KNOWN_ALONE}\n{APPEND}"))
    }

    /// The full source of the run script: the includes, `lua/append.lua`'s body as the local
    /// function `append_one(ARGV)` (its parameter shadows the script's ARGV, so the body reads
    /// one group's arguments unchanged), then `lua/append_run.lua`. One body, two scripts: a
    /// group is decided by the same lines alone or in a run.
    pub fn append_run_source() -> String {
        mailbox_source(
            Memory::Grows,
            &format!(
                "{KNOWN}\nlocal function append_one(ARGV)\n{APPEND}\nend\n{}",
                include_str!("../../../lua/append_run.lua")
            ),
        )
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}

/// The negative reply codes of the scripts (`lua/includes/common.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScriptCode {
    FutureCreatedAt,
    SpanExceeded,
    CrossDay,
    UnsupportedFormat,
    IndexLost,
    MetaLost,
    IdentityMissing,
    BadProof,
    EpochMismatch,
    CursorTrimmed,
    CursorGap,
    UnderRepair,
    FenceLost,
    StoreLost,
}

impl ScriptCode {
    pub(crate) fn from_code(code: i64) -> Option<Self> {
        Some(match code {
            -1 => Self::FutureCreatedAt,
            -2 => Self::SpanExceeded,
            -3 => Self::CrossDay,
            -10 => Self::UnsupportedFormat,
            -11 => Self::IndexLost,
            -12 => Self::MetaLost,
            -13 => Self::IdentityMissing,
            -14 => Self::BadProof,
            -20 => Self::EpochMismatch,
            -30 => Self::CursorTrimmed,
            -31 => Self::CursorGap,
            -40 => Self::UnderRepair,
            -41 => Self::FenceLost,
            -42 => Self::StoreLost,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each `ERR_*` constant of `common.lua` with the variant it must map to.
    fn lua_name(code: ScriptCode) -> &'static str {
        match code {
            ScriptCode::FutureCreatedAt => "ERR_FUTURE",
            ScriptCode::SpanExceeded => "ERR_SPAN",
            ScriptCode::CrossDay => "ERR_CROSS_DAY",
            ScriptCode::UnsupportedFormat => "ERR_UNSUPPORTED_FORMAT",
            ScriptCode::IndexLost => "ERR_INDEX_LOST",
            ScriptCode::MetaLost => "ERR_META_LOST",
            ScriptCode::IdentityMissing => "ERR_IDENTITY_MISSING",
            ScriptCode::BadProof => "ERR_BAD_PROOF",
            ScriptCode::EpochMismatch => "ERR_EPOCH_MISMATCH",
            ScriptCode::CursorTrimmed => "ERR_CURSOR_TRIMMED",
            ScriptCode::CursorGap => "ERR_CURSOR_GAP",
            ScriptCode::UnderRepair => "ERR_UNDER_REPAIR",
            ScriptCode::FenceLost => "ERR_FENCE_LOST",
            ScriptCode::StoreLost => "ERR_STORE_LOST",
        }
    }

    #[test]
    fn every_error_code_of_the_lua_scripts_has_its_script_code_and_no_other() {
        let declared: Vec<(&str, i64)> = COMMON
            .lines()
            .filter_map(|line| {
                let (name, value) = line.trim().strip_prefix("local ")?.split_once('=')?;
                let name = name.trim();
                name.starts_with("ERR_")
                    .then(|| Some((name, value.trim().parse().ok()?)))?
            })
            .collect();
        assert!(
            declared.len() >= 13,
            "common.lua's codes not found: {declared:?}"
        );
        for (name, code) in &declared {
            let variant = ScriptCode::from_code(*code)
                .unwrap_or_else(|| panic!("{name} = {code} has no ScriptCode"));
            assert_eq!(lua_name(variant), *name, "code {code}");
        }
        // And the other way: every code the Rust side knows is declared, with its number.
        for code in -100..0 {
            if let Some(variant) = ScriptCode::from_code(code) {
                assert!(
                    declared.contains(&(lua_name(variant), code)),
                    "{variant:?} ({code}) is not declared in common.lua"
                );
            }
        }
    }

    /// A refusal both a script and the shared rules write reads the same on every backend: the
    /// Lua text is the Rust one (they had drifted apart once).
    #[test]
    fn a_scan_whose_meta_vanished_is_worded_as_on_every_other_backend() {
        let detail = crate::model::rules::meta_vanished_during_scan().detail();
        let lua = include_str!("../../../lua/scan_end.lua");
        assert!(
            lua.contains(&format!("\"{detail}\"")),
            "scan_end.lua does not say {detail:?}"
        );
    }
}
