#!/usr/bin/env bash
# Open MPI (Debian) and mpi4py (PyPI, built against it) for the MPI benchmark (root; idempotent).
#   ci/mpi/install-deps.sh [PYTHON]     mpi4py goes into PYTHON's environment [python3]
set -euo pipefail
python=${1:-python3}
if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicc >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends openmpi-bin libopenmpi-dev \
        || { apt-get update && apt-get install -y --no-install-recommends openmpi-bin libopenmpi-dev; }
fi
if ! "$python" -c 'import mpi4py' 2>/dev/null; then
    "$python" -m pip install --quiet mpi4py
fi
"$python" -c 'import mpi4py; print("mpi4py", mpi4py.__version__, "with", mpi4py.get_config().get("mpicc", "mpicc"))'
