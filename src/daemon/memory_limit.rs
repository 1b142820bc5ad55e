//! The pod's memory limit, and whether the daemon's budget fits in it.
//!
//! A replica's peak memory during a catch-up is a fixed overhead plus its in-flight byte budget
//! plus librdkafka's prefetch, with a margin for the allocator (docs/operations.md "Memory",
//! measured by `benches/catchup_memory.rs`):
//!
//! `peak ≤ FIXED_OVERHEAD_BYTES + 1.25 × (kafka.max_in_flight_bytes + prefetch)`
//!
//! where the prefetch is `queued.max.messages.kbytes` plus one `fetch.max.bytes` response
//! ([`super::kafka::prefetch_sizes`]). At start the daemon reads its cgroup's memory limit
//! (cgroup v2 `memory.max`, or v1 `memory.limit_in_bytes`, the smallest along the cgroup's path)
//! and logs an error naming the keys to lower when the formula does not fit; `check-config`
//! refuses the configuration for the same reason. Without a limit (or without cgroups) there is
//! nothing to check.

use std::path::{Path, PathBuf};

use super::kafka::prefetch_sizes;
use crate::config::KafkaConfig;

/// What the daemon holds besides its in-flight work: the binary, the runtimes' threads and
/// stacks, the store and broker clients, the metrics registry (about 30 MiB measured idle; 64
/// MiB stated, so a larger cluster's metadata still fits).
pub(crate) const FIXED_OVERHEAD_BYTES: u64 = 64 << 20;

/// A cgroup v1 "no limit" is a huge page-aligned number, not a word; anything above this is none.
const V1_UNLIMITED_ABOVE: u64 = 1 << 60;

/// The peak memory the formula allows for this configuration, in bytes.
pub fn required_bytes(kafka: &KafkaConfig) -> u64 {
    let in_flight = kafka.max_in_flight_bytes as u64 + prefetch_sizes(kafka).total() as u64;
    FIXED_OVERHEAD_BYTES + in_flight + in_flight / 4
}

/// This process's memory limit, if its cgroup has one.
pub fn limit() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    limit_from(Path::new("/sys/fs/cgroup"), &cgroups)
}

/// The memory limit of the cgroup `/proc/self/cgroup` names (`cgroups`), read under `root`: the
/// smallest limit on the path from the cgroup up to the root (a parent's limit binds too). v2
/// first (`0::/path`), then v1 (`N:...memory...:/path`).
pub(crate) fn limit_from(root: &Path, cgroups: &str) -> Option<u64> {
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            if let Some(limit) = smallest_on_path(root, path, "memory.max") {
                return Some(limit);
            }
        }
    }
    for line in cgroups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory") {
            return smallest_on_path(&root.join("memory"), path, "memory.limit_in_bytes");
        }
    }
    None
}

/// The smallest numeric `file` from `root/path` up to `root` (a container sees its own cgroup
/// as `/`, so the root itself is read too).
fn smallest_on_path(root: &Path, path: &str, file: &str) -> Option<u64> {
    let mut dir: PathBuf = root.join(path.trim_start_matches('/'));
    let mut smallest: Option<u64> = None;
    loop {
        if let Ok(text) = std::fs::read_to_string(dir.join(file)) {
            // "max" (v2) and v1's near-2^63 value mean no limit.
            if let Ok(limit) = text.trim().parse::<u64>() {
                if limit < V1_UNLIMITED_ABOVE {
                    smallest = Some(smallest.map_or(limit, |s| s.min(limit)));
                }
            }
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            break;
        }
    }
    smallest
}

/// `Err` with what to lower when the formula's peak exceeds `limit`.
pub fn check(kafka: &KafkaConfig, limit: u64) -> Result<u64, String> {
    let required = required_bytes(kafka);
    if required <= limit {
        return Ok(required);
    }
    let prefetch = prefetch_sizes(kafka);
    Err(format!(
        "the memory limit is {} MiB but a catch-up may take {} MiB ({} MiB fixed + 1.25 × \
         (kafka.max_in_flight_bytes {} MiB + prefetch {} MiB)): lower kafka.max_in_flight_bytes \
         (the prefetch, kafka.properties \"queued.max.messages.kbytes\" and \"fetch.max.bytes\", \
         follows it unless set) or raise the limit",
        limit >> 20,
        required >> 20,
        FIXED_OVERHEAD_BYTES >> 20,
        kafka.max_in_flight_bytes >> 20,
        prefetch.total() >> 20,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> PathBuf {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let root = std::env::temp_dir().join(format!(
            "cgroup-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        for (path, text) in files {
            let file = root.join(path);
            std::fs::create_dir_all(file.parent().expect("parent")).expect("dir");
            std::fs::write(file, text).expect("write");
        }
        root
    }

    #[test]
    fn v2_limit_of_the_container_seen_as_root() {
        let root = tree(&[("memory.max", "536870912\n")]);
        assert_eq!(limit_from(&root, "0::/\n"), Some(512 << 20));
    }

    #[test]
    fn v2_max_is_no_limit() {
        let root = tree(&[("memory.max", "max\n")]);
        assert_eq!(limit_from(&root, "0::/\n"), None);
    }

    #[test]
    fn v2_a_parents_smaller_limit_binds() {
        let root = tree(&[
            ("kubepods/memory.max", "268435456\n"),
            ("kubepods/pod1/memory.max", "max\n"),
            ("kubepods/pod1/ctr/memory.max", "1073741824\n"),
        ]);
        assert_eq!(
            limit_from(&root, "0::/kubepods/pod1/ctr\n"),
            Some(256 << 20)
        );
    }

    #[test]
    fn v1_memory_controller() {
        let root = tree(&[
            ("memory/docker/abc/memory.limit_in_bytes", "805306368\n"),
            ("memory/memory.limit_in_bytes", "9223372036854771712\n"),
        ]);
        let cgroups =
            "12:cpu,cpuacct:/docker/abc\n9:memory:/docker/abc\n1:name=systemd:/docker/abc\n";
        assert_eq!(limit_from(&root, cgroups), Some(768 << 20));
    }

    #[test]
    fn v1_unlimited_is_none() {
        let root = tree(&[("memory/memory.limit_in_bytes", "9223372036854771712\n")]);
        assert_eq!(limit_from(&root, "4:memory:/\n"), None);
    }

    #[test]
    fn no_cgroup_files_no_limit() {
        let root = tree(&[]);
        assert_eq!(limit_from(&root, "0::/user.slice\n"), None);
    }

    #[test]
    fn the_default_budget_fits_the_charts_limit_and_not_a_small_one() {
        let kafka = crate::config::Config::default().kafka;
        // 64 MiB + 1.25 × (64 MiB budget + 16 MiB prefetch) = 164 MiB.
        assert_eq!(required_bytes(&kafka), 164 << 20);
        assert!(check(&kafka, 512 << 20).is_ok());
        let refused = check(&kafka, 128 << 20).expect_err("128 MiB is too small");
        assert!(refused.contains("kafka.max_in_flight_bytes"), "{refused}");
        assert!(refused.contains("164 MiB"), "{refused}");
    }

    #[test]
    fn prefetch_set_by_the_operator_counts_as_set() {
        let mut kafka = crate::config::Config::default().kafka;
        kafka
            .properties
            .insert("queued.max.messages.kbytes".to_owned(), "65536".to_owned());
        kafka
            .properties
            .insert("fetch.max.bytes".to_owned(), "52428800".to_owned());
        // 64 + 1.25 × (64 + 64 + 50) MiB.
        assert_eq!(required_bytes(&kafka), (64 << 20) + (178 << 20) * 5 / 4);
    }
}
