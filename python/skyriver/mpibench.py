"""The multi-node MPI benchmark, as the source thesis measured Plasma: ``mpirun -np N python -m
skyriver.mpibench``.

Every rank attaches to the Skyriver daemon of its node. For each size, in every iteration, rank
0 puts a new object; after a barrier every other rank fetches it at once (timed from the
barrier to the bytes being in its node's store), then the same bytes move from rank 0 to every
other rank through two baselines, in turn, in the same iteration:

- ``plasma-4k``: the Plasma-style TCP path: rank 0 serves the object over TCP, written and
  read 4 KiB at a time (Plasma's manager's chunk size), one connection per receiving rank;
- ``mpi``: raw ``mpi4py`` ``Send``/``Recv`` of the same bytes from rank 0 to every other rank.

Per size and system the ranks' times are gathered on rank 0, which prints one table:
aggregate bandwidth (bytes received by all ranks / the slowest rank's time), per-rank bandwidth,
p50/p99 of the ranks' times, and Skyriver's aggregate bandwidth as a ratio to each baseline.

Rank → node (which daemon a rank uses): ``--node N``; else ``SKYRIVER_NODE``; else, when a
socket template is given (one machine, one daemon per namespace: ``--socket-template
'/tmp/sky/node-{node}.sock'``), ``OMPI_COMM_WORLD_LOCAL_RANK`` (or ``SLURM_LOCALID``) modulo
``--nodes``; else ``SLURM_NODEID``; else the index of this rank's host among the job's hosts.
The socket is ``--socket``, else the template with the node, else ``SKYRIVER_SOCKET``, else the
default. Under ``deploy/slurm/skyriver.sbatch`` nothing needs to be given.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

CHUNK_BYTES = 4096
UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 1000, "mb": 10**6, "gb": 10**9}


def parse_size(text: str) -> int:
    lower = text.strip().lower()
    number = lower.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = lower[len(number):] or "b"
    if unit not in UNITS or not number:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size like 64KiB or 16MiB")
    return int(float(number) * UNITS[unit])


def show_size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def expected_bytes(size: int, seed: int) -> bytes:
    """The object's bytes, which every rank can make for itself to check what it fetched."""
    return random.Random(seed).randbytes(size)


def object_id(skyriver: Any, run: int, size: int, iteration: int) -> Any:
    binary = b"mpib" + run.to_bytes(8, "big") + size.to_bytes(5, "big") + iteration.to_bytes(3, "big")
    return skyriver.ObjectID(binary)


def choose_node(args: argparse.Namespace, comm: Any) -> Tuple[int, str]:
    """This rank's node index, and where it came from."""
    if args.node is not None:
        return args.node, "--node"
    if "SKYRIVER_NODE" in os.environ:
        return int(os.environ["SKYRIVER_NODE"]), "SKYRIVER_NODE"
    template = args.socket_template or os.environ.get("SKYRIVER_SOCKET_TEMPLATE")
    if template and args.socket is None:
        for variable in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"):
            if variable in os.environ:
                return int(os.environ[variable]) % max(args.nodes, 1), variable
    if "SLURM_NODEID" in os.environ:
        return int(os.environ["SLURM_NODEID"]), "SLURM_NODEID"
    hosts = comm.allgather(socket.gethostname())
    return sorted(set(hosts)).index(hosts[comm.Get_rank()]), "host name"


def choose_socket(args: argparse.Namespace, node: int) -> Optional[str]:
    if args.socket is not None:
        return args.socket
    template = args.socket_template or os.environ.get("SKYRIVER_SOCKET_TEMPLATE")
    if template:
        return template.format(node=node)
    return os.environ.get("SKYRIVER_SOCKET")


def advertised_host(client: Any) -> str:
    """The address other nodes reach this node at: its daemon's published fabric address."""
    view = client.nodes()
    for member in view.get("members", []):
        if member.get("node") == view.get("node"):
            host = str(member.get("address", "")).rsplit(":", 1)[0]
            if host and host not in ("0.0.0.0", "[::]"):
                return host
    return socket.gethostbyname(socket.gethostname())


class PlasmaServer:
    """Rank 0's side of the Plasma-style path: a length request is answered with a header and
    the bytes in 4 KiB writes, one thread per connection."""

    def __init__(self, host: str, connections: int) -> None:
        self.listener = socket.create_server((host, 0))
        self.address = (host, self.listener.getsockname()[1])
        self.data = memoryview(b"")
        self.threads = [threading.Thread(target=self._accept, args=(connections,), daemon=True)]
        self.threads[0].start()

    def _accept(self, connections: int) -> None:
        for _ in range(connections):
            connection, _ = self.listener.accept()
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            thread = threading.Thread(target=self._serve, args=(connection,), daemon=True)
            thread.start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            while True:
                request = connection.recv(8, socket.MSG_WAITALL)
                if len(request) < 8:
                    return
                length = int.from_bytes(request, "little")
                data = self.data[:length]
                connection.sendall(length.to_bytes(8, "little"))
                for start in range(0, length, CHUNK_BYTES):
                    connection.sendall(data[start:start + CHUNK_BYTES])


