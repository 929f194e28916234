#!/usr/bin/env bash
# Runs an MPI program on a namespace cluster on this machine (root): `skyriver up --netns`
# starts N daemons, each in its own network namespace, then `mpirun -np N` starts one rank per
# namespace (rank i in node i's namespace, attached to node i's daemon), so the ranks' own
# traffic (the benchmark's TCP and MPI baselines) crosses the same veth links as the fetches.
# Everything stops and the namespaces go when the program ends, fails or is interrupted.
#
#   ci/netns/mpirun.sh [-n NODES] [--link 10gbit,50us] [--] PROGRAM ARGS...
#   ci/netns/mpirun.sh -n 3 python3 -m skyriver.mpibench --sizes 1KiB,1MiB
#
# SKYRIVER_BIN names the skyriver binary [skyriver on PATH, else target/release/skyriver].
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
nodes=3
link=()
while [ $# -gt 0 ]; do
    case "$1" in
        -n|--nodes) nodes=$2; shift 2 ;;
        --link) link=(--link "$2"); shift 2 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "usage: $0 [-n NODES] [--link RATE,LATENCY] [--] PROGRAM ARGS..." >&2; exit 2; }
bin=${SKYRIVER_BIN:-$(command -v skyriver || echo "$here/../../target/release/skyriver")}
[ -x "$bin" ] || { echo "$0: no skyriver binary at $bin (cargo build --release, or set SKYRIVER_BIN)" >&2; exit 2; }

work=$(mktemp -d /tmp/skyriver-mpirun.XXXXXX)
up_pid=
cleanup() {
    trap - EXIT INT TERM
    if [ -n "$up_pid" ]; then
        kill -TERM "$up_pid" 2>/dev/null || true
        wait "$up_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap 'status=$?; cleanup; exit $status' EXIT
trap 'cleanup; exit 130' INT TERM

"$bin" up --nodes "$nodes" --netns "${link[@]}" --memory "${SKYRIVER_MEMORY:-1GiB}" \
    --log warn --dir "$work" >"$work/up.out" 2>"$work/up.err" &
up_pid=$!
for _ in $(seq 600); do
    grep -q '^Ctrl-C stops' "$work/up.out" 2>/dev/null && break
    kill -0 "$up_pid" 2>/dev/null || { cat "$work/up.err" >&2; echo "$0: skyriver up failed" >&2; exit 1; }
    sleep 0.1
done
grep -q '^Ctrl-C stops' "$work/up.out" || { echo "$0: the cluster did not come up" >&2; exit 1; }
namespaces=$(awk '$2 == "namespace" { print $3 }' "$work/up.out" | tr '\n' ' ')
first_addr=$(awk '$2 == "namespace" { print $5; exit }' "$work/up.out")
subnet=${first_addr%.*}.0/24
grep -E '^  (node-[0-9]+: namespace|links:)' "$work/up.out" >&2

# The ranks run inside the namespaces and mpirun outside: Open MPI's runtime (PMIx, ORTE)
# reaches mpirun over TCP, on the host's address on the cluster's bridge (the subnet's last,
# which `up --netns` gives the host), where mpirun's servers listen.
export PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=$subnet

export SKYRIVER_NETNS_NAMESPACES=$namespaces
export SKYRIVER_SOCKET_TEMPLATE=$work/node-{node}.sock
export SKYRIVER_NODES=$nodes
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Ranks talk over TCP on the namespaces' subnet only: no shared-memory transport between
# them (it would bypass the links), no other interface.
mpirun -np "$nodes" --oversubscribe \
    --mca btl tcp,self --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" \
    -x SKYRIVER_NETNS_NAMESPACES -x SKYRIVER_SOCKET_TEMPLATE -x SKYRIVER_NODES -x PATH \
    "$here/in-namespace.sh" "$@" &
mpi_pid=$!
wait "$mpi_pid"
