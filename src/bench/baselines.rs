//! Baselines measured next to Skyriver in the same run, each a [`Prepared`] system whose
//! workers time one transfer per call:
//!
//! - streams: `tcp`, one untuned TCP stream (default socket buffers, the object in one
//!   `write_all`, read with one `read_exact`); `tcp-tuned`, the same with the TCP fabric's
//!   socket buffers (`SO_SNDBUF`/`SO_RCVBUF`) and its write size (one READ slice per `write`):
//!   the ceiling Skyriver's fetches over the TCP fabric are held to;
//! - round trips, the floor of any small request: `uds-rtt` and `tcp-rtt` (1 byte each way
//!   over a Unix socket and over TCP loopback) and `tcp-rr-1k` (1 KiB request, 1 KiB response).
//!   Both ends poll for the next message before they block for as long as Skyriver's daemon
//!   and client do (`SKYRIVER_POLL_US`, [`skyriver_transport::poll`]): the same tuning, or a quiet machine
//!   would charge the floor wake-ups that Skyriver's polling avoids;
//! - other systems' ways of moving an object: `plasma-4k` (Plasma's manager: 4 KiB chunks, a
//!   syscall each), `chunked-5m` (a chunked pull like Ray's object manager: a request per 5 MiB
//!   chunk) and `redis` (`GET` from a local `redis-server`, RESP spoken directly).
//!
//! Every server thread runs on the far CPU of the run's placement (`--cpus`), the client
//! wherever the calling thread is bound.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{pin_process, pin_this_thread, BenchError};
use crate::up::free_loopback_port;

/// One iteration of one system, on one client thread; returns the time of the transfer itself
/// (a Skyriver iteration also deletes its copy afterwards, untimed).
pub(super) type Worker = Box<dyn FnMut() -> Result<Duration, BenchError> + Send>;

/// Times `transfer`.
pub(super) fn timed(
    transfer: impl FnOnce() -> Result<(), BenchError>,
) -> Result<Duration, BenchError> {
    let begin = Instant::now();
    transfer()?;
    Ok(begin.elapsed())
}

/// A system under measurement at one size: one worker per concurrent client, and what to
/// undo afterwards.
pub(super) struct Prepared {
    pub(super) name: String,
    pub(super) workers: Vec<Worker>,
    pub(super) cleanup: Option<Box<dyn FnOnce()>>,
}

pub(super) fn setup_error(what: &str) -> impl Fn(std::io::Error) -> BenchError + '_ {
    move |e| BenchError::Io {
        what: what.to_string(),
        source: e,
    }
}

/// A server thread per connection, bound to `cpu`, answering each request with `serve`.
fn spawn_server(
    concurrency: usize,
    cpu: Option<usize>,
    serve: impl Fn(TcpStream) -> std::io::Result<()> + Send + Sync + 'static,
) -> Result<std::net::SocketAddr, BenchError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(setup_error("baseline listener"))?;
    let addr = listener
        .local_addr()
        .map_err(setup_error("baseline listener"))?;
    let serve = std::sync::Arc::new(serve);
    std::thread::spawn(move || {
        for _ in 0..concurrency {
            let Ok((stream, _)) = listener.accept() else {
                return;
            };
            let _ = stream.set_nodelay(true);
            let serve = serve.clone();
            std::thread::spawn(move || {
                if pin_server(cpu) {
                    let _ = serve(stream);
                }
            });
        }
    });
    Ok(addr)
}

pub(super) fn connect(addr: std::net::SocketAddr) -> Result<TcpStream, BenchError> {
    let stream = TcpStream::connect(addr).map_err(setup_error("baseline connect"))?;
    stream
        .set_nodelay(true)
        .map_err(setup_error("baseline connect"))?;
    Ok(stream)
}

/// A destination buffer with its pages already faulted in, like a store's arena.
pub(super) fn destination(size: u64) -> Vec<u8> {
    let mut buffer = vec![0u8; size as usize];
    buffer.iter_mut().step_by(4096).for_each(|b| *b = 1);
    buffer
}

/// How a raw TCP stream baseline sets up its sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StreamTuning {
    /// Kernel defaults (autotuned buffers), the object in one `write_all`.
    Default,
    /// The TCP fabric's socket buffers, the object written one READ slice at a time.
    Fabric,
}

