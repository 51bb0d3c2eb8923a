// dense_linear.cu: CUDA version of dense_linear.h: GEMMs through cuBLASLt (bias and ReLU as the forward's
// epilogue, fp32 compute: no TF32), the fused activation + bias gradient, the 16-bit conversions, and the
// per-stream cuBLASLt handle, workspace and scratch that dense_reduce.cuh declares.
//
// Algorithm search (what HugeCTR does at start-up): the first time a kind of call is seen (stream, shape, types,
// epilogue, pointer alignments), the heuristic's first kSearchCandidates answers are each timed kSearchRuns
// times on the call's own buffers with CUDA events, the fastest is kept for every later call of that kind and
// rank 0 logs it once. Only candidates whose outputs equal the heuristic's first bit for bit are taken, so the
// choice changes the speed and never a result; set_gemm_algo_search(false) takes the heuristic's first alone.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "src/base/check.h"
#include "src/base/log.h"
#include "kernels/dense_linear.h"
#include "kernels/dense_reduce.cuh"
#include "kernels/half16.cuh"

namespace sparta {

namespace {

void check_cublas_at(cublasStatus_t s, const char* expr, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) fatalf_at(file, line, "cuBLASLt error %d in %s", static_cast<int>(s), expr);
}
#define CUBLAS_CHECK(x) check_cublas_at((x), #x, __FILE__, __LINE__)

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS's advice for Hopper
constexpr int kSearchCandidates = 8;  // the heuristic's answers timed per kind of call
constexpr int kSearchRuns = 3;        // timed runs of each (after one untimed), the best kept

// What decides cuBLASLt's choice of algorithm for one call, and whether it was searched.
using AlgoKey = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, bool,
                           uint32_t, uint32_t, uint32_t, bool>;

// The algorithm for one kind of call, and whether it fuses the epilogue (where cuBLASLt has no algorithm with the
// bias or ReLU epilogue for a shape, the plain product runs and bias_relu_kernel follows it).
struct GemmPlan {
  cublasLtMatmulAlgo_t algo;
  bool fused = true;
};

constexpr int64_t kStagedBiasMax = 1 << 16;  // the widest bias staged (below)

struct StreamContext {
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  float* scratch = nullptr;
  size_t scratch_floats = 0;
  uint64_t scratch_epoch = 0;  // times scratch was made anew
  std::map<AlgoKey, GemmPlan> algos;
  std::map<AlgoKey, bool> available;  // gemm_available_cuda's answers
  // A 16-bit D's bias, rounded to D's type (the only bias type cuBLASLt takes with it), staged for the call that
  // reads it next at an address of its own, 256-byte aligned as the availability probe assumes.
  uint16_t* bias16 = nullptr;  // [kStagedBiasMax]
};

std::mutex g_mutex;
std::map<std::pair<int, Stream>, std::unique_ptr<StreamContext>> g_contexts;

// The context of (current device, stream), made on first use and kept for the life of the process.
StreamContext& context_for(Stream stream) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& slot = g_contexts[{device, stream}];
  if (!slot) {
    slot = std::make_unique<StreamContext>();
    CUBLAS_CHECK(cublasLtCreate(&slot->lt));
    CUDA_CHECK(cudaMalloc(&slot->workspace, kWorkspaceBytes));
    CUDA_CHECK(cudaMalloc(&slot->bias16, kStagedBiasMax * sizeof(uint16_t)));
  }
  return *slot;
}

// The largest power of two (at most 256) that divides the address: what cuBLASLt may assume of a pointer.
uint32_t alignment_of(const void* p) {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a & (al - 1)) != 0) al >>= 1;
  return al;
}

cudaDataType_t cuda_type(GemmType t) {
  return t == GemmType::bf16 ? CUDA_R_16BF : t == GemmType::f16 ? CUDA_R_16F : CUDA_R_32F;
}

}  // namespace

