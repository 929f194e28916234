#!/usr/bin/env bash
# The test command: every test of the workspace (`cargo test --workspace`, arguments passed
# on), then the tests that did not run for lack of something, each with how to run it.
#
# A test that lacks something (redis-server, prometheus, root for network namespaces, Slurm,
# a Python with pytest, the verbs headers, RDMA devices, memory) passes without running and
# prints a `SKIPPED: <binary>::<test>: <reason> (to run it: ...)` line; this script collects
# those lines (SKYRIVER_SKIP_LOG) and lists them after cargo's summary. With a
# SKYRIVER_REQUIRE_* variable set, its tests fail instead of skipping (CI sets them).
# Exits with cargo's status.
set -uo pipefail
cd "$(dirname "$0")/.."
skip_log=$(mktemp "${TMPDIR:-/tmp}/skyriver-skips.XXXXXX")
trap 'rm -f "$skip_log"' EXIT
SKYRIVER_SKIP_LOG=$skip_log cargo test --workspace "$@"
status=$?
if [ -s "$skip_log" ]; then
    printf '\n%s test(s) passed without running, for lack of something:\n' \
        "$(wc -l < "$skip_log")"
    sort "$skip_log"
else
    printf '\nNo test was skipped.\n'
fi
exit "$status"
