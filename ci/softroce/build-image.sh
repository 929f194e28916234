#!/usr/bin/env bash
# Build Skyriver's SoftRoCE test VM: Debian's stock kernel, its module tree and
# a tiny busybox initramfs. Idempotent (~1 s when up to date). Root, Debian 12.
#
# The kernel .deb is fetched with `apt-get download` and unpacked into the work
# folder with `dpkg -x`; it is never installed on the host. Everything goes to
# $SKYRIVER_VM_WORK (default ${XDG_CACHE_HOME:-${HOME:-/var/tmp}/.cache}/skyriver-softroce):
#   vmlinuz, vmlinux      the kernel (bzImage, and uncompressed for PVH direct boot)
#   modroot/lib/modules/<kver>   its depmod'ed modules; the guest bind-mounts them
#   initrd.img            busybox-static + init.sh + the modules init.sh loads
#   accel                 "kvm" or "tcg": result of a one-time KVM boot probe
#   kver, config          kernel version and config
#
# Environment:
#   SKYRIVER_VM_WORK           work folder (no spaces or commas in its path)
#   SKYRIVER_VM_KERNEL_PKG     kernel package (default: what linux-image-amd64 depends on)
#   SKYRIVER_VM_NO_APT=1       do not install missing host packages
#   SKYRIVER_VM_PROBE_TIMEOUT  seconds for the KVM probe boot (default 30)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WORK=${SKYRIVER_VM_WORK:-${XDG_CACHE_HOME:-${HOME:-/var/tmp}/.cache}/skyriver-softroce}
PROBE_TIMEOUT=${SKYRIVER_VM_PROBE_TIMEOUT:-30}

say() { echo "build-image: $*" >&2; }

[ "$(id -u)" = 0 ] || { say "must run as root"; exit 1; }
case "$WORK" in *[[:space:],]*) say "SKYRIVER_VM_WORK must not contain spaces or commas"; exit 1;; esac
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd -P)

# One builder at a time (concurrent cargo runners may all call us).
exec 9> "$WORK/.build.lock"
flock -w 600 9 || { say "timed out waiting for $WORK/.build.lock"; exit 1; }

# 1. host packages
"$HERE/install-deps.sh" vm

# 2. kernel package: downloaded and unpacked, never installed
resolve_kpkg() {
    apt-cache depends linux-image-amd64 2>/dev/null \
        | sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | head -n1 || true
}
KPKG=${SKYRIVER_VM_KERNEL_PKG:-}
if [ -z "$KPKG" ] && [ -f "$WORK/kver" ]; then
    KPKG=linux-image-$(cat "$WORK/kver")   # already built: do not chase archive updates
elif [ -z "$KPKG" ]; then
    KPKG=$(resolve_kpkg)
    if [ -z "$KPKG" ] && [ -z "${SKYRIVER_VM_NO_APT:-}" ]; then
        apt-get update >&2
        KPKG=$(resolve_kpkg)
    fi
    [ -n "$KPKG" ] || { say "cannot resolve linux-image-amd64's kernel package (apt-get update?)"; exit 1; }
