#!/usr/bin/env bash
# One call on a GPU machine: the test suites on the GPUs and the benchmarks beside their peers (PyTorch reference
# scripts in peers/, when that folder is there — it is not part of the repository — run in the same call so every
# figure has its ratio from one run on the same GPUs).
#   experiments/gpu_session.sh BUILD OUT [PART...]
# BUILD is a `make gpu-bundle` folder (build/openmpi), or a .tar.xz of one (extracted under /tmp). PARTs, run in
# the order given (default: all = tests repeat kernels comm collection train graphs sweeps emulated). GPU
# counts: 1 and every power of 2 up to the machine's GPUs (1 2 4 8 on 8), or SPARTA_GPU_COUNTS="2 4 8" (a part
# that runs too long for one call can be split by counts across calls); "multi" below: those counts from 2 up.
#   tests       every suite (tests/run_all.sh) at each count; with one GPU, mpi_test_collection again with 2 ranks
#               sharing it (SPARTA_TEST_SHARED_GPU=1, MPI communication: the overlap's streams with more than one
#               rank)
#   repeat      with 2 GPUs or more: mpi_test_collection at 2 ranks six times, NCCL's connections made at creation
#               (the default) and on first use (SPARTA_TEST_LAZY_CONNECT=1) alternating, each stopped after 90 s
#   kernels     bench_hashtable, bench_embedding; peer_torch.py (EmbeddingBag): one-hot (uniform, power-law),
#               hot 8 at dims 16-128 and the DCNv2 hotness at dim 128 (bench_embedding with the hashed and the
#               direct index, the step with the sorted and the atomic SGD update, and the step's traffic floor)
#   comm        at each multi count: bench_alltoall (nccl 1 KiB-1 GiB, then hier and mpi) beside peer_a2a.py on
#               as many GPUs; nccl at 4 KiB-16 MiB with NCCL's non-blocking mode and the default blocking one
#   collection  bench_collection: MLPerf v1 one-hot and DCNv2 multi-hot tables, every placement and the plan, at
#               each count, 65536 samples per GPU, hashed (every key inserted first: --prefill 1) and direct
#               index; MLPerf v1 hashed while its tables fill
#               (--prefill 0); MLPerf v1 with power-law keys (alpha 1.1), and from 2 GPUs the bf16 wire; the
#               same shapes' step in plain PyTorch on one GPU (experiments/torch_collection.py)
#   train       bench_train: dot and dcnv2 at 65536 per GPU (weak scaling), bf16 at each count (three runs each,
#               alternating, 50 timed steps: launches of the same command differ by a few percent; from 2 GPUs
#               once more with the bf16 wire, --exchange bf16, and once with --trace 3:
#               every rank's timeline in bench_train.log), fp16 and
#               fp32 on 1, sgd hashed / direct / direct with the atomic update on 1; peer_dlrm.py with and without
#               --compile
#   graphs      bench_train on 1 GPU, bf16, dot and dcnv2 at 16384 and 65536 samples: --cuda-graphs 1 and 0
#               alternating (GRAPH_REPS times, default 2), 50 timed steps each
#   sweeps      the README figures' sweeps (collection, train_weak, train_strong: the planner's plan and fixed
#               placements at a fixed batch per GPU and a fixed global batch) at the counts, their results.jsonl
#               copied to OUT/<sweep>.jsonl
#   emulated    with 2 GPUs or more: 2 emulated nodes of 1 GPU (--ranks-per-node 1), MPI between them:
#               bench_alltoall hier, bench_collection, bench_train dot and dcnv2; with 4
#               GPUs or more also 2 nodes of half the GPUs each
# Logs and JSON lines go to OUT; the exit status is non-zero when any part failed.
set -u -o pipefail
build=${1:?build folder or bundle}
out=${2:?output folder}
shift 2
parts=("$@")
[ ${#parts[@]} = 0 ] && parts=(all)
[ "${parts[*]}" = all ] && parts=(tests repeat kernels comm collection train graphs sweeps emulated)
mkdir -p "$out"
if [[ $build == *.tar.xz ]]; then
  mkdir -p /tmp/sparta_bundle && tar -xJf "$build" -C /tmp/sparta_bundle && build=/tmp/sparta_bundle/openmpi
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The revision the bundle was built from (make gpu-bundle writes it), for every result's provenance.
[ -f "$build/REVISION" ] && export SPARTA_GIT_REV=${SPARTA_GIT_REV:-$(cat "$build/REVISION")}
# NVLink multicast stays off on shared machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
# A test case that runs longer than this prints every rank's stack (tests/main_mpi.cpp); the suites' communicator
# timeouts (120 s) name a wait inside the communicator first.
export SPARTA_TEST_STACKS_AFTER=${SPARTA_TEST_STACKS_AFTER:-180}
# The python3 on the PATH is the one with h5py and matplotlib there; nothing can be installed, so cases needing
# HDF5's command-line tools are reported as skipped when h5dump is absent.
export SPARTA_PYTHON=${SPARTA_PYTHON:-$(command -v python3)}
command -v h5dump >/dev/null || export SPARTA_NO_HDF5_TOOLS=1
mpiexec="mpiexec --oversubscribe"
gpus=$(nvidia-smi -L | wc -l)
nvidia-smi -L
ldd "$build/lib/libsparta.so" | grep -E "nccl|hdf5|cudart|cublas|not found"
status=0
run() {  # run LOG COMMAND...: the command's output to the screen and appended to OUT/LOG; a failure is remembered
  local log=$1
  shift
  echo "== $*" | tee -a "$out/$log"
  "$@" 2>&1 | tee -a "$out/$log" || { status=1; echo "!! failed: $*" | tee -a "$out/$log"; }
}
peer() {
  if [ -f "peers/$1" ]; then
    run peers.log python3 "peers/$@" --out "$out/peers.jsonl"
  else
    echo "(no peers/$1: peer skipped)"
  fi
}
two=$([ "$gpus" -ge 2 ] && echo 1 || echo 0)
# GPU counts to run at: 1 and the powers of 2 up to the machine's GPUs, or SPARTA_GPU_COUNTS
counts=${SPARTA_GPU_COUNTS:-$(for n in 1 2 4 8 16; do [ "$gpus" -ge $n ] && echo -n "$n "; done)}
multi=$(for n in $counts; do [ "$n" -ge 2 ] && echo -n "$n "; done)
for n in $counts; do
  [ "$n" -le "$gpus" ] || { echo "SPARTA_GPU_COUNTS asks for $n GPUs; this machine has $gpus"; exit 2; }
done
echo "GPU counts: $counts"
visible() { seq -s, 0 $(($1 - 1)); }  # CUDA_VISIBLE_DEVICES for the first n GPUs
dcnv2_hotness=3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1  # keys per slot, MLPerf DLRM-DCNv2

for part in "${parts[@]}"; do
  case $part in
    tests)
      run tests.log bash tests/run_all.sh "$build" "$mpiexec" "$counts" 600
      [ "$two" = 0 ] && run tests.log env SPARTA_TEST_SHARED_GPU=1 SPARTA_SUITES=mpi_test_collection \
        bash tests/run_all.sh "$build" "$mpiexec" 2 600
      ;;
    repeat)
      # an intermittent stop shows only over several runs: connections made at creation (the default) against
      # connections made on first use, alternating; each run stopped after 90 s, stacks of a case past 60 s
      if [ "$two" = 1 ]; then
        for i in 1 2 3; do
          for lazy in 0 1; do
            log="repeat_${i}_lazy${lazy}.log"
            run "$log" timeout -k 5 90 $mpiexec -n 2 -x SPARTA_TEST_STACKS_AFTER=60 -x SPARTA_TEST_LAZY_CONNECT=$lazy \
              -x NCCL_RUNTIME_CONNECT=$lazy "$build/tests/mpi_test_collection"
            pkill -9 -f "$build/tests/mpi_test_collection" 2>/dev/null  # ranks a stopped launcher left behind
            grep -E "mpi verdict|has run for" "$out/$log" | sed "s/^/[run $i, lazy $lazy] /"
          done
        done
      fi
      ;;
    kernels)
      run bench_hashtable.log "$build/bin/bench_hashtable" --out "$out/bench.jsonl"
      run bench_embedding.log "$build/bin/bench_embedding" --out "$out/bench.jsonl"
      peer peer_torch.py --rows 40000000 --dim 128 --batch 65536 --slots 26 --hot 1 --alpha 0
      peer peer_torch.py --rows 40000000 --dim 128 --batch 65536 --slots 26 --hot 1 --alpha 1.1
      # multi-hot: hot 8 at dims 16-128 and the MLPerf DLRM-DCNv2 hotness at dim 128, uniform keys
      for index in hashed direct; do
        run bench_embedding.log "$build/bin/bench_embedding" --index $index --rows 40000000 --dims 16,32,64,128 \
          --hot 8 --alphas 0 --out "$out/bench.jsonl"
        run bench_embedding.log "$build/bin/bench_embedding" --index $index --rows 40000000 --dims 128 \
          --hotness "$dcnv2_hotness" --alphas 0 --out "$out/bench.jsonl"
        run bench_embedding.log "$build/bin/bench_embedding" --index $index --update atomic --rows 40000000 \
          --dims 16,32,64,128 --hot 8 --alphas 0 --modes step --out "$out/bench.jsonl"
        run bench_embedding.log "$build/bin/bench_embedding" --index $index --update atomic --rows 40000000 \
          --dims 128 --hotness "$dcnv2_hotness" --alphas 0 --modes step --out "$out/bench.jsonl"
      done
      # the least traffic of a step on the same keys (gather + read and write of each key's row): the floor ratio
      run bench_embedding.log "$build/bin/bench_embedding" --index direct --rows 40000000 --dims 16,32,64,128 \
        --hot 8 --alphas 0 --modes floor --out "$out/bench.jsonl"
      run bench_embedding.log "$build/bin/bench_embedding" --index direct --rows 40000000 --dims 128 \
        --hotness "$dcnv2_hotness" --alphas 0 --modes floor --out "$out/bench.jsonl"
      for d in 16 32 64 128; do
        peer peer_torch.py --rows 40000000 --dim $d --batch 65536 --slots 26 --hot 8 --alpha 0
      done
      peer peer_torch.py --rows 40000000 --dim 128 --batch 65536 --hotness "$dcnv2_hotness" --alpha 0
      ;;
    comm)
      for n in $multi; do
        run bench_alltoall.log $mpiexec -n $n "$build/bin/bench_alltoall" --modes nccl --ops alltoall,allreduce \
          --min-bytes 1K --max-bytes 1G --step-factor 4 --out "$out/bench.jsonl"
        # the peer spawns one process per visible GPU: as many as our ranks
        CUDA_VISIBLE_DEVICES=$(visible $n) peer peer_a2a.py --sizes-mb 0.00390625,0.0625,1,16,64,256,1024
        # the host's cost per call: NCCL's non-blocking mode (a launch thread per call) against the default
        for nb in 0 1; do
          run bench_alltoall.log $mpiexec -n $n "$build/bin/bench_alltoall" --modes nccl --ops alltoall,allreduce \
            --min-bytes 4K --max-bytes 16M --step-factor 4 --nccl-blocking $nb --out "$out/bench.jsonl"
        done
        run bench_alltoall.log $mpiexec -n $n "$build/bin/bench_alltoall" --modes hier,mpi --max-bytes 64M \
          --step-factor 4 --iters 5 --repeats 3 --out "$out/bench.jsonl"
      done
      ;;
    collection)
      for n in $counts; do
        for t in mlperf-v1 dcnv2; do
          for index in hashed direct; do
            run bench_collection.log $mpiexec -n $n "$build/bin/bench_collection" --tables $t --batch 65536 \
              --index $index --out "$out/bench.jsonl"
          done
        done
        # hashed tables filling during the steps (no prefill): most keys of a step new, each inserted
        run bench_collection.log $mpiexec -n $n "$build/bin/bench_collection" --tables mlperf-v1 --batch 65536 \
          --index hashed --prefill 0 --out "$out/bench.jsonl"
        # power-law keys (fewer distinct rows to exchange), fp32 and bf16 on the wire
        for x in fp32 $([ $n -ge 2 ] && echo bf16); do
          run bench_collection.log $mpiexec -n $n "$build/bin/bench_collection" --tables mlperf-v1 --batch 65536 \
            --index direct --alpha 1.1 --exchange $x --out "$out/bench.jsonl"
        done
      done
      # the same shapes in plain PyTorch on one GPU (26 EmbeddingBags, and one fused), beside the runs above
      if python3 -c "import torch" 2>/dev/null; then
        for shape in "mlperf-v1 0" "dcnv2 0" "mlperf-v1 1.1"; do
          read -r tables alpha <<< "$shape"
          run peers.log python3 experiments/torch_collection.py --like "$out/bench.jsonl" --tables $tables --alpha $alpha \
            --out "$out/peers.jsonl"
        done
      else
        echo "(no PyTorch: torch_collection.py skipped)"
      fi
      ;;
    train)
      for m in dot dcnv2; do  # the targets are bf16's: 1 and 2 GPUs alternating, three times
        for rep in 1 2 3; do
          for n in $counts; do
            run bench_train.log $mpiexec -n $n "$build/bin/bench_train" --model $m --precision bf16 --batch 65536 \
              --steps 50 --tag rep$rep --out "$out/bench.jsonl"
          done
        done
        # the embedding exchange's vectors and gradients as bf16 (half the bytes) from 2 GPUs on, once each; and
        # the timeline of three steps as training takes them
        for n in $multi; do
          run bench_train.log $mpiexec -n $n "$build/bin/bench_train" --model $m --precision bf16 --batch 65536 \
            --exchange bf16 --steps 50 --tag wire_bf16 --out "$out/bench.jsonl"
          run bench_train.log $mpiexec -n $n "$build/bin/bench_train" --model $m --precision bf16 --batch 65536 \
            --steps 5 --trace 3 --tag trace --out "$out/bench.jsonl"
        done
        for p in fp16 fp32; do
          run bench_train.log $mpiexec -n 1 "$build/bin/bench_train" --model $m --precision $p --batch 65536 \
            --out "$out/bench.jsonl"
        done
        # the direct index (sgd, sorted and atomic update) beside hashed sgd, bf16 on 1 GPU
        for v in "--index hashed" "--index direct" "--index direct --atomic-update 1"; do
          run bench_train.log $mpiexec -n 1 "$build/bin/bench_train" --model $m --precision bf16 --batch 65536 \
            --sparse-optimizer sgd $v --out "$out/bench.jsonl"
        done
      done
      for m in dot dcnv2; do
        peer peer_dlrm.py --model $m --batches 65536
        peer peer_dlrm.py --model $m --batches 65536 --compile
      done
      ;;
    graphs)
      for rep in $(seq 1 "${GRAPH_REPS:-2}"); do
        for m in dot dcnv2; do
          for b in 16384 65536; do
            for g in 1 0; do
              run bench_train.log $mpiexec -n 1 "$build/bin/bench_train" --model $m --precision bf16 --batch $b \
                --cuda-graphs $g --steps 50 --tag graphs$g-rep$rep --out "$out/bench.jsonl"
            done
          done
        done
      done
      ;;
    sweeps)
      ranks=$(echo $counts | tr ' ' ,)
      for sw in collection train_weak train_strong; do
        extra=()
        [ $sw != collection ] && extra=(--set placement=auto)
        run sweeps.log python3 experiments/sweeps/sweep.py "experiments/sweeps/$sw.json" --build "$build" \
          --mpiexec "$mpiexec" --results "/tmp/sparta_sweeps/$sw" --set ranks=$ranks "${extra[@]}"
        cp "/tmp/sparta_sweeps/$sw/results.jsonl" "$out/$sw.jsonl" 2>/dev/null
      done
      ;;
    emulated)
      if [ "$two" = 1 ]; then
        e=(--ranks-per-node 1)
        run emulated.log $mpiexec -n 2 "$build/bin/bench_alltoall" "${e[@]}" --modes hier --ops alltoall,allreduce \
          --min-bytes 64K --max-bytes 256M --step-factor 4 --iters 5 --repeats 3 --out "$out/emulated.jsonl"
        run emulated.log $mpiexec -n 2 "$build/bin/bench_collection" "${e[@]}" --comm-mode hier --tables mlperf-v1 \
          --batch 16384,65536 --iters 10 --warmup 3 --out "$out/emulated.jsonl"
        for m in dot dcnv2; do
          run emulated.log $mpiexec -n 2 "$build/bin/bench_train" "${e[@]}" --model $m --precision bf16 \
            --out "$out/emulated.jsonl"
        done
      fi
      if [ "$gpus" -ge 4 ]; then  # 2 nodes of half the GPUs: NVLink inside a node, MPI between the two
        e=(--ranks-per-node $((gpus / 2)))
        run emulated.log $mpiexec -n $gpus "$build/bin/bench_alltoall" "${e[@]}" --modes hier --ops alltoall,allreduce \
          --min-bytes 64K --max-bytes 256M --step-factor 4 --iters 5 --repeats 3 --out "$out/emulated.jsonl"
        run emulated.log $mpiexec -n $gpus "$build/bin/bench_collection" "${e[@]}" --comm-mode hier \
          --tables mlperf-v1 --batch 65536 --iters 10 --warmup 3 --out "$out/emulated.jsonl"
        for m in dot dcnv2; do
          run emulated.log $mpiexec -n $gpus "$build/bin/bench_train" "${e[@]}" --model $m --precision bf16 \
            --out "$out/emulated.jsonl"
        done
      fi
      ;;
    *) echo "unknown part '$part' (tests repeat kernels comm collection train graphs sweeps emulated all)"; exit 2 ;;
  esac
done
exit $status
