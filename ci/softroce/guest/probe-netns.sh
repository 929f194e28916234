#!/bin/bash
# probe: can rxe live in network namespaces in the guest?
set -u
T() { echo "+ $*"; timeout 30 "$@"; echo "  -> $?"; }
uname -r
T rdma system show
# A: rxe on an interface inside a namespace
T ip netns add pa
T ip netns add pb
T ip link add va netns pa type veth peer name vb netns pb
T ip -n pa addr add 10.20.0.1/24 dev va
T ip -n pb addr add 10.20.0.2/24 dev vb
T ip -n pa link set va up
T ip -n pb link set vb up
T ip -n pa link set lo up
T ip -n pb link set lo up
T ip netns exec pa rdma link add rxa type rxe netdev va
T ip netns exec pb rdma link add rxb type rxe netdev vb
T rdma link show
sleep 1
for d in rxa rxb; do cat /sys/class/infiniband/$d/ports/1/state; cat /sys/class/infiniband/$d/ports/1/gids/1; done
T ip netns exec pa ibv_devices
timeout 20 ip netns exec pb ibv_rc_pingpong -d rxb -g 1 -n 20 > /tmp/srv.log 2>&1 &
sleep 1
T ip netns exec pa ibv_rc_pingpong -d rxa -g 1 -n 20 10.20.0.2
wait; cat /tmp/srv.log
# B: rxe in init_net on a bridge, processes in namespaces
T ip netns add pc
T ip netns add pd
T ip link add vc netns pc type veth peer name vd netns pd
T ip -n pc addr add 10.21.0.1/24 dev vc
T ip -n pd addr add 10.21.0.2/24 dev vd
T ip -n pc link set vc up
T ip -n pd link set vd up
T ip link add br9 type bridge
T ip link set br9 up
for i in 1 2; do
  T ip link add r$i type veth peer name r${i}p
  T ip link set r${i}p master br9
  T ip link set r${i}p up
  T ip addr add 10.12.0.$i/24 dev r$i
  T ip link set r$i up
  T ip rule add pref $((100+i)) from 10.12.0.$i to 10.12.0.0/24 iif lo lookup $((100+i))
  T ip route add 10.12.0.0/24 dev r$i src 10.12.0.$i table $((100+i))
  echo 1 > /proc/sys/net/ipv4/conf/r$i/accept_local
  echo 0 > /proc/sys/net/ipv4/conf/r$i/rp_filter
  T rdma link add rxr$i type rxe netdev r$i
done
echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter
T ip rule add pref 1000 lookup local
T ip rule del pref 0 lookup local
sleep 1
for d in rxr1 rxr2; do cat /sys/class/infiniband/$d/ports/1/state; cat /sys/class/infiniband/$d/ports/1/gids/1; done
T ip netns exec pc ibv_devices
timeout 20 ip netns exec pd ibv_rc_pingpong -d rxr2 -g 1 -n 20 > /tmp/srv.log 2>&1 &
sleep 1
T ip netns exec pc ibv_rc_pingpong -d rxr1 -g 1 -n 20 10.21.0.2
wait; cat /tmp/srv.log
echo "link down r1:"; ip link set r1 down
timeout 10 ip netns exec pd ibv_rc_pingpong -d rxr2 -g 1 -n 20 > /tmp/srv.log 2>&1 &
sleep 1
T ip netns exec pc ibv_rc_pingpong -d rxr1 -g 1 -n 20 10.21.0.2
wait; cat /tmp/srv.log
ip link set r1 up; sleep 1
echo "tc on r1 then pingpong:"
T tc qdisc replace dev r1 root tbf rate 1mbit burst 32kbit latency 400ms
timeout 20 ip netns exec pd ibv_rc_pingpong -d rxr2 -g 1 -n 20 > /tmp/srv.log 2>&1 &
sleep 1
T ip netns exec pc ibv_rc_pingpong -d rxr1 -g 1 -n 20 10.21.0.2
wait; cat /tmp/srv.log