fi
KVER=${KPKG#linux-image-}
if [ ! -f "$WORK/modroot/.done-$KVER" ]; then
    say "fetching $KPKG"
    rm -rf "$WORK/debs" "$WORK/modroot" "$WORK/modroot.tmp"
    mkdir -p "$WORK/debs" "$WORK/modroot.tmp"
    (cd "$WORK/debs" && timeout 600 apt-get download "$KPKG" 2>&1 \
        | { grep -v '^W: Download is performed unsandboxed' || true; } >&2)
    deb=$(ls "$WORK"/debs/"$KPKG"_*.deb)
    dpkg -x "$deb" "$WORK/modroot.tmp"
    # Debian 12 ships modules under /lib; merged-/usr packages under /usr/lib.
    if [ ! -d "$WORK/modroot.tmp/lib/modules/$KVER" ]; then
        mkdir -p "$WORK/modroot.tmp/lib"
        mv "$WORK/modroot.tmp/usr/lib/modules" "$WORK/modroot.tmp/lib/modules"
    fi
    depmod -b "$WORK/modroot.tmp" "$KVER"   # the .deb ships no modules.dep
    cp "$WORK/modroot.tmp/boot/vmlinuz-$KVER" "$WORK/vmlinuz"
    cp "$WORK/modroot.tmp/boot/config-$KVER" "$WORK/config"
    rm -rf "$WORK/modroot.tmp/boot" "$WORK/modroot.tmp/usr/share" "$WORK/modroot.tmp/usr/lib/linux" "$WORK/debs"
    touch "$WORK/modroot.tmp/.done-$KVER"
    mv "$WORK/modroot.tmp" "$WORK/modroot"
    rm -f "$WORK/initrd.img" "$WORK/accel" "$WORK/vmlinux"
fi
echo "$KVER" > "$WORK/kver"

# 2b. Uncompressed vmlinux: qemu boots it through its PVH entry, which skips
#     the in-guest decompression of the bzImage (seconds under TCG).
if [ ! -s "$WORK/vmlinux" ] && grep -q '^CONFIG_PVH=y' "$WORK/config"; then
    for fmt in 'xz:\xfd7zXZ\x00:xz -dc --single-stream' 'zstd:\x28\xb5\x2f\xfd:zstd -dcq' 'gzip:\x1f\x8b\x08:gzip -dc'; do
        magic=${fmt#*:}; magic=${magic%%:*}; cmd=${fmt##*:}
        off=$( { LC_ALL=C grep -obUaP "$magic" "$WORK/vmlinuz" 2>/dev/null || true; } | head -n1 | cut -d: -f1)
        [ -n "$off" ] || continue
        tail -c +$((off + 1)) "$WORK/vmlinuz" | $cmd > "$WORK/vmlinux.tmp" 2>/dev/null || true
        if [ "$(head -c 4 "$WORK/vmlinux.tmp" 2>/dev/null | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
            mv "$WORK/vmlinux.tmp" "$WORK/vmlinux"; break
        fi
    done
    rm -f "$WORK/vmlinux.tmp"
    [ -s "$WORK/vmlinux" ] || say "could not extract vmlinux; booting the bzImage (slower)"
fi

# 3. initramfs: busybox, init.sh and the modules it loads (dependencies first).
#    crc32_generic: rdma_rxe allocates the crypto API's "crc32" and would
#    otherwise request_module() it from the initramfs, which has no modprobe
#    configuration at that point.
INITRD_MODULES="virtio_pci 9pnet_virtio 9p overlay crc32_generic rdma_rxe ib_uverbs rdma_ucm veth dummy"
INITRD_OPTIONAL_MODULES="crc32-pclmul"
MODDIR="$WORK/modroot/lib/modules/$KVER"
[ -d "$MODDIR" ] || { say "module tree missing: $MODDIR"; exit 1; }
if [ ! -f "$WORK/initrd.img" ] || [ "$HERE/init.sh" -nt "$WORK/initrd.img" ] \
   || [ "$HERE/build-image.sh" -nt "$WORK/initrd.img" ]; then
    say "building initramfs"
    ir=$(mktemp -d "$WORK/initrd.XXXXXX")
    trap 'rm -rf "$ir"' EXIT
    mkdir -p "$ir"/{bin,sbin,dev,proc,sys,modules,usr/bin,usr/sbin}
    cp /bin/busybox "$ir/bin/busybox"
    cp "$HERE/init.sh" "$ir/init"
    chmod 755 "$ir/init"
    modlist() {
        for m in "$@"; do
            modprobe -d "$WORK/modroot" -S "$KVER" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
        done | awk '!seen[$0]++'
    }
    modlist $INITRD_MODULES > "$ir/modules.list"
    modlist $INITRD_OPTIONAL_MODULES | grep -vxFf "$ir/modules.list" > "$ir/optional.list" || true
    : > "$ir/modules/order"; : > "$ir/modules/optional"
    while read -r ko; do cp "$ko" "$ir/modules/"; basename "$ko" >> "$ir/modules/order"; done < "$ir/modules.list"
    while read -r ko; do cp "$ko" "$ir/modules/"; basename "$ko" >> "$ir/modules/optional"; done < "$ir/optional.list"
    rm -f "$ir/modules.list" "$ir/optional.list"
    (cd "$ir" && find . | cpio -o -H newc --quiet | gzip -1) > "$WORK/initrd.img.tmp"
    mv "$WORK/initrd.img.tmp" "$WORK/initrd.img"
    rm -rf "$ir"
    trap - EXIT
fi

# 4. One-time accelerator probe. KVM hosts that only run PVM guests (kvm_pvm)
#    fail here, and then TCG is used.
KERNEL="$WORK/vmlinuz"; [ -s "$WORK/vmlinux" ] && KERNEL="$WORK/vmlinux"
if [ ! -s "$WORK/accel" ]; then
    accel=tcg
    if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
        say "probing KVM (up to ${PROBE_TIMEOUT}s)"
        out=$(timeout -k 5 "$PROBE_TIMEOUT" qemu-system-x86_64 -nodefaults -no-user-config \
                -display none -monitor none -accel kvm -cpu host -m 512 -smp 1 -no-reboot \
                -kernel "$KERNEL" -initrd "$WORK/initrd.img" -serial stdio \
                -append "console=ttyS0 quiet panic=-1 skyriver.probe=1" < /dev/null 2>&1 || true)
        if grep -q SKYRIVER_PROBE_OK <<< "$out"; then accel=kvm; else
            say "KVM probe failed, using TCG: $(tr -d '\r' <<< "$out" | grep -a -v '^$' | tail -n 2 | tr '\n' ' ')"
        fi
    fi
    echo "$accel" > "$WORK/accel"
fi
say "ready: kernel $KVER, accel $(cat "$WORK/accel"), work folder $WORK"
