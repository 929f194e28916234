"""`python -m skyriver.bench`: its help, its errors, its output."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import skyriver
from skyriver import bench


def run_bench(*args: str, env_changes=None) -> subprocess.CompletedProcess:
    package_root = str(Path(skyriver.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=package_root)
    env.pop("SKYRIVER_BIN", None)
    env.update(env_changes or {})
    return subprocess.run(
        [sys.executable, "-m", "skyriver.bench", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_help_describes_every_option():
    out = run_bench("--help")
    assert out.returncode == 0, out.stderr
    for option, words in [
        ("--sizes", "object sizes"),
        ("--millis-per-case", "time spent measuring"),
        ("--memory", "memory of every store"),
        ("--cpus", "CPU placement"),
        ("--systems", "systems to measure"),
        ("--skyriver-bin", "$SKYRIVER_BIN, else skyriver on PATH"),
        ("--json", "results as JSON"),
        ("--spill-dir", "spills to DIR"),
        ("--spill-limit", "most bytes the daemon spills"),
    ]:
        assert option in out.stdout and words in out.stdout, (option, out.stdout)


def test_a_spill_limit_without_a_spill_dir_is_refused(tmp_path):
    out = run_bench("--spill-limit", "1GiB", "--json", str(tmp_path / "out.json"))
    assert out.returncode != 0
    assert "--spill-limit needs --spill-dir" in out.stderr, out.stderr


def test_no_binary_says_where_it_looked(tmp_path):
    out = run_bench(
        "--systems", "skyriver", "--cpus", "any", "--sizes", "1KiB", "--millis-per-case", "1",
        "--json", str(tmp_path / "out.json"),
        env_changes={"PATH": str(tmp_path)},
    )
    assert out.returncode != 0
    assert "no skyriver binary" in out.stderr and "PATH" in out.stderr, out.stderr
    assert "--skyriver-bin" in out.stderr and "SKYRIVER_BIN" in out.stderr, out.stderr


def test_plasma_deprecation_warnings_are_hidden_and_others_kept():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bench.hide_plasma_warnings()
        warnings.warn_explicit(
            "Plasma is deprecated since Arrow 10.0.0. It will be removed in 12.0.0 or so.",
            DeprecationWarning, "plasma.py", 1, module="pyarrow.plasma",
        )
        warnings.warn("something else is deprecated", DeprecationWarning)
    assert [str(w.message) for w in caught] == ["something else is deprecated"]
