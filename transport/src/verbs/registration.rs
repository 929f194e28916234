//! Memory registration of an existing range, split into several memory regions when it
//! is larger than the device (or the caller) allows, and the address arithmetic that keeps
//! every work request inside one region on each side.

use std::ffi::c_int;
use std::sync::Arc;

use super::connection::ReadRequest;
use super::objects::{MemoryRegion, ProtectionDomain};
use super::MAX_MESSAGE_BYTES;

const PAGE_BYTES: u64 = 4096;

/// Why a registration failed.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// Null pointer or zero length.
    #[error("cannot register an empty or null range")]
    Empty,
    /// `ibv_reg_mr` failed for one chunk (earlier chunks were released).
    #[error("ibv_reg_mr failed for chunk {index} ({len} bytes at {addr:#x})")]
    RegisterMr {
        /// Chunk number.
        index: usize,
        /// Chunk start.
        addr: u64,
        /// Chunk length.
        len: u64,
        /// The errno.
        #[source]
        source: std::io::Error,
    },
}

/// One memory region of a registration: `[addr, addr + len)` with its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrChunk {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Local key (for local scatter/gather entries).
    pub lkey: u32,
    /// Remote key (what a peer uses to READ it).
    pub rkey: u32,
}

/// A memory region as a peer sees it: what it may READ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteChunk {
    /// Start address in the peer's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

/// A registered memory range: one or more memory regions, in address order, contiguous.
pub struct Registration {
    chunks: Vec<MrChunk>,
    // Dropping these deregisters the regions.
    mrs: Vec<MemoryRegion>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("chunks", &self.chunks)
            .finish()
    }
}

impl Registration {
    /// # Safety
    ///
    /// As [`super::VerbsDevice::register`].
    pub(crate) unsafe fn new(
        pd: &Arc<ProtectionDomain>,
        ptr: *mut u8,
        len: usize,
        max_mr_bytes: u64,
        access: c_int,
    ) -> Result<Registration, RegisterError> {
        if ptr.is_null() || len == 0 {
            return Err(RegisterError::Empty);
        }
        let chunk_cap = (max_mr_bytes / PAGE_BYTES * PAGE_BYTES).max(PAGE_BYTES);
        let base = ptr as u64;
        let total = len as u64;
        let mut chunks = Vec::new();
        let mut mrs = Vec::new();
        let mut offset = 0u64;
        while offset < total {
            let chunk_len = chunk_cap.min(total - offset);
            let addr = base + offset;
            // SAFETY: [addr, addr + chunk_len) lies inside the caller's range, which the
            // caller keeps mapped until this Registration (which owns the MR) is dropped.
            let mr = unsafe { pd.register(addr as *mut u8, chunk_len as usize, access) }.map_err(
                |e| RegisterError::RegisterMr {
                    index: chunks.len(),
                    addr,
                    len: chunk_len,
                    source: e,
                },
            )?;
            chunks.push(MrChunk {
                addr,
                len: chunk_len,
                lkey: mr.lkey(),
                rkey: mr.rkey(),
            });
            mrs.push(mr);
            offset += chunk_len;
        }
        Ok(Registration { chunks, mrs })
    }

    /// The memory regions, in address order.
    pub fn chunks(&self) -> &[MrChunk] {
        &self.chunks
    }

    /// What a peer needs to READ this registration.
    pub fn remote_chunks(&self) -> Vec<RemoteChunk> {
        self.chunks
            .iter()
            .map(|c| RemoteChunk {
                addr: c.addr,
                len: c.len,
                rkey: c.rkey,
            })
            .collect()
    }

    /// Start address.
    pub fn addr(&self) -> u64 {
        self.chunks[0].addr
    }

    /// Total length in bytes.
    pub fn len(&self) -> u64 {
        self.chunks.iter().map(|c| c.len).sum()
    }

    /// Never true: an empty range cannot be registered.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The memory region holding `addr`.
    pub fn chunk_for(&self, addr: u64) -> Option<MrChunk> {
        find_chunk(&self.chunks, addr, |c| (c.addr, c.len)).copied()
    }