namespace dense {

float* stream_scratch(Stream stream, size_t floats) {
  StreamContext& ctx = context_for(stream);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (ctx.scratch_floats < floats) {
    if (ctx.scratch) {
      CUDA_CHECK(cudaStreamSynchronize(stream));  // queued kernels may still read the old scratch
      CUDA_CHECK(cudaFree(ctx.scratch));
    }
    CUDA_CHECK(cudaMalloc(&ctx.scratch, floats * sizeof(float)));
    ctx.scratch_floats = floats;
    ++ctx.scratch_epoch;
  }
  return ctx.scratch;
}

int sm_count() {
  static thread_local int sms = 0, sms_device = -1;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  if (device != sms_device) {
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    sms_device = device;
  }
  return sms;
}

}  // namespace dense

// ----------------------------------------------------------------------------
// kernels

// sums[c] = Σ_chunk partial[chunk, c]: a block takes 32 adjacent columns (coalesced reads) and 8 lanes of chunks;
// lane y adds chunks y, y + 8, ... in order, then a fixed tree adds the lanes: the same bits every run, and 8 loads
// in flight per column where one lane walking every chunk would wait on each.
constexpr int kChunkLanes = 8;
__global__ void __launch_bounds__(32 * kChunkLanes) add_chunks_kernel(const float* partial,  // [chunks, cols]
                                                                     int chunks, int cols, float* sums) {
  __shared__ float part[kChunkLanes][32];
  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
  const int c = blockIdx.x * 32 + tx;
  float s = 0.f;
  if (c < cols)
    for (int k = ty; k < chunks; k += kChunkLanes) s += partial[int64_t(k) * cols + c];
  part[ty][tx] = s;
  __syncthreads();
  for (int h = kChunkLanes / 2; h > 0; h >>= 1) {
    if (ty < h) part[ty][tx] += part[ty + h][tx];
    __syncthreads();
  }
  if (ty == 0 && c < cols) sums[c] = part[0][tx];
}

// dst[i] = H(src[i]), H the 16-bit type (half16.cuh).
template <class H>
__global__ void __launch_bounds__(256) to_half_kernel(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = H::bits(src[i]);
}

// The same over n4 groups of four: a float4 read and an 8-byte write each (src 16-byte, dst 8-byte aligned).
template <class H>
__global__ void __launch_bounds__(256) to_half_vec_kernel(const float4* __restrict__ src, uint2* __restrict__ dst,
                                                          size_t n4) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    const float4 v = src[i];
    uint2 bits;
    bits.x = H::pair(v.x, v.y);
    bits.y = H::pair(v.z, v.w);
    dst[i] = bits;
  }
}

// dst [rows, ld] = H(src [rows, cols]), zeros in columns cols .. ld - 1. Thread per destination element.
template <class H>
__global__ void __launch_bounds__(256) to_half_padded_kernel(const float* src, int64_t rows, int64_t cols,
                                                             uint16_t* dst, int64_t ld) {
  const int64_t n = rows * ld;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / ld, c = e - r * ld;
    dst[e] = c < cols ? H::bits(src[r * cols + c]) : uint16_t(0);
  }
}

// D [m, n] (column-major, ldd) += bias [m] per column, then ReLU: the epilogue where cuBLASLt could not fuse it.
__global__ void __launch_bounds__(256)
    bias_relu_kernel(float* d, int64_t ldd, int64_t m, int64_t n, const float* bias, bool relu) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < m * n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e % m, j = e / m;
    float v = d[j * ldd + i];
    if (bias) v += bias[i];
    d[j * ldd + i] = relu && !(v > 0.f) ? 0.f : v;
  }
}

