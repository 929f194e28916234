#!/usr/bin/env bash
# Installs the Debian packages Skyriver's tests need beyond a Rust toolchain (idempotent; root).
# The build itself needs none of them.
#   ci/install-deps.sh          test dependencies of the host suite
#   ci/install-deps.sh all      also the SoftRoCE guest (qemu, rdma-core, perftest)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/softroce/install-deps.sh" build
# The Redis directory's tests run against a real redis-server (CI sets SKYRIVER_REQUIRE_REDIS=1).
if ! command -v redis-server >/dev/null 2>&1; then
    apt-get install -y --no-install-recommends redis-server \
        || { apt-get update && apt-get install -y --no-install-recommends redis-server; }
fi
# The metrics tests run a real Prometheus server of their own (CI sets
# SKYRIVER_REQUIRE_PROMETHEUS=1; promtool comes with it) and drive `skyriver top` in tmux.
# Debian's package also starts a system prometheus on :9090; the tests never use it.
# The Redis TLS test makes its own CA and server certificate with the openssl tool.
missing=()
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get install -y --no-install-recommends "${missing[@]}" \
        || { apt-get update && apt-get install -y --no-install-recommends "${missing[@]}"; }
fi
if [ "${1:-}" = all ]; then
    "$here/softroce/install-deps.sh" vm
fi
