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
            _ => return None,
        })
    }
}