namespace {

// Element (r, c) of the activation + bias gradient ([rows, cols]). dy and dpre may be the same array; dpre may be
// nullptr (16-bit training reads dpre16, of type H, alone).
template <class H>
struct ActivationGrad {
  static constexpr int kCols = 1;
  const float* y;
  const float* dy;
  float* dpre;
  uint16_t* dpre16;
  bool relu;
  float dy_scale;
  int cols;
  struct In {
    float y, dy;
  };
  __device__ __forceinline__ In load(int64_t r, int c) const {
    const int64_t i = r * cols + c;
    return {relu ? y[i] : 1.f, dy[i]};
  }
  __device__ __forceinline__ void finish(const In& in, int64_t r, int c, float* acc) const {
    const int64_t i = r * cols + c;
    const float v = relu && !(in.y > 0.f) ? 0.f : __fmul_rn(in.dy, dy_scale);
    if (dpre) dpre[i] = v;
    if (dpre16) dpre16[i] = H::bits(v);
    acc[0] += v;
  }
};

// Elements (r, c .. c + V) of the ReLU + bias gradient from 16-bit arrays (type H); dpre16 may be dy16. V = 8:
// 16-byte loads and stores (cols a multiple of 8, the arrays 16-byte aligned).
template <class H, int V>
struct ReluGradHalf {
  static constexpr int kCols = V;
  const uint16_t* y16;
  const uint16_t* dy16;
  uint16_t* dpre16;
  int cols;
  struct In {
    dense::Halves8 y, dy;
  };
  __device__ __forceinline__ In load(int64_t r, int c) const {
    const int64_t i = r * cols + c;
    return {dense::load_halves<V>(y16 + i), dense::load_halves<V>(dy16 + i)};
  }
  __device__ __forceinline__ void finish(const In& in, int64_t r, int c, float* acc) const {
    dense::Halves8 out;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      out.h[v] = H::value(in.y.h[v]) > 0.f ? in.dy.h[v] : uint16_t(0);
      acc[v] += H::value(out.h[v]);
    }
    dense::store_halves<V>(dpre16 + r * cols + c, out);
  }
};

}  // namespace

// ----------------------------------------------------------------------------
// launchers

namespace dense {
void add_chunks(const float* partial, int chunks, int cols, float* sums, Stream stream) {
  add_chunks_kernel<<<(cols + 31) / 32, 32 * kChunkLanes, 0, stream>>>(partial, chunks, cols, sums);
  CUDA_CHECK_LAUNCH("add_chunks_kernel");
}
}  // namespace dense

uint64_t scratch_epoch_cuda(Stream stream) {
  StreamContext& ctx = context_for(stream);
  std::lock_guard<std::mutex> lock(g_mutex);
  return ctx.scratch_epoch;
}

namespace {

// The descriptors of one call: the operation with its epilogue and pointers, and the layouts of A, B, C and D.
struct LtCall {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr, ld = nullptr;
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  LtCall(const LtCall&) = delete;
  LtCall& operator=(const LtCall&) = delete;
  explicit LtCall(const GemmCall& g) {
    const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    epi = g.bias ? (g.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                 : (g.relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    set_epilogue(epi);
    // fp32 for an fp32 D; a 16-bit D's in its type (gemm_cuda stages it so)
    if (g.bias) set_bias(g.bias, g.d_type == GemmType::f32 ? CUDA_R_32F : cuda_type(g.d_type));
    const cudaDataType_t in = cuda_type(g.type), out = cuda_type(g.d_type);
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, in, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, in, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, out, g.m, g.n, g.ldd));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, out, g.m, g.n, g.ldd));
  }
  void set_bias(const void* bias, cudaDataType_t type) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof(type)));
  }
  void set_epilogue(cublasLtEpilogue_t e) {
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e)));
  }
  ~LtCall() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
  }
};

const void* c_of(const GemmCall& g) { return g.c ? static_cast<const void*>(g.c) : g.d; }

// Sets *differ when any of the n bytes of a and b differ.
__global__ void __launch_bounds__(256) bytes_differ_kernel(const unsigned char* a, const unsigned char* b, size_t n,
                                                           int* differ) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    if (a[i] != b[i]) {
      *differ = 1;
      return;
    }
}

