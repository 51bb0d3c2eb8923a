#!/usr/bin/env bash
# make bench: runs every experiment binary (BUILD/bin/bench_*) with its default sweep (one rank; bench_alltoall on
# BENCH_COMM_RANKS, default 2); each
# prints its #-headed table and appends JSON lines under results/.   experiments/run_benches.sh BUILD "MPIEXEC"
set -eu
build=${1:?build folder}
mpiexec=${2:-mpiexec}
mkdir -p results
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
shopt -s nullglob
benches=("$build"/bin/bench_*)
if [ ${#benches[@]} = 0 ]; then
  echo "no experiment binaries in $build/bin"
  exit 0
fi
for b in "${benches[@]}"; do
  name=$(basename "$b")
  echo "== $name"
  ranks=1
  [ "$name" = bench_alltoall ] && ranks=${BENCH_COMM_RANKS:-2}  # a collective needs peers
  # shellcheck disable=SC2086
  $mpiexec -n "$ranks" "$b" --out "results/$name.jsonl"
done
