#!/usr/bin/env bash
# Which crates the kubelet-rs binary's code comes from (issue 21), as
# `cargo bloat --crates` reports it (cargo-bloat is not installable offline
# here): every function symbol's size from `nm`, attributed to the crate of
# its demangled path; a generic instance counts for the crate that defines
# the function, as cargo-bloat does (so `core`/`alloc` hold instances made
# for every crate). Usage: hack/bloat.sh [BINARY] [N]
set -euo pipefail
BIN=${1:-target/release/kubelet-rs}
N=${2:-25}
echo "$BIN: $(stat -c %s "$BIN") bytes, .text $(size -A "$BIN" | awk '$1==".text"{print $2}') bytes"
nm -S --size-sort -C "$BIN" | python3 -c '
import re, sys, collections
n = int(sys.argv[1])
by = collections.Counter()
total = 0
for line in sys.stdin:
    parts = line.rstrip("\n").split(" ", 3)
    if len(parts) < 4 or parts[2] not in "tTwW":
        continue
    size = int(parts[1], 16)
    total += size
    name = parts[3].lstrip("<&*").replace("dyn ", "").replace("mut ", "")
    m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)::", name)
    by[m.group(1) if m else "[unknown]"] += size
print(f"{total/1e6:6.2f} MB in function symbols")
for crate, size in by.most_common(n):
    print(f"{size/1e6:6.2f} MB {100*size/total:5.1f}% {crate}")
' "$N"
