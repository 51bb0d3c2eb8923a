#!/usr/bin/env bash
# One call on a GPU machine: every test suite on the GPUs, then the benchmarks beside their peers (PyTorch
# reference scripts in peers/, when that folder is there — it is not part of the repository — run in the same
# call so every figure has its ratio from one run on the same GPUs).
#   experiments/gpu_session.sh BUILD OUT [tests|bench|all]
# BUILD is a carried `make gpu-bundle` folder; logs and JSON lines go to OUT.
set -u
build=${1:?build folder}
out=${2:?output folder}
what=${3:-all}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# NVLink multicast stays off on shared machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
mpiexec="mpiexec --oversubscribe"
gpus=$(nvidia-smi -L | wc -l)
nvidia-smi -L
ldd "$build/lib/libsparta.so" | grep -E "nccl|hdf5|cudart|not found"
status=0

if [ "$what" = tests ] || [ "$what" = all ]; then
  ranks="1"
  [ "$gpus" -ge 2 ] && ranks="1 2"
  bash tests/run_all.sh "$build" "$mpiexec" "$ranks" 600 2>&1 | tee "$out/tests.log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if [ "$what" = bench ] || [ "$what" = all ]; then
  "$build/bin/bench_hashtable" --out "$out/bench.jsonl" 2>&1 | tee "$out/bench_hashtable.log" || status=1
  "$build/bin/bench_embedding" --out "$out/bench.jsonl" 2>&1 | tee "$out/bench_embedding.log" || status=1
  peer() { if [ -f "peers/$1" ]; then python3 "peers/$@" --out "$out/peers.jsonl"; else echo "(no peers/$1: peer skipped)"; fi; }
  peer peer_torch.py --rows 40000000 --dim 128 --batch 65536 --slots 26 --hot 1 --alpha 0
  peer peer_torch.py --rows 40000000 --dim 128 --batch 65536 --slots 26 --hot 1 --alpha 1.1
  if [ "$gpus" -ge 2 ]; then
    $mpiexec -n 2 "$build/bin/bench_alltoall" --modes nccl --ops alltoall,allreduce --min-bytes 1K --max-bytes 1G --step-factor 4 \
      --out "$out/bench.jsonl" 2>&1 | tee "$out/bench_alltoall.log" || status=1
    peer peer_a2a.py --sizes-mb 1,16,64,256,1024
    $mpiexec -n 2 "$build/bin/bench_alltoall" --modes hier,mpi --max-bytes 256M --step-factor 4 --iters 10 --repeats 3 \
      --out "$out/bench.jsonl" 2>&1 | tee -a "$out/bench_alltoall.log" || status=1
    $mpiexec -n 2 "$build/bin/bench_alltoall" --ranks-per-node 1 --modes hier,mpi --max-bytes 256M --step-factor 4 --iters 10 \
      --repeats 3 --out "$out/bench.jsonl" 2>&1 | tee -a "$out/bench_alltoall.log" || status=1
  fi
fi
exit $status
