#!/usr/bin/env bash
# The Python wheel: built once with Rust, installed and run where there is none.
#
#   ci/python-wheel.sh [PYTHON]
#
# 1. `maturin build --release` builds target/wheels/skyriver-*.whl for PYTHON (default python3).
#    maturin checks the wheel's manylinux tag against the glibc symbols the extension links (its
#    built-in auditwheel check) and fails the build when the tag promises too much.
# 2. `pip install ./python` is checked as users run it (it reuses the build's target/ cache).
# 3. The wheel goes into a fresh venv whose PATH has no cargo or rustc, and runs from there:
#    `import skyriver`, `skyriver daemon` (stopped by SIGINT, as Ctrl-C), `plasma_store -m -s`
#    (stopped by SIGTERM) and skyriver.plasma against it.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-python3}

build_venv=target/wheel-build
rm -rf "$build_venv" target/wheels
"$python" -m venv "$build_venv"
"$build_venv/bin/pip" install --quiet "maturin>=1.9.4,<2"
"$build_venv/bin/maturin" build --release --manifest-path python/Cargo.toml \
    --interpreter "$build_venv/bin/python" --out target/wheels
wheel=$(ls target/wheels/skyriver-*manylinux*.whl)
echo "built $wheel"
case "$wheel" in
    *manylinux*) ;;
    *) echo "the wheel has no manylinux tag: $wheel" >&2; exit 1 ;;
esac

# (pip builds in place, so target/ caches it; maturin may leave a linux_x86_64 wheel beside.)
"$build_venv/bin/pip" install --quiet ./python
"$build_venv/bin/skyriver" --version

venv=target/wheel-venv
rm -rf "$venv"
"$python" -m venv "$venv"
venv=$(cd "$venv" && pwd)
bare_path="$venv/bin:/usr/local/bin:/usr/bin:/bin"
for tool in cargo rustc; do
    if PATH=$bare_path command -v "$tool" >/dev/null; then
        echo "$tool is on the fresh venv's PATH ($bare_path): the check would prove nothing" >&2
        exit 1
    fi
done
env -i HOME="$HOME" PATH="$bare_path" "$venv/bin/pip" install --quiet "$wheel"
smoke_dir=$(mktemp -d)
trap 'rm -rf "$smoke_dir"' EXIT
env -i HOME="$HOME" PATH="$bare_path" SMOKE_DIR="$smoke_dir" "$venv/bin/python" - <<'PY'
import os, shutil, signal, subprocess, sys, time

import skyriver
import skyriver.plasma as plasma

directory = os.environ["SMOKE_DIR"]
for command in ("skyriver", "plasma_store"):
    assert shutil.which(command) == os.path.join(sys.prefix, "bin", command), command


def serve(argv, socket):
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            skyriver.connect(socket).close()
            return process
        except ConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                sys.exit(f"{argv[0]} did not serve {socket}")
            time.sleep(0.05)


def stop(process, how):
    process.send_signal(how)
    status = process.wait(timeout=30)
    assert status == 0, f"{process.args[0]} exited with {status} on {how!r}"


socket = os.path.join(directory, "skyriver.sock")
daemon = serve(["skyriver", "daemon", "--memory", "64MiB", "--socket", socket], socket)
try:
    with skyriver.connect(socket) as client:
        oid = client.put(b"from the wheel")
        assert client.get(oid).to_bytes() == b"from the wheel"
finally:
    stop(daemon, signal.SIGINT)
assert not os.path.exists(socket)

socket = os.path.join(directory, "plasma.sock")
store = serve(["plasma_store", "-m", "10000000", "-s", socket], socket)
try:
    client = plasma.connect(socket)
    assert client.store_capacity() == 10000000
    oid = client.put({"a": [1, 2, 3]})
    assert client.get(oid) == {"a": [1, 2, 3]}
    client.disconnect()
finally:
    stop(store, signal.SIGTERM)
print(f"wheel {skyriver.__version__}: import, skyriver daemon, plasma_store and skyriver.plasma run without Rust")
PY
