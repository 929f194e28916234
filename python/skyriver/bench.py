"""Benchmark from Python, side by side: Skyriver, pyarrow.plasma 11 and Redis (redis-py).

    python -m skyriver.bench [--sizes 1KiB,64KiB,1MiB,16MiB,128MiB] [--millis-per-case 300]
                             [--cpus pinned|spread|any] [--json bench-python.json]

Starts its own daemons with the same memory: a `skyriver daemon` (``--skyriver-bin``,
``$SKYRIVER_BIN``, or ``skyriver`` on PATH), a plasma_store when ``pyarrow.plasma`` is
importable (pyarrow <= 11), and a redis-server when one is on PATH (redis-py installed).
Measures put, get (zero copy; then with a full read of the bytes), contains and delete at
each size, prints a table with p50/p99 and MB/s and the ratios to Plasma and Redis, reports
the targets, and writes JSON. A program, not a test: absolute numbers move with the machine's
load; the ratios, taken in the same run, are what to compare.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket as _socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

import skyriver

OPS = ["put", "get", "get+read", "contains", "delete"]
UNITS = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "b": 1}


def parse_size(text: str) -> int:
    text = text.strip().lower()
    for unit, factor in sorted(UNITS.items(), key=lambda item: -len(item[0])):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def show_size(size: int) -> str:
    for unit, factor in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} B"


def full_read(view: Any) -> int:
    """Touches every byte (a sum over 8-byte words)."""
    return int(np.frombuffer(view, dtype=np.uint64).sum())


class Timings:
    def __init__(self) -> None:
        self.samples_ns: List[int] = []

    def summary(self, size: int) -> Dict[str, float]:
        samples = sorted(self.samples_ns)
        mean_s = statistics.fmean(samples) / 1e9
        return {
            "iterations": len(samples),
            "p50_us": samples[len(samples) // 2] / 1e3,
            "p99_us": samples[min(len(samples) - 1, int(len(samples) * 0.99))] / 1e3,
            "mean_us": mean_s * 1e6,
            "mb_per_sec": size / mean_s / 1e6 if mean_s > 0 else float("inf"),
            "ops_per_sec": 1.0 / mean_s if mean_s > 0 else float("inf"),
        }


def measure(
    budget_s: float,
    setup: Callable[[], Any],
    timed: Callable[[Any], Any],
    teardown: Callable[[Any], None],
    min_iterations: int = 5,
    max_iterations: int = 20000,
) -> Timings:
    timings = Timings()
    for _ in range(2):  # warm-up
        teardown(timed(setup()))
    started = time.perf_counter()
    while len(timings.samples_ns) < max_iterations and (
        len(timings.samples_ns) < min_iterations or time.perf_counter() - started < budget_s
    ):
        state = setup()
        begin = time.perf_counter_ns()
        result = timed(state)
        timings.samples_ns.append(time.perf_counter_ns() - begin)
        teardown(result)
    return timings


def free_port() -> int:
    with _socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Placement:
    """Where the client and the daemons run: `pinned` (all on one CPU: no cross-CPU wake-up),
    `spread` (client on one CPU, daemons on another) or `any` (the scheduler decides)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        cpus = sorted(os.sched_getaffinity(0))
        self.client_cpu = cpus[0]
        self.daemon_cpu = cpus[0] if mode == "pinned" or len(cpus) == 1 else cpus[1]
        if mode != "any":
            os.sched_setaffinity(0, {self.client_cpu})

    def prefix(self) -> List[str]:
        if self.mode == "any" or shutil.which("taskset") is None:
            return []
        return ["taskset", "-c", str(self.daemon_cpu)]

    def describe(self) -> Dict[str, Any]:
        if self.mode == "any":
            return {"mode": "any"}
        return {"mode": self.mode, "client_cpu": self.client_cpu, "daemon_cpu": self.daemon_cpu}


@contextlib.contextmanager
def process(command: List[str], ready: Callable[[], bool], what: str, log: Path) -> Iterator[None]:
    with open(log, "wb") as output:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not ready():
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        yield
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


class System:
    """One store under test: the same five operations on it."""

    name = ""

    def put(self, key: Any, data: np.ndarray) -> None: ...
    def get(self, key: Any) -> None: ...
    def get_read(self, key: Any) -> int: ...
    def contains(self, key: Any) -> bool: ...
    def delete(self, key: Any) -> None: ...
    def new_key(self) -> Any: ...


