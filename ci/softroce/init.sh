#!/bin/busybox sh
# PID 1 of Skyriver's SoftRoCE test VM (in the initramfs built by
# build-image.sh). Only busybox exists until the host root is mounted.
#
# Kernel command line (set by run-in-vm.sh):
#   skyriver.rundir=DIR   host directory shared read-write as 9p tag "xfer":
#                         holds cmd.sh (what to run), receives rc and dmesg.txt
#   skyriver.moddir=DIR   host directory holding lib/modules/<kver> of the guest kernel
#   skyriver.net=MODE     veth (default): rxe0 on veth0 10.11.1.1, rxe1 on veth1 10.11.1.2
#                         dummy: rxe0 on dummy0 10.11.0.1;  none: no rxe device
#   skyriver.mtu=N        MTU of the rxe netdevs (default 9000 -> RoCE MTU 4096)
#   skyriver.timeout=N    guest watchdog: power off (status 124) after N s, in
#                         case the host script died without killing qemu
#   skyriver.probe=1      print SKYRIVER_PROBE_OK and power off (accelerator probe)
#
# The host's root is mounted read-only over 9p (tag "hostroot") under a tmpfs
# overlay; the command runs chrooted in it, so host-built binaries and the
# host's rdma-core run unchanged.

/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

log() { echo "skyriver-vm[$(cut -d' ' -f1 /proc/uptime)]: $*" > /dev/ttyS0; }
halt_now() {
    sync
    poweroff -f
    echo o > /proc/sysrq-trigger
    sleep 10
}
report() { # STATUS: hand the exit status to the host
    [ -d /xfer/. ] && echo "$1" > /xfer/rc.tmp && mv /xfer/rc.tmp /xfer/rc
}
die() {
    log "FATAL: $*"
    report 125
    halt_now
}

RUNDIR= MODDIR= NET=veth MTU=9000 PROBE= TIMEOUT=
for a in $(cat /proc/cmdline); do
    case "$a" in
        skyriver.rundir=*)  RUNDIR=${a#*=} ;;
        skyriver.moddir=*)  MODDIR=${a#*=} ;;
        skyriver.net=*)     NET=${a#*=} ;;
        skyriver.mtu=*)     MTU=${a#*=} ;;
        skyriver.probe=*)   PROBE=${a#*=} ;;
        skyriver.timeout=*) TIMEOUT=${a#*=} ;;
    esac
done

if [ -n "$PROBE" ]; then
    echo SKYRIVER_PROBE_OK > /dev/ttyS0
    halt_now
fi

# Arm the watchdog first: nothing below may hang the VM past its budget.
if [ -n "$TIMEOUT" ]; then
    ( sleep "$TIMEOUT"
      log "guest watchdog: ${TIMEOUT}s elapsed, powering off"
      report 124
      halt_now ) &
fi

log "init started"
for m in $(cat /modules/order); do
    insmod "/modules/$m" || log "insmod $m failed"
done
for m in $(cat /modules/optional); do
    insmod "/modules/$m" 2>/dev/null
done
for m in 9p overlay rdma_rxe rdma_ucm ib_uverbs; do
    [ -d /sys/module/$m ] || die "module $m is not loaded"
done

mkdir -p /host /xfer /rw /newroot
# cache=loose: the host tree is treated as immutable while the guest runs,
# which makes exec and mmap of host binaries much faster.
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=524288 hostroot /host \
    || die "cannot mount the host root (9p tag hostroot)"
mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=524288 xfer /xfer \
    || die "cannot mount the run directory (9p tag xfer)"
# The whole root is an overlay (not a tmpfs on /tmp, which would hide the
# host's /tmp where test binaries and the work folder may live).
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work overlay /newroot \
    || die "cannot mount the overlay root"

R=/newroot
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t devtmpfs devtmpfs $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts $R/dev/pts
mount -t tmpfs tmpfs $R/dev/shm
mount --bind /xfer "$R$RUNDIR" || die "cannot bind the run directory"
# The guest kernel's module tree, for later module loads: for the chroot
# (kmod) and for the initramfs (busybox modprobe, which the kernel's
# request_module() runs in PID 1's root).
if [ -d "$R$MODDIR/lib/modules" ]; then
    mkdir -p $R/lib/modules /lib/modules
    mount --bind "$R$MODDIR/lib/modules" $R/lib/modules
    mount --bind "$R$MODDIR/lib/modules" /lib/modules
    echo /sbin/modprobe > /proc/sys/kernel/modprobe
else
    log "warning: module tree $MODDIR/lib/modules not visible in the guest"
fi
hostname skyriver-vm
ip link set lo up
log "root ready"

# Host tools run through env(1): Debian's static busybox prefers its own
# applets, and busybox ip cannot create veth pairs. Commands are batched:
# each exec of a host binary over 9p costs ~0.1-0.2 s under TCG.
c() { chroot $R /usr/bin/env "$@"; }

RXE_DEVS= RXE_IPS=
case "$NET" in
veth)
    # rxe (6.1) listens for RoCE in init_net only, so no network namespaces:
    # both veth ends stay in init_net. Traffic between two local addresses
    # would take lo, where rxe drops it; policy routing sends locally
    # generated packets for the peer's address out of the veth instead, and
    # accept_local lets the other end take packets from a local source.
    printf '%s\n' \
        "link add veth0 type veth peer name veth1" \
        "link set veth0 mtu $MTU" \
        "link set veth1 mtu $MTU" \
        "addr add 10.11.1.1/24 dev veth0" \
        "addr add 10.11.1.2/24 dev veth1" \
        "link set veth0 up" \
        "link set veth1 up" \
        "rule add pref 100 to 10.11.1.2 iif lo lookup 101" \
        "rule add pref 101 to 10.11.1.1 iif lo lookup 102" \
        "route add 10.11.1.2 dev veth0 src 10.11.1.1 table 101" \
        "route add 10.11.1.1 dev veth1 src 10.11.1.2 table 102" \
        "rule add pref 1000 lookup local" \
        "rule del pref 0 lookup local" > /tmp.net
    c ip -batch - < /tmp.net || die "cannot set up the veth pair"
    for d in veth0 veth1; do
        echo 1 > /proc/sys/net/ipv4/conf/$d/accept_local
        echo 0 > /proc/sys/net/ipv4/conf/$d/rp_filter
    done
    echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter
    # veth delivers through the per-CPU backlog (default 1000 packets); bulk
    # RDMA overflows it and rxe then retransmits slowly or stalls.
    echo 100000 > /proc/sys/net/core/netdev_max_backlog
    printf '%s\n' "link add rxe0 type rxe netdev veth0" \
                  "link add rxe1 type rxe netdev veth1" > /tmp.rdma
    c rdma -b - < /tmp.rdma || die "rdma link add failed"
    RXE_DEVS="rxe0 rxe1" RXE_IPS="10.11.1.1 10.11.1.2"
    ;;
