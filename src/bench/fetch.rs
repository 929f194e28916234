//! `bench fetch`: fetch bandwidth and latency between daemons on this machine, by object size
//! and transfer mode, next to a raw TCP stream between the same kind of endpoints measured in
//! the same run (the ceiling of the TCP fabric).
//!
//! Each mode runs its own two-daemon cluster (`skyriver up`) with the eager threshold forced
//! (eager: as large as the receive slots allow; rendezvous: 0) or chosen by the cost model
//! (auto). One iteration fetches an object held by node 0 into node 1 and then deletes the copy,
//! so every iteration moves the bytes again.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use super::{BenchError, CaseResult, MachineInfo, Timer};
use crate::client::Client;
use crate::size::{format_bytes, ByteSize};
use crate::up::{LocalCluster, UpArgs};
use skyriver_core::ObjectId;

/// Options of `bench fetch`.
#[derive(Args, Debug, Clone)]
pub struct FetchArgs {
    /// Object sizes to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1KiB,64KiB,1MiB,16MiB,64MiB"
    )]
    pub sizes: Vec<ByteSize>,
    /// Transfer modes to compare.
    #[arg(long, value_delimiter = ',', default_value = "eager,rendezvous,auto",
          value_parser = ["eager", "rendezvous", "auto"])]
    pub modes: Vec<String>,
    /// Time spent on each size in each mode.
    #[arg(long, default_value_t = 1000)]
    pub millis_per_case: u64,
    /// Most iterations of one case.
    #[arg(long, default_value_t = 2000)]
    pub max_iterations: usize,
    /// Fabric between the two daemons: tcp, or verbs (needs --devices).
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "verbs"])]
    pub fabric: String,
    /// RDMA devices for the verbs fabric: node 0 (holder) and node 1 (requester), e.g. rxe0,rxe1.
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<String>,
    /// Write the results as JSON here.
    #[arg(long, default_value = "bench-fetch.json")]
    pub json: PathBuf,
}

/// One row of the table: a size in one mode.
#[derive(Debug, Clone, Serialize)]
struct FetchRow {
    mode: String,
    #[serde(flatten)]
    result: CaseResult,
    /// Bandwidth relative to the raw TCP stream at this size.
    ratio_to_tcp: f64,
}

fn threshold_flag(mode: &str) -> &'static str {
    match mode {
        "eager" => "1GiB",
        "rendezvous" => "0",
        _ => "auto",
    }
}

pub(super) fn run(args: &FetchArgs) -> Result<(), BenchError> {
    let largest = args.sizes.iter().map(|s| s.0).max().unwrap_or(0);
    let memory = ByteSize((largest * 3).max(128 << 20));
    let timer = Timer {
        budget: Duration::from_millis(args.millis_per_case),
        max_iterations: args.max_iterations,
    };
    eprintln!("raw TCP stream baseline...");
    let mut tcp = Vec::new();
    for &ByteSize(size) in &args.sizes {
        tcp.push(raw_tcp_case(size, &timer)?);
    }
    let exe = std::env::current_exe().map_err(|e| BenchError::Setup(e.to_string()))?;
    let mut rows = Vec::new();
    for mode in &args.modes {
        eprintln!(
            "mode {mode}: starting two daemons with {} each...",
            format_bytes(memory.0)
        );
        let mut up = UpArgs::new(2, memory, None);
        up.eager_threshold = threshold_flag(mode).into();
        up.fabric = args.fabric.clone();
        up.devices = args.devices.clone();
        let cluster = LocalCluster::start(&up, &exe).map_err(BenchError::Setup)?;
        let holder = Client::connect(&cluster.sockets[0])?;
        let requester = Client::connect(&cluster.sockets[1])?;
        for (index, &ByteSize(size)) in args.sizes.iter().enumerate() {
            eprintln!("  {mode} {}...", format_bytes(size));
            let id = ObjectId::from_u64(0xfe7c_0000 + index as u64);
            holder.create_and_seal(id, &vec![0x5a; size as usize], b"")?;
            let mut samples = timer.measure(
                |_| Ok(()),
                |()| {
                    let object = requester.fetch_one(id, Some(Duration::from_secs(120)))?;
                    std::hint::black_box(object.data().as_ptr());
                    Ok(())
                },
                |()| {
                    requester.flush()?;
                    requester.delete(&[id])?;
                    Ok(())
                },
            )?;
            let result = CaseResult::from_samples("fetch", size, &mut samples);
            let ratio_to_tcp = result.mb_per_sec / tcp[index].mb_per_sec.max(f64::MIN_POSITIVE);
            rows.push(FetchRow {
                mode: mode.clone(),
                result,
                ratio_to_tcp,
            });
        }
        let view = requester.nodes()?;
        if let Some(peer) = view.members.iter().find(|m| m.node != view.node) {
            eprintln!("  link: {}", peer.link);
        }
        drop(cluster);
    }
    print_table(&tcp, &rows, &args.modes);
    let document = serde_json::json!({
        "benchmark": "fetch",
        "fabric": args.fabric,
        "machine": MachineInfo::probe(),
        "raw_tcp": tcp,
        "results": rows,
    });
    std::fs::write(
        &args.json,
        serde_json::to_string_pretty(&document).expect("results serialize"),
    )
    .map_err(|e| BenchError::Setup(format!("cannot write {}: {e}", args.json.display())))?;
    eprintln!("wrote {}", args.json.display());
    Ok(())
}