class SkyriverSystem(System):
    name = "skyriver"

    def __init__(self, socket: Path) -> None:
        self.client = skyriver.connect(socket)

    def new_key(self) -> Any:
        return skyriver.ObjectID.from_random()

    def put(self, key: Any, data: np.ndarray) -> None:
        self.client.put(data, id=key)

    def get(self, key: Any) -> None:
        self.client.get(key, timeout=0).release()

    def get_read(self, key: Any) -> int:
        buffer = self.client.get(key, timeout=0)
        total = full_read(buffer)
        buffer.release()
        return total

    def contains(self, key: Any) -> bool:
        return self.client.contains(key)

    def delete(self, key: Any) -> None:
        self.client.delete(key)


class PlasmaSystem(System):
    name = "plasma"

    def __init__(self, plasma: Any, socket: Path) -> None:
        self.plasma = plasma
        self.client = plasma.connect(str(socket))

    def new_key(self) -> Any:
        return self.plasma.ObjectID(np.random.bytes(20))

    def put(self, key: Any, data: np.ndarray) -> None:
        self.client.put_raw_buffer(data, object_id=key)

    def get(self, key: Any) -> None:
        [buffer] = self.client.get_buffers([key], timeout_ms=0)
        del buffer  # releases, as Plasma's buffers do when they go

    def get_read(self, key: Any) -> int:
        [buffer] = self.client.get_buffers([key], timeout_ms=0)
        total = full_read(buffer)
        del buffer
        return total

    def contains(self, key: Any) -> bool:
        return self.client.contains(key)

    def delete(self, key: Any) -> None:
        self.client.delete([key])


class RedisSystem(System):
    name = "redis"

    def __init__(self, redis: Any, socket: Path) -> None:
        self.client = redis.Redis(unix_socket_path=str(socket))
        self.counter = 0

    def new_key(self) -> Any:
        self.counter += 1
        return f"k{self.counter}".encode()

    def put(self, key: Any, data: np.ndarray) -> None:
        self.client.set(key, memoryview(data))

    def get(self, key: Any) -> None:
        self.client.get(key)  # a copy: Redis has no zero-copy read

    def get_read(self, key: Any) -> int:
        return full_read(self.client.get(key))

    def contains(self, key: Any) -> bool:
        return bool(self.client.exists(key))

    def delete(self, key: Any) -> None:
        self.client.delete(key)


def run_system(system: System, sizes: List[int], budget_s: float, log: Callable[[str], None]) -> List[Dict[str, Any]]:
    results = []
    for size in sizes:
        data = np.frombuffer(np.random.bytes(size), dtype=np.uint8)
        budget = budget_s
        stored = system.new_key()
        system.put(stored, data)
        cases = {
            "put": (lambda: system.new_key(), lambda key: system.put(key, data) or key, system.delete),
            "get": (lambda: stored, system.get, lambda _: None),
            "get+read": (lambda: stored, system.get_read, lambda _: None),
            "contains": (lambda: stored, system.contains, lambda _: None),
            "delete": (lambda: _put_fresh(system, data), system.delete, lambda _: None),
        }
        for op in OPS:
            setup, timed, teardown = cases[op]
            timings = measure(budget, setup, timed, teardown)
            row = {"system": system.name, "op": op, "size_bytes": size, **timings.summary(size)}
            results.append(row)
            log(f"  {system.name:8} {op:9} {show_size(size):>8}: p50 {row['p50_us']:10.1f} us")
        system.delete(stored)
    return results


def _put_fresh(system: System, data: np.ndarray) -> Any:
    key = system.new_key()
    system.put(key, data)
    return key


def numpy_copy_baseline(size: int, budget_s: float) -> Dict[str, float]:
    """A numpy copy of `size` bytes into pre-faulted memory: the ceiling of a put."""
    source = np.frombuffer(np.random.bytes(size), dtype=np.uint8)
    destination = np.empty(size, dtype=np.uint8)
    destination[:] = 1  # fault every page in
    timings = measure(budget_s, lambda: None, lambda _: np.copyto(destination, source), lambda _: None)
    return timings.summary(size)


def table(results: List[Dict[str, Any]], systems: List[str], sizes: List[int]) -> str:
    index = {(r["system"], r["op"], r["size_bytes"]): r for r in results}
    lines = []
    header = f"{'op':9} {'size':>8} | " + " | ".join(
        f"{name + ' p50/p99 us':>24} {'MB/s':>8}" for name in systems
    )
    others = [s for s in systems if s != "skyriver"]
    header += "".join(f" | {'p50 ' + s + '/sky':>13}" for s in others)
    lines.append(header)
    lines.append("-" * len(header))
    for op in OPS:
        for size in sizes:
            cells = []
            for name in systems:
                row = index.get((name, op, size))
                if row is None:
                    cells.append(f"{'-':>24} {'-':>8}")
                else:
                    cells.append(f"{row['p50_us']:>11.1f}/{row['p99_us']:<12.1f} {row['mb_per_sec']:>8.0f}")
            line = f"{op:9} {show_size(size):>8} | " + " | ".join(cells)
            ours = index.get(("skyriver", op, size))
            for name in others:
                theirs = index.get((name, op, size))
                ratio = theirs["p50_us"] / ours["p50_us"] if ours and theirs else float("nan")
                line += f" | {ratio:>12.2f}x"
            lines.append(line)
    return "\n".join(lines)


