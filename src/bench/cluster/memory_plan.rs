//! What a `bench cluster` run needs in memory, checked before anything starts: the daemons'
//! stores, and this process's own buffers for the baselines (the raw TCP baseline's destination
//! buffers alone are N × (N−1) objects in all-to-all, 14 GiB at 8 nodes and 256 MiB).

use skyriver_daemon::host_memory;
use skyriver_daemon::size::format_bytes;

use super::{BenchError, Pattern};

/// The sizes `bench cluster` runs when none are given.
pub(super) const DEFAULT_SIZES: [u64; 6] =
    [1 << 10, 16 << 10, 256 << 10, 4 << 20, 64 << 20, 256 << 20];

/// What the run is: its nodes, patterns and baselines.
pub(super) struct RunShape<'a> {
    pub nodes: u64,
    pub patterns: &'a [Pattern],
    pub tcp: bool,
    pub redis: bool,
}

impl RunShape<'_> {
    /// Each daemon's `--memory` when `largest` is the largest size: an all-to-all node holds its
    /// own object and N−1 copies, a broadcast node N−1 copies.
    pub(super) fn store_bytes(&self, largest: u64) -> u64 {
        (largest * self.nodes + (64 << 20)).max(128 << 20)
    }

    /// Everything the run needs at its peak with these sizes: every store, and this process's
    /// buffers for its largest case.
    fn total_bytes(&self, sizes: &[u64]) -> u64 {
        let largest = sizes.iter().copied().max().unwrap_or(0);
        let own = sizes
            .iter()
            .map(|&size| self.own_bytes(size, largest))
            .max()
            .unwrap_or(0);
        self.nodes * self.store_bytes(largest) + own
    }

    /// This process's buffers during a case of `size`: the source data, the raw TCP servers'
    /// payload, the baselines' destination buffers of the most demanding pattern, and Redis's
    /// copies of the objects.
    fn own_bytes(&self, size: u64, largest: u64) -> u64 {
        let n = self.nodes;
        let destinations = if self.tcp || self.redis {
            let per_pattern = |p: &Pattern| match p {
                Pattern::AllToAll => n * (n - 1) * size,
                Pattern::Broadcast | Pattern::Incast => (n - 1) * size,
            };
            self.patterns.iter().map(per_pattern).max().unwrap_or(0)
        } else {
            0
        };
        let payload = if self.tcp { largest } else { 0 };
        let redis = if self.redis { (n - 1) * size } else { 0 };
        size + payload + destinations + redis
    }
}

/// The sizes to run: `asked` if given and it fits in the memory this machine has now, else an
/// error saying what fits; without `asked`, [`DEFAULT_SIZES`] less the largest ones that do not
/// fit (said on stderr). A machine whose free memory cannot be read runs what was asked.
pub(super) fn sizes_that_fit(shape: &RunShape<'_>, asked: &[u64]) -> Result<Vec<u64>, BenchError> {
    let available = host_memory::available(None);
    let fits = |sizes: &[u64]| {
        available
            .as_ref()
            .is_none_or(|a| shape.total_bytes(sizes) <= a.bytes)
    };
    let describe = |sizes: &[u64]| {
        let available = available
            .as_ref()
            .expect("only called when memory was read");
        let largest = sizes.iter().copied().max().unwrap_or(0);
        format!(
            "{} nodes with sizes up to {} need {} ({} for the stores, the rest for the baselines' buffers); {} available ({})",
            shape.nodes,
            format_bytes(largest),
            format_bytes(shape.total_bytes(sizes)),
            format_bytes(shape.nodes * shape.store_bytes(largest)),
            format_bytes(available.bytes),
            available.source
        )
    };
    if !asked.is_empty() {
        if fits(asked) {
            return Ok(asked.to_vec());
        }
        return Err(BenchError::Usage(format!(
            "{}. Use smaller --sizes, fewer --nodes, or --baselines '' to drop the baselines' buffers",
            describe(asked)
        )));
    }
    let mut sizes = DEFAULT_SIZES.to_vec();
    while !fits(&sizes) && sizes.len() > 1 {
        let all = sizes.clone();
        let dropped = sizes.pop().expect("more than one size");
        eprintln!("leaving out {}: {}", format_bytes(dropped), describe(&all));
    }
    if fits(&sizes) {
        Ok(sizes)
    } else {
        Err(BenchError::Usage(format!(
            "{}. Use fewer --nodes",
            describe(&sizes)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_to_all_needs_the_baselines_buffers_of_every_pair() {
        let patterns = [Pattern::Broadcast, Pattern::AllToAll];
        let shape = RunShape {
            nodes: 8,
            patterns: &patterns,
            tcp: true,
            redis: false,
        };
        let mib = 1 << 20;
        // 8 stores of 8 × 256 MiB + 64 MiB, then the data, the payload and 8 × 7 buffers.
        let expected = 8 * (8 * 256 * mib + 64 * mib) + 256 * mib + 256 * mib + 56 * 256 * mib;
        assert_eq!(shape.total_bytes(&[mib, 256 * mib]), expected);
        let without = RunShape {
            tcp: false,
            ..shape
        };
        assert_eq!(
            without.total_bytes(&[mib, 256 * mib]),
            8 * (8 * 256 * mib + 64 * mib) + 256 * mib
        );
    }
}
