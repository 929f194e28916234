"""The package's commands: `skyriver` and `plasma_store` run the Rust command line from the
extension (``skyriver._native.run_cli``), as the wheel's console scripts do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import List

import pytest

import skyriver
from skyriver import _native

# What the console scripts run: `sys.exit(skyriver._cli.main())` with the script as argv[0].
SCRIPT = "import sys; from skyriver import _cli; sys.argv[0] = {argv0!r}; sys.exit(_cli.{entry}())"


def command(entry: str, argv0: str, *args: str) -> List[str]:
    return [sys.executable, "-c", SCRIPT.format(argv0=argv0, entry=entry), *args]


def wait_for_daemon(socket: Path, process: subprocess.Popen) -> skyriver.Client:
    deadline = time.monotonic() + 60
    while True:
        try:
            return skyriver.connect(socket)
        except ConnectionError:
            assert process.poll() is None, "the daemon exited before serving"
            assert time.monotonic() < deadline, "the daemon did not serve in time"
            time.sleep(0.02)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


def test_run_cli_returns_the_exit_status(workdir):
    assert _native.run_cli(["skyriver", "stat", "--socket", str(workdir / "none.sock")]) == 1


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_a_daemon_started_through_the_entry_point_stops_on_a_signal(workdir, stop_signal):
    socket = workdir / "entry.sock"
    process = subprocess.Popen(
        command("main", "skyriver", "daemon", "--memory", "16MiB", "--no-prefault",
                "--log", "warn", "--socket", str(socket)),
        stdin=subprocess.DEVNULL,
    )
    try:
        with wait_for_daemon(socket, process) as client:
            assert client.stats()["capacity_bytes"] == 16 << 20
        process.send_signal(stop_signal)
        assert process.wait(timeout=30) == 0  # shut down, as the binary does
        assert not socket.exists()
    finally:
        stop(process)


def test_plasma_store_entry_point_takes_plasmas_flags(workdir):
    socket = workdir / "plasma.sock"
    process = subprocess.Popen(
        command("plasma_store", "/anywhere/plasma_store", "-m", "10000", "-s", str(socket)),
        stdin=subprocess.DEVNULL,
    )
    try:
        with wait_for_daemon(socket, process) as client:
            assert client.stats()["capacity_bytes"] == 10000
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        stop(process)


def test_the_entry_point_names_itself_for_the_daemons_it_starts(workdir):
    script = str(workdir / "bin" / "skyriver")
    show = (
        "import os, sys; from skyriver import _cli; "
        f"status = _cli.main([{script!r}, 'stat', '--socket', {str(workdir / 'none.sock')!r}]); "
        "print(status, os.environ['SKYRIVER_EXE'])"
    )
    run = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, timeout=60)
    assert run.stdout.split() == ["1", script]


def test_usage_errors_exit_as_the_binary_does():
    run = subprocess.run(
        command("main", "skyriver", "no-such-command"), capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2 and "no-such-command" in run.stderr


def installed_script(name: str) -> str:
    path = os.path.join(sysconfig.get_path("scripts"), name)
    if not os.access(path, os.X_OK):
        pytest.skip(f"the package is not installed here (no {path}): run from the wheel")
    return path


def test_installed_commands(workdir):
    # Against an installed wheel: the console scripts on the environment's PATH.
    skyriver_command = installed_script("skyriver")
    plasma_store = installed_script("plasma_store")
    version = subprocess.run([skyriver_command, "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and skyriver.__version__ in version.stdout
    socket = workdir / "installed.sock"
    process = subprocess.Popen([plasma_store, "-m", "2000000", "-s", str(socket)])
    try:
        import skyriver.plasma as plasma

        wait_for_daemon(socket, process).close()
        client = plasma.connect(str(socket))
        assert client.store_capacity() == 2000000
        object_id = client.put("through the installed plasma_store")
        assert client.get(object_id) == "through the installed plasma_store"
        client.disconnect()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        stop(process)