def targets(results: List[Dict[str, Any]], copy: Optional[Dict[str, float]], sizes: List[int]) -> List[Dict[str, Any]]:
    index = {(r["system"], r["op"], r["size_bytes"]): r for r in results}
    found = []
    small, large = min(sizes), max(sizes)
    for op in ("put", "get"):
        ours, plasma = index.get(("skyriver", op, small)), index.get(("plasma", op, small))
        if ours and plasma:
            ratio = ours["p50_us"] / plasma["p50_us"]
            found.append({"target": f"{op} p50 at {show_size(small)} <= 0.5x Plasma's", "value": f"{ratio:.2f}x", "met": ratio <= 0.5})
        else:
            found.append({"target": f"{op} p50 at {show_size(small)} <= 0.5x Plasma's", "value": "Plasma not measured", "met": None})
    first, last = index.get(("skyriver", "get", small)), index.get(("skyriver", "get", large))
    if first and last:
        spread = last["p50_us"] / first["p50_us"]
        found.append({"target": f"zero-copy get flat in size (p50 {show_size(large)} / {show_size(small)} <= 2)", "value": f"{spread:.2f}x", "met": spread <= 2.0})
    put_large = index.get(("skyriver", "put", large))
    if put_large and copy:
        ratio = put_large["mb_per_sec"] / copy["mb_per_sec"]
        found.append({"target": f"{show_size(large)} put >= 0.8x a numpy copy into pre-faulted memory ({copy['mb_per_sec']:.0f} MB/s)", "value": f"{ratio:.2f}x", "met": ratio >= 0.8})
    return found


