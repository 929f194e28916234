//! Passing file descriptors over a Unix socket (SCM_RIGHTS): how a client receives the
//! arenas' memory fds from the daemon, once per connection.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// Most fds one message may carry.
pub const MAX_FDS_PER_MESSAGE: usize = 64;

/// Sends `data` with `fds` attached to its first byte. Returns the bytes sent, which may be
/// fewer than `data.len()` on a non-blocking socket; the caller writes the rest normally.
pub fn send_with_fds(
    socket: BorrowedFd<'_>,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<usize> {
    assert!(
        fds.len() <= MAX_FDS_PER_MESSAGE,
        "too many fds in one message"
    );
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let control = [ControlMessage::ScmRights(&raw)];
    let iov = [IoSlice::new(data)];
    sendmsg::<()>(
        socket.as_raw_fd(),
        &iov,
        &control,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(std::io::Error::from)
}

/// Receives into `buf` and takes ownership of any fds that came with the bytes.
pub fn recv_with_fds(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    let mut control = nix::cmsg_space!([RawFd; MAX_FDS_PER_MESSAGE]);
    let mut iov = [IoSliceMut::new(buf)];
    let message = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut control),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let mut fds = Vec::new();
    for cmsg in message.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            for raw in received {
                // SAFETY: the kernel just installed this fd in our table for this message;
                // nothing else in the process knows it, so we are its only owner.
                fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
    }
    if message.flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err(std::io::Error::other(
            "fds were truncated: more than the limit were sent",
        ));
    }
    Ok((message.bytes, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn an_fd_crosses_the_socket() {
        let (left, right) = UnixStream::pair().unwrap();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"shared").unwrap();
        let sent = send_with_fds(left.as_fd(), b"hi", &[file.as_fd()]).unwrap();
        assert_eq!(sent, 2);
        let mut buf = [0u8; 16];
        let (n, fds) = recv_with_fds(right.as_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..n], b"hi");
        assert_eq!(fds.len(), 1);
        let mut received = std::fs::File::from(fds.into_iter().next().unwrap());
        received.rewind().unwrap();
        let mut text = String::new();
        received.read_to_string(&mut text).unwrap();
        assert_eq!(text, "shared");
    }
}
