#!/usr/bin/env bash
# Fuzzes every target in fuzz/ for a bounded time: ci/fuzz.sh [SECONDS_PER_TARGET] (default 60).
#
# Installs cargo-fuzz if missing, builds every target once (address sanitizer, debug
# assertions, so an arithmetic overflow is a crash too), then runs each with
# -max_total_time. Each target writes its seed corpus (valid encodings of what it decodes)
# into fuzz/corpus/TARGET when it starts, and keeps what it found there for the next run.
# Prints the executions and executions/s of each target, writes target/fuzz-summary.json, and
# fails if any target found a crash (its input is kept in fuzz/artifacts/TARGET/; replay it
# with `cargo fuzz run -a TARGET PATH`).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
[[ $seconds =~ ^[0-9]+$ && $seconds -gt 0 ]] || { echo "usage: $0 [SECONDS_PER_TARGET]" >&2; exit 2; }
started=$(date +%s)

# cargo-fuzz needs nightly features; this makes the stable toolchain accept them.
export RUSTC_BOOTSTRAP=1
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
fuzz_flags=(--debug-assertions)

echo "=== building the fuzz targets"
cargo fuzz build "${fuzz_flags[@]}"
built=$(date +%s)
echo "built in $((built - started)) s"

mapfile -t targets < <(cargo fuzz list)
mkdir -p target fuzz/corpus fuzz/artifacts target/fuzz-logs
results=()
failed=()
for t in "${targets[@]}"; do
    log=target/fuzz-logs/$t.log
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
    echo "=== $t: ${seconds} s"
    status=ok
    SKYRIVER_FUZZ_SEEDS="$PWD/fuzz/corpus/$t" \
        cargo fuzz run "${fuzz_flags[@]}" "$t" -- \
        -max_total_time="$seconds" -timeout=20 -print_final_stats=1 >"$log" 2>&1 \
        || status=crash
    executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    if [[ -z $executions ]]; then
        # Without the final stats (a crash), the last status line has the count.
        executions=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
    fi
    per_sec=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    run_seconds=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    if [[ $status == crash ]]; then
        failed+=("$t")
        echo "!!! $t FAILED; last lines of $log:"
        tail -40 "$log"
        echo "!!! crash input: ${artifact:-none written (see $log)}"
    fi
    printf '%-18s %-5s %12s executions %10s exec/s\n' "$t" "$status" "${executions:-?}" "${per_sec:-?}"
    results+=("$(printf '{"target":"%s","status":"%s","executions":%s,"execs_per_sec":%s,"seconds":%s,"artifact":%s}' \
        "$t" "$status" "${executions:-null}" "${per_sec:-null}" "${run_seconds:-null}" \
        "$([[ -n $artifact ]] && printf '"%s"' "$artifact" || echo null)")")
done

finished=$(date +%s)
{
    printf '{"seconds_per_target":%s,"build_seconds":%s,"total_seconds":%s,"cpus":%s,"targets":[' \
        "$seconds" "$((built - started))" "$((finished - started))" "$(nproc)"
    (IFS=,; printf '%s' "${results[*]}")
    printf ']}\n'
} >target/fuzz-summary.json
echo "=== fuzzing took $((finished - started)) s (build $((built - started)) s); summary in target/fuzz-summary.json"
if ((${#failed[@]})); then
    echo "fuzzing found crashes in: ${failed[*]}" >&2
    exit 1
fi
