#!/usr/bin/env bash
# Skyriver fetch bandwidth and latency over rxe next to perftest (ib_read_bw,
# ib_send_bw, ib_send_lat) on the same devices in the same VM boot; prints the
# table with ratios and writes JSON. Informational: nothing is asserted. Root.
#
#   ci/softroce/bench.sh [SIZES]        SIZES in bytes, default 4096,65536,196608,1048576,8388608
#                                       (192 KiB lies between the threshold and what the
#                                       receive slots carry: there the modes take different paths)
#
# Results go to $SKYRIVER_BENCH_OUT (default target/softroce-bench): perftest.tsv,
# bench-fetch.json, bench-softroce.json (the table's data) and the raw logs.
# Exit status: 0 when the table was printed.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$HERE/../.."
OUT=${SKYRIVER_BENCH_OUT:-target/softroce-bench}
export SKYRIVER_VM_TIMEOUT=${SKYRIVER_VM_TIMEOUT:-600}

say() { echo "softroce-bench: $*" >&2; }

say "building skyriver (release)"
json=$(cargo build --release --bin skyriver --message-format=json)
exe=$(grep '"reason":"compiler-artifact"' <<< "$json" | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n1)
[ -x "$exe" ] || { say "no skyriver binary"; exit 1; }

rm -rf "$OUT"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
say "running perftest and skyriver bench fetch in the VM (limit ${SKYRIVER_VM_TIMEOUT}s)"
rc=0
SKYRIVER_VM_OUT="$OUT" "$HERE/run-in-vm.sh" "$HERE/guest/bench.sh" "$exe" "${1:-4096,65536,196608,1048576,8388608}" || rc=$?
[ "$rc" = 0 ] || say "the guest benchmark ended with status $rc"
ls "$OUT"/bench-fetch*.json > /dev/null 2>&1 || { say "no fetch results: nothing to compare"; exit 1; }
echo
python3 "$HERE/bench-table.py" "$OUT"
