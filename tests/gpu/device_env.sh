# Sourced by the device scripts (tests/gpu/*.sh) from the repository root: the log folder $OUT (the device call's
# return folder, or /tmp/gpu_out) and the environment every GPU step runs in.
OUT="${OUT:-/tmp/gpu_out}"
export OUT PYTHONUNBUFFERED=1 CUTE_DSL_ARCH=sm_90a
mkdir -p "$OUT"
