#!/usr/bin/env bash
# Run one command inside a throw-away qemu guest with SoftRoCE (rdma_rxe)
# devices, stream its output, and exit with its exit status.
#
#   ci/softroce/run-in-vm.sh [--] COMMAND [ARGS...]
#
# Also a cargo target runner (each test binary then runs in its own VM):
#   CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=$PWD/ci/softroce/run-in-vm.sh \
#       cargo test -p skyriver-transport --test verbs_rxe
#
# The guest sees the host's whole file system read-only (writes go to a tmpfs
# overlay and are discarded), so COMMAND can be any host path. It runs as root
# in the current directory, stdin /dev/null, `ulimit -l unlimited`, with PATH
# HOME USER LANG TERM, every CARGO*, RUST* and SKYRIVER_* variable of the
# caller, the names listed in SKYRIVER_VM_PASSENV, and:
#   SKYRIVER_VM=1
#   SKYRIVER_RDMA_DEVICES  devices created, e.g. "rxe0 rxe1"
#   SKYRIVER_RDMA_IPS      their IPv4 addresses, e.g. "10.11.1.1 10.11.1.2"
#   SKYRIVER_VM_OUT        a directory copied back to the host's $SKYRIVER_VM_OUT
# rxe0 sits on veth0 and rxe1 on veth1, the two ends of one veth pair: traffic
# between them really crosses a link (RoCE v2, GID index 1 = the IPv4 address).
#
# Exit status: the command's; 124 when the time limit was hit; 125 when the VM
# failed (the guest kernel log is then printed to stderr); 2 on bad usage.
#
# Environment (all optional):
#   SKYRIVER_VM_WORK      work folder (default ${XDG_CACHE_HOME:-${HOME:-/var/tmp}/.cache}/skyriver-softroce)
#   SKYRIVER_VM_TIMEOUT   seconds for the whole run, boot included (default 900)
#   SKYRIVER_VM_BOOT_TIMEOUT  seconds for the guest to reach the command (default 240
#                         under TCG, 60 under KVM); a boot that takes longer is retried once
#   SKYRIVER_VM_ACCEL     auto (default: what build-image.sh probed) | kvm | tcg
#   SKYRIVER_VM_SMP       guest CPUs (default 2, at most the host's)
#   SKYRIVER_VM_MEM       guest memory in MiB (default 2048)
#   SKYRIVER_VM_NET       veth (default) | dummy | none
#   SKYRIVER_VM_MTU       MTU of the rxe netdevs (default 9000 -> RoCE MTU 4096)
#   SKYRIVER_VM_PASSENV   extra variable names to pass into the guest
#   SKYRIVER_VM_OUT       host directory receiving what the command writes to $SKYRIVER_VM_OUT
#   SKYRIVER_VM_CONSOLE   file to keep the guest kernel log (console + dmesg) in
#   SKYRIVER_VM_VERBOSE=1 also stream the guest kernel console to stderr
#   SKYRIVER_VM_KERNEL_ARGS  extra guest kernel arguments (default under TCG:
#                         "clocksource=tsc tsc=reliable"; empty keeps the kernel's choice)
#   SKYRIVER_VM_NO_APT=1  never apt-get install (the image must be buildable as is)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WORK=${SKYRIVER_VM_WORK:-${XDG_CACHE_HOME:-${HOME:-/var/tmp}/.cache}/skyriver-softroce}
TIMEOUT=${SKYRIVER_VM_TIMEOUT:-900}
MEM=${SKYRIVER_VM_MEM:-2048}
NET=${SKYRIVER_VM_NET:-veth}
MTU=${SKYRIVER_VM_MTU:-9000}
ncpu=$(nproc)
SMP=${SKYRIVER_VM_SMP:-$(( ncpu < 2 ? ncpu : 2 ))}

