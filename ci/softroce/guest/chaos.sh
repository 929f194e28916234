#!/bin/sh
# `skyriver chaos --fabric verbs` INSIDE the SoftRoCE VM (started by ../chaos.sh): the
# daemons in network namespaces (TCP for the directory and the connections' set-up), their
# RDMA traffic on rxe0/rxe1 in the initial namespace, where SoftRoCE carries RoCE.
#
#   guest/chaos.sh SKYRIVER-BINARY [CHAOS ARGS...]
#
# The verdict goes to $SKYRIVER_VM_OUT/chaos.json (with the history beside it) and the
# daemons' logs to $SKYRIVER_VM_OUT/logs. Exit status: chaos's.
set -u
exe=$1; shift
echo "chaos on verbs in the guest: devices ${SKYRIVER_RDMA_DEVICES:-none} (${SKYRIVER_RDMA_IPS:-})"
[ -n "${SKYRIVER_RDMA_DEVICES:-}" ] || { echo "no RDMA devices in the guest"; exit 1; }
# The namespaces' bridge: the initramfs loads only what the verbs suites need.
modprobe bridge || { echo "cannot load the bridge module"; exit 1; }
export NO_COLOR=1
out=${SKYRIVER_VM_OUT:-/tmp}
exec "$exe" chaos --fabric verbs --json "$out/chaos.json" --keep-logs "$out/logs" "$@"