dummy)
    [ -d /sys/class/net/dummy0 ] || c ip link add dummy0 type dummy || die "cannot create dummy0"
    printf '%s\n' "link set dummy0 mtu $MTU" "addr add 10.11.0.1/24 dev dummy0" \
                  "link set dummy0 up" > /tmp.net
    c ip -batch - < /tmp.net || die "cannot set up dummy0"
    c rdma link add rxe0 type rxe netdev dummy0 || die "rdma link add rxe0 failed"
    RXE_DEVS="rxe0" RXE_IPS="10.11.0.1"
    ;;
none) ;;
*) die "unknown skyriver.net=$NET" ;;
esac

# Wait (bounded) until every port is ACTIVE and has its IPv4 RoCE GID.
for d in $RXE_DEVS; do
    i=0
    until grep -q ACTIVE /sys/class/infiniband/$d/ports/1/state 2>/dev/null \
          && grep -q '0000:0000:0000:0000:0000:ffff' /sys/class/infiniband/$d/ports/1/gids/* 2>/dev/null; do
        i=$((i + 1))
        [ $i -le 100 ] || die "$d: port not ACTIVE with an IPv4 GID after 10 s"
        sleep 0.1
    done
done
log "rxe ready: ${RXE_DEVS:-none} ${RXE_IPS:+($RXE_IPS)}"
# Tell the host the guest is up (it retries a boot that never gets here).
: > /xfer/started

# The command's output goes to the second serial port, which the host streams.
stty -F /dev/ttyS1 raw -echo 2>/dev/null
SKYRIVER_VM=1 SKYRIVER_RDMA_DEVICES="$RXE_DEVS" SKYRIVER_RDMA_IPS="$RXE_IPS" \
    chroot $R /bin/sh "$RUNDIR/cmd.sh" < /dev/null > /dev/ttyS1 2>&1
rc=$?
log "command exited with status $rc"
dmesg > /xfer/dmesg.txt 2>/dev/null
report $rc
halt_now
