#!/usr/bin/env bash
# The project's one test command (README "Test it"; CI runs exactly this).
# It builds in release mode (the filter and model tests do real work) and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
# The status-page test (tests/status_page.rs) drives headless Chromium: install it when missing.
if ! command -v chromium >/dev/null 2>&1; then
    apt-get update && apt-get install -y chromium
fi
# The S3 tests (tests/s3_garage.rs) run against a local Garage: start one, stop it on exit.
GARAGE_DIR=$(mktemp -d -t backlinks-garage.XXXXXX)
trap 'scripts/garage.sh stop "$GARAGE_DIR"; rm -rf "$GARAGE_DIR"' EXIT
scripts/garage.sh start "$GARAGE_DIR"
# shellcheck source=/dev/null
source "$GARAGE_DIR/env"
cargo fmt --check
cargo clippy --release --all-targets -- -D warnings
cargo test --release --all-targets