fn print_table(tcp: &[CaseResult], rows: &[FetchRow], modes: &[String]) {
    println!(
        "{:>10} {:>12} {:>10} | {:>11} {:>9} {:>9} {:>7} per mode",
        "size", "tcp MB/s", "tcp p50µs", "mode", "MB/s", "p50 µs", "vs tcp"
    );
    for (index, base) in tcp.iter().enumerate() {
        for (m, mode) in modes.iter().enumerate() {
            let Some(row) = rows.iter().filter(|r| &r.mode == mode).nth(index) else {
                continue;
            };
            let (size, tcp_bw, tcp_p50) = if m == 0 {
                (
                    format_bytes(base.size_bytes),
                    format!("{:.1}", base.mb_per_sec),
                    format!("{:.1}", base.p50_us),
                )
            } else {
                (String::new(), String::new(), String::new())
            };
            println!(
                "{size:>10} {tcp_bw:>12} {tcp_p50:>10} | {:>11} {:>9.1} {:>9.1} {:>6.2}x",
                mode, row.result.mb_per_sec, row.result.p50_us, row.ratio_to_tcp
            );
        }
    }
}

/// One "fetch" over a plain TCP connection: a one-byte request, then `size` bytes streamed
/// from a buffer into a buffer. Same request/response shape as a fetch, no store around it.
fn raw_tcp_case(size: u64, timer: &Timer) -> Result<CaseResult, BenchError> {
    let setup = |e: std::io::Error| BenchError::Setup(format!("raw TCP baseline: {e}"));
    let listener = TcpListener::bind("127.0.0.1:0").map_err(setup)?;
    let addr = listener.local_addr().map_err(setup)?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut stream, _) = listener.accept()?;
        stream.set_nodelay(true)?;
        let payload = vec![0x5au8; size as usize];
        let mut request = [0u8; 1];
        while stream.read_exact(&mut request).is_ok() {
            stream.write_all(&payload)?;
        }
        Ok(())
    });
    let mut stream = TcpStream::connect(addr).map_err(setup)?;
    stream.set_nodelay(true).map_err(setup)?;
    let mut buffer = vec![0u8; size as usize];
    let mut samples = timer.measure(
        |_| Ok(()),
        |()| {
            stream.write_all(&[1]).map_err(setup)?;
            stream.read_exact(&mut buffer).map_err(setup)?;
            Ok(())
        },
        |()| Ok(()),
    )?;
    drop(stream);
    let _ = server.join();
    let started = Instant::now();
    let result = CaseResult::from_samples("raw tcp", size, &mut samples);
    std::hint::black_box(started);
    Ok(result)
}
