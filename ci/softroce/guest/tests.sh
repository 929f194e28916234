#!/bin/sh
# Runs verbs test binaries one after another INSIDE the SoftRoCE VM (started by
# ../test.sh), each with one test thread, its output uncaptured (the tests print
# connect times and link summaries) and a time limit, and prints a summary.
#
#   guest/tests.sh TEST-BINARY...
#
# Environment: SKYRIVER_TEST_TIMEOUT  seconds per binary (default 600).
#              SKYRIVER_TEST_FILTER   run only the tests whose names contain it (every binary).
#              SKYRIVER_TEST_IGNORED=1  run the ignored tests only (to reproduce a known bug).
# Exit status 0 when every binary passed.
set -u
limit=${SKYRIVER_TEST_TIMEOUT:-600}
select=""
[ "${SKYRIVER_TEST_IGNORED:-}" = 1 ] && select="--ignored"
export NO_COLOR=1   # plain CI logs from the daemons too
echo "verbs suite in the guest: devices ${SKYRIVER_RDMA_DEVICES:-none} (${SKYRIVER_RDMA_IPS:-})"
[ -n "${SKYRIVER_RDMA_DEVICES:-}" ] || { echo "no RDMA devices: refusing to run (the tests would only skip)"; exit 1; }
failed="" summary=""
for bin in "$@"; do
    name=$(basename "$bin" | sed 's/-[0-9a-f]*$//')
    echo
    echo "=== $name"
    start=$(date +%s)
    # $select is empty or one word; the filter (possibly empty) is one argument.
    # shellcheck disable=SC2086
    timeout -k 10 "$limit" "$bin" --test-threads=1 --nocapture --color=never $select \
        ${SKYRIVER_TEST_FILTER:+"$SKYRIVER_TEST_FILTER"}
    rc=$?
    took=$(( $(date +%s) - start ))
    if [ $rc = 0 ]; then
        summary="$summary
ok     $name (${took}s)"
    else
        [ $rc = 124 ] && echo "$name: time limit of ${limit}s reached"
        summary="$summary
FAILED $name (status $rc, ${took}s)"
        failed="$failed $name"
    fi
done
echo
echo "=== verbs suite summary$summary"
[ -z "$failed" ] || { echo "failed:$failed"; exit 1; }
