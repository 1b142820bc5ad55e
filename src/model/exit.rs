//! SPEC 8.2's exit table: the one status every command ends with, whatever the command.
//!
//! Scripts, Kubernetes Jobs and people read only this: 2 is the one status worth retrying (the
//! chart's Jobs retry it and nothing else), 64 is a command line or configuration that will
//! never work, 3 and 1 are answers an operator acts on. A command picks a variant; the number
//! is decided here alone.

use super::ErrorClass;

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: done.
    Done,
    /// 1: a finding or a refusal: a mailbox differs, a command refused to start, a cursor
    /// expired, nothing to do where something was expected.
    Finding,
    /// 2: unreachable or transient (a store, a broker, a replica, a user under repair): retry
    /// later.
    Retry,
    /// 3: a corrupt mailbox was met.
    Corrupt,
    /// 4: interrupted by SIGINT/SIGTERM before the end.
    Interrupted,
    /// 64 (`EX_USAGE`): an unknown flag, a bad argument or configuration value; never worth
    /// retrying.
    Usage,
}

impl Exit {
    /// The process exit status.
    pub const fn code(self) -> u8 {
        match self {
            Self::Done => 0,
            Self::Finding => 1,
            Self::Retry => 2,
            Self::Corrupt => 3,
            Self::Interrupted => 4,
            Self::Usage => 64,
        }
    }

    /// The status of a command that ends on a store error of this class.
    pub const fn of_class(class: ErrorClass) -> Self {
        match class {
            ErrorClass::Unavailable | ErrorClass::UnderRepair => Self::Retry,
            ErrorClass::Corrupt => Self::Corrupt,
            ErrorClass::Refused | ErrorClass::FenceLost => Self::Finding,
        }
    }

    /// The worse of two: a command that met several ends with the one an operator must see
    /// first (usage, then interrupted, corrupt, retry, finding, done).
    pub fn worst(self, other: Self) -> Self {
        if other.rank() > self.rank() {
            other
        } else {
            self
        }
    }

    const fn rank(self) -> u8 {
        match self {
            Self::Done => 0,
            Self::Finding => 1,
            Self::Retry => 2,
            Self::Corrupt => 3,
            Self::Interrupted => 4,
            Self::Usage => 5,
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(exit: Exit) -> Self {
        Self::from(exit.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_of_spec_8_2() {
        let table: Vec<u8> = [
            Exit::Done,
            Exit::Finding,
            Exit::Retry,
            Exit::Corrupt,
            Exit::Interrupted,
            Exit::Usage,
        ]
        .iter()
        .map(|e| e.code())
        .collect();
        assert_eq!(table, [0, 1, 2, 3, 4, 64]);
    }

    #[test]
    fn a_store_error_ends_a_command_by_its_class() {
        assert_eq!(Exit::of_class(ErrorClass::Unavailable), Exit::Retry);
        assert_eq!(Exit::of_class(ErrorClass::UnderRepair), Exit::Retry);
        assert_eq!(Exit::of_class(ErrorClass::Corrupt), Exit::Corrupt);
        assert_eq!(Exit::of_class(ErrorClass::Refused), Exit::Finding);
        assert_eq!(Exit::of_class(ErrorClass::FenceLost), Exit::Finding);
    }

    #[test]
    fn the_worst_wins() {
        assert_eq!(Exit::Done.worst(Exit::Corrupt), Exit::Corrupt);
        assert_eq!(Exit::Corrupt.worst(Exit::Finding), Exit::Corrupt);
        assert_eq!(Exit::Retry.worst(Exit::Interrupted), Exit::Interrupted);
    }
}