/// The fabric's settings the tuned stream copies: socket buffer bytes and write bytes.
pub(super) fn fabric_stream_settings() -> (usize, usize) {
    let slice = skyriver_core::NodeConfig::new(skyriver_core::NodeId(0), 0).read_slice_bytes;
    (
        skyriver_transport::fabric::tcp::SOCKET_BUFFER_SIZE_BYTES,
        usize::try_from(slice).unwrap_or(usize::MAX),
    )
}

/// Sets the fabric's socket buffer sizes on `stream` (as the fabric does, after connecting).
fn set_fabric_buffers(stream: &TcpStream) -> std::io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    let (buffer, _) = fabric_stream_settings();
    setsockopt(stream, sockopt::SndBuf, &buffer)?;
    setsockopt(stream, sockopt::RcvBuf, &buffer)?;
    Ok(())
}

fn tune(stream: &TcpStream, tuning: StreamTuning) -> Result<(), BenchError> {
    if tuning == StreamTuning::Fabric {
        set_fabric_buffers(stream).map_err(setup_error("tuned TCP stream"))?;
    }
    Ok(())
}

/// A raw TCP stream: a one-byte request, then the object, read with one `read_exact` into a
/// pre-faulted destination.
pub(super) fn tcp_stream(
    size: u64,
    concurrency: usize,
    cpu: usize,
    tuning: StreamTuning,
) -> Result<Prepared, BenchError> {
    let payload = std::sync::Arc::new(vec![0x5au8; size as usize]);
    let (_, slice) = fabric_stream_settings();
    let write_bytes = match tuning {
        StreamTuning::Default => usize::MAX,
        StreamTuning::Fabric => slice.max(1),
    };
    let addr = spawn_server(concurrency, Some(cpu), move |mut stream| {
        if tuning == StreamTuning::Fabric {
            set_fabric_buffers(&stream)?;
        }
        let mut request = [0u8; 1];
        while stream.read_exact(&mut request).is_ok() {
            for piece in payload.chunks(write_bytes.min(payload.len().max(1))) {
                stream.write_all(piece)?;
            }
        }
        Ok(())
    })?;
    let name = match tuning {
        StreamTuning::Default => "tcp",
        StreamTuning::Fabric => "tcp-tuned",
    };
    let mut workers: Vec<Worker> = Vec::new();
    for _ in 0..concurrency {
        let mut stream = connect(addr)?;
        tune(&stream, tuning)?;
        let mut buffer = destination(size);
        workers.push(Box::new(move || {
            timed(|| {
                stream.write_all(&[1]).map_err(setup_error(name))?;
                stream.read_exact(&mut buffer).map_err(setup_error(name))?;
                Ok(())
            })
        }));
    }
    Ok(Prepared {
        name: name.into(),
        workers,
        cleanup: None,
    })
}

/// Echoes `bytes`-byte requests with `bytes`-byte responses until the peer closes. Like the
/// daemon, it polls for the next request for a while (`SKYRIVER_POLL_US`) before it blocks.
fn echo(mut stream: impl Read + Write + AsRawFd, bytes: usize) -> std::io::Result<()> {
    let mut message = vec![0u8; bytes];
    let poll = skyriver_transport::poll::poll_from_env();
    loop {
        skyriver_transport::poll::wait_readable(stream.as_raw_fd(), poll);
        if stream.read_exact(&mut message).is_err() {
            return Ok(());
        }
        stream.write_all(&message)?;
    }
}

/// A ping-pong worker: `bytes` out, `bytes` back, timed. Like the client awaiting a reply, it
/// polls for the answer for a while (`SKYRIVER_POLL_US`) before it blocks.
fn ping_pong(
    mut stream: impl Read + Write + AsRawFd + Send + 'static,
    bytes: usize,
    name: &'static str,
) -> Worker {
    let mut message = vec![0x5au8; bytes];
    let poll = skyriver_transport::poll::poll_from_env();
    Box::new(move || {
        timed(|| {
            stream.write_all(&message).map_err(setup_error(name))?;
            skyriver_transport::poll::wait_readable(stream.as_raw_fd(), poll);
            stream.read_exact(&mut message).map_err(setup_error(name))?;
            Ok(())
        })
    })
}

/// Binds a baseline server's thread to `cpu` (`None`: where the scheduler puts it); whether
/// it may serve.
fn pin_server(cpu: Option<usize>) -> bool {
    cpu.is_none_or(|cpu| pin_this_thread(cpu).is_ok())
}

