#!/usr/bin/env bash
# Idle CPU of a two-daemon verbs cluster, for each skyriver executable given: `skyriver up
# --nodes 2 --fabric verbs --devices rxe0,rxe1`, wait until both nodes are connected and a
# settling pause passed, then read both daemons' CPU time (utime + stime, /proc/PID/stat) over
# SKYRIVER_IDLE_SECONDS (default 10). Run inside the guest:
#
#   ci/softroce/run-in-vm.sh ci/softroce/guest/idle-cpu.sh target/release/skyriver [OTHER_EXE...]
set -u
secs=${SKYRIVER_IDLE_SECONDS:-10}
devices=${SKYRIVER_RDMA_DEVICES:-rxe0 rxe1}
hz=$(getconf CLK_TCK)
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
for exe in "$@"; do
    dir=$(mktemp -d)
    "$exe" up --nodes 2 --fabric verbs --devices "${devices// /,}" --dir "$dir" --log warn \
        > "$dir/up.log" 2>&1 &
    up=$!
    connected=0
    for _ in $(seq 1 600); do
        n=$("$exe" nodes -s "$dir/node-1.sock" --json 2> /dev/null | tr -d ' \n' | grep -o '"connected":true' | wc -l)
        if [ "$n" -ge 2 ]; then
            connected=1
            break
        fi
        sleep 0.5
    done
    if [ $connected = 0 ]; then
        echo "$exe: the two daemons did not connect"; cat "$dir/up.log"
        kill "$up" 2> /dev/null; wait "$up" 2> /dev/null; rm -rf "$dir"; continue
    fi
    sleep 3
    pids=$(pgrep -P "$up" | tr '\n' ' ')
    before=0; for p in $pids; do before=$((before + $(ticks "$p"))); done
    sleep "$secs"
    after=0; for p in $pids; do after=$((after + $(ticks "$p"))); done
    n=$(wc -w <<< "$pids")
    awk -v exe="$exe" -v d=$((after - before)) -v hz="$hz" -v s="$secs" -v n="$n" 'BEGIN {
        ms = d * 1000 / hz
        printf "%s: %d idle daemons used %.0f ms of CPU in %d s: %.2f%% of a core each\n",
            exe, n, ms, s, (n > 0 ? ms / 10 / s / n : 0) }'
    kill "$up" 2> /dev/null; wait "$up" 2> /dev/null
    rm -rf "$dir"
done