def plasma_pull(connection: socket.socket, buffer: memoryview) -> None:
    connection.sendall(len(buffer).to_bytes(8, "little"))
    header = connection.recv(8, socket.MSG_WAITALL)
    length = int.from_bytes(header, "little")
    if length != len(buffer):
        raise RuntimeError(f"plasma-4k: expected {len(buffer)} bytes, the server sends {length}")
    position = 0
    while position < length:
        received = connection.recv_into(buffer[position:position + CHUNK_BYTES])
        if received == 0:
            raise RuntimeError("plasma-4k: the server closed the connection")
        position += received


def summarize(samples: List[List[float]], size: int) -> Dict[str, float]:
    """samples: per iteration, every receiving rank's time in seconds."""
    aggregate = []
    per_rank = []
    times = []
    for iteration in samples:
        if not iteration:
            continue
        aggregate.append(size * len(iteration) / max(max(iteration), 1e-9) / 1e6)
        per_rank.extend(size / max(t, 1e-9) / 1e6 for t in iteration)
        times.extend(iteration)
    times.sort()

    def percentile(p: float) -> float:
        if not times:
            return 0.0
        return times[round((len(times) - 1) * p)] * 1e6

    return {
        "aggregate_mb_per_sec": statistics.fmean(aggregate) if aggregate else 0.0,
        "per_rank_mb_per_sec": statistics.fmean(per_rank) if per_rank else 0.0,
        "p50_us": percentile(0.5),
        "p99_us": percentile(0.99),
        "samples": len(times),
    }