/// A round trip over a Unix socket pair: 1 byte each way, the server on `cpu` (`None`:
/// anywhere) (what a local request to the daemon costs at least).
pub(super) fn uds_round_trip(cpu: Option<usize>) -> Result<Prepared, BenchError> {
    let (client, server) = UnixStream::pair().map_err(setup_error("uds-rtt"))?;
    std::thread::spawn(move || {
        if pin_server(cpu) {
            let _ = echo(server, 1);
        }
    });
    Ok(Prepared {
        name: "uds-rtt".into(),
        workers: vec![ping_pong(client, 1, "uds-rtt")],
        cleanup: None,
    })
}

/// A request/response over TCP loopback with `bytes` each way (1: `tcp-rtt`, 1024:
/// `tcp-rr-1k`), the server on `cpu` (`None`: anywhere) (what a hop between daemons costs at
/// least).
pub(super) fn tcp_round_trip(bytes: usize, cpu: Option<usize>) -> Result<Prepared, BenchError> {
    let name = if bytes == 1 { "tcp-rtt" } else { "tcp-rr-1k" };
    let addr = spawn_server(1, cpu, move |stream| echo(stream, bytes))?;
    Ok(Prepared {
        name: name.into(),
        workers: vec![ping_pong(connect(addr)?, bytes, name)],
        cleanup: None,
    })
}

/// Plasma's manager: the object size first, then the object in 4 KiB chunks, one `write` per
/// chunk on the sender and one `read` of at most 4 KiB per step on the receiver.
pub(super) fn plasma_chunks(
    size: u64,
    concurrency: usize,
    cpu: usize,
) -> Result<Prepared, BenchError> {
    const CHUNK: usize = 4096;
    let payload = std::sync::Arc::new(vec![0x5au8; size as usize]);
    let addr = spawn_server(concurrency, Some(cpu), move |mut stream| {
        let mut request = [0u8; 1];
        while stream.read_exact(&mut request).is_ok() {
            stream.write_all(&(payload.len() as u64).to_le_bytes())?;
            for chunk in payload.chunks(CHUNK) {
                stream.write_all(chunk)?;
            }
        }
        Ok(())
    })?;
    let mut workers: Vec<Worker> = Vec::new();
    for _ in 0..concurrency {
        let mut stream = connect(addr)?;
        let mut buffer = destination(size);
        workers.push(Box::new(move || {
            timed(|| {
                let io = setup_error("plasma-4k");
                stream.write_all(&[1]).map_err(&io)?;
                let mut header = [0u8; 8];
                stream.read_exact(&mut header).map_err(&io)?;
                let len = u64::from_le_bytes(header) as usize;
                let mut cursor = 0;
                while cursor < len {
                    let end = (cursor + CHUNK).min(len);
                    let n = stream.read(&mut buffer[cursor..end]).map_err(&io)?;
                    if n == 0 {
                        return Err(BenchError::Check("plasma-4k: server closed".into()));
                    }
                    cursor += n;
                }
                Ok(())
            })
        }));
    }
    Ok(Prepared {
        name: "plasma-4k".into(),
        workers,
        cleanup: None,
    })
}

/// A chunked pull like Ray's object manager: a request per 5 MiB chunk (offset, length), the
/// chunk read straight into place.
pub(super) fn pulled_chunks(
    size: u64,
    concurrency: usize,
    cpu: usize,
) -> Result<Prepared, BenchError> {
    const CHUNK: u64 = 5 << 20;
    let payload = std::sync::Arc::new(vec![0x5au8; size as usize]);
    let addr = spawn_server(concurrency, Some(cpu), move |mut stream| {
        let mut request = [0u8; 16];
        while stream.read_exact(&mut request).is_ok() {
            let offset = u64::from_le_bytes(request[..8].try_into().expect("8 bytes")) as usize;
            let len = u64::from_le_bytes(request[8..].try_into().expect("8 bytes")) as usize;
            let chunk = payload
                .get(offset..offset.saturating_add(len))
                .ok_or_else(|| std::io::Error::other("chunk out of range"))?;
            stream.write_all(chunk)?;
        }
        Ok(())
    })?;
    let mut workers: Vec<Worker> = Vec::new();
    for _ in 0..concurrency {
        let mut stream = connect(addr)?;
        let mut buffer = destination(size);
        workers.push(Box::new(move || {
            timed(|| {
                let io = setup_error("chunked-5m");
                let mut offset = 0u64;
                while offset < size || (size == 0 && offset == 0) {
                    let len = CHUNK.min(size - offset);
                    let mut request = [0u8; 16];
                    request[..8].copy_from_slice(&offset.to_le_bytes());
                    request[8..].copy_from_slice(&len.to_le_bytes());
                    stream.write_all(&request).map_err(&io)?;
                    stream
                        .read_exact(&mut buffer[offset as usize..(offset + len) as usize])
                        .map_err(&io)?;
                    offset += len;
                    if size == 0 {
                        break;
                    }
                }
                Ok(())
            })
        }));
    }
    Ok(Prepared {
        name: "chunked-5m".into(),
        workers,
        cleanup: None,
    })
}

