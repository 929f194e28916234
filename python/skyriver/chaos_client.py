"""A Python client of ``skyriver chaos``: puts, gets, fetches and deletes objects of known
contents on one daemon while the nemesis injects faults, and reports every operation to the
chaos process, which records it in the run's history beside its own clients' operations.

Run by ``skyriver chaos`` (not by hand) as::

    python3 chaos_client.py SOCKET SEED NODE WORKER

Protocol, one JSON object or word a line:

- stdout: ``{"event": "start", "kind": K, "id": HEX, "size": N, "timeout_ms": T}`` before an
  operation, ``{"event": "end", "result": {"outcome": "ok" | "not_found" | "wrong_bytes" |
  "failed", ...}}`` after it (kinds and outcomes as in the history);
- stdin, one line after each ``end``: ``stop`` (exit now), ``-`` (nothing new) or the hex id
  of an object acknowledged on another node, for later fetches.

An object's id and contents are the chaos workload's (``object_id`` and ``content`` mirror
``src/chaos/workload.rs``): any reader, in either language, can tell right bytes from wrong.
An exception other than the client's own errors ends the process: chaos reports that as a
client crash.
"""

from __future__ import annotations

import functools
import json
import random
import sys
import time
from typing import List, Optional

import skyriver

MASK = (1 << 64) - 1
# Data sizes and weights: the workload's classes up to 300 kB (pure Python makes the bytes).
SIZE_CLASSES = [(1, 3), (100, 3), (3_000, 3), (40_000, 2), (300_000, 1)]
FETCH_TIMEOUT_MS = 5_000
LIVE_OBJECTS = 16
KNOWN_REMOTE = 64
# Errors meaning the connection is gone (the daemon died, restarted or is unreachable).
CONNECTION_LOST = (skyriver.DaemonUnavailable, skyriver.ClientClosed, skyriver.ProtocolError)


def splitmix64(state: int) -> "tuple[int, int]":
    """The next (state, output) of SplitMix64 (as ``schedule::SplitMix64``)."""
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def object_id(seed: int, node: int, worker: int, counter: int, size: int) -> bytes:
    """Size in bytes 0..4, seed 4..12, node 12, worker 13, counter 14..20 (little endian)."""
    return (
        size.to_bytes(4, "little")
        + seed.to_bytes(8, "little")
        + bytes([node, worker])
        + counter.to_bytes(8, "little")[:6]
    )


def size_of(oid: bytes) -> int:
    return int.from_bytes(oid[0:4], "little")


@functools.lru_cache(maxsize=64)
def content(oid: bytes) -> bytes:
    """``size_of(oid)`` bytes of a SplitMix64 stream seeded by the FNV-1a hash of the id."""
    seed = 0xCBF29CE484222325
    for byte in oid:
        seed = ((seed ^ byte) * 0x100000001B3) & MASK
    size = size_of(oid)
    words = []
    state = seed
    for _ in range((size + 7) // 8):
        state, word = splitmix64(state)
        words.append(word.to_bytes(8, "little"))
    return b"".join(words)[:size]


def verify(oid: bytes, data: bytes) -> dict:
    expected = content(oid)
    if len(data) != len(expected):
        return {"outcome": "wrong_bytes", "detail": f"{len(data)} bytes, expected {len(expected)}"}
    if data == expected:
        return {"outcome": "ok"}
    offset = next(i for i, (a, b) in enumerate(zip(data, expected)) if a != b)
    return {
        "outcome": "wrong_bytes",
        "detail": f"byte {offset} is {data[offset]:#04x}, expected {expected[offset]:#04x}",
    }


class ChaosClient:
    def __init__(self, socket: str, seed: int, node: int, worker: int) -> None:
        self.socket = socket
        self.seed = seed
        self.node = node
        self.worker = worker
        self.rng = random.Random(seed ^ (node << 32) ^ (worker << 48))
        self.client: Optional[skyriver.Client] = None
        self.mine: List[bytes] = []
        self.remote: List[bytes] = []
        self.counter = 0
        self.stopped = False

    def send(self, record: dict) -> None:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()

    def operation(self, kind: str, oid: bytes, timeout_ms: int, call) -> dict:
        """Runs ``call(client)`` as one reported operation and reads chaos's answer."""
        self.send(
            {"event": "start", "kind": kind, "id": oid.hex(), "size": size_of(oid),
             "timeout_ms": timeout_ms}
        )
        try:
            if self.client is None:
                self.client = skyriver.connect(self.socket)
            result = call(self.client)
        except CONNECTION_LOST as error:
            self.client = None
            result = {"outcome": "failed", "error": f"{type(error).__name__}: {error}"}
        except skyriver.SkyriverError as error:
            result = {"outcome": "failed", "error": f"{type(error).__name__}: {error}"}
        self.send({"event": "end", "result": result})
        answer = sys.stdin.readline().strip()
        if answer in ("", "stop"):
            self.stopped = True
        elif answer != "-":
            self.remote.append(bytes.fromhex(answer))
            del self.remote[:-KNOWN_REMOTE]
        return result

    def next_id(self) -> bytes:
        sizes = [size for size, _ in SIZE_CLASSES]
        weights = [weight for _, weight in SIZE_CLASSES]
        self.counter += 1
        size = self.rng.choices(sizes, weights)[0]
        return object_id(self.seed, self.node, self.worker, self.counter, size)

    def put(self) -> None:
        oid = self.next_id()
        data = content(oid)

        def call(client: skyriver.Client) -> dict:
            client.put(data, id=oid)
            return {"outcome": "ok"}

        if self.operation("put", oid, 0, call)["outcome"] == "ok":
            self.mine.append(oid)

    def get(self, oid: bytes) -> None:
        def call(client: skyriver.Client) -> dict:
            try:
                with client.get(oid, timeout=0) as buffer:
                    return verify(oid, buffer.to_bytes())
            except (skyriver.ObjectNotFound, skyriver.Timeout):
                return {"outcome": "not_found"}

        self.operation("get", oid, 0, call)

    def fetch(self, oid: bytes) -> None:
        def call(client: skyriver.Client) -> dict:
            try:
                with client.fetch(oid, timeout=FETCH_TIMEOUT_MS / 1000) as buffer:
                    return verify(oid, buffer.to_bytes())
            except skyriver.ObjectNotFound:
                return {"outcome": "not_found"}

        self.operation("fetch", oid, FETCH_TIMEOUT_MS, call)

    def delete(self, oid: bytes) -> None:
        def call(client: skyriver.Client) -> dict:
            client.delete(oid)
            return {"outcome": "ok"}

        self.operation("delete", oid, 0, call)

    def run(self) -> None:
        while not self.stopped:
            roll = self.rng.randrange(100)
            if roll < 40:
                self.put()
            elif roll < 60 and self.mine:
                self.get(self.rng.choice(self.mine))
            elif roll < 90 and self.remote:
                self.fetch(self.rng.choice(self.remote))
            elif self.mine:
                self.delete(self.mine.pop(self.rng.randrange(len(self.mine))))
            else:
                self.put()
            while len(self.mine) > LIVE_OBJECTS and not self.stopped:
                self.delete(self.mine.pop(0))
            time.sleep(self.rng.uniform(0.005, 0.03))


def main(argv: List[str]) -> int:
    if len(argv) != 5:
        sys.stderr.write("usage: chaos_client.py SOCKET SEED NODE WORKER\n")
        return 2
    socket, seed, node, worker = argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    ChaosClient(socket, seed, node, worker).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