    /// Local key covering the whole of `[addr, addr + len)`, if one region does.
    /// The memory region holding all of `[addr, addr + len)`, to bind a window in.
    pub(crate) fn region_for(&self, addr: u64, len: u64) -> Option<&MemoryRegion> {
        let end = addr.checked_add(len)?;
        self.chunks
            .iter()
            .position(|c| c.addr <= addr && end <= c.addr + c.len)
            .map(|i| &self.mrs[i])
    }

    pub fn lkey_for(&self, addr: u64, len: u64) -> Option<u32> {
        let c = self.chunk_for(addr)?;
        (addr + len <= c.addr + c.len).then_some(c.lkey)
    }
}

fn find_chunk<T>(chunks: &[T], addr: u64, span: impl Fn(&T) -> (u64, u64)) -> Option<&T> {
    let i = chunks.partition_point(|c| {
        let (start, len) = span(c);
        start + len <= addr
    });
    chunks.get(i).filter(|c| span(c).0 <= addr)
}

/// Why a READ could not be planned.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    /// Zero length, or a maximum READ size of zero.
    #[error("empty read")]
    Empty,
    /// Part of the local range is not registered.
    #[error("local range {addr:#x}+{len} is not covered by the registration")]
    LocalNotCovered {
        /// Range start.
        addr: u64,
        /// Range length.
        len: u64,
    },
    /// Part of the remote range is not in the peer's regions.
    #[error("remote range {addr:#x}+{len} is not covered by the peer's regions")]
    RemoteNotCovered {
        /// Range start.
        addr: u64,
        /// Range length.
        len: u64,
    },
}

