//! The Lua scripts of `lua/`, embedded at build time with their shared includes, called with
//! EVALSHA and loaded on NOSCRIPT (redis-rs `Script`), and the reply codes they return.

use redis::Script;

const COMMON: &str = include_str!("../../../lua/includes/common.lua");
const PROMOTE: &str = include_str!("../../../lua/includes/promote.lua");

/// Every script, compiled once per store.
pub struct Scripts {
    pub append: Script,
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
}

fn with_includes(body: &str) -> Script {
    Script::new(&format!("{COMMON}\n{PROMOTE}\n{body}"))
}

impl Scripts {
    pub fn new() -> Self {
        Self {
            append: with_includes(include_str!("../../../lua/append.lua")),
            truncate: with_includes(include_str!("../../../lua/truncate.lua")),
            promote: with_includes(include_str!("../../../lua/promote.lua")),
            scan_begin: with_includes(include_str!("../../../lua/scan_begin.lua")),
            scan_end: with_includes(include_str!("../../../lua/scan_end.lua")),
            inspect: Script::new(include_str!("../../../lua/inspect.lua")),
            repair_begin: with_includes(include_str!("../../../lua/repair_begin.lua")),
            repair_renew: with_includes(include_str!("../../../lua/repair_renew.lua")),
            repair_swap: with_includes(include_str!("../../../lua/repair_swap.lua")),
            repair_abort: with_includes(include_str!("../../../lua/repair_abort.lua")),
            repair_collect: with_includes(include_str!("../../../lua/repair_collect.lua")),
            user_keys: with_includes(include_str!("../../../lua/user_keys.lua")),
        }
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}

/// The negative reply codes of the scripts (`lua/includes/common.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptCode {
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
}

impl ScriptCode {
    pub fn from_code(code: i64) -> Option<Self> {
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
            _ => return None,
        })
    }
}
