//! What the machine can give the store, checked before the arena is made.
//!
//! An arena's memfd pages belong to no process: when a store larger than the machine fills (or
//! is pre-faulted), the kernel's OOM killer cannot find the culprit and kills other processes.
//! So the daemon refuses a `--memory` above what is available — `MemAvailable`, the cgroup's
//! limit less its usage, or the free huge pages of a hugetlbfs arena — unless told
//! `--allow-overcommit`.

use std::path::Path;

use crate::size::format_bytes;

/// Smallest arena a daemon starts with: one page. plasma_store took stores of a few KiB
/// (`-m 10000`), and scripts written for it still start such stores.
pub const MIN_MEMORY_BYTES: u64 = 4 << 10;

/// Environment variable that replaces what the machine reports as available (bytes, or a size
/// such as `4GiB`): for tests, and for operators who know better than `/proc/meminfo`.
pub const AVAILABLE_OVERRIDE_ENV: &str = "SKYRIVER_MEMORY_AVAILABLE";

/// What can be had, and where the number comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Available {
    /// Bytes.
    pub bytes: u64,
    /// How it was found, for the message.
    pub source: String,
}

/// Why the machine cannot give the store what was asked, or the memory flags are unusable.
/// Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// `--memory` below [`MIN_MEMORY_BYTES`].
    #[error(
        "--memory {} is too small: a store needs at least {} (e.g. --memory 1GiB)",
        format_bytes(*asked_bytes),
        format_bytes(MIN_MEMORY_BYTES)
    )]
    TooSmall {
        /// What was asked.
        asked_bytes: u64,
    },
    /// `--memory` above what is available, without `--allow-overcommit`.
    #[error(
        "--memory {} is more than this machine can give the store: {} available ({}). A store \
         that large would drive the kernel into killing processes when it fills (memfd pages \
         belong to no process, so the OOM killer cannot find the store); --no-prefault only \
         delays that. Use --memory {} or less, or --allow-overcommit to start anyway.",
        format_bytes(*asked_bytes),
        format_bytes(available.bytes),
        available.source,
        format_bytes(*suggested_bytes)
    )]
    MoreThanAvailable {
        /// What was asked.
        asked_bytes: u64,
        /// What the machine has.
        available: Available,
        /// What to ask instead (nine tenths of it).
        suggested_bytes: u64,
    },
    /// `--hugepages DIR` cannot be examined.
    #[error("--hugepages {}: {source}", dir.display())]
    HugepagesStat {
        /// The directory.
        dir: std::path::PathBuf,
        /// From `statfs`.
        #[source]
        source: nix::Error,
    },
    /// `--hugepages DIR` is not a hugetlbfs mount: it would silently give normal pages.
    #[error(
        "--hugepages {}: not a hugetlbfs mount (mount one with `mount -t hugetlbfs none \
         /dev/hugepages` and reserve pages with `sysctl vm.nr_hugepages=N`)",
        dir.display()
    )]
    NotHugetlbfs {
        /// The directory.
        dir: std::path::PathBuf,
    },
}

/// Checks `memory_bytes` against the machine.
pub fn check(
    memory_bytes: u64,
    hugepages_dir: Option<&Path>,
    allow_overcommit: bool,
) -> Result<(), MemoryError> {
    if memory_bytes < MIN_MEMORY_BYTES {
        return Err(MemoryError::TooSmall {
            asked_bytes: memory_bytes,
        });
    }
    if allow_overcommit {
        return Ok(());
    }
    let Some(available) = available(hugepages_dir) else {
        return Ok(()); // Nothing to measure against (no /proc): trust the operator.
    };
    if memory_bytes <= available.bytes {
        return Ok(());
    }
    let suggestion = ((available.bytes / 10 * 9) >> 20) << 20;
    Err(MemoryError::MoreThanAvailable {
        asked_bytes: memory_bytes,
        available,
        suggested_bytes: suggestion.max(MIN_MEMORY_BYTES),
    })
}

/// The most the store can take now: the override, else the smallest of what the sources say.
pub fn available(hugepages_dir: Option<&Path>) -> Option<Available> {
    if let Ok(text) = std::env::var(AVAILABLE_OVERRIDE_ENV) {
        if let Ok(size) = text.parse::<crate::size::ByteSize>() {
            return Some(Available {
                bytes: size.0,
                source: format!("${AVAILABLE_OVERRIDE_ENV}"),
            });
        }
    }
    if hugepages_dir.is_some() {
        let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
        let free = meminfo_value(&meminfo, "HugePages_Free")?;
        let page = meminfo_value(&meminfo, "Hugepagesize")? * 1024;
        return Some(Available {
            bytes: free * page,
            source: format!(
                "{free} free huge pages of {} (HugePages_Free)",
                format_bytes(page)
            ),
        });
    }
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let mem_available = meminfo_value(&meminfo, "MemAvailable")? * 1024;
    let mut best = Available {
        bytes: mem_available,
        source: "MemAvailable in /proc/meminfo".to_string(),
    };
    if let Some((limit, usage)) = cgroup_limit() {
        let room = limit.saturating_sub(usage);
        if room < best.bytes {
            best = Available {
                bytes: room,
                source: format!(
                    "this cgroup's memory limit {} less its usage {}",
                    format_bytes(limit),
                    format_bytes(usage)
                ),
            };
        }
    }
    Some(best)
}

/// A `/proc/meminfo` field's number (kB for sizes, a count for huge pages).
fn meminfo_value(meminfo: &str, key: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The memory limit and usage of this process's cgroup (v2, else v1), when it has a limit.
fn cgroup_limit() -> Option<(u64, u64)> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let (dir, limit_file, usage_file) = if controllers.is_empty() {
            (
                format!("/sys/fs/cgroup{path}"),
                "memory.max",
                "memory.current",
            )
        } else if controllers.split(',').any(|c| c == "memory") {
            (
                format!("/sys/fs/cgroup/memory{path}"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        } else {
            continue;
        };
        let read = |file: &str| -> Option<u64> {
            std::fs::read_to_string(format!("{dir}/{file}"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        // "max" (v2) does not parse: no limit. v1 reports "no limit" as a huge number.
        if let (Some(limit), Some(usage)) = (read(limit_file), read(usage_file)) {
            if limit < (1 << 60) {
                return Some((limit, usage));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_parse() {
        let text = "MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\nHugePages_Free:        3\nHugepagesize:       2048 kB\n";
        assert_eq!(meminfo_value(text, "MemAvailable"), Some(20_000_000));
        assert_eq!(meminfo_value(text, "HugePages_Free"), Some(3));
        assert_eq!(meminfo_value(text, "Hugepagesize"), Some(2048));
        assert_eq!(meminfo_value(text, "Missing"), None);
    }

    #[test]
    fn too_small_is_refused_even_with_overcommit() {
        let e = check(0, None, true).unwrap_err();
        assert!(
            matches!(e, MemoryError::TooSmall { asked_bytes: 0 }),
            "{e:?}"
        );
        assert!(e.to_string().contains("at least 4.0 KiB"), "{e}");
        assert!(matches!(
            check(1, None, true),
            Err(MemoryError::TooSmall { .. })
        ));
        assert!(check(MIN_MEMORY_BYTES, None, true).is_ok());
    }

    #[test]
    fn this_machine_reports_something_available() {
        let a = available(None).expect("/proc/meminfo is readable here");
        assert!(a.bytes > 0, "{a:?}");
    }
}
