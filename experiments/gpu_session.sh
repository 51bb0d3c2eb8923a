#!/usr/bin/env bash
# One visit to a GPU machine: the test suites on the GPUs, and every figure of experiments/RESULTS.md beside its
# peer in the same call (experiments/peers/: PyTorch, PyTorch + FBGEMM TBE, NCCL through PyTorch).
#   experiments/gpu_session.sh BUNDLE OUT [PART...]        then, where matplotlib is: experiments/make_results.py OUT
# BUNDLE: a `make gpu-bundle` folder (build/openmpi) or a .tar.xz of one (unpacked under /tmp/sparta_bundle, which
# a later call on the same machine may name instead). PARTs, in the order given (default: tests results):
#   tests     every suite (tests/run_all.sh) at 1 and 2 GPUs: the MPI suites at 1 and 2 ranks beside the plain
#             suites, split in groups that run side by side (the suites are CPU-bound; the GPUs have room)
#   results   what RESULTS.md shows: the parts one, host and two
#   one       what needs one GPU, 65536 samples per GPU, tables capped at 4M rows (40M for one table). On
#             GPU 0: bench_train dot (sgd) and dcnv2 (row-wise Adagrad, MLPerf DCNv2 keys per slot), bf16, two
#             runs each with hashed keys and two with the direct index, one with the algorithm search off;
#             bench_collection's plan (sgd and row-wise Adagrad; fp32, bf16 and fp16 rows); bench_embedding.
#             Meanwhile on GPU 1 their peers (run_peers): peer_dlrm.py --embedding tbe (PyTorch + FBGEMM TBE, compiled),
#             peer_fbgemm.py on the same shapes, peer_dlrm.py (plain PyTorch)
#   host      tables in host memory, one GPU: the host tier against HBM, while the caches fill and once they are full
#             and evicting, the full MLPerf tables with a cache, and eviction (bench_hashtable --evict); meanwhile on
#             GPU 1 their peers (run_host_peers: FBGEMM TBE in HBM and under MANAGED_CACHING)
#   two       on 2 GPUs: bench_train, the full MLPerf v1 tables (40M cap) under the plan and each fixed placement,
#             every placement (bench_collection), bench_alltoall beside peer_a2a.py (each part may be a call of
#             its own where a call's time is short: one and host took about 9 minutes together, two 3)
#   peers     on a machine of one GPU: the peers of `one` and `host` alone on it (a call of its own)
#   profile   where a step's time goes (GPU 0): the timeline of a DCNv2 and a dot step (bench_train --trace 2) and
#             ncu of one step of each and of a DCNv2 collection step, summed by kernel (experiments/ncu_summary.py);
#             the host tier's parts in a steady step of the 60 GB table (bench_collection --trace 1);
#             make_results.py keeps the summaries and timelines beside the records
# FBGEMM is whatever `import fbgemm_gpu` finds (pip), or /tmp/fbgemm_tbe (PYTHONPATH) when a chunk0/ folder was
# unpacked there (peers/README.md; FBGEMM_CACHE_ADDON=the cache add-on's .tar.xz adds MANAGED_CACHING); without it
# the FBGEMM peers are skipped and say so. Logs and JSON lines go to
# OUT; the exit status is non-zero when any part failed.
set -u -o pipefail
build=${1:?build folder or bundle}
out=${2:?output folder}
shift 2
parts=("$@")
[ ${#parts[@]} = 0 ] && parts=(tests results)
expanded=()
for part in "${parts[@]}"; do
  if [ "$part" = results ]; then expanded+=(one host two); else expanded+=("$part"); fi
done
parts=("${expanded[@]}")
mkdir -p "$out"
if [[ $build == *.tar.xz ]]; then
  rm -rf /tmp/sparta_bundle && mkdir -p /tmp/sparta_bundle && tar -xJf "$build" -C /tmp/sparta_bundle &&
    build=/tmp/sparta_bundle/openmpi
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The revision the bundle was built from (make gpu-bundle writes it), for every result's provenance.
[ -f "$build/REVISION" ] && export SPARTA_GIT_REV=${SPARTA_GIT_REV:-$(cat "$build/REVISION")}
# NVLink multicast stays off on shared machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 SPARTA_TEST_STACKS_AFTER=${SPARTA_TEST_STACKS_AFTER:-180}
export SPARTA_PYTHON=${SPARTA_PYTHON:-$(command -v python3)}
command -v h5dump >/dev/null || export SPARTA_NO_HDF5_TOOLS=1
[ -d /tmp/fbgemm_tbe/fbgemm_gpu ] && export PYTHONPATH=/tmp/fbgemm_tbe${PYTHONPATH:+:$PYTHONPATH}
# FBGEMM_CACHE_ADDON: the cache's libraries (peers/fbgemm/pack.sh CACHE=only) unpacked beside an unpacked chunk0
if [ -n "${FBGEMM_CACHE_ADDON:-}" ] && [ -d /tmp/fbgemm_tbe/fbgemm_gpu ]; then
  tar -xJf "$FBGEMM_CACHE_ADDON" -C /tmp/fbgemm_tbe/fbgemm_gpu
fi
mpiexec="mpiexec --oversubscribe"
gpus=$(nvidia-smi -L | wc -l)
nvidia-smi -L
status=0
run() {  # run LOG COMMAND...: output to the screen and appended to OUT/LOG; a failure is remembered
  local log=$1
  shift
  echo "== $*" | tee -a "$out/$log"
  "$@" 2>&1 | tee -a "$out/$log" || { status=1; echo "!! failed: $*" | tee -a "$out/$log"; }
}
quiet() {  # quiet LOG COMMAND...: output appended to OUT/LOG only (runs beside others); a failure is remembered
  local log=$1
  shift
  echo "== $*" >>"$out/$log"
  "$@" >>"$out/$log" 2>&1 || { echo "!! failed: $*" >>"$out/$log"; return 1; }
}
peer() {  # peer GPU SCRIPT ARGS...: a peer script on one GPU, its lines into OUT/peers.jsonl
  local g=$1 script=$2
  shift 2
  CUDA_VISIBLE_DEVICES=$g quiet peers.log python3 "experiments/peers/$script" "$@" --out "$out/peers.jsonl"
}
have_fbgemm() { python3 -c "import fbgemm_gpu" 2>/dev/null; }
have_fbgemm_cache() {  # the cache's libraries beside the package (pip's, or the add-on of peers/fbgemm/pack.sh)
  python3 -c "import fbgemm_gpu, os, sys; d = os.path.dirname(fbgemm_gpu.__file__); \
sys.exit(not os.path.exists(os.path.join(d, 'fbgemm_gpu_tbe_cache.so')))" 2>/dev/null
}
rows60=116279069  # one table of 60 GB with row-wise Adagrad's state (128 + 1 floats a row)
dcnv2_hotness=3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1  # MLPerf DLRM-DCNv2 keys per slot
run_peers() {  # run_peers GPU: every peer on that GPU, one after the other (FBGEMM first: the strongest)
  local g=$1
  if have_fbgemm; then
    for m in dcnv2 dot; do
      peer "$g" peer_dlrm.py --model $m --embedding tbe --compile --batches $b --precisions bf16
    done
    for t in dcnv2 mlperf-v1; do
      peer "$g" fbgemm/peer_fbgemm.py --tables $t --batch $b --optimizers sgd,rowwise_adagrad \
        --weights-precisions fp32,fp16
    done
    for shape in "--dim 128 --hot 1" "--dim 32 --hot 8" "--dim 128 --hotness $dcnv2_hotness"; do
      # shellcheck disable=SC2086
      peer "$g" fbgemm/peer_fbgemm.py --rows 40000000 --batch $b $shape --alpha 0 --optimizers sgd
    done
  else
    echo "(no fbgemm_gpu: the FBGEMM peers skipped)" >>"$out/peers.log"
  fi
  for m in dcnv2 dot; do
    peer "$g" peer_dlrm.py --model $m --batches $b --precisions bf16
  done
}
run_host_peers() {  # run_host_peers GPU: the host tier's peers on that GPU
  local g=$1
  if ! have_fbgemm; then
    echo "(no fbgemm_gpu: the host tier's FBGEMM peers skipped)" >>"$out/peers.log"
    return 0
  fi
  # TBE in HBM and under MANAGED_CACHING with as many rows cached as sparta's caches and HBM tables hold (7 caches
  # of 968992 rows and 1.1M rows of small tables; 29069767 rows: 15 GB)
  if have_fbgemm_cache; then
    # a new batch each forward and step (--fresh-batches), as sparta's benchmarks draw them; then 20 steps after
    # 200, the caches full and evicting
    for alpha in 1.1 0; do
      for cache in 0 7890000; do
        peer "$g" fbgemm/peer_fbgemm.py --tables mlperf-v1 --batch $b --optimizers rowwise_adagrad --alpha $alpha \
          --cache-rows $cache --fresh-batches 50
      done
    done
    for cache in 0 7890000; do
      peer "$g" fbgemm/peer_fbgemm.py --tables mlperf-v1 --batch $b --optimizers rowwise_adagrad --alpha 1.1 \
        --cache-rows $cache --warmup 200 --iters 20 --fresh-batches 440
    done
    for cache in 0 29069767; do
      peer "$g" fbgemm/peer_fbgemm.py --rows $rows60 --slots 1 --hot 26 --dim 128 --batch $b \
        --optimizers rowwise_adagrad --alpha 1.1 --cache-rows $cache --fresh-batches 50
    done
    # the 60 GB table after 500 steps (about 40M distinct rows drawn: its 15 GB cache of 29M full and evicting)
    for cache in 0 29069767; do
      peer "$g" fbgemm/peer_fbgemm.py --rows $rows60 --slots 1 --hot 26 --dim 128 --batch $b \
        --optimizers rowwise_adagrad --alpha 1.1 --cache-rows $cache --warmup 500 --iters 20 --fresh-batches 1040
    done
  else
    echo "(no fbgemm_gpu_tbe_cache: the host tier's FBGEMM peers skipped; peers/README.md)" >>"$out/peers.log"
  fi
}
b=65536  # samples per GPU
counts=1
[ "$gpus" -ge 2 ] && counts="1 2"

for part in "${parts[@]}"; do
  case $part in
    tests)
      # Side by side: the MPI suites at 1 rank and at 2, and the plain suites in two halves; each group's closing
      # line ("tests: N passed, ...") goes to OUT/tests.log with its suites' lines.
      heavy='synthetic|experiments|embedding_backward|embedding_table|hash_table|route|dense_|model|planner'
      for n in $counts; do
        quiet tests_mpi$n.log env SPARTA_SUITES='^mpi_' bash tests/run_all.sh "$build" "$mpiexec" $n 420 &
      done
      quiet tests_plain_a.log env SPARTA_SUITES="^test_($heavy)" bash tests/run_all.sh "$build" "$mpiexec" 1 420 &
      quiet tests_plain_b.log env SPARTA_SUITES="^(test_|layer)" SPARTA_SUITES_EXCLUDE="^test_($heavy)" \
        bash tests/run_all.sh "$build" "$mpiexec" 1 420 &
      for j in $(jobs -p); do wait "$j" || status=1; done
      cat "$out"/tests_mpi*.log "$out"/tests_plain_a.log "$out"/tests_plain_b.log >>"$out/tests.log"
      rm -f "$out"/tests_mpi*.log "$out"/tests_plain_*.log
      grep -E "^tests: |FAILED|TIMED OUT" "$out/tests.log"
      ;;
    one)
      # GPU 1: their peers (run_peers) while GPU 0 runs ours; one GPU: the peers are the part `peers`, a call of
      # their own
      peers_pid=
      if [ "$gpus" -ge 2 ]; then
        run_peers 1 &
        peers_pid=$!
      fi
      for m in dcnv2 dot; do
        opt=$([ $m = dot ] && echo sgd || echo rowwise_adagrad)
        for v in "--tag rep1" "--tag rep2" "--index direct --tag direct1" "--index direct --tag direct2" \
          "--gemm-search 0 --tag variant_search0"; do
          # shellcheck disable=SC2086
          CUDA_VISIBLE_DEVICES=0 run bench_train.log $mpiexec -n 1 "$build/bin/bench_train" --model $m \
            --sparse-optimizer $opt --precision bf16 --batch $b --steps 30 $v --out "$out/bench.jsonl"
        done
      done
      for t in dcnv2 mlperf-v1; do
        for opt in sgd rowwise_adagrad; do
          for st in fp32 bf16 fp16; do
            CUDA_VISIBLE_DEVICES=0 run bench_collection.log $mpiexec -n 1 "$build/bin/bench_collection" --tables $t \
              --batch $b --index direct --placements plan --optimizer $opt --storage $st --out "$out/bench.jsonl"
          done
        done
      done
      for shape in "--dims 128 --hot 1" "--dims 32 --hot 8" "--dims 128 --hotness $dcnv2_hotness"; do
        # shellcheck disable=SC2086
        CUDA_VISIBLE_DEVICES=0 run bench_embedding.log "$build/bin/bench_embedding" --index direct --rows 40000000 \
          $shape --alphas 0 --modes eval,step --out "$out/bench.jsonl"
      done
      [ -n "${peers_pid:-}" ] && wait "$peers_pid"
      grep -h '^!!' "$out"/*.log && status=1
      ;;
    host)
      # GPU 1: the host tier's peers (run_host_peers) while GPU 0 runs ours; one GPU: the part `peers`
      peers_pid=
      if [ "$gpus" -ge 2 ]; then
        run_host_peers 1 &
        peers_pid=$!
      fi
      # tables in host memory under a GPU cache (src/host_tier.h): the 26 MLPerf tables (4M cap, 1.9 GB a large
      # table), power-law and uniform keys, a cache of 0.5 GB a table, and one table of 60 GB under a 15 GB cache,
      # against the same tables in HBM (their peers: run_host_peers' MANAGED_CACHING runs); the full MLPerf tables
      # trained with a cache; then eviction under a stream of new keys (bench_hashtable --evict)
      for alpha in 1.1 0; do
        for t in hbm host; do
          tier=$([ $t = host ] && echo "--tier host --cache-gb 0.5" || echo "--tier hbm")
          # shellcheck disable=SC2086
          CUDA_VISIBLE_DEVICES=0 run bench_collection.log timeout 150 $mpiexec -n 1 "$build/bin/bench_collection" \
            --tables mlperf-v1 --batch $b --index direct --placements plan --optimizer rowwise_adagrad \
            --alpha $alpha --prefill 0 --iters 10 $tier --tag tier_$t --out "$out/bench.jsonl"
        done
      done
      # the same after 200 steps: the caches full and evicting (LRU, then LFU; then bf16 rows, in HBM and in host
      # memory under caches of as many bytes)
      for t in hbm host host_lfu hbm_bf16 host_bf16; do
        case $t in
          hbm) tier="--tier hbm" ;;
          host) tier="--tier host --cache-gb 0.5" ;;
          host_lfu) tier="--tier host --cache-gb 0.5 --eviction lfu" ;;
          hbm_bf16) tier="--tier hbm --storage bf16" ;;
          *) tier="--tier host --cache-gb 0.5 --storage bf16" ;;
        esac
        # shellcheck disable=SC2086
        CUDA_VISIBLE_DEVICES=0 run bench_collection.log timeout 150 $mpiexec -n 1 "$build/bin/bench_collection" \
          --tables mlperf-v1 --batch $b --index direct --placements plan --optimizer rowwise_adagrad --alpha 1.1 \
          --prefill 0 --warmup 200 --iters 20 $tier --tag steady_$t --out "$out/bench.jsonl"
      done
      for t in hbm host; do
        tier=$([ $t = host ] && echo "--tier host --cache-gb 15" || echo "--tier hbm")
        # shellcheck disable=SC2086
        CUDA_VISIBLE_DEVICES=0 run bench_collection.log timeout 240 $mpiexec -n 1 "$build/bin/bench_collection" \
          --tables custom --rows-list $rows60 --hotness-list 26 --dims 128 --row-cap 200000000 --batch $b \
          --index direct --placements plan --optimizer rowwise_adagrad --alpha 1.1 --prefill 0 --iters 10 $tier \
          --tag t60_$t --out "$out/bench.jsonl"
        # the same after 500 steps: the cache full and evicting
        # shellcheck disable=SC2086
        CUDA_VISIBLE_DEVICES=0 run bench_collection.log timeout 300 $mpiexec -n 1 "$build/bin/bench_collection" \
          --tables custom --rows-list $rows60 --hotness-list 26 --dims 128 --row-cap 200000000 --batch $b \
          --index direct --placements plan --optimizer rowwise_adagrad --alpha 1.1 --prefill 0 --warmup 500 \
          --iters 20 $tier --tag t60s_$t --out "$out/bench.jsonl"
      done
      CUDA_VISIBLE_DEVICES=0 run bench_train.log timeout 240 $mpiexec -n 1 "$build/bin/bench_train" --model dot \
        --max-rows 40000000 --index direct --sparse-optimizer rowwise_adagrad --precision bf16 --batch $b --steps 20 \
        --alpha 1.1 --batches 8 --warmup 16 --tier host --cache-gb 4 --tag full_host --out "$out/bench.jsonl"
      for e in lru lfu; do
        CUDA_VISIBLE_DEVICES=0 run bench_hashtable.log timeout 120 "$build/bin/bench_hashtable" --evict $e \
          --rows 1048576 --dims 32 --keys 262144 --hit-fractions 0.6 --stream 10 --out "$out/bench.jsonl"
      done
      [ -n "${peers_pid:-}" ] && wait "$peers_pid"
      grep -h '^!!' "$out"/*.log && status=1
      ;;
    two)
      # 2 GPUs: end to end, every placement, the collectives
      if [ "$gpus" -lt 2 ]; then
        echo "(one GPU: the part two skipped)"
      else
        for m in dcnv2 dot; do
          opt=$([ $m = dot ] && echo sgd || echo rowwise_adagrad)
          for rep in 1 2; do
            run bench_train.log $mpiexec -n 2 "$build/bin/bench_train" --model $m --sparse-optimizer $opt \
              --precision bf16 --batch $b --steps 30 --tag rep$rep --out "$out/bench.jsonl"
          done
        done
        # the full MLPerf v1 tables (40M cap, 188M rows): the planner's plan against each fixed placement
        for p in auto dispatch hybrid localized distributed; do
          run bench_train.log $mpiexec -n 2 "$build/bin/bench_train" --model dot --max-rows 40000000 --index direct \
            --sparse-optimizer rowwise_adagrad --precision bf16 --batch $b --steps 20 --placement $p --tag fullsize_$p \
            --out "$out/bench.jsonl"
        done
        for t in dcnv2 mlperf-v1; do
          run bench_collection.log $mpiexec -n 2 "$build/bin/bench_collection" --tables $t --batch $b \
            --index direct --optimizer sgd --out "$out/bench.jsonl"
        done
        run bench_alltoall.log $mpiexec -n 2 "$build/bin/bench_alltoall" --modes nccl --ops alltoall,allreduce \
          --min-bytes 1M --max-bytes 256M --step-factor 4 --out "$out/bench.jsonl"
        CUDA_VISIBLE_DEVICES=0,1 quiet peers.log python3 experiments/peers/peer_a2a.py --sizes-mb 1,16,64,256 \
          --out "$out/peers.jsonl" || status=1
      fi
      grep -h '^!!' "$out"/*.log && status=1
      ;;
    peers)
      run_peers 0
      run_host_peers 0
      grep -h '^!!' "$out"/peers.log && status=1
      ;;
    profile)
      # where a step's time goes, on GPU 0 (uniform keys, direct index, bf16): each model's timeline
      # (--trace 2, <model>_trace.txt) and ncu of one step, kernels one at a time (<model>_ncu.txt, summed by
      # experiments/ncu_summary.py), and of one DCNv2 collection step with fp32 rows and sgd (collection_ncu.txt)
      met=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct
      for m in dcnv2 dot; do
        opt=$([ $m = dot ] && echo sgd || echo rowwise_adagrad)
        train=(--model $m --sparse-optimizer $opt --precision bf16 --batch $b --index direct)
        CUDA_VISIBLE_DEVICES=0 run ${m}_trace.txt $mpiexec -n 1 "$build/bin/bench_train" "${train[@]}" --steps 10 \
          --trace 2 --tag trace --out "$out/profile.jsonl"
        CUDA_VISIBLE_DEVICES=0 ncu --clock-control none --csv --metrics $met "$build/bin/bench_train" "${train[@]}" \
          --warmup 1 --steps 1 --cuda-graphs 0 --gemm-search 0 >"$out/${m}_ncu.csv" 2>>"$out/ncu.log" &&
          python3 experiments/ncu_summary.py "$out/${m}_ncu.csv" --title "bench_train ${train[*]}" \
            >"$out/${m}_ncu.txt" || { status=1; echo "!! failed: ncu of $m" | tee -a "$out/ncu.log"; }
      done
      coll=(--tables dcnv2 --batch $b --index direct --placements plan --optimizer sgd --storage fp32)
      CUDA_VISIBLE_DEVICES=0 ncu --clock-control none --csv --metrics $met "$build/bin/bench_collection" "${coll[@]}" \
        --warmup 1 --iters 1 --check-samples 1 >"$out/collection_ncu.csv" 2>>"$out/ncu.log" &&
        python3 experiments/ncu_summary.py "$out/collection_ncu.csv" --nth-last 3 \
          --title "bench_collection ${coll[*]}" >"$out/collection_ncu.txt" ||
        { status=1; echo "!! failed: ncu of the collection" | tee -a "$out/ncu.log"; }
      # the host tier's parts (src/host_tier.h: look-up, victims, placement, store) in a steady step of the 60 GB
      # table under a 15 GB cache, after 500 steps (the part host's t60s_host), timed by no record
      CUDA_VISIBLE_DEVICES=0 run tier_trace.txt timeout 300 $mpiexec -n 1 "$build/bin/bench_collection" --tables custom \
        --rows-list $rows60 --hotness-list 26 --dims 128 --row-cap 200000000 --batch $b --index direct \
        --placements plan --optimizer rowwise_adagrad --alpha 1.1 --prefill 0 --warmup 500 --iters 5 \
        --tier host --cache-gb 15 --trace 1
      ;;
    *) echo "unknown part '$part' (tests results one host two peers profile)"; exit 2 ;;
  esac
done
exit $status
