#!/usr/bin/env bash
# `skyriver chaos` on the verbs fabric: builds skyriver, boots one SoftRoCE VM and runs a
# short chaos run there (daemons in namespaces, RDMA on rxe0/rxe1; see guest/chaos.sh and
# README "Reliability"), printing the schedule, the summary and the verdict. Root.
#
#   ci/softroce/chaos.sh [CHAOS ARGS...]    (default: --nodes 3 --seconds 60 --seed 1)
#
# CHAOS ARGS are `skyriver chaos`'s, without --fabric, --json and --keep-logs (set here).
# Under TCG (an emulated CPU, 5-15x slower: see README.md) the checker's real-time bounds
# are stretched with --slowdown 6 (30 s past a timeout instead of 5 s, 60 s to re-publish
# after a fault instead of 10 s), unless CHAOS ARGS give a --slowdown.
# The Python clients' extension is built too, so they speak the daemons' protocol.
# The verdict (chaos.json, its history) and the daemons' logs come back to
# $SKYRIVER_CHAOS_OUT (default target/softroce-chaos). SKYRIVER_VM_TIMEOUT bounds the VM
# (default 420 s). Exit status: chaos's (1 = violations or a run that could not be carried
# out); 124 = time limit; 125 = VM failure.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$HERE/../.."
OUT=${SKYRIVER_CHAOS_OUT:-target/softroce-chaos}
export SKYRIVER_VM_TIMEOUT=${SKYRIVER_VM_TIMEOUT:-420}
# Three daemons' arenas registered (pinned) with rxe, their tmpfs stores and the workload.
export SKYRIVER_VM_MEM=${SKYRIVER_VM_MEM:-3072}

say() { echo "softroce-chaos: $*" >&2; }

args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--nodes 3 --seconds 60 --seed 1)

say "building skyriver and its Python extension"
json=$(cargo build --bin skyriver --message-format=json)
exe=$(grep '"reason":"compiler-artifact"' <<< "$json" | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n1)
[ -x "$exe" ] || { say "no skyriver binary"; exit 1; }
# chaos stages the extension found beside the program (lib_native.so) for its Python clients.
cargo build -p skyriver-python

"$HERE/build-image.sh"
WORK=${SKYRIVER_VM_WORK:-${XDG_CACHE_HOME:-${HOME:-/var/tmp}/.cache}/skyriver-softroce}
accel=${SKYRIVER_VM_ACCEL:-auto}
[ "$accel" = auto ] && accel=$(cat "$WORK/accel")
if [ "$accel" = tcg ] && [[ " ${args[*]} " != *" --slowdown"* ]]; then
    args+=(--slowdown 6)
fi

rm -rf "$OUT"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
say "running skyriver chaos --fabric verbs ${args[*]} in the VM (limit ${SKYRIVER_VM_TIMEOUT}s)"
started=$(date +%s)
rc=0
SKYRIVER_VM_OUT="$OUT" "$HERE/run-in-vm.sh" "$HERE/guest/chaos.sh" "$exe" "${args[@]}" || rc=$?
say "status $rc after $(( $(date +%s) - started )) s; verdict and logs in $OUT"
exit "$rc"
