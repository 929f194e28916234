#!/bin/bash
# Skyriver's fetch next to perftest on the same rxe devices, run INSIDE the
# SoftRoCE VM by ../bench.sh. Writes into $SKYRIVER_VM_OUT:
#   perftest.tsv      tool, message size, value (MB/s in 10^6 bytes, or µs)
#   bench-fetch.json  `skyriver bench fetch --fabric verbs` results, every mode
#   *.log             raw outputs
#
#   guest/bench.sh SKYRIVER-BINARY [SIZES]      SIZES default 4096,65536,196608,1048576,8388608
#
# Every step is bounded by `timeout`; a failed step is reported and skipped, so
# the table shows what could be measured.
set -u
skyriver=$1
sizes=${2:-4096,65536,196608,1048576,8388608}
out=${SKYRIVER_VM_OUT:-/tmp}
set -- $SKYRIVER_RDMA_DEVICES
dev0=${1:-rxe0} dev1=${2:-${1:-rxe0}}
server_ip=$(echo "$SKYRIVER_RDMA_IPS" | awk '{ print ($2 != "" ? $2 : $1) }')
gid=${SKYRIVER_RDMA_GID_INDEX:-1}
tsv=$out/perftest.tsv
: > "$tsv"
port=18600

# Iterations per message size: about 64 MiB per run, within [16, 4000].
iters() { local n=$(( (64 << 20) / $1 )); [ $n -gt 4000 ] && n=4000; [ $n -lt 16 ] && n=16; echo $n; }

wait_listen() { # PORT
    for _ in $(seq 100); do
        ss -Hltn "sport = :$1" | grep -q . && return 0
        sleep 0.1
    done
    return 1
}

# perftest TOOL SIZE COLUMN ITERS: server on dev1, client on dev0 across the veth pair;
# prints the client's value in COLUMN of the row for SIZE.
perftest() { # TOOL SIZE COLUMN ITERS [FLAG...]
    local tool=$1 size=$2 column=$3 n=$4; shift 4
    port=$((port + 1))
    local log="$out/$tool-$size-$port.log"
    timeout 120 "$tool" -d "$dev1" -x "$gid" -F -p "$port" -s "$size" -n "$n" "$@" > "$log.server" 2>&1 &
    local server=$!
    wait_listen "$port" || echo "$tool: server did not listen" >> "$log"
    timeout 120 "$tool" -d "$dev0" -x "$gid" -F -p "$port" -s "$size" -n "$n" "$@" "$server_ip" > "$log" 2>&1
    local rc=$?
    wait "$server"
    [ $rc = 0 ] || { echo "  $tool -s $size failed (status $rc):" >&2; tail -n 5 "$log" >&2; return 1; }
    awk -v s="$size" -v c="$column" '$1 == s && NF >= c { print $c; exit }' "$log"
}

echo "perftest on $dev0 -> $dev1 ($server_ip), GID index $gid"
# A positive number? (perftest's cycle-based timing can print 0.00 on an emulated CPU.)
positive() { awk -v v="$1" 'BEGIN { exit !(v + 0 > 0) }'; }
for size in ${sizes//,/ }; do
    for tool in ib_read_bw ib_send_bw; do
        # column 4: BW average[MB/sec], where perftest's MB is 2^20 bytes; one retry
        for try in 1 2; do
            v=$(perftest "$tool" "$size" 4 "$(iters "$size")") && positive "$v" && break
            echo "  $tool $size B: no usable result (${v:-none}, try $try of 2)"
            v=
        done
        [ -n "$v" ] || continue
        mb=$(awk -v v="$v" 'BEGIN { printf "%.2f", v * 1.048576 }')
        printf '%s\t%s\t%s\n' "$tool" "$size" "$mb" >> "$tsv"
        echo "  $tool $size B: $mb MB/s"
    done
done
# column 5: t_typical[usec], half a round trip; busy polling (default) and completion
# events (-e: on few, shared vCPUs two spinning processes can be slower than events)
for mode in poll event; do
    flag=; [ $mode = event ] && flag=-e
    v=$(perftest ib_send_lat 4096 5 1000 $flag) && positive "$v" || continue
    printf '%s\t%s\t%s\n' "ib_send_lat_$mode" 4096 "$v" >> "$tsv"
    echo "  ib_send_lat ($mode) 4096 B: $v us one way"
done

# Every mode in one pair of daemons, interleaved fetch by fetch (each fetch names its mode),
# next to the raw TCP baseline between the same two addresses.
cd "$out" || exit 1
echo "skyriver bench fetch --fabric verbs --devices $dev0,$dev1 --modes eager,rendezvous,auto"
# SKYRIVER_BENCH_COMPARE_EXE: another skyriver build whose modes run interleaved with these (A/B).
compare=()
[ -n "${SKYRIVER_BENCH_COMPARE_EXE:-}" ] && compare=(--compare-exe "$SKYRIVER_BENCH_COMPARE_EXE")
# SKYRIVER_BENCH_ARENA_KEYS=1: also daemons without memory windows (rows MODE@arena-keys).
[ -n "${SKYRIVER_BENCH_ARENA_KEYS:-}" ] && compare+=(--arena-keys)
timeout 600 "$skyriver" bench fetch --fabric verbs --devices "$dev0,$dev1" --sizes "$sizes" \
    --modes eager,rendezvous,auto --baselines tcp --millis-per-case "${SKYRIVER_BENCH_MILLIS:-1000}" \
    "${compare[@]}" \
    --max-iterations 500 --json "$out/bench-fetch.json" --plot "$out/bench-fetch.svg" \
    > "$out/bench-fetch.log" 2>&1
rc=$?
grep -v 'WARN\|INFO' "$out/bench-fetch.log"
[ $rc = 0 ] || echo "skyriver bench fetch failed (status $rc)"
exit $rc
