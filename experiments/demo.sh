#!/usr/bin/env bash
# make demo: the main job on a small synthetic dataset, under mpiexec, on GPUs when every rank gets one,
# else on the cpu backend.   experiments/demo.sh BUILD "MPIEXEC [flags]" RANKS
set -eu
build=${1:?build folder}
mpiexec=${2:-mpiexec}
ranks=${3:-2}
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
bin=$build/bin
echo "== sparta demo: $ranks ranks"
# shellcheck disable=SC2086
$mpiexec -n "$ranks" "$bin/sparta-info" --device auto
if [ ! -x "$bin/sparta-train" ]; then
  echo "== the trainer (sparta-train) is not part of this build yet: the demo stops after start-up."
  exit 0
fi
