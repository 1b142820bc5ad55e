//! Saving and loading the memory store to a JSON file.
//!
//! The memory store lives in one process; a snapshot lets separate `materializer apply`, `scan`,
//! `inspect` and `truncate` invocations share one store for scripted checks and demos. It is not a
//! durability mechanism for production (use Redis or Scylla for that).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::mailbox::UserState;
use super::MemoryStore;
use crate::model::UserId;

/// Version of the snapshot file format.
pub const SNAPSHOT_FORMAT: u32 = 1;

/// Why a snapshot could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("memory snapshot {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("memory snapshot {path} is not valid: {message}")]
    Invalid { path: PathBuf, message: String },
}

#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    format: u32,
    users: Vec<(UserId, UserState)>,
}

impl MemoryStore {
    /// Replaces the store's content with the snapshot at `path`; a missing file is an empty store.
    pub fn load_snapshot(&self, path: &Path) -> Result<(), SnapshotError> {
        let text = match std::fs::read(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(SnapshotError::Io {
                    path: path.to_owned(),
                    source,
                })
            }
        };
        let file: SnapshotFile =
            serde_json::from_slice(&text).map_err(|e| SnapshotError::Invalid {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
        if file.format != SNAPSHOT_FORMAT {
            return Err(SnapshotError::Invalid {
                path: path.to_owned(),
                message: format!(
                    "format {} is not the supported {SNAPSHOT_FORMAT}",
                    file.format
                ),
            });
        }
        for shard in self.shards.iter() {
            super::lock(shard).clear();
        }
        for (user, state) in file.users {
            self.shard(&user).insert(user, state);
        }
        Ok(())
    }

    /// Writes the whole store to `path` (through a temporary file and a rename, so a crash never
    /// leaves a half-written snapshot).
    pub(crate) fn save_snapshot(&self, path: &Path) -> Result<(), SnapshotError> {
        let io = |source| SnapshotError::Io {
            path: path.to_owned(),
            source,
        };
        let mut users = Vec::new();
        for shard in self.shards.iter() {
            let shard = super::lock(shard);
            for (user, state) in shard.iter() {
                users.push((user.clone(), state.clone()));
            }
        }
        users.sort_by(|a, b| a.0.cmp(&b.0));
        let file = SnapshotFile {
            format: SNAPSHOT_FORMAT,
            users,
        };
        let text = serde_json::to_vec(&file).map_err(|e| SnapshotError::Invalid {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }
}