// Whether n bytes at a and b are equal (a host wait).
bool bytes_equal(const void* a, const void* b, size_t n, int* flag, Stream stream) {
  CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), stream));
  bytes_differ_kernel<<<1024, 256, 0, stream>>>(static_cast<const unsigned char*>(a),
                                                static_cast<const unsigned char*>(b), n, flag);
  CUDA_CHECK(cudaGetLastError());
  int differ = 0;
  CUDA_CHECK(cudaMemcpyAsync(&differ, flag, sizeof(int), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return differ == 0;
}

// Times candidates[0 .. count) on the call's own buffers (each once untimed, then kSearchRuns times with CUDA
// events; its best time counts) and returns the index of the fastest among those whose outputs (D) equal
// candidate 0's bit for bit: the search changes the speed, never a result, so runs stay
// reproducible whatever the timings. Logs the choice on rank 0. D's contents are kept where the call reads them
// (beta != 0 with C = D): saved first, restored before each candidate's first run and at the end.
int search_fastest(StreamContext& ctx, const GemmCall& g, const LtCall& lt, const cublasLtMatmulHeuristicResult_t* cand,
                   int count, Stream stream) {
  const size_t d_bytes = (size_t(g.ldd) * size_t(g.n - 1) + size_t(g.m)) * gemm_type_bytes(g.d_type);
  void *saved = nullptr, *ref = nullptr;
  int* flag = nullptr;
  if (g.beta != 0.f && !g.c) {
    CUDA_CHECK(cudaMalloc(&saved, d_bytes));
    CUDA_CHECK(cudaMemcpyAsync(saved, g.d, d_bytes, cudaMemcpyDeviceToDevice, stream));
  }
  CUDA_CHECK(cudaMalloc(&ref, d_bytes));
  CUDA_CHECK(cudaMalloc(&flag, sizeof(int)));
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  const float alpha = 1.f, beta = g.beta;
  std::vector<float> best(count, -1.f);
  int same_bits = 0;
  for (int c = 0; c < count; ++c) {
    auto run = [&] {
      return cublasLtMatmul(ctx.lt, lt.op, &alpha, g.a, lt.la, g.b, lt.lb, &beta, c_of(g), lt.lc, g.d, lt.ld,
                            &cand[c].algo, ctx.workspace, kWorkspaceBytes, stream);
    };
    if (saved) CUDA_CHECK(cudaMemcpyAsync(g.d, saved, d_bytes, cudaMemcpyDeviceToDevice, stream));
    if (run() != CUBLAS_STATUS_SUCCESS) {  // a candidate that does not launch is not taken
      if (c == 0) break;                   // nor is any other: there is no reference to hold them to
      continue;
    }
    if (c == 0) {
      CUDA_CHECK(cudaMemcpyAsync(ref, g.d, d_bytes, cudaMemcpyDeviceToDevice, stream));
    } else if (!bytes_equal(g.d, ref, d_bytes, flag, stream)) {
      continue;  // other bits than the heuristic's first: not taken
    }
    ++same_bits;
    bool ran = true;
    for (int r = 0; r < kSearchRuns && ran; ++r) {
      CUDA_CHECK(cudaEventRecord(start, stream));
      ran = run() == CUBLAS_STATUS_SUCCESS;
      CUDA_CHECK(cudaEventRecord(stop, stream));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0.f;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (ran && (best[c] < 0.f || ms < best[c])) best[c] = ms;
    }
    if (!ran) best[c] = -1.f;
  }
  (void)cudaGetLastError();  // a failed candidate's launch error is not the next launch's
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  if (saved) CUDA_CHECK(cudaMemcpyAsync(g.d, saved, d_bytes, cudaMemcpyDeviceToDevice, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (saved) CUDA_CHECK(cudaFree(saved));
  CUDA_CHECK(cudaFree(ref));
  CUDA_CHECK(cudaFree(flag));
  int pick = 0;
  for (int c = 1; c < count; ++c)
    if (best[c] >= 0.f && (best[pick] < 0.f || best[c] < best[pick])) pick = c;
  note_gemm_algo_search();
  const double flop = 2.0 * double(g.m) * double(g.n) * double(g.k);
  LOG_INFO("gemm search: layer %s %s m %lld n %lld k %lld op %c%c epilogue %d: candidate %d of %d (%d with the "
           "heuristic's bits), %.3f ms (%.0f TFLOP/s); the heuristic's first %.3f ms",
           g.layer, gemm_type_name(g.type), (long long)g.m, (long long)g.n, (long long)g.k, g.trans_a ? 'T' : 'N',
           g.trans_b ? 'T' : 'N', int(lt.epi), pick, count, same_bits, double(best[pick]),
           best[pick] > 0.f ? flop / (double(best[pick]) * 1e9) : 0.0, double(best[0]));
  return pick;
}

// What decides the algorithm of a call; searched: whether the search was on.
AlgoKey algo_key(const GemmCall& g, cublasLtEpilogue_t epi, bool searched) {
  return AlgoKey{int(g.type) * 4 + int(g.d_type), g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldd,
                 int(epi) * 2 + (g.c != nullptr), g.beta != 0.f, alignment_of(g.a), alignment_of(g.b),
                 std::min(alignment_of(g.d), alignment_of(c_of(g))), searched};
}

// Up to `want` of the heuristic's runnable answers for the call as lt stands, best first.
int heuristic(StreamContext& ctx, const GemmCall& g, const LtCall& lt, int want,
              std::vector<cublasLtMatmulHeuristicResult_t>& results) {
  const uint32_t al_a = alignment_of(g.a), al_b = alignment_of(g.b), al_c = alignment_of(c_of(g)),
                 al_d = alignment_of(g.d);
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));
  results.assign(size_t(want), cublasLtMatmulHeuristicResult_t{});
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(ctx.lt, lt.op, lt.la, lt.lb, lt.lc, lt.ld, pref, want, results.data(), &found);
  CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  if (st != CUBLAS_STATUS_SUCCESS) found = 0;
  int ok = 0;  // keep the answers cuBLASLt says it can run
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) results[ok++] = results[i];
  return ok;
}

}  // namespace

