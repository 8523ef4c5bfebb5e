#!/usr/bin/env bash
# Runs every benchmark in bench/ (C programs and Python scripts) in turn.
set -u
cd "$(dirname "$0")/.."
make -s bench-bin || exit 1
for b in build/bench/*; do [ -x "$b" ] && { echo "== $b"; "$b"; }; done
for p in bench/*.py; do [ -f "$p" ] && { echo "== $p"; python3 "$p"; }; done
