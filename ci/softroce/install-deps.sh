#!/usr/bin/env bash
# Install the Debian 12 packages Skyriver's build and its SoftRoCE test VM need.
# Idempotent: only missing packages are installed (--no-install-recommends);
# `apt-get update` runs only when an install fails or a package is unknown.
#
#   ci/softroce/install-deps.sh [build|rxe|vm|all]     (default: all)
#
#   build  what the host test suite needs beyond a Rust toolchain: a C compiler
#          and rdma-core's headers for the verbs layout test (the build itself
#          needs neither: libibverbs is loaded at run time)
#   vm     what ci/softroce/run-in-vm.sh needs: qemu, busybox, kmod, the
#          rdma-core user space the guest runs (libibverbs + the rxe provider),
#          and the verbs tools its selftest uses (ibverbs-utils, perftest)
#   rxe    only what a machine with its own RDMA kernel needs (the Vagrant VM,
#          real hardware): rdma-core user space, the verbs tools, perftest,
#          python3 (the benchmark table)
#
# Must run as root. Set SKYRIVER_VM_NO_APT=1 to only report what is missing.
set -euo pipefail

BUILD_PKGS=(gcc libc6-dev libibverbs-dev)
RXE_PKGS=(kmod iproute2 rdma-core ibverbs-providers libibverbs1 librdmacm1
          ibverbs-utils rdmacm-utils perftest python3)
VM_PKGS=(qemu-system-x86 busybox-static cpio gzip xz-utils zstd util-linux "${RXE_PKGS[@]}")

say() { echo "install-deps: $*" >&2; }

case "${1:-all}" in
    build) want=("${BUILD_PKGS[@]}") ;;
    rxe)   want=("${RXE_PKGS[@]}") ;;
    vm)    want=("${VM_PKGS[@]}") ;;
    all)   want=("${BUILD_PKGS[@]}" "${VM_PKGS[@]}") ;;
    *)     say "usage: $0 [build|rxe|vm|all]"; exit 2 ;;
esac

missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ -n "${SKYRIVER_VM_NO_APT:-}" ]; then
    say "missing packages (SKYRIVER_VM_NO_APT set, not installing): ${missing[*]}"
    exit 1
fi
[ "$(id -u)" = 0 ] || { say "must run as root to install: ${missing[*]}"; exit 1; }

say "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y --no-install-recommends "${missing[@]}" >&2; then
    say "apt-get install failed; running apt-get update and retrying"
    apt-get update >&2
    apt-get install -y --no-install-recommends "${missing[@]}" >&2
fi