/// A `redis-server` on a free loopback port, without persistence, stopped on drop.
pub(super) struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    /// Starts the server with room for values of `largest` bytes, bound to `cpu`.
    pub(super) fn start(largest: u64, cpu: usize) -> Result<Self, BenchError> {
        let port = free_loopback_port().map_err(crate::up::UpError::NoFreePort)?;
        let max_bulk = (largest + (1 << 20)).max(512 << 20).to_string();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .args(["--proto-max-bulk-len", &max_bulk])
            .args(["--client-query-buffer-limit", &max_bulk])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .stdin(Stdio::null())
            .spawn()
            .map_err(|source| BenchError::Spawn {
                program: "redis-server",
                hint: "; install it (ci/install-deps.sh)",
                source,
            })?;
        let server = Self { child, port };
        pin_process(server.child.id(), cpu)?;
        let started = Instant::now();
        loop {
            if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
                let mut reply = [0u8; 7];
                if stream.write_all(b"*1\r\n$4\r\nPING\r\n").is_ok()
                    && stream.read_exact(&mut reply).is_ok()
                {
                    eprintln!("redis baseline: redis-server on 127.0.0.1:{port}");
                    return Ok(server);
                }
            }
            if started.elapsed() > Duration::from_secs(10) {
                return Err(BenchError::NotReady {
                    what: format!("redis-server on 127.0.0.1:{port}"),
                    within: Duration::from_secs(10),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(super) fn prepare(&self, size: u64, concurrency: usize) -> Result<Prepared, BenchError> {
        let io = setup_error("redis");
        let key = format!("skyriver-bench-{size}");
        let mut stream = connect(std::net::SocketAddr::from(([127, 0, 0, 1], self.port)))?;
        let mut command =
            format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${size}\r\n", key.len()).into_bytes();
        command.extend(std::iter::repeat_n(0x5au8, size as usize));
        command.extend_from_slice(b"\r\n");
        stream.write_all(&command).map_err(&io)?;
        drop(command);
        let mut reply = [0u8; 5];
        stream.read_exact(&mut reply).map_err(&io)?;
        if &reply != b"+OK\r\n" {
            return Err(BenchError::BadAnswer {
                server: "redis SET",
                answer: String::from_utf8_lossy(&reply).into_owned(),
            });
        }
        let get = format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).into_bytes();
        let mut workers: Vec<Worker> = Vec::new();
        for _ in 0..concurrency {
            let mut reader = BufReader::with_capacity(
                64 * 1024,
                connect(std::net::SocketAddr::from(([127, 0, 0, 1], self.port)))?,
            );
            let mut buffer = destination(size);
            let get = get.clone();
            let mut line = String::new();
            workers.push(Box::new(move || {
                timed(|| {
                    let io = setup_error("redis GET");
                    reader.get_mut().write_all(&get).map_err(&io)?;
                    line.clear();
                    reader.read_line(&mut line).map_err(&io)?;
                    let len: usize = line
                        .strip_prefix('$')
                        .and_then(|l| l.trim_end().parse().ok())
                        .ok_or_else(|| BenchError::BadAnswer {
                            server: "redis GET",
                            answer: line.clone(),
                        })?;
                    if len != buffer.len() {
                        return Err(BenchError::Check(format!("redis GET returned {len} bytes")));
                    }
                    reader.read_exact(&mut buffer).map_err(&io)?;
                    let mut crlf = [0u8; 2];
                    reader.read_exact(&mut crlf).map_err(&io)?;
                    Ok(())
                })
            }));
        }
        let port = self.port;
        Ok(Prepared {
            name: "redis".into(),
            workers,
            cleanup: Some(Box::new(move || {
                if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
                    let del = format!("*2\r\n$3\r\nDEL\r\n${}\r\n{key}\r\n", key.len());
                    let _ = stream.write_all(del.as_bytes());
                    let mut reply = [0u8; 4];
                    let _ = stream.read_exact(&mut reply);
                }
            })),
        })
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
