#!/usr/bin/env bash
# Build the kernel store on this (CPU) machine and pack it for the device calls (no GPU needed):
#   bash tests/gpu/build_store.sh [STORE_DIR] [-- extra prebuild_kernels.py arguments]
# compiles every default variant (prebuild_kernels.py --all, ~950 s on the 2-core CI machine for 766 variants) into
# STORE_DIR (default /tmp/pdsa_store), then packs it with xz -9 into .device/kernel_store.tar.xz, which
# tests/gpu/device_env.sh unpacks on the device. An x86-64 entry's host code is built for x86-64-v3 whatever the CPU
# (ops/common/kernel_cache.py), so a store built on the AMD CPU machine loads on the Intel device host (2026-12-07
# 00:33: 766 of 766 loadable; the suite in 168 s instead of 529 s). Knob variants (prebuild_knob_variants.py) are
# left to the device's idle cores: they add ~240 entries and the tarball must fit beside .device (64 MiB a call).
# Start it first thing in a session: later kernel edits change keys, and a rerun compiles only what changed.
set -eu
cd "$(dirname "$0")/../.."
STORE=${1:-/tmp/pdsa_store}
shift || true
[ "${1:-}" = "--" ] && shift
export CUTE_DSL_ARCH=sm_90a PADDLE_DSA_KERNEL_CACHE="$STORE"
python tests/gpu/prebuild_kernels.py --all --jobs "${JOBS:-$(nproc)}" "$@" 2>&1 | grep -v Warn | tail -3
python tests/gpu/prebuild_kernels.py --check 2>&1 | grep -v Warn | tail -1
mkdir -p .device
tar -cf - -C "$STORE" . | xz -9 -T1 > .device/kernel_store.tar.xz.tmp && mv .device/kernel_store.tar.xz.tmp .device/kernel_store.tar.xz
carried=$(( $(du -sb .device | cut -f1) + $( (git ls-files; git ls-files -o --exclude-standard) | xargs -d '\n' du -cb 2>/dev/null | tail -1 | cut -f1) ))
echo "packed $(ls "$STORE" | grep -c '\.o$') entries: .device/kernel_store.tar.xz $(du -h .device/kernel_store.tar.xz | cut -f1);" \
  "a call carries $((carried / 1048576)) of 64 MiB"
[ "$carried" -lt $((64 * 1048576)) ] || { echo "over 64 MiB: carry a subset (tests/gpu/store_subset.py)"; exit 1; }