namespace {

// A bias read by a 16-bit D's epilogue is staged (stage_bias) at the context's own address.
// (at most kStagedBiasMax wide: gemm_available_cuda says no to a wider one)
bool staged_bias(const GemmCall& g) { return g.bias && g.d_type != GemmType::f32; }

// Up to `want` algorithms for g as lt stands, or for an fp32 D where there are none the plain product's
// (bias_relu_kernel then applies the epilogue; plan.fused false, lt's epilogue set to match).
int find_algorithms(StreamContext& ctx, const GemmCall& g, LtCall& lt, int want,
                    std::vector<cublasLtMatmulHeuristicResult_t>& results, GemmPlan& plan) {
  int found = heuristic(ctx, g, lt, want, results);
  if (found == 0 && lt.epi != CUBLASLT_EPILOGUE_DEFAULT && g.d_type == GemmType::f32) {
    lt.set_epilogue(CUBLASLT_EPILOGUE_DEFAULT);
    plan.fused = false;
    found = heuristic(ctx, g, lt, want, results);
  }
  return found;
}

// g with its bias pointer at the staging address when it is staged (a 16-bit array there, despite the type).
GemmCall with_staged_bias(const StreamContext& ctx, const GemmCall& g) {
  GemmCall s = g;
  if (staged_bias(g)) s.bias = reinterpret_cast<const float*>(ctx.bias16);
  return s;
}

}  // namespace

bool gemm_available_cuda(const GemmCall& given, Stream stream) {
  if (staged_bias(given) && given.m > kStagedBiasMax) return false;
  if (given.m == 0 || given.n == 0 || given.k == 0) return true;
  StreamContext& ctx = context_for(stream);
  const GemmCall g = with_staged_bias(ctx, given);
  LtCall lt(g);
  const AlgoKey key = algo_key(g, lt.epi, false);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = ctx.available.find(key);
    if (it != ctx.available.end()) return it->second;
  }
  std::vector<cublasLtMatmulHeuristicResult_t> results;
  GemmPlan plan;
  const bool ok = find_algorithms(ctx, g, lt, 1, results, plan) > 0 && plan.fused;
  std::lock_guard<std::mutex> lock(g_mutex);
  ctx.available[key] = ok;
  return ok;
}

