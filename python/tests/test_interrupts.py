"""Ctrl-C and close() end waits promptly: a blocked get, a plasma get, a subscription."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import skyriver
from skyriver import ObjectID

DEADLINE = 10.0


def wait_until(condition, what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def process_state(pid) -> str:
    """The state letter of /proc/PID (or PID/task/TID) of a process or thread."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


BLOCKED_GET = {
    "native": "client = skyriver.connect(socket)\nprint('ready', flush=True)\nclient.get(skyriver.ObjectID.from_random())",
    "plasma": "import skyriver.plasma as plasma\nclient = plasma.connect(socket)\nprint('ready', flush=True)\nclient.get(plasma.ObjectID.from_random())",
    "subscribe": "client = skyriver.connect(socket)\nevents = client.subscribe()\nprint('ready', flush=True)\nfor event in events: pass",
}


@pytest.mark.parametrize("kind", sorted(BLOCKED_GET))
def test_ctrl_c_interrupts_a_blocking_wait(daemon, kind):
    script = "import sys, skyriver\nsocket = sys.argv[1]\ntry:\n" + textwrap.indent(
        BLOCKED_GET[kind], "    "
    ) + "\nexcept KeyboardInterrupt:\n    print('interrupted', flush=True)\n"
    package_root = str(Path(skyriver.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=package_root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(daemon.socket)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        with skyriver.connect(daemon.socket) as observer:
            if kind in ("native", "plasma"):
                wait_until(lambda: observer.stats()["waiting_gets"] == 1, "the get to wait")
            else:
                # Asleep in the kernel, waiting (not running Python code).
                wait_until(lambda: process_state(child.pid) == "S", "the child to block")
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=DEADLINE)
        assert out.strip() == "interrupted", err
        assert child.returncode == 0, err
        assert time.monotonic() - sent < 5
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_close_wakes_a_get_blocked_on_another_thread(client, daemon):
    outcome = []

    def blocked() -> None:
        try:
            client.get(ObjectID.from_random())
            outcome.append("returned")
        except BaseException as error:  # noqa: BLE001 - checked below
            outcome.append(error)

    thread = threading.Thread(target=blocked)
    thread.start()
    try:
        with skyriver.connect(daemon.socket) as observer:
            wait_until(lambda: observer.stats()["waiting_gets"] == 1, "the get to wait")
            client.close()
            thread.join(timeout=DEADLINE)
            assert not thread.is_alive()
            assert len(outcome) == 1 and isinstance(outcome[0], skyriver.ClientClosed), outcome
            # The closed client's connection goes with it: the daemon forgets the get.
            wait_until(lambda: observer.stats()["waiting_gets"] == 0, "the get to go")
    finally:
        client.close()
        thread.join(timeout=DEADLINE)


def test_an_interrupted_get_releases_the_object_that_comes_later(client, daemon):
    # A get abandoned (here: by a signal handler raising in the main thread) leaves no
    # reference behind when its object comes after all.
    oid = ObjectID.from_random()

    def raise_in_handler(signum, frame):
        raise RuntimeError("stop waiting")

    previous = signal.signal(signal.SIGUSR1, raise_in_handler)
    try:
        timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGUSR1))
        timer.start()
        with pytest.raises(RuntimeError, match="stop waiting"):
            client.get(oid)
        timer.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    with skyriver.connect(daemon.socket) as writer:
        writer.put(b"late", id=oid)
    assert bytes(client.get(oid, timeout=5)) == b"late"
    client.flush()

    def references() -> int:
        return [e["ref_count"] for e in client.list() if e["id"] == oid][0]

    wait_until(lambda: (client.flush(), references())[1] == 0, "the late reference to go")


def test_closing_a_subscription_wakes_its_waiting_thread(client):
    events = client.subscribe()
    outcome = []
    thread = threading.Thread(target=lambda: outcome.append(events.next_event()))
    thread.start()
    try:
        # The thread asleep in the kernel: waiting for an event, not starting up.
        wait_until(
            lambda: thread.native_id is not None
            and process_state(f"{os.getpid()}/task/{thread.native_id}") == "S",
            "the thread to wait",
        )
        started = time.monotonic()
        events.close()
        thread.join(timeout=DEADLINE)
        assert not thread.is_alive() and outcome == [None]
        assert time.monotonic() - started < 5
    finally:
        events.close()
        thread.join(timeout=DEADLINE)