say() { echo "run-in-vm: $*" >&2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || usage
case "$1" in -h|--help) usage ;; esac
[ "$(id -u)" = 0 ] || { say "must run as root (qemu's 9p export of / and the image build need it)"; exit 2; }
case "$TIMEOUT" in ''|*[!0-9]*) say "bad SKYRIVER_VM_TIMEOUT=$TIMEOUT"; exit 2;; esac
case "$NET" in veth|dummy|none) ;; *) say "bad SKYRIVER_VM_NET=$NET"; exit 2;; esac

# Build (or just check) the image; about a second when it is up to date.
if [ ! -s "$WORK/accel" ] || [ ! -f "$WORK/initrd.img" ] || [ ! -s "$WORK/kver" ] \
   || [ "$HERE/init.sh" -nt "$WORK/initrd.img" ] || [ "$HERE/build-image.sh" -nt "$WORK/initrd.img" ]; then
    SKYRIVER_VM_WORK="$WORK" "$HERE/build-image.sh" || { say "image build failed"; exit 125; }
fi
WORK=$(cd "$WORK" && pwd -P)
KERNEL="$WORK/vmlinuz"; [ -s "$WORK/vmlinux" ] && KERNEL="$WORK/vmlinux"

ACCEL=${SKYRIVER_VM_ACCEL:-auto}
[ "$ACCEL" = auto ] && ACCEL=$(cat "$WORK/accel")
case "$ACCEL" in
    kvm) accel_args=(-accel kvm -cpu host); clock_args= ;;
    # Under TCG the kernel falls back to the HPET clocksource, and every clock_gettime becomes
    # an emulated MMIO read (tens of µs): programs that read the clock often (async runtimes,
    # timers, the daemons) would be measured against that, while perftest reads the TSC
    # directly. The emulated TSC is constant-rate, so the guest may use it.
    tcg) accel_args=(-accel tcg,thread=multi,tb-size=256 -cpu max); clock_args="clocksource=tsc tsc=reliable" ;;
    *) say "bad SKYRIVER_VM_ACCEL=$ACCEL"; exit 2 ;;
esac

BOOT_TIMEOUT=${SKYRIVER_VM_BOOT_TIMEOUT:-$([ "$ACCEL" = kvm ] && echo 60 || echo 240)}
RUN=$(mktemp -d "$WORK/run.XXXXXX")
chmod 700 "$RUN"
case "$RUN" in *[[:space:],]*) say "work folder path must not contain spaces or commas"; rm -rf "$RUN"; exit 2;; esac

QPID= TPID=
stop_qemu() {
    [ -n "$QPID" ] || return 0
    if kill -0 "$QPID" 2>/dev/null; then
        kill -TERM "$QPID" 2>/dev/null || true
        for _ in $(seq 20); do kill -0 "$QPID" 2>/dev/null || break; sleep 0.25; done
        kill -KILL "$QPID" 2>/dev/null || true
    fi
    wait "$QPID" 2>/dev/null || true
    QPID=
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    stop_qemu
    [ -n "$TPID" ] && kill "$TPID" 2>/dev/null || true
    rm -rf "$RUN"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# The command, as a POSIX sh script run by the host's /bin/sh in the guest.
q() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }
{
    echo "#!/bin/sh"
    for v in PATH HOME USER LANG TERM $(compgen -e | grep -E '^(CARGO|RUST|SKYRIVER_)' \
                | grep -vE '^SKYRIVER_(VM|VM_.*|RDMA_DEVICES|RDMA_IPS)$') ${SKYRIVER_VM_PASSENV:-}; do
        if [ -n "${!v+x}" ]; then echo "export $v=$(q "${!v}")"; fi
    done
    echo "export SKYRIVER_VM_OUT=$(q "$RUN/out")"
    echo "ulimit -l unlimited 2>/dev/null"
    echo "cd $(q "$PWD") 2>/dev/null || cd /"
    printf 'exec'
    for a in "$@"; do printf ' %s' "$(q "$a")"; done
    echo
} > "$RUN/cmd.sh"
mkdir -p "$RUN/out"

