#!/usr/bin/env bash
# SoftRoCE devices on a machine whose kernel has rdma_rxe (the Vagrant VM, any
# Debian 12 box): the same layout as the CI guest (see init.sh, mode veth), plus
# optionally one rxe device on a real NIC. Idempotent. Root.
#
#   ci/softroce/rxe-up.sh [IP-OF-A-NIC]
#
#   rxe0 on veth0 10.11.1.1, rxe1 on veth1 10.11.1.2 (one veth pair, MTU 9000,
#   policy routing so traffic between them crosses the pair instead of lo);
#   rxe2 on the NIC that carries IP-OF-A-NIC, when given (for tests across
#   machines). Then run the verbs suite with `ci/softroce/test.sh --here`.
set -euo pipefail
MTU=${SKYRIVER_RXE_MTU:-9000}
say() { echo "rxe-up: $*" >&2; }
[ "$(id -u)" = 0 ] || { say "must run as root"; exit 1; }

modprobe rdma_rxe
modprobe ib_uverbs
modprobe rdma_ucm 2>/dev/null || true

if [ ! -d /sys/class/net/veth0 ]; then
    ip link add veth0 type veth peer name veth1
    ip link set veth0 mtu "$MTU"
    ip link set veth1 mtu "$MTU"
    ip addr add 10.11.1.1/24 dev veth0
    ip addr add 10.11.1.2/24 dev veth1
    ip link set veth0 up
    ip link set veth1 up
    ip rule add pref 100 to 10.11.1.2 iif lo lookup 101
    ip rule add pref 101 to 10.11.1.1 iif lo lookup 102
    ip route add 10.11.1.2 dev veth0 src 10.11.1.1 table 101
    ip route add 10.11.1.1 dev veth1 src 10.11.1.2 table 102
    ip rule add pref 1000 lookup local
    ip rule del pref 0 lookup local
    for d in veth0 veth1; do
        sysctl -qw "net.ipv4.conf.$d.accept_local=1" "net.ipv4.conf.$d.rp_filter=0"
    done
    sysctl -qw net.ipv4.conf.all.rp_filter=0 net.core.netdev_max_backlog=100000
fi
rdma link show rxe0 >/dev/null 2>&1 || rdma link add rxe0 type rxe netdev veth0
rdma link show rxe1 >/dev/null 2>&1 || rdma link add rxe1 type rxe netdev veth1

if [ -n "${1:-}" ]; then
    nic=$(ip -o -4 addr show | awk -v ip="$1" '{ split($4, a, "/") } a[1] == ip { print $2; exit }')
    [ -n "$nic" ] || { say "no interface carries $1"; exit 1; }
    rdma link show rxe2 >/dev/null 2>&1 || rdma link add rxe2 type rxe netdev "$nic"
fi

for _ in $(seq 100); do
    active=1
    for d in rxe0 rxe1; do
        grep -q ACTIVE "/sys/class/infiniband/$d/ports/1/state" 2>/dev/null || active=0
    done
    [ $active = 1 ] && break
    sleep 0.1
done
rdma link show
