//! A node's arena costs the memory its objects were written to, not its whole size, whatever
//! the allocator did before: 1,000 nodes of 1 MiB arenas must not be 1 GB resident from the
//! start. (Arenas were zeroed heap vectors: once glibc's mmap threshold had risen, an arena
//! could be served from memory the heap had used and freed, cleared byte by byte, every page
//! resident.)

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use skyriver_core::node::ArenaKey;
use skyriver_core::{ArenaId, LocalRegion};
use skyriver_sim::rdma::Memory;

const PAGE: usize = 4096;
const ARENA_BYTES: usize = 4 << 20;

/// How many of the pages of `[address, address + len)` are resident, from `/proc/self/pagemap`
/// (bit 63 of each page's entry; readable without privileges). `None` where it cannot be read.
fn resident_pages(address: usize, len: usize) -> Option<usize> {
    let mut pagemap = File::open("/proc/self/pagemap").ok()?;
    let first = address / PAGE;
    let last = (address + len - 1) / PAGE;
    pagemap.seek(SeekFrom::Start(first as u64 * 8)).ok()?;
    let mut entries = vec![0u8; (last - first + 1) * 8];
    pagemap.read_exact(&mut entries).ok()?;
    Some(
        entries
            .chunks_exact(8)
            .filter(|e| u64::from_le_bytes((*e).try_into().expect("8 bytes")) >> 63 == 1)
            .count(),
    )
}

#[test]
fn an_arena_costs_only_the_pages_written() {
    // What a long run does to the heap before an arena is made (a restart makes one mid-run):
    // a large block freed raises glibc's mmap threshold, and a block of the arena's size is
    // used, written and freed, kept by the heap (a later block stops it returning to the system).
    drop(vec![0u8; 2 * ARENA_BYTES]);
    let used = vec![1u8; ARENA_BYTES];
    let later = vec![2u8; 64];
    drop(used);

    let key = ArenaKey {
        base_addr: 0x1000,
        rkey: 7,
    };
    let mut memory = Memory::new(ARENA_BYTES as u64, key);
    let region = LocalRegion {
        arena: ArenaId(0),
        offset: 3 * PAGE as u64 + 10,
        len: 100,
    };
    memory.write(region, &[9; 100]);
    assert_eq!(&memory.read(region)[..], &[9; 100]);
    drop(later);

    let Some(resident) = resident_pages(memory.address(), memory.len()) else {
        eprintln!("skipped: /proc/self/pagemap cannot be read here");
        return;
    };
    let pages = ARENA_BYTES / PAGE;
    eprintln!("{resident} of {pages} pages of a fresh arena with one write are resident");
    assert!(
        resident <= 2,
        "{resident} of the {pages} pages of an arena written once are resident"
    );
}
