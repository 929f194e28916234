"""The ``skyriver`` and ``plasma_store`` commands of the Python package.

Both run the Rust command line inside this process (``skyriver._native.run_cli``), so a
``pip install`` of the wheel brings the daemon and every subcommand without a Rust toolchain.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import sysconfig
from typing import List, Optional

from . import _native

#: Environment variable naming the program that daemons started by `up`, `demo` and the
#: benchmarks run (the Rust side reads it: ``skyriver::self_exe``).
EXE_ENV = "SKYRIVER_EXE"


def _script_path(argv0: str) -> str:
    """The absolute path of the script this process was started as."""
    if os.sep not in argv0:
        found = shutil.which(argv0)
        if found:
            argv0 = found
    return os.path.abspath(argv0)


def _installed_skyriver() -> Optional[str]:
    """The `skyriver` command of this environment (its console script), if installed."""
    candidate = os.path.join(sysconfig.get_path("scripts"), "skyriver")
    return candidate if os.access(candidate, os.X_OK) else None


def _run(program: str, args: List[str], exe: Optional[str]) -> int:
    if exe is not None:
        os.environ[EXE_ENV] = exe
    # Ctrl-C and SIGTERM act as on the binary: the daemon watches both and shuts down; other
    # commands die of them. Python's own SIGINT handler would only raise KeyboardInterrupt once
    # the command returned.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    return _native.run_cli([program, *args])


def main(argv: Optional[List[str]] = None) -> int:
    """``skyriver ...``: every subcommand of the Rust binary, the daemon included."""
    argv = list(sys.argv if argv is None else argv)
    exe = _script_path(argv[0])
    return _run(exe, argv[1:], exe)


def plasma_store(argv: Optional[List[str]] = None) -> int:
    """``plasma_store -m BYTES -s SOCKET [-d DIR] [-h] [-e URL]``: the daemon with Plasma's
    flags, as the ``plasma_store`` link to the binary."""
    argv = list(sys.argv if argv is None else argv)
    # It starts no other process; should it, they would be `skyriver` commands.
    return _run("plasma_store", argv[1:], _installed_skyriver())


if __name__ == "__main__":
    # `python -m skyriver._cli skyriver|plasma_store ARGS...`: the commands without their
    # console scripts (`start_plasma_store` runs the daemon this way).
    if len(sys.argv) < 2 or sys.argv[1] not in ("skyriver", "plasma_store"):
        sys.exit("usage: python -m skyriver._cli skyriver|plasma_store [ARGS...]")
    if sys.argv[1] == "plasma_store":
        sys.exit(plasma_store(["plasma_store", *sys.argv[2:]]))
    installed = _installed_skyriver()
    sys.exit(_run(installed or "skyriver", sys.argv[2:], installed))
