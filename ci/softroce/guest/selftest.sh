#!/bin/bash
# Sanity checks of the SoftRoCE devices, run INSIDE the VM by ../selftest.sh.
# Every step is bounded by `timeout`; exit status 0 = all passed.
set -u
fails=0
out=$(mktemp)
srv_out=$(mktemp)
check() { # NAME CMD...
    local name=$1; shift
    local st; st=$(date +%s%N)
    if "$@" > "$out" 2>&1; then
        echo "ok   $name ($(( ($(date +%s%N) - st) / 1000000 )) ms)"
    else
        echo "FAIL $name (status $?)"; sed 's/^/     /' "$out" | tail -n 20; fails=$((fails + 1))
    fi
}
# Wait until a server listens on TCP (out-of-band exchange) or an RDMA CM id.
wait_listen() {
    for _ in $(seq 100); do
        ss -Hltn | grep -q . && return 0
        rdma res show cm_id 2>/dev/null | grep -q LISTEN && return 0
        sleep 0.1
    done
    return 1
}
pair() { # SERVER-CMD... -- CLIENT-CMD...
    local srv=() cli=()
    while [ "$1" != -- ]; do srv+=("$1"); shift; done; shift; cli=("$@")
    timeout 60 "${srv[@]}" > "$srv_out" 2>&1 &
    local sp=$!
    wait_listen || echo "server did not start listening"
    timeout 60 "${cli[@]}"; local crc=$?
    wait $sp; local src=$?
    [ $src = 0 ] || { echo "server failed ($src):"; cat "$srv_out"; }
    [ $crc = 0 ] && [ $src = 0 ]
}

echo "devices: ${SKYRIVER_RDMA_DEVICES:-?} addresses: ${SKYRIVER_RDMA_IPS:-?}"
check "rxe0 and rxe1 exist" test "${SKYRIVER_RDMA_DEVICES:-}" = "rxe0 rxe1"
check "rdma link: rxe0 and rxe1 ACTIVE" sh -c \
    'rdma link show | grep -q "rxe0/1 state ACTIVE" && rdma link show | grep -q "rxe1/1 state ACTIVE"'
check "ibv_devinfo rxe1 PORT_ACTIVE, MTU 4096" sh -c \
    'ibv_devinfo -d rxe1 | grep -q PORT_ACTIVE && ibv_devinfo -d rxe1 | grep -q "active_mtu:.*4096"'
check "ibv_rc_pingpong rxe0->rxe1" pair ibv_rc_pingpong -d rxe1 -g 1 -n 100 -- \
    ibv_rc_pingpong -d rxe0 -g 1 -n 100 10.11.1.2
check "rping (rdma_cm) 10.11.1.1->10.11.1.2" pair rping -s -a 10.11.1.2 -C 10 -- \
    rping -c -a 10.11.1.2 -I 10.11.1.1 -C 10
check "ib_read_bw 1MiB rxe0->rxe1" pair ib_read_bw -d rxe1 -x 1 -F -s 1048576 -n 20 -- \
    ib_read_bw -d rxe0 -x 1 -F -s 1048576 -n 20 10.11.1.2
check "RoCE traffic crossed the veth pair" sh -c \
    'test "$(cat /sys/class/net/veth0/statistics/rx_packets)" -gt 5000'
rm -f "$out" "$srv_out"
[ $fails = 0 ] && echo "selftest: PASS" || echo "selftest: $fails FAILED"
[ $fails = 0 ]