void gemm_cuda(const GemmCall& given, Stream stream) {
  if (given.m == 0 || given.n == 0) return;
  const bool fused_only = given.d_type != GemmType::f32;
  if (given.k == 0) {  // an empty product: D = beta * D; only a weight gradient over an empty batch gets here
    SPARTA_ASSERT(!given.bias && !given.relu && !fused_only && !given.c && (given.beta == 0.f || given.beta == 1.f),
                  "layer %s: empty GEMM with epilogue", given.layer);
    if (given.beta == 0.f)
      CUDA_CHECK(cudaMemset2DAsync(given.d, size_t(given.ldd) * sizeof(float), 0, size_t(given.m) * sizeof(float),
                                   size_t(given.n), stream));
    return;
  }
  SPARTA_ASSERT(!staged_bias(given) || given.m <= kStagedBiasMax, "layer %s: a 16-bit D's bias of %lld > %lld",
                given.layer, (long long)given.m, (long long)kStagedBiasMax);
  StreamContext& ctx = context_for(stream);
  const GemmCall g = with_staged_bias(ctx, given);
  LtCall lt(g);
  // No search while the stream is captured into a graph (its launches do not run then): the heuristic's first
  // answer serves the capture and is not kept, so the next call outside a capture searches.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  const bool mode = gemm_algo_search(), capturing = capture != cudaStreamCaptureStatusNone;
  const bool search = mode && !capturing;
  const AlgoKey key = algo_key(g, lt.epi, mode);
  GemmPlan plan;
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = ctx.algos.find(key);
    if (it != ctx.algos.end()) plan = it->second, known = true;
  }
  std::vector<cublasLtMatmulHeuristicResult_t> results;
  int found = 0;
  if (!known) {
    found = find_algorithms(ctx, g, lt, search ? kSearchCandidates : 1, results, plan);
    // (a 16-bit D is asked for by its callers only where gemm_available_cuda says it runs fused)
    if (found == 0 || (fused_only && !plan.fused))
      SPARTA_FATAL("layer %s: cuBLASLt has no algorithm for %s GEMM m %lld n %lld k %lld (op %c%c, lda %lld ldb %lld "
                   "ldd %lld, D %s, epilogue %d, alignments %u %u %u)",
                   g.layer, gemm_type_name(g.type), (long long)g.m, (long long)g.n, (long long)g.k,
                   g.trans_a ? 'T' : 'N', g.trans_b ? 'T' : 'N', (long long)g.lda, (long long)g.ldb,
                   (long long)g.ldd, gemm_type_name(g.d_type), int(lt.epi), alignment_of(g.a), alignment_of(g.b),
                   alignment_of(g.d));
  } else if (!plan.fused) {
    lt.set_epilogue(CUBLASLT_EPILOGUE_DEFAULT);
  }
  // the bias where and as the call reads it, before any run of it (the search's included)
  if (staged_bias(g)) to_half_cuda(g.d_type, given.bias, ctx.bias16, size_t(g.m), stream);
  if (!known) {
    plan.algo = results[0].algo;
    if (search && found > 1) plan.algo = results[search_fastest(ctx, g, lt, results.data(), found, stream)].algo;
    if (search || !mode) {
      std::lock_guard<std::mutex> lock(g_mutex);
      ctx.algos.emplace(key, plan);
    }
  }

  const float alpha = 1.f, beta = g.beta;
  CUBLAS_CHECK(cublasLtMatmul(ctx.lt, lt.op, &alpha, g.a, lt.la, g.b, lt.lb, &beta, c_of(g), lt.lc, g.d, lt.ld,
                              &plan.algo, ctx.workspace, kWorkspaceBytes, stream));
  CUDA_CHECK_LAUNCH("cublasLtMatmul");
  if (!plan.fused && lt.epi != CUBLASLT_EPILOGUE_DEFAULT) {
    const int64_t n = g.m * g.n;
    const int64_t blocks = (n + 255) / 256, cap = int64_t(dense::sm_count()) * 16;
    bias_relu_kernel<<<int(blocks < cap ? blocks : cap), 256, 0, stream>>>(static_cast<float*>(g.d), g.ldd, g.m,
                                                                           g.n, g.bias, g.relu);
    CUDA_CHECK_LAUNCH("bias_relu_kernel");
  }
}

