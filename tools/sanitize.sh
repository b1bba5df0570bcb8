#!/usr/bin/env bash
# Runs the native core's tests (ring, JPEG transcoder) against sanitizer builds of the native core (`make test-sanitize`).
#
#   tools/sanitize.sh [address|thread|all]     (default: all)
#
# SANITIZE_BUILD_DIR=DIR keeps each variant's build in DIR/<variant> and reuses it; SANITIZE_BUILD_ONLY=1 stops after
# the build (tests/conftest.py starts the ASan build that way when the suite begins, so it overlaps the unit tests).
#
# Each variant copies the package into a temporary folder, builds `fastfeed._native` there with
# FASTFEED_SANITIZE=address,undefined or =thread (see setup.py), and runs tests/test_ring*.py (except the test that
# calls this script) with that copy first on PYTHONPATH and the sanitizer runtime LD_PRELOADed (CPython itself is not
# instrumented). Leak detection is off because CPython leaks at exit by design. Any sanitizer report fails the run,
# even if pytest passed.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
[ -x "$py" ] || py=python3
which=${1:-all}
# the native core: the ring, the JPEG transcoder (transcode_many runs its own threads), the tar writer, the
# JPEG probe and scan check with its walk (check_jpegs and the writer's reader threads run them), the window decode,
# the PNG decode
tests=("$root/tests/test_ring.py" "$root/tests/test_ring_binding.py" "$root/tests/test_ring_shutdown.py"
       "$root/tests/test_ring_digests.py"
       "$root/tests/test_jpeg_transcode.py" "$root/tests/test_pack_native.py" "$root/tests/test_image_probe.py"
       "$root/tests/test_scan_check.py" "$root/tests/test_scan_walk.py" "$root/tests/test_jpeg_region.py"
       "$root/tests/test_png_decode.py")

run_variant() {
    local name=$1 flags=$2 runtime tmp log status
    runtime=$(gcc -print-file-name="lib${name}.so")
    if [ ! -e "$runtime" ]; then
        echo "sanitize: lib${name}.so not found (gcc -print-file-name); install gcc's sanitizer runtime" >&2
        return 1
    fi
    if [ -n "${SANITIZE_BUILD_DIR:-}" ]; then  # a build kept for a later call (the test suite builds it early)
        tmp=$SANITIZE_BUILD_DIR/$name
        mkdir -p "$tmp"
    else
        tmp=$(mktemp -d "${TMPDIR:-/tmp}/fastfeed-sanitize-${name}.XXXXXX")
        [ -n "${SANITIZE_KEEP:-}" ] || trap 'rm -rf "$tmp"' RETURN
    fi
    log="$tmp/pytest.log"
    if [ -e "$tmp/.built" ]; then
        echo "== sanitize [$flags]: built earlier in $tmp"
    else
        cp "$root/setup.py" "$root/pyproject.toml" "$tmp/"
        cp -r "$root/csrc" "$tmp/"
        (cd "$root" && tar cf - --exclude='*.so' --exclude=__pycache__ fastfeed) | (cd "$tmp" && tar xf -)
        echo "== sanitize [$flags]: building in $tmp"
        (cd "$tmp" && FASTFEED_SANITIZE="$flags" "$py" setup.py -q build_ext --inplace >"$tmp/build.log" 2>&1) || {
            cat "$tmp/build.log" >&2
            return 1
        }
        touch "$tmp/.built"
    fi
    [ "${SANITIZE_BUILD_ONLY:-}" != 1 ] || return 0
    local -a env=(
        # libstdc++ is preloaded too: python does not link it, and without it the runtime's __cxa_throw
        # interceptor finds no real __cxa_throw and aborts on the first C++ exception.
        "PYTHONPATH=$tmp" "LD_PRELOAD=$runtime $(gcc -print-file-name=libstdc++.so)" "FASTFEED_RING_SANITIZE=1"
        # A small quarantine: the default 256 MB keeps freed ring arenas resident, which the RSS leak test
        # would (rightly) read as a leak; 16 MB still catches use of recently freed memory.
        "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1:quarantine_size_mb=16"
        "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1"
        "TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1"
    )
    # Run from $tmp: `python -c` and `python -m` put the working directory first on sys.path.
    (cd "$tmp" && env "${env[@]}" "$py" -c "import fastfeed._native as n, sys; sys.exit(0 if n.__file__.startswith('$tmp') else \
        f'sanitize: imported {n.__file__}, not the instrumented build in $tmp')")
    echo "== sanitize [$flags]: ${tests[*]#$root/}"
    status=0
    # DALI's decoder does not load under the sanitizer runtime (its dlopen of libnvimgcodec fails): its cases are
    # left out; the native code they would exercise (the tar writer, the probe) runs in the other cases.
    (cd "$tmp" && env "${env[@]}" "$py" -m pytest -q -p no:cacheprovider -k "not cpu-dali" "${tests[@]}") \
        >"$log" 2>&1 || status=$?
    cat "$log"
    if grep -qE "(Address|Thread|UndefinedBehavior|Leak)Sanitizer|runtime error:" "$log"; then
        echo "== sanitize [$flags]: sanitizer reported problems (see above)" >&2
        return 1
    fi
    [ "$status" -eq 0 ] || { echo "== sanitize [$flags]: tests failed (exit $status)" >&2; return "$status"; }
    echo "== sanitize [$flags]: clean"
}

case "$which" in
    address) run_variant asan address,undefined ;;
    thread) run_variant tsan thread ;;
    all) run_variant asan address,undefined && run_variant tsan thread ;;
    *) echo "usage: $0 [address|thread|all]" >&2; exit 2 ;;
esac
