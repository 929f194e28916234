"""Daemons for the tests: real `skyriver daemon` processes on private sockets.

The daemon binary is `$SKYRIVER_BIN`, else `skyriver` on PATH, else the workspace's
`target/{debug,release}/skyriver`. Every daemon and temporary directory is removed when its
test ends, passed or failed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

import skyriver

REPO = Path(__file__).resolve().parents[2]


def skyriver_binary() -> Optional[str]:
    explicit = os.environ.get("SKYRIVER_BIN")
    if explicit:
        return explicit
    on_path = shutil.which("skyriver")
    if on_path:
        return on_path
    for profile in ("debug", "release"):
        candidate = REPO / "target" / profile / "skyriver"
        if candidate.exists():
            return str(candidate)
    return None


class Daemon:
    """One `skyriver daemon` process."""

    def __init__(self, directory: Path, name: str, args: List[str]) -> None:
        binary = skyriver_binary()
        if binary is None:
            pytest.skip("no skyriver binary: set SKYRIVER_BIN or run `cargo build`")
        self.socket = directory / f"{name}.sock"
        self.log = open(directory / f"{name}.log", "wb")
        self.process = subprocess.Popen(
            [binary, "daemon", "--log", "warn", "--no-prefault", "--socket", str(self.socket), *args],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                skyriver.connect(self.socket).close()
                return
            except ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"daemon did not start: {(directory / f'{name}.log').read_text()}"
                    )
                time.sleep(0.02)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="skyriver-pytest-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Daemons:
    """Starts daemons for one test and stops them all at its end."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: List[Daemon] = []

    def start(self, memory: str = "64MiB", *args: str, name: Optional[str] = None) -> Daemon:
        daemon = Daemon(self.directory, name or f"daemon-{len(self.started)}", ["--memory", memory, *args])
        self.started.append(daemon)
        return daemon

    def stop_all(self) -> None:
        for daemon in self.started:
            daemon.stop()


@pytest.fixture
def daemons(workdir: Path) -> Iterator[Daemons]:
    started = Daemons(workdir)
    try:
        yield started
    finally:
        started.stop_all()


@pytest.fixture
def daemon(daemons: Daemons) -> Daemon:
    return daemons.start("64MiB")


@pytest.fixture
def client(daemon: Daemon) -> Iterator[skyriver.Client]:
    with skyriver.connect(daemon.socket) as connected:
        yield connected


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
