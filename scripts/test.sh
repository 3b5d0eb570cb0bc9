#!/usr/bin/env bash
# The project's one test command (README "Test it"; CI runs exactly this).
# It builds in release mode (the filter and model tests do real work) and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --check
cargo clippy --release --all-targets -- -D warnings
cargo test --release --all-targets
