#!/usr/bin/env bash
# Runs every cargo-fuzz target of crates/kubelet-fuzz (issue 20 point 3)
# for N seconds each (default 600), one at a time at nice 10, seeded from
# the checked-in corpus; prints each target's executions and findings.
#
#   bash hack/fuzz.sh [seconds-per-target]
#   FUZZ_TARGETS="quantity flags" picks targets; FUZZ_NO_BUILD=1 reuses the
#   last build.
#
# Needs the nightly toolchain and cargo-fuzz (cargo +nightly install
# cargo-fuzz --locked). New inputs libFuzzer finds go to
# crates/kubelet-fuzz/fuzz/corpus-work/<target>/, crashes and timeouts
# (an input over 2 s is a hang) to .../fuzz/artifacts/<target>/; neither is
# checked in: a finding's input is copied into corpus/<target>/ with its fix.
set -euo pipefail

secs=${1:-600}
root=$(cd "$(dirname "$0")/.." && pwd)
fz=$root/crates/kubelet-fuzz/fuzz
seeds=$root/crates/kubelet-fuzz/corpus
cd "$fz"
# Safe Rust: no sanitizer; overflow checks and debug assertions stay on.
flags=(-s none)
targets=${FUZZ_TARGETS:-$(cargo +nightly fuzz list)}
[[ -n ${FUZZ_NO_BUILD:-} ]] || nice -n 10 cargo +nightly fuzz build "${flags[@]}"
# The binaries run directly: `cargo fuzz run` would rebuild whenever the
# shared checkout changes under it.
bin=$fz/target/x86_64-unknown-linux-gnu/release

found=0
printf '%-22s %8s %14s %10s %s\n' target seconds execs exec/s findings
for t in $targets; do
    mkdir -p "corpus-work/$t" "artifacts/$t"
    log=artifacts/$t.log
    # Findings of this run only: artifacts of earlier runs stay in the directory.
    marker=$(mktemp)
    nice -n 10 "$bin/$t" "$fz/corpus-work/$t" "$seeds/$t" \
        -max_total_time="$secs" -timeout=2 -rss_limit_mb=2048 -max_len=65536 \
        -artifact_prefix="$fz/artifacts/$t/" -print_final_stats=1 >"$log" 2>&1 || true
    execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log" | tail -1)
    rate=$(awk '/stat::average_exec_per_sec/ {print $2}' "$log" | tail -1)
    new=$(find "artifacts/$t" -type f -newer "$marker" -printf '%f ')
    rm -f "$marker"
    n=$(wc -w <<<"$new")
    found=$((found + n))
    # A finding stops libFuzzer early: the seconds it really ran.
    ran=$(awk '/^Done [0-9]+ runs in/ {print $5}' "$log" | tail -1)
    if [[ -z $ran && ${rate:-0} -gt 0 ]]; then ran="~$((execs / rate))"; fi
    printf '%-22s %8s %14s %10s %s\n' "$t" "${ran:-?}" "${execs:-?}" "${rate:-?}" \
        "$n$( ((n > 0)) && printf ' (%s)' "$new")"
done
exit $((found > 0))
