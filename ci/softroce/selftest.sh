#!/usr/bin/env bash
# End-to-end check of the SoftRoCE VM: builds the image if needed and runs
# guest/selftest.sh (rxe devices, ibv_rc_pingpong, rping, ib_read_bw across
# the veth pair) in one VM. Root. Exit status 0 = real verbs work here (~20 s).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export SKYRIVER_VM_TIMEOUT=${SKYRIVER_VM_TIMEOUT:-300}
"$HERE/build-image.sh"
exec "$HERE/run-in-vm.sh" "$HERE/guest/selftest.sh"
