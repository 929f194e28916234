//! Random object ids are unique in every process, also in children forked from one parent.

use std::collections::HashSet;
use std::io::{Read, Seek, Write};

use skyriver_client::{random_object_id, ObjectId};

const CHILDREN: usize = 8;
const IDS_PER_PROCESS: usize = 100_000;
const ID_LEN: usize = skyriver_core::ids::OBJECT_ID_LEN;

/// Draws `IDS_PER_PROCESS` ids into `buf` (already allocated: a forked child of a threaded
/// process must not allocate).
fn draw_into(buf: &mut [u8], draw: fn() -> ObjectId) {
    for chunk in buf.chunks_exact_mut(ID_LEN) {
        chunk.copy_from_slice(draw().as_bytes());
    }
}

/// Forks `CHILDREN` children after the parent drew one id (so any generator state is warm),
/// each drawing `IDS_PER_PROCESS` ids into a file of its own; returns every id drawn, the
/// parent's too.
fn ids_of_forked_children(draw: fn() -> ObjectId) -> Vec<[u8; ID_LEN]> {
    let dir = tempfile::Builder::new()
        .prefix("skyriver-ids-fork")
        .tempdir()
        .unwrap();
    let mut files: Vec<std::fs::File> = (0..CHILDREN)
        .map(|n| {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(dir.path().join(format!("child-{n}")))
                .unwrap()
        })
        .collect();
    let mut buf = vec![0u8; IDS_PER_PROCESS * ID_LEN];
    let first = draw();
    let mut children = Vec::new();
    for file in &mut files {
        // SAFETY: the child only fills a buffer allocated before the fork, writes it to a file
        // opened before the fork and leaves with `_exit`: it allocates nothing and takes no lock
        // another thread of this process could hold.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                draw_into(&mut buf, draw);
                let code = i32::from(file.write_all(&buf).is_err());
                // SAFETY: ends the child at once, running nothing of the parent's.
                unsafe { nix::libc::_exit(code) };
            }
            nix::unistd::ForkResult::Parent { child } => children.push(child),
        }
    }
    for child in children {
        let status = nix::sys::wait::waitpid(child, None).unwrap();
        assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
    }
    draw_into(&mut buf, draw);
    let mut ids: Vec<[u8; ID_LEN]> = vec![*first.as_bytes()];
    let mut add = |bytes: &[u8]| {
        ids.extend(
            bytes
                .chunks_exact(ID_LEN)
                .map(|chunk| <[u8; ID_LEN]>::try_from(chunk).unwrap()),
        )
    };
    add(&buf);
    for mut file in files {
        let mut bytes = Vec::new();
        file.rewind().unwrap();
        file.read_to_end(&mut bytes).unwrap();
        assert_eq!(
            bytes.len(),
            IDS_PER_PROCESS * ID_LEN,
            "a child wrote its ids"
        );
        add(&bytes);
    }
    ids
}

#[test]
fn forked_children_never_draw_the_same_ids() {
    let ids = ids_of_forked_children(random_object_id);
    assert_eq!(ids.len(), 1 + (CHILDREN + 1) * IDS_PER_PROCESS);
    let distinct: HashSet<_> = ids.iter().collect();
    assert_eq!(
        distinct.len(),
        ids.len(),
        "{} ids repeat",
        ids.len() - distinct.len()
    );
}
