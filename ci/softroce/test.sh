#!/usr/bin/env bash
# Builds the verbs test suites and runs them in ONE SoftRoCE VM (rxe0 and rxe1 on
# a veth pair): the verbs layer (verbs_rxe), the verbs fabric (verbs_fabric) and
# daemons on rxe (verbs_cluster). Root. Exit status 0 = every test passed; 124 =
# time limit; 125 = VM failure.
#
#   ci/softroce/test.sh [--here] [SUITE...]   (default: verbs_rxe verbs_fabric verbs_cluster)
#
# --here runs them on this machine instead, on the devices in SKYRIVER_RDMA_DEVICES
# (default "rxe0 rxe1", as rxe-up.sh creates them; on hardware e.g. "mlx5_0 mlx5_1"
# with SKYRIVER_RDMA_GID_INDEX=3 for RoCE v2).
#
# Uses cargo's usual target dir (CARGO_TARGET_DIR is honoured). SKYRIVER_VM_TIMEOUT
# bounds the whole VM run (default 1500 s), SKYRIVER_TEST_TIMEOUT each binary (600 s).
# SKYRIVER_TEST_FILTER runs only the tests whose names contain it, SKYRIVER_TEST_IGNORED=1
# only the ignored ones (see guest/tests.sh).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$HERE/../.."
export SKYRIVER_VM_TIMEOUT=${SKYRIVER_VM_TIMEOUT:-1500}

say() { echo "softroce-test: $*" >&2; }

here=
[ "${1:-}" = --here ] && { here=1; shift; }
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(verbs_rxe verbs_fabric verbs_cluster)
# Built as the README's `cargo test --workspace` builds them (the whole workspace's features),
# so after it nothing is rebuilt; `-p` alone would unify other features and rebuild dozens of
# crates.
args=(--workspace)
for s in "${suites[@]}"; do
    args+=(--test "$s")
done

say "building ${suites[*]}"
json=$(cargo test --no-run --message-format=json "${args[@]}")
bins=()
for s in "${suites[@]}"; do
    bin=$(grep '"reason":"compiler-artifact"' <<< "$json" | grep "\"name\":\"$s\"" \
          | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n1)
    [ -n "$bin" ] || { say "no test binary for $s"; exit 1; }
    bins+=("$bin")
done

if [ -n "$here" ]; then
    export SKYRIVER_RDMA_DEVICES=${SKYRIVER_RDMA_DEVICES:-rxe0 rxe1}
    ulimit -l unlimited 2>/dev/null || say "cannot lift the locked-memory limit; registrations may fail"
    exec timeout -k 10 "$SKYRIVER_VM_TIMEOUT" "$HERE/guest/tests.sh" "${bins[@]}"
fi
"$HERE/build-image.sh"
say "running ${#bins[@]} test binaries in the VM (limit ${SKYRIVER_VM_TIMEOUT}s)"
exec "$HERE/run-in-vm.sh" "$HERE/guest/tests.sh" "${bins[@]}"