def table(rows: List[Dict[str, Any]], systems: Sequence[str]) -> str:
    lines = []
    header = f"{'size':>9} {'system':<10} {'aggr MB/s':>11} {'rank MB/s':>11} {'p50 µs':>11} {'p99 µs':>11}"
    baselines = [s for s in systems if s != "skyriver"]
    header += "".join(f" {'×' + b:>11}" for b in baselines)
    lines.append(header)
    last = None
    for row in rows:
        size = show_size(row["size_bytes"]) if row["size_bytes"] != last else ""
        last = row["size_bytes"]
        line = (
            f"{size:>9} {row['system']:<10} {row['aggregate_mb_per_sec']:>11.1f} "
            f"{row['per_rank_mb_per_sec']:>11.1f} {row['p50_us']:>11.1f} {row['p99_us']:>11.1f}"
        )
        for baseline in baselines:
            ratio = row.get("ratios", {}).get(baseline)
            line += f" {ratio:>10.2f}x" if ratio is not None else " " * 12
        lines.append(line)
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m skyriver.mpibench",
        description="Multi-node fetch benchmark under MPI: Skyriver next to a Plasma-style "
        "4 KiB TCP path and raw mpi4py Send/Recv of the same bytes.",
    )
    parser.add_argument("--sizes", default="1KiB,64KiB,1MiB,16MiB,64MiB",
                        type=lambda t: [parse_size(s) for s in t.split(",") if s])
    parser.add_argument("--iterations", type=int, default=5, help="iterations per size and system")
    parser.add_argument("--baselines", default="plasma-4k,mpi",
                        help="comma-separated: plasma-4k, mpi (none: '')")
    parser.add_argument("--socket", help="this rank's daemon socket")
    parser.add_argument("--socket-template",
                        help="one machine, one daemon per node: a path with {node}, e.g. /tmp/sky/node-{node}.sock")
    parser.add_argument("--node", type=int, help="this rank's node index")
    parser.add_argument("--nodes", type=int, default=int(os.environ.get("SKYRIVER_NODES", "0") or 0),
                        help="daemons behind --socket-template [number of ranks]")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per fetch")
    parser.add_argument("--json", help="write the results here (rank 0)")
    parser.add_argument("--no-verify", action="store_true", help="skip checking the fetched bytes")
    parser.add_argument("--no-hint", action="store_true",
                        help="fetch without naming rank 0's node (every fetch looks the object up)")
    args = parser.parse_args(argv)

    from mpi4py import MPI

    import skyriver

    comm = MPI.COMM_WORLD
    rank, ranks = comm.Get_rank(), comm.Get_size()
    if ranks < 2:
        print("skyriver.mpibench: needs at least 2 ranks (mpirun -np N, N >= 2)", file=sys.stderr)
        return 2
    if not args.nodes:
        args.nodes = ranks
    baselines = [b for b in args.baselines.split(",") if b]
    for baseline in baselines:
        if baseline not in ("plasma-4k", "mpi"):
            parser.error(f"unknown baseline {baseline!r}")
    systems = ["skyriver"] + baselines

    node, node_source = choose_node(args, comm)
    socket_path = choose_socket(args, node)
    client = skyriver.connect(socket_path)
    attached = comm.gather((rank, node, node_source, str(client.socket), client.node, socket.gethostname()), root=0)
    if rank == 0:
        print(f"skyriver.mpibench: {ranks} ranks, MPI {MPI.Get_library_version().splitlines()[0].strip()}")
        for r, n, source, path, daemon_node, host in attached:
            print(f"  rank {r} on {host}: node {n} (from {source}), daemon node-{daemon_node} at {path}")
        sys.stdout.flush()

    run = comm.bcast(random.getrandbits(63) if rank == 0 else None, root=0)
    # The program knows the producer (rank 0): its node is every fetch's hint, so no fetch
    # waits for a directory lookup (`--no-hint` measures the lookup too).
    producer = comm.bcast(client.node if rank == 0 else None, root=0)
    hint = None if args.no_hint else producer
    largest = max(args.sizes)

    # Plasma-style path: rank 0 serves, every other rank holds one connection to it.
    plasma_server = None
    plasma_connection = None
    if "plasma-4k" in baselines:
        address = None
        if rank == 0:
            plasma_server = PlasmaServer(advertised_host(client), ranks - 1)
            address = plasma_server.address
        address = comm.bcast(address, root=0)
        if rank != 0:
            plasma_connection = socket.create_connection(address)
            plasma_connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    receive = bytearray(largest) if rank != 0 else bytearray()
    # Fault the pages in, as a store's arena is.
    for offset in range(0, len(receive), 4096):
        receive[offset] = 1

    rows: List[Dict[str, Any]] = []
    for size in args.sizes:
        data = expected_bytes(size, run ^ size) if rank == 0 or not args.no_verify else b""
        if plasma_server is not None:
            plasma_server.data = memoryview(data)
        samples: Dict[str, List[List[float]]] = {s: [] for s in systems}
        for iteration in range(args.iterations):
            oid = object_id(skyriver, run, size, iteration)
            if rank == 0:
                client.put(data, id=oid)
                # Untimed: published in the directory before anyone asks for it.
                deadline = time.monotonic() + 10
                while not client.locate(oid)["holders"] and time.monotonic() < deadline:
                    time.sleep(0.0002)
            for system in systems:
                comm.Barrier()
                began = time.perf_counter()
                fetched = None
                if rank != 0:
                    if system == "skyriver":
                        fetched = client.fetch(oid, timeout=args.timeout, hint=hint)
                    elif system == "plasma-4k":
                        assert plasma_connection is not None
                        plasma_pull(plasma_connection, memoryview(receive)[:size])
                    else:
                        comm.Recv([receive, size, MPI.BYTE], source=0, tag=iteration)
                elif system == "mpi":
                    requests = [comm.Isend([data, size, MPI.BYTE], dest=r, tag=iteration) for r in range(1, ranks)]
                    MPI.Request.Waitall(requests)
                took = time.perf_counter() - began
                if rank != 0 and iteration == 0 and not args.no_verify:
                    with memoryview(fetched) if fetched is not None else memoryview(receive)[:size] as got:
                        intact = got == memoryview(data)
                    if not intact:
                        raise SystemExit(f"rank {rank}: {system} delivered other bytes at {show_size(size)}")
                if fetched is not None:
                    fetched.release()
                times = comm.gather(took if rank != 0 else None, root=0)
                if rank == 0:
                    samples[system].append([t for t in times if t is not None])
            # Untimed: every copy goes, so the next iteration moves the bytes again.
            comm.Barrier()
            try:
                client.delete(oid)
            except skyriver.SkyriverError:
                pass
            client.flush()
            comm.Barrier()
        if rank == 0:
            case = [dict(system=s, size_bytes=size, **summarize(samples[s], size)) for s in systems]
            for row in case:
                row["ratios"] = {
                    base["system"]: row["aggregate_mb_per_sec"] / max(base["aggregate_mb_per_sec"], 1e-12)
                    for base in case
                    if base["system"] != row["system"] and base["system"] != "skyriver"
                }
            rows.extend(case)
            print(f"  {show_size(size)} done", file=sys.stderr)

    if plasma_connection is not None:
        plasma_connection.close()
    if rank == 0:
        print()
        print(f"fetch from rank 0 to the other {ranks - 1} ranks, {args.iterations} iterations per size "
              "(ratios: aggregate bandwidth / the baseline's)")
        print(table(rows, systems))
        if args.json:
            document = {
                "benchmark": "mpibench",
                "ranks": ranks,
                "attached": [dict(rank=a[0], node=a[1], node_from=a[2], socket=a[3], daemon_node=a[4], host=a[5])
                             for a in attached],
                "iterations": args.iterations,
                "chunk_bytes_plasma": CHUNK_BYTES,
                "results": rows,
            }
            with open(args.json, "w") as out:
                json.dump(document, out, indent=2)
            print(f"wrote {args.json}", file=sys.stderr)
    comm.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
