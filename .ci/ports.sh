#!/usr/bin/env bash
# .ci/ports.sh -- run paddle_dsa's CPU suite and tests/ports once per supported Paddle release line.
#
# One venv per line under $PADDLE_DSA_VENV_CACHE (default /root/.cache/paddle_dsa_venvs), named
# <line>-<hash>; the hash covers the port's requirements.txt, the setup.py extra of that line, the DSL
# and test pins and the Python version, so a changed pin builds a fresh venv and an unchanged one is
# reused. The package itself is (re)installed editable, without deps, whenever the venv's
# paddle_dsa does not point at this checkout.
#
# Env: PADDLE_DSA_PORT_LINES  lines to run (default "2.6 3.0 3.2 3.3")
#      PADDLE_DSA_PORTS_TESTS pytest targets (default: tests/ minus gpu and compile)
#      PYTHON                 interpreter for the venvs (default python3.11, else python3)
# Prints one summary line per venv; exits non-zero if any venv failed to build or any test failed.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${PADDLE_DSA_VENV_CACHE:-/root/.cache/paddle_dsa_venvs}
LINES=${PADDLE_DSA_PORT_LINES:-"2.6 3.0 3.2 3.3"}
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
DSL="nvidia-cutlass-dsl[cu13]==4.8.1"
TESTPKGS="pytest>=7"
read -r -a TESTS <<< "${PADDLE_DSA_PORTS_TESTS:-tests/ --ignore=tests/gpu --ignore=tests/compile}"
mkdir -p "$CACHE"

port_dir() {  # release line -> port package directory
  case "$1" in
    2.6) echo ports/paddle_2_6 ;;
    3.0|3.1|3.2) echo ports/paddle_3_0 ;;
    3.3) echo ports/paddle_3_3 ;;
    *) return 1 ;;
  esac
}

venv_key() {  # hash of everything the venv's contents depend on
  local line=$1 dir=$2
  {
    echo "line=$line dsl=$DSL test=$TESTPKGS"
    "$PY" -c 'import sys; print(sys.version)'
    cat "$ROOT/$dir/requirements.txt"
    grep -E "^\s*\"paddle-$line\":" "$ROOT/setup.py"
    grep -E "^(DSL|TVM_FFI) =|install_requires" "$ROOT/setup.py"
  } | sha256sum | cut -c1-16
}

build_venv() {  # line dir venv log -> 0 on success
  local line=$1 dir=$2 venv=$3 log=$4
  # Built in place (pip writes the venv's absolute path into scripts); .complete marks a finished one.
  "$PY" -m venv "$venv" >>"$log" 2>&1 || return 1
  "$venv/bin/python" -m pip install -q -U pip >>"$log" 2>&1 || return 1
  # One resolver run: the line's pins (requirements.txt and the extra), the DSL and pytest together.
  (cd "$ROOT" && "$venv/bin/python" -m pip install -q -r "$dir/requirements.txt" -e ".[paddle-$line]" \
      "$DSL" "$TESTPKGS") >>"$log" 2>&1 || return 1
  "$venv/bin/python" -m pip check >>"$log" 2>&1 || return 1
  touch "$venv/.complete"
}

ensure_editable() {  # make the venv's paddle_dsa this checkout
  local venv=$1 log=$2 where
  where=$(cd /tmp && "$venv/bin/python" -c 'import importlib.util as u; s = u.find_spec("paddle_dsa"); print(s.submodule_search_locations[0] if s else "")' 2>/dev/null)
  if [ "$where" != "$ROOT/paddle_dsa" ]; then
    (cd "$ROOT" && "$venv/bin/python" -m pip install -q --no-deps -e .) >>"$log" 2>&1
  fi
}

status=0
summary=()
for line in $LINES; do
  t0=$(date +%s)
  dir=$(port_dir "$line") || { summary+=("ports[$line]: FAIL unknown release line"); status=1; continue; }
  key=$(venv_key "$line" "$dir")
  venv="$CACHE/paddle-$line-$key"
  log="$CACHE/paddle-$line-$key.log"
  : >"$log"
  built=cached
  # One builder per venv at a time (two CI runs on one machine share the cache).
  exec {lockfd}>"$venv.lock"
  flock "$lockfd"
  if [ ! -f "$venv/.complete" ]; then
    rm -rf "$venv"
    built=built
    if ! build_venv "$line" "$dir" "$venv" "$log"; then
      summary+=("ports[$line]: FAIL venv build ($(( $(date +%s) - t0 ))s), log $log")
      tail -n 20 "$log"
      rm -rf "$venv"
      flock -u "$lockfd"; exec {lockfd}>&-
      status=1
      continue
    fi
  fi
  flock -u "$lockfd"; exec {lockfd}>&-
  if ! ensure_editable "$venv" "$log"; then
    summary+=("ports[$line]: FAIL editable install, log $log"); tail -n 20 "$log"; status=1; continue
  fi
  t1=$(date +%s)
  paddle_v=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("paddlepaddle"))' 2>/dev/null)
  # -p paddle_dsa.ports runs the port's import-order step (2.6: zlib before paddle) ahead of every conftest.
  out=$(cd "$ROOT" && "$venv/bin/python" -m pytest -p paddle_dsa.ports -q -p no:cacheprovider "${TESTS[@]}" 2>&1)
  rc=$?
  t2=$(date +%s)
  echo "$out" >>"$log"
  last=$(echo "$out" | grep -E "(passed|failed|error|skipped|no tests ran)" | tail -n 1 | sed -e 's/=//g' -e 's/^ *//;s/ *$//')
  if [ $rc -ne 0 ]; then
    status=1
    echo "---- ports[$line] (paddle $paddle_v) failures:"
    echo "$out" | tail -n 40
  fi
  word=$([ $rc -eq 0 ] && echo PASS || echo FAIL)
  summary+=("ports[$line]: $word paddle $paddle_v, venv $built in $((t1 - t0))s, tests $((t2 - t1))s: ${last:-rc=$rc}")
done
printf '%s\n' "${summary[@]}"
exit $status
