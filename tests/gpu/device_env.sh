# Sourced by the device scripts (tests/gpu/*.sh) from the repository root: the log folder $OUT (the device call's
# return folder, or /tmp/gpu_out), the environment every GPU step runs in, and run_suite (one suite and its sanitizer).
OUT="${OUT:-/tmp/gpu_out}"
export OUT PYTHONUNBUFFERED=1 CUTE_DSL_ARCH=sm_90a
mkdir -p "$OUT"
# The kernel store (ops/common/kernel_cache.py): a kernel variant compiled by one process of the call (a test file,
# prebuild_kernels.py) is loaded by every later one (the sanitizer runs, the other test files) instead of compiled
# again. PADDLE_DSA_KERNEL_CACHE= (empty) turns it off.
# A store carried as .device/kernel_store.tar.xz seeds it: one an earlier call brought back (check_project.sh with
# STORE_OUT=1: $OUT/kernel_store.tar.xz), or one built on the CPU machine (PADDLE_DSA_KERNEL_CACHE=/tmp/s python
# tests/gpu/prebuild_kernels.py --all --jobs 2, and tests/gpu/prebuild_knob_variants.py for the knob variants the
# sparse score tests and benches compile; then tar -cJf .device/kernel_store.tar.xz -C /tmp/s .). An entry
# built on a CPU with a feature this host lacks is compiled here instead (ops/common/kernel_cache.py). Since 2026-12-07
# an x86-64 entry's host code is built for x86-64-v3 on any CPU (kernel_cache.PORTABLE_FEATURES), so a store built on
# the AMD CPU machine loads on the Intel device host (2026-12-07 00:33: 766 of 766; before, 12-06 19:33: every entry
# refused): build it there with tests/gpu/build_store.sh. A call whose
# working tree and .device/ would pass 64 MiB can carry a subset: tests/gpu/store_subset.py.
export PADDLE_DSA_KERNEL_CACHE="${PADDLE_DSA_KERNEL_CACHE-/tmp/pdsa_kernels}"
if [ -n "$PADDLE_DSA_KERNEL_CACHE" ] && [ -f .device/kernel_store.tar.xz ] && [ ! -d "$PADDLE_DSA_KERNEL_CACHE" ]; then
  mkdir -p "$PADDLE_DSA_KERNEL_CACHE" && tar -xJf .device/kernel_store.tar.xz -C "$PADDLE_DSA_KERNEL_CACHE"
fi

# run_suite TEST SANITIZER PYTEST_S SAN_S: tests/gpu/TEST.py, then tests/gpu/SANITIZER.py under compute-sanitizer
# racecheck and memcheck, through run_device.sh (its log: $OUT/run_device.log); prints the test log's failure lines.
run_suite() {
  GPU_TESTS="tests/gpu/$1.py" GPU_SANITIZE="tests/gpu/$2.py" PYTEST_TIMEOUT=$3 SAN_TIMEOUT=$4 \
    bash tests/gpu/run_device.sh > "$OUT/run_device.log" 2>&1
  grep -E "FAILED|Error" "$OUT/$1.log" 2>/dev/null | head -8
}