/// Split a READ of `len` bytes from the peer's `remote_addr` into the local `local_addr`
/// into work requests that each stay inside one local and one remote memory region and are
/// at most `max_read_bytes` long. Work request ids are `first_wr_id`, `first_wr_id + 1`, ...
///
/// `remote` must be sorted by address and contiguous where the range crosses regions (as
/// [`Registration::remote_chunks`] gives).
pub fn plan_reads(
    local: &[MrChunk],
    local_addr: u64,
    remote: &[RemoteChunk],
    remote_addr: u64,
    len: u64,
    max_read_bytes: u64,
    first_wr_id: u64,
) -> Result<Vec<ReadRequest>, PlanError> {
    if len == 0 || max_read_bytes == 0 {
        return Err(PlanError::Empty);
    }
    let max_piece = max_read_bytes.min(MAX_MESSAGE_BYTES);
    let mut out = Vec::new();
    let mut done = 0u64;
    while done < len {
        let l_addr = local_addr + done;
        let r_addr = remote_addr + done;
        let lc =
            find_chunk(local, l_addr, |c| (c.addr, c.len)).ok_or(PlanError::LocalNotCovered {
                addr: l_addr,
                len: len - done,
            })?;
        let rc =
            find_chunk(remote, r_addr, |c| (c.addr, c.len)).ok_or(PlanError::RemoteNotCovered {
                addr: r_addr,
                len: len - done,
            })?;
        let piece = (len - done)
            .min(lc.addr + lc.len - l_addr)
            .min(rc.addr + rc.len - r_addr)
            .min(max_piece);
        out.push(ReadRequest {
            wr_id: first_wr_id + out.len() as u64,
            local_addr: l_addr,
            lkey: lc.lkey,
            remote_addr: r_addr,
            rkey: rc.rkey,
            // Cannot truncate: piece <= MAX_MESSAGE_BYTES = 2^31.
            len: piece as u32,
        });
        done += piece;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(addr: u64, sizes: &[u64]) -> Vec<MrChunk> {
        let mut a = addr;
        sizes
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let c = MrChunk {
                    addr: a,
                    len,
                    lkey: 100 + i as u32,
                    rkey: 200 + i as u32,
                };
                a += len;
                c
            })
            .collect()
    }

    fn remote(addr: u64, sizes: &[u64]) -> Vec<RemoteChunk> {
        local(addr, sizes)
            .into_iter()
            .map(|c| RemoteChunk {
                addr: c.addr,
                len: c.len,
                rkey: c.rkey + 1000,
            })
            .collect()
    }

    #[test]
    fn single_region_read_is_one_request() {
        let l = local(0x1000, &[1 << 20]);
        let r = remote(0x9000, &[1 << 20]);
        let p = plan_reads(&l, 0x1000, &r, 0x9000, 4096, u64::MAX, 7).unwrap();
        assert_eq!(
            p,
            vec![ReadRequest {
                wr_id: 7,
                local_addr: 0x1000,
                lkey: 100,
                remote_addr: 0x9000,
                rkey: 1200,
                len: 4096
            }]
        );
    }

    #[test]
    fn read_splits_at_both_sides_boundaries_and_max_size() {
        // Local regions of 8 KiB, remote of 12 KiB, offset so boundaries interleave.
        let l = local(0, &[8192, 8192, 8192, 8192]);
        let r = remote(1 << 40, &[12288, 12288, 12288]);
        let p = plan_reads(&l, 1000, &r, (1 << 40) + 2000, 30000, 5000, 0).unwrap();
        let total: u64 = p.iter().map(|q| u64::from(q.len)).sum();
        assert_eq!(total, 30000);
        let mut expect_l = 1000;
        let mut expect_r = (1u64 << 40) + 2000;
        for (i, q) in p.iter().enumerate() {
            assert_eq!(q.wr_id, i as u64);
            assert_eq!(q.local_addr, expect_l);
            assert_eq!(q.remote_addr, expect_r);
            assert!(q.len <= 5000);
            let lc = l.iter().find(|c| c.lkey == q.lkey).unwrap();
            assert!(q.local_addr >= lc.addr && q.local_addr + u64::from(q.len) <= lc.addr + lc.len);
            let rc = r.iter().find(|c| c.rkey == q.rkey).unwrap();
            assert!(
                q.remote_addr >= rc.addr && q.remote_addr + u64::from(q.len) <= rc.addr + rc.len
            );
            expect_l += u64::from(q.len);
            expect_r += u64::from(q.len);
        }
    }

    #[test]
    fn uncovered_ranges_are_errors() {
        let l = local(0, &[4096]);
        let r = remote(0, &[4096]);
        assert_eq!(
            plan_reads(&l, 0, &r, 0, 8192, u64::MAX, 0),
            Err(PlanError::LocalNotCovered {
                addr: 4096,
                len: 4096
            })
        );
        let l2 = local(0, &[8192]);
        assert_eq!(
            plan_reads(&l2, 0, &r, 0, 8192, u64::MAX, 0),
            Err(PlanError::RemoteNotCovered {
                addr: 4096,
                len: 4096
            })
        );
        assert_eq!(plan_reads(&l, 0, &r, 0, 0, 1, 0), Err(PlanError::Empty));
        assert_eq!(
            plan_reads(&l, 8192, &r, 0, 1, 1, 0),
            Err(PlanError::LocalNotCovered { addr: 8192, len: 1 })
        );
    }

    #[test]
    fn chunk_lookup_by_address() {
        let l = local(0x1000, &[4096, 4096, 100]);
        assert_eq!(find_chunk(&l, 0xfff, |c| (c.addr, c.len)), None);
        assert_eq!(
            find_chunk(&l, 0x1000, |c| (c.addr, c.len)).unwrap().lkey,
            100
        );
        assert_eq!(
            find_chunk(&l, 0x1fff, |c| (c.addr, c.len)).unwrap().lkey,
            100
        );
        assert_eq!(
            find_chunk(&l, 0x2000, |c| (c.addr, c.len)).unwrap().lkey,
            101
        );
        assert_eq!(
            find_chunk(&l, 0x3063, |c| (c.addr, c.len)).unwrap().lkey,
            102
        );
        assert_eq!(find_chunk(&l, 0x3064, |c| (c.addr, c.len)), None);
    }
}