def hide_plasma_warnings() -> None:
    """pyarrow.plasma warns that it is deprecated on import and use: those warnings would land
    in the middle of the table, so they are hidden (the output says it once instead)."""
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"pyarrow(\..*)?$")
    warnings.filterwarnings("ignore", message=r"(?i).*plasma.*", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=r"(?i).*plasma.*", category=FutureWarning)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m skyriver.bench",
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", default="1KiB,64KiB,1MiB,16MiB,128MiB",
                        help="object sizes to measure, comma-separated, with B/KiB/MiB/GiB (default %(default)s)")
    parser.add_argument("--millis-per-case", type=int, default=300,
                        help="time spent measuring each operation at each size, in ms (default %(default)s)")
    parser.add_argument("--memory", default="1GiB", help="memory of every store (default %(default)s)")
    parser.add_argument("--cpus", choices=["pinned", "spread", "any"], default="pinned",
                        help="CPU placement: pinned = the benchmark and every store on one CPU, spread = the "
                             "benchmark and the store on different CPUs, any = left to the kernel (default %(default)s)")
    parser.add_argument("--systems", default="skyriver,plasma,redis",
                        help="systems to measure, comma-separated; those not installed are skipped and "
                             "reported (default %(default)s)")
    parser.add_argument("--skyriver-bin", default=os.environ.get("SKYRIVER_BIN") or shutil.which("skyriver"),
                        help="the skyriver binary that runs the daemon (default: $SKYRIVER_BIN, else "
                             "skyriver on PATH)")
    parser.add_argument("--spill-dir", default=None,
                        help="give the skyriver daemon --spill-dir DIR: a full store spills to DIR "
                             "instead of evicting (default: no spill tier)")
    parser.add_argument("--spill-limit", default=None,
                        help="with --spill-dir: most bytes the daemon spills, with B/KiB/MiB/GiB "
                             "(default: 90%% of the free space of DIR's file system)")
    parser.add_argument("--json", default="bench-python.json",
                        help="where to write the results as JSON (default %(default)s)")
    args = parser.parse_args(argv)
    if args.spill_limit is not None and not args.spill_dir:
        parser.error("--spill-limit needs --spill-dir")
    spill_limit = parse_size(args.spill_limit) if args.spill_limit is not None else None
    hide_plasma_warnings()

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    memory = parse_size(args.memory)
    budget_s = args.millis_per_case / 1000.0
    wanted = args.systems.split(",")
    placement = Placement(args.cpus)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    results: List[Dict[str, Any]] = []
    skipped: Dict[str, str] = {}
    workdir = Path(tempfile.mkdtemp(prefix="skyriver-bench-"))
    # The copy baseline is measured before and after the systems; the faster one counts (the
    # conservative choice for the put target).
    copies = [numpy_copy_baseline(max(sizes), budget_s)]
    try:
        if "skyriver" in wanted:
            if not args.skyriver_bin:
                raise SystemExit(
                    "no skyriver binary: none named `skyriver` on PATH and no --skyriver-bin or "
                    "$SKYRIVER_BIN; build it (`cargo build --release` in the repository) and put "
                    "target/release on PATH, pass --skyriver-bin PATH/TO/skyriver, or measure "
                    "without it (--systems plasma,redis)"
                )
            socket = workdir / "skyriver.sock"
            command = placement.prefix() + [args.skyriver_bin, "daemon", "--log", "warn", "--memory", str(memory), "--socket", str(socket)]
            if args.spill_dir:
                command += ["--spill-dir", args.spill_dir]
            if spill_limit is not None:
                command += ["--spill-limit", str(spill_limit)]
            with process(command, lambda: _connects(socket), "skyriver daemon", workdir / "skyriver.log"):
                log("skyriver:")
                system = SkyriverSystem(socket)
                results += run_system(system, sizes, budget_s, log)
                system.client.close()
        if "plasma" in wanted:
            try:
                import pyarrow
                import pyarrow.plasma as plasma  # pyarrow <= 11
            except ImportError as error:
                skipped["plasma"] = f"pyarrow.plasma not importable ({error}); use pyarrow==11.0.0 on Python <= 3.11"
            else:
                store = Path(pyarrow.__file__).parent / "plasma-store-server"
                socket = workdir / "plasma.sock"
                command = placement.prefix() + [str(store), "-m", str(memory), "-s", str(socket)]
                with process(command, lambda: socket.exists(), "plasma_store", workdir / "plasma.log"):
                    log("plasma:")
                    system = PlasmaSystem(plasma, socket)
                    results += run_system(system, sizes, budget_s, log)
                    system.client.disconnect()
        if "redis" in wanted:
            server = shutil.which("redis-server")
            try:
                import redis
            except ImportError:
                redis = None
            if server is None or redis is None:
                skipped["redis"] = "needs redis-server on PATH and redis-py"
            else:
                socket = workdir / "redis.sock"
                command = placement.prefix() + [server, "--port", "0", "--unixsocket", str(socket), "--save", "", "--appendonly", "no", "--maxmemory", str(memory), "--proto-max-bulk-len", str(max(512 << 20, 2 * max(sizes)))]
                with process(command, lambda: socket.exists(), "redis-server", workdir / "redis.log"):
                    log("redis:")
                    results += run_system(RedisSystem(redis, socket), sizes, budget_s, log)
        copies.append(numpy_copy_baseline(max(sizes), budget_s))
        copy = max(copies, key=lambda c: c["mb_per_sec"])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    systems = [name for name in ("skyriver", "plasma", "redis") if any(r["system"] == name for r in results)]
    found = targets(results, copy, sizes)
    machine = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus_online": os.cpu_count(),
        "placement": placement.describe(),
        "numpy": np.__version__,
        "skyriver": skyriver.__version__,
    }
    print(f"# Python benchmark: {', '.join(systems)}; CPU placement {json.dumps(placement.describe())}; "
          f"{args.millis_per_case} ms per case; Python {platform.python_version()}")
    for name, reason in skipped.items():
        print(f"# {name} skipped: {reason}")
    if "plasma" in systems:
        print("# pyarrow.plasma is deprecated upstream (its DeprecationWarnings are hidden here)")
    print("# get = zero-copy get + release (Redis: GET, which copies); get+read also reads every byte;"
          " ratio columns: other system's p50 / Skyriver's (above 1: Skyriver faster)")
    print(table(results, systems, sizes))
    print(f"\nnumpy copy of {show_size(max(sizes))} into pre-faulted memory (best of before/after): "
          f"{copy['mb_per_sec']:.0f} MB/s (p50 {copy['p50_us']:.0f} us; before {copies[0]['mb_per_sec']:.0f}, after {copies[-1]['mb_per_sec']:.0f})")
    print("\ntargets:")
    for target in found:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[target["met"]]
        print(f"  {target['target']}: {target['value']} ({verdict})")
    with open(args.json, "w") as output:
        json.dump({"machine": machine, "systems": systems, "skipped": skipped, "millis_per_case": args.millis_per_case,
                   "results": results, "numpy_copy": copy, "numpy_copy_runs": copies, "targets": found}, output, indent=2)
    print(f"\nwrote {args.json}")
    return 0


def _connects(socket: Path) -> bool:
    try:
        skyriver.connect(socket).close()
        return True
    except ConnectionError:
        return False


if __name__ == "__main__":
    sys.exit(main())