append="console=ttyS0 quiet panic=-1 oops=panic skyriver.rundir=$RUN skyriver.moddir=$WORK/modroot"
append+=" skyriver.net=$NET skyriver.mtu=$MTU skyriver.timeout=$((TIMEOUT + 15))"
append+=" ${SKYRIVER_VM_KERNEL_ARGS-$clock_args}"
qemu=(qemu-system-x86_64 -nodefaults -no-user-config -display none -monitor none
      "${accel_args[@]}" -m "$MEM" -smp "$SMP" -no-reboot
      -kernel "$KERNEL" -initrd "$WORK/initrd.img" -append "$append"
      -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
      -virtfs "local,path=$RUN,mount_tag=xfer,security_model=none"
      -serial "file:$RUN/console.log"
      -chardev stdio,id=cmdout,signal=off -serial chardev:cmdout)

# Watchdogs: the whole run, boot included, gets $TIMEOUT seconds; a guest that has not
# reached its command (init.sh creates $RUN/started) within $BOOT_TIMEOUT seconds is stopped
# and booted once more: an emulated boot now and then hangs before user space, and that
# should not cost the whole time limit or fail the run.
timed_out=0
for attempt in 1 2; do
    rm -f "$RUN/started" "$RUN/rc"
    : > "$RUN/console.log"
    start=$(date +%s)
    "${qemu[@]}" < /dev/null &
    QPID=$!
    if [ -n "${SKYRIVER_VM_VERBOSE:-}" ]; then
        (tail -s 0.2 -F --pid="$QPID" "$RUN/console.log" 2>/dev/null | sed -u 's/^/[guest] /' >&2) &
        TPID=$!
    fi
    boot_hung=0
    while kill -0 "$QPID" 2>/dev/null; do
        elapsed=$(( $(date +%s) - start ))
        if [ "$elapsed" -ge "$TIMEOUT" ]; then
            timed_out=1
            say "time limit of ${TIMEOUT}s reached, stopping the VM"
            break
        fi
        if [ ! -e "$RUN/started" ] && [ "$elapsed" -ge "$BOOT_TIMEOUT" ]; then
            boot_hung=1
            break
        fi
        sleep 0.2
    done
    stop_qemu
    [ "$boot_hung" = 1 ] || break
    say "the guest did not reach its command within ${BOOT_TIMEOUT}s (boot $attempt of 2); console tail:"
    tr -d '\r' < "$RUN/console.log" | tail -n 20 >&2 || true
    [ "$attempt" = 2 ] && { say "giving up"; exit 125; }
done

if [ -n "${SKYRIVER_VM_CONSOLE:-}" ]; then
    { cat "$RUN/console.log"; echo "----- dmesg -----"; cat "$RUN/dmesg.txt" 2>/dev/null; } \
        > "$SKYRIVER_VM_CONSOLE" || true
fi
if [ -n "${SKYRIVER_VM_OUT:-}" ]; then
    mkdir -p "$SKYRIVER_VM_OUT" && cp -a "$RUN/out/." "$SKYRIVER_VM_OUT/" || true
fi

if [ "$timed_out" = 1 ]; then
    say "guest kernel log (tail):"; tr -d '\r' < "$RUN/console.log" | tail -n 40 >&2 || true
    exit 124
fi
if [ -s "$RUN/rc" ]; then
    rc=$(cat "$RUN/rc")
    case "$rc" in ''|*[!0-9]*) say "bad status file: $rc"; exit 125;; esac
    if [ "$rc" = 125 ] && grep -q FATAL "$RUN/console.log"; then
        say "VM setup failed:"; tr -d '\r' < "$RUN/console.log" | tail -n 40 >&2
    elif [ "$rc" = 124 ]; then
        say "guest watchdog fired"
    fi
    exit "$rc"
fi
say "VM ended without reporting a status; guest kernel log:"
tr -d '\r' < "$RUN/console.log" | tail -n 60 >&2 || true
exit 125
