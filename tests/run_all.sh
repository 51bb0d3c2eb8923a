#!/usr/bin/env bash
# Runs every test suite of a build folder and prints one closing line: "tests: N passed, N failed, N skipped".
#   tests/run_all.sh BUILD "MPIEXEC [flags]" "RANK COUNTS" [TIMEOUT_SECONDS]
# Plain suites (BUILD/tests/test_*) run once; MPI suites (BUILD/tests/mpi_test_*) run under mpiexec with each
# rank count. Counts are test cases as Boost.Test reports them (rank 0's report for MPI suites); a suite that
# dies without a report, times out, or exits non-zero with no failure reported counts as one failure.
# Exit status: 0 when nothing failed. SPARTA_SUITES (an extended regular expression, optional) runs only the suites
# whose name matches it, e.g. SPARTA_SUITES='collection|train|dense' for one part of a GPU visit, and
# SPARTA_SUITES_EXCLUDE (likewise) leaves out the suites whose name matches it; the layering cases are named
# "layers".
set -u
build=${1:?build folder}
# Words of the launcher joined by single spaces ("mpiexec.mpich " from an empty MPIEXEC_FLAGS becomes "mpiexec.mpich"):
# tests compare commands they build from it with the commands programs print.
mpiexec=$(echo ${2:-mpiexec})
ranks=${3:-"1 2 4"}
limit=${4:-900}
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export SPARTA_TOOLS=${SPARTA_TOOLS:-$build/tests} SPARTA_MPIEXEC=${SPARTA_MPIEXEC:-$mpiexec}

passed=0 failed=0 skipped=0
failures=()
log=$(mktemp)
report=$(mktemp)
trap 'rm -f "$log" "$report"' EXIT

count() {  # count WORD: "N test case(s) out of M WORD" in the report
  grep -oE "[0-9]+ test cases? out of [0-9]+ $1" "$report" | head -1 | grep -oE '^[0-9]+' || echo 0
}

run_one() {  # run_one NAME COMMAND...
  local name=$1
  shift
  local t0=$SECONDS
  : >"$report"
  # The report goes to a file (rank 0's, for MPI suites), not through the launcher's output forwarding.
  timeout --kill-after=10 "$limit" "$@" --report_level=short --report_sink="$report" >"$log" 2>&1
  local rc=$?
  cat "$report" >>"$log"
  local p f s
  p=$(count passed)
  f=$(count failed)
  s=$(count skipped)
  # "passed" in a failing report counts the cases that did pass; an all-passed module says "N out of N passed".
  if grep -q "No errors detected" "$log" && [ "$p" = 0 ]; then p=1; fi
  if [ "$rc" != 0 ] && [ "$f" = 0 ]; then f=1; fi
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  local verdict=ok
  [ "$f" != 0 ] && verdict=FAILED
  [ "$rc" = 124 ] && verdict="TIMED OUT after ${limit}s"
  printf '%-44s %3d passed %3d failed %3d skipped  %4ds  %s\n' "$name" "$p" "$f" "$s" $((SECONDS - t0)) "$verdict"
  if [ "$f" != 0 ]; then
    failures+=("$name")
    # the seed and the failed checks first (a chatty suite's tail may hold neither), then the log's tail
    grep -E "test seed|error|fatal|FAILED|TIMED OUT" "$log" | head -20 | sed 's/^/    ! /'
    sed 's/^/    | /' "$log" | tail -60
  fi
}

shopt -s nullglob
# The layering rule on the source tree, and a planted violation it must catch (so the check can fail).
layer_case() {  # layer_case NAME EXPECTED_STATUS ROOT
  local out rc
  out=$(bash tests/check_layers.sh "$3" 2>&1); rc=$?
  if { [ "$2" = 0 ] && [ $rc = 0 ]; } || { [ "$2" != 0 ] && [ $rc != 0 ]; }; then
    passed=$((passed + 1)); printf '%-44s %3d passed %3d failed %3d skipped\n' "$1" 1 0 0
  else
    failed=$((failed + 1)); failures+=("$1"); printf '%-44s %3d passed %3d failed %3d skipped  FAILED\n' "$1" 0 1 0
    sed 's/^/    | /' <<<"$out" | tail -30
  fi
}
selected() {
  local name=$(basename "$1")
  { [ -z "${SPARTA_SUITES:-}" ] || [[ $name =~ $SPARTA_SUITES ]]; } &&
    { [ -z "${SPARTA_SUITES_EXCLUDE:-}" ] || ! [[ $name =~ $SPARTA_SUITES_EXCLUDE ]]; }
}
if [ -f tests/check_layers.sh ] && selected layers; then
  layer_case "layers (include rule)" 0 .
  planted=$(mktemp -d)
  mkdir -p "$planted"/{src/base,kernels,comm,io,experiments,tests}
  echo '#include "src/base/check.h"' >"$planted/src/base/check.h"
  echo '#include "src/base/check.h"' >"$planted/comm/communicator.h"
  printf '#include "src/base/check.h"\n#include "comm/communicator.h"\n' >"$planted/kernels/x.cu"
  layer_case "layers (catches kernels -> comm)" 1 "$planted"
  # the lab (measurement kernels) may include kernels/ and src/base/, and nothing in the library includes it
  mkdir -p "$planted/experiments/lab"
  printf '#include "src/base/check.h"\n#include "kernels/x.cu"\n' >"$planted/experiments/lab/m.h"
  rm "$planted/kernels/x.cu"
  echo '#include "src/base/check.h"' >"$planted/kernels/x.cu"
  layer_case "layers (lab -> kernels, base)" 0 "$planted"
  echo '#include "experiments/lab/m.h"' >"$planted/kernels/y.cu"
  layer_case "layers (catches kernels -> lab)" 1 "$planted"
  rm "$planted/kernels/y.cu"
  echo '#include "comm/communicator.h"' >>"$planted/experiments/lab/m.h"
  layer_case "layers (catches lab -> comm)" 1 "$planted"
  rm -rf "$planted"
fi
for t in "$build"/tests/test_*; do
  [ -x "$t" ] && selected "$t" && run_one "$(basename "$t")" "$t"
done
for t in "$build"/tests/mpi_test_*; do
  [ -x "$t" ] && selected "$t" || continue
  for n in $ranks; do
    # shellcheck disable=SC2086
    run_one "$(basename "$t") (${n} ranks)" $mpiexec -n "$n" "$t"
  done
done

if [ ${#failures[@]} -gt 0 ]; then
  echo "failed suites: ${failures[*]}"
fi
echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
