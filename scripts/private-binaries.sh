#!/usr/bin/env bash
# Puts private copies of the release binaries the benchmark scripts run (backlinks,
# backlinks-workload, and the benches' `suite`) in DEST: built now, or copied from FROM when
# given. Private copies: a build by anyone else during a long run cannot change them under it.
#
#   scripts/private-binaries.sh DEST [FROM]
set -euo pipefail
cd "$(dirname "$0")/.."
dest=$1
from=${2:-}
mkdir -p "$dest"
if [ -n "$from" ]; then
    cp "$from/backlinks" "$from/backlinks-workload" "$from/suite" "$dest/"
else
    cargo build --release --bins
    suite=$(cargo bench --bench suite --no-run --message-format=json 2>/dev/null |
        jq -r 'select(.reason == "compiler-artifact" and .target.name == "suite" and .executable != null) | .executable' |
        tail -n 1)
    cp target/release/backlinks target/release/backlinks-workload "$dest/"
    cp "$suite" "$dest/suite"
fi
