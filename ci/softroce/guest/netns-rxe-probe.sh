#!/bin/bash
# Can SoftRoCE work inside network namespaces on this guest's kernel? Run it in a throw-away
# VM (it changes the guest's network):
#
#   SKYRIVER_VM_NET=none ci/softroce/run-in-vm.sh ci/softroce/guest/netns-rxe-probe.sh
#
# Two namespaces joined by a veth pair, an rxe device on each end (created from inside its
# namespace), then ibv_rc_pingpong between them. On Debian 12's 6.1 both devices come up
# ACTIVE with their GIDs, and the first send fails ("local QP operation error"): rxe routes
# and listens for RoCE in the initial namespace only. This is why `skyriver chaos --fabric
# verbs` keeps the devices outside the daemons' namespaces (README "Chaos on verbs").
# Exit status 0 when the ping-pong worked (rxe works in namespaces here).
set -u
step() { echo "+ $*"; timeout 30 "$@"; }
uname -r
rdma system show
for ns in pa pb; do ip netns add $ns; ip -n $ns link set lo up; done
step ip link add va netns pa type veth peer name vb netns pb || exit 2
ip -n pa addr add 10.20.0.1/24 dev va && ip -n pa link set va up
ip -n pb addr add 10.20.0.2/24 dev vb && ip -n pb link set vb up
step ip netns exec pa rdma link add rxa type rxe netdev va || exit 2
step ip netns exec pb rdma link add rxb type rxe netdev vb || exit 2
for _ in $(seq 50); do
    grep -q ACTIVE /sys/class/infiniband/rxb/ports/1/state && break
    sleep 0.1
done
rdma link show
timeout 20 ip netns exec pb ibv_rc_pingpong -d rxb -g 1 -n 20 > /tmp/server.log 2>&1 &
server=$!
for _ in $(seq 100); do
    ip netns exec pb ss -Hltn | grep -q . && break
    sleep 0.1
done
step ip netns exec pa ibv_rc_pingpong -d rxa -g 1 -n 20 10.20.0.2
rc=$?
wait $server
echo "server: $(tail -n 2 /tmp/server.log | tr '\n' ' ')"
if [ $rc = 0 ]; then echo "rxe works in network namespaces here"; else echo "rxe does NOT carry RoCE in network namespaces here"; fi
exit $rc