void activation_bias_backward_cuda(const LinearDims& d, GemmType t, Activation act, const float* y, const float* dy,
                                   float* dpre, uint16_t* dpre16, float* db, float dy_scale, Stream stream) {
  // without a 16-bit copy the type is not read: the bf16 instance serves fp32
  dense::with_half(dpre16 ? t : GemmType::bf16, [&](auto h) {
    ActivationGrad<decltype(h)> op{y, dy, dpre, dpre16, act == Activation::relu, dy_scale, d.out};
    dense::column_sums(op, d.batch, d.out, db, stream, "activation_bias_backward (column_sum_kernel)");
  });
}

void relu_bias_backward_half_cuda(const LinearDims& d, GemmType t, const uint16_t* y16, const uint16_t* dy16,
                                  uint16_t* dpre16, float* db, Stream stream) {
  dense::with_half(t, [&](auto h) {
    using H = decltype(h);
    if (d.out % 8 == 0 && dense::aligned16(y16) && dense::aligned16(dy16) && dense::aligned16(dpre16)) {
      ReluGradHalf<H, 8> op{y16, dy16, dpre16, d.out};
      dense::column_sums(op, d.batch, d.out, db, stream, "relu_bias_backward_half (column_sum_kernel)");
    } else {
      ReluGradHalf<H, 1> op{y16, dy16, dpre16, d.out};
      dense::column_sums(op, d.batch, d.out, db, stream, "relu_bias_backward_half (column_sum_kernel)");
    }
  });
}

void to_half_cuda(GemmType t, const float* src, uint16_t* dst, size_t n, Stream stream) {
  if (n == 0) return;
  const int block = 256;
  const size_t cap = size_t(dense::sm_count()) * 16;
  dense::with_half(t, [&](auto h) {
    using H = decltype(h);
    size_t done = 0;
    if ((reinterpret_cast<uintptr_t>(src) & 15) == 0 && (reinterpret_cast<uintptr_t>(dst) & 7) == 0 && n >= 4) {
      const size_t n4 = n / 4, blocks = (n4 + block - 1) / block;
      to_half_vec_kernel<H><<<int(blocks < cap ? blocks : cap), block, 0, stream>>>(
          reinterpret_cast<const float4*>(src), reinterpret_cast<uint2*>(dst), n4);
      CUDA_CHECK_LAUNCH("to_half_vec_kernel");
      done = n4 * 4;
      if (done == n) return;
    }
    const size_t rest = n - done, blocks = (rest + block - 1) / block;
    to_half_kernel<H><<<int(blocks < cap ? blocks : cap), block, 0, stream>>>(src + done, dst + done, rest);
    CUDA_CHECK_LAUNCH("to_half_kernel");
  });
}

void to_half_padded_cuda(GemmType t, const float* src, int64_t rows, int64_t cols, uint16_t* dst, int64_t dst_ld,
                         Stream stream) {
  const int64_t n = rows * dst_ld;
  if (n == 0) return;
  const int64_t blocks = (n + 255) / 256, cap = int64_t(dense::sm_count()) * 16;
  dense::with_half(t, [&](auto h) {
    to_half_padded_kernel<decltype(h)><<<int(blocks < cap ? blocks : cap), 256, 0, stream>>>(src, rows, cols, dst,
                                                                                             dst_ld);
    CUDA_CHECK_LAUNCH("to_half_padded_kernel");
  });
}

}  // namespace sparta
