#!/usr/bin/env bash
# Copies what the offline GPU machine lacks into .carry/ (git-ignored): GoogleTest's sources from
# Debian's googletest package. Name ".carry" in the device tool's carry list, then run
# scripts/gpu_check.sh there.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/src/googletest ] || { apt-get update -qq && apt-get install -y -qq googletest=1.12.1-0.2; }
rm -rf .carry/googletest && mkdir -p .carry && cp -r /usr/src/googletest .carry/googletest
echo "prepared .carry/ ($(du -sh .carry | cut -f1))"
