// dense_linear.cu: CUDA version of dense_linear.h: GEMMs through cuBLASLt (bias and ReLU as the forward's
// epilogue, fp32 compute: no TF32), the fused activation + bias gradient, the 16-bit conversions, and the
// per-stream cuBLASLt handle, workspace and scratch that dense_reduce.cuh declares.
//
// cuBLASLt chooses an algorithm per call from its heuristic; the answer is cached per (stream, shape, types,
// epilogue, pointer alignments), so a training step queries it only in its first iteration.
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>

#include "src/base/check.h"
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

// What decides cuBLASLt's choice of algorithm for one call.
using AlgoKey = std::tuple<int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, bool,
                           uint32_t, uint32_t, uint32_t>;

// The algorithm for one kind of call, and whether it fuses the epilogue (where cuBLASLt has no algorithm with
// the bias or ReLU epilogue for a shape, the plain product runs and bias_relu_kernel follows it).
struct GemmPlan {
  cublasLtMatmulAlgo_t algo;
  bool fused = true;
};

struct StreamContext {
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  float* scratch = nullptr;
  size_t scratch_floats = 0;
  uint64_t scratch_epoch = 0;  // times scratch was made anew
  std::map<AlgoKey, GemmPlan> algos;
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

__global__ void __launch_bounds__(256) add_chunks_kernel(const float* partial,  // [chunks, cols]
                                                         int chunks, int cols, float* sums) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.f;
  for (int k = 0; k < chunks; ++k) s += partial[int64_t(k) * cols + c];
  sums[c] = s;
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

// Element i = r * out + c of the activation + bias gradient. dy and dpre may be the same array; dpre may be
// nullptr (16-bit training reads dpre16, of type H, alone).
template <class H>
struct ActivationGrad {
  const float* y;
  const float* dy;
  float* dpre;
  uint16_t* dpre16;
  bool relu;
  struct In {
    float y, dy;
  };
  __device__ __forceinline__ In load(int64_t i) const { return {relu ? y[i] : 1.f, dy[i]}; }
  __device__ __forceinline__ float finish(const In& in, int64_t i) const {
    const float v = relu && !(in.y > 0.f) ? 0.f : in.dy;
    if (dpre) dpre[i] = v;
    if (dpre16) dpre16[i] = H::bits(v);
    return v;
  }
};

}  // namespace

// ----------------------------------------------------------------------------
// launchers

namespace dense {
void add_chunks(const float* partial, int chunks, int cols, float* sums, Stream stream) {
  add_chunks_kernel<<<(cols + 255) / 256, 256, 0, stream>>>(partial, chunks, cols, sums);
  CUDA_CHECK_LAUNCH("add_chunks_kernel");
}
}  // namespace dense

uint64_t scratch_epoch_cuda(Stream stream) {
  StreamContext& ctx = context_for(stream);
  std::lock_guard<std::mutex> lock(g_mutex);
  return ctx.scratch_epoch;
}

void gemm_cuda(const GemmCall& g, Stream stream) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {  // an empty product: D = beta * D; only a weight gradient over an empty batch gets here
    SPARTA_ASSERT(!g.bias && !g.relu && (g.beta == 0.f || g.beta == 1.f), "layer %s: empty GEMM with epilogue",
                  g.layer);
    if (g.beta == 0.f)
      CUDA_CHECK(cudaMemset2DAsync(g.d, size_t(g.ldd) * sizeof(float), 0, size_t(g.m) * sizeof(float), size_t(g.n),
                                   stream));
    return;
  }
  StreamContext& ctx = context_for(stream);
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasLtEpilogue_t epi = g.bias ? (g.relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                        : (g.relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
  const cudaDataType_t in = cuda_type(g.type);

  cublasLtMatmulDesc_t op;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (g.bias) CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));

  cublasLtMatrixLayout_t la, lb, ld;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, in, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, in, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, g.m, g.n, g.ldd));

  const uint32_t al_a = alignment_of(g.a), al_b = alignment_of(g.b), al_d = alignment_of(g.d);
  const AlgoKey key{int(g.type), g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldd, int(epi), g.beta != 0.f,
                    al_a, al_b, al_d};
  GemmPlan plan;
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = ctx.algos.find(key);
    if (it != ctx.algos.end()) plan = it->second, known = true;
  }
  if (!known) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kWorkspaceBytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));
    auto ask = [&](cublasLtMatmulAlgo_t& algo) {
      cublasLtMatmulHeuristicResult_t result;
      std::memset(&result, 0, sizeof(result));
      int found = 0;
      const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx.lt, op, la, lb, ld, ld, pref, 1, &result, &found);
      if (st != CUBLAS_STATUS_SUCCESS || found == 0) return false;
      algo = result.algo;
      return true;
    };
    bool ok = ask(plan.algo);
    if (!ok && epi != CUBLASLT_EPILOGUE_DEFAULT) {
      const cublasLtEpilogue_t plain = CUBLASLT_EPILOGUE_DEFAULT;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &plain, sizeof(plain)));
      plan.fused = false;
      ok = ask(plan.algo);
    }
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (!ok)
      SPARTA_FATAL("layer %s: cuBLASLt has no algorithm for %s GEMM m %lld n %lld k %lld (op %c%c, lda %lld ldb %lld "
                   "ldd %lld, alignments %u %u %u)",
                   g.layer, gemm_type_name(g.type), (long long)g.m, (long long)g.n, (long long)g.k,
                   g.trans_a ? 'T' : 'N', g.trans_b ? 'T' : 'N', (long long)g.lda, (long long)g.ldb,
                   (long long)g.ldd, al_a, al_b, al_d);
    std::lock_guard<std::mutex> lock(g_mutex);
    ctx.algos.emplace(key, plan);
  } else if (!plan.fused) {
    const cublasLtEpilogue_t plain = CUBLASLT_EPILOGUE_DEFAULT;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &plain, sizeof(plain)));
  }

  const float alpha = 1.f, beta = g.beta;
  CUBLAS_CHECK(cublasLtMatmul(ctx.lt, op, &alpha, g.a, la, g.b, lb, &beta, g.d, ld, g.d, ld, &plan.algo,
                              ctx.workspace, kWorkspaceBytes, stream));
  CUDA_CHECK_LAUNCH("cublasLtMatmul");
  if (!plan.fused && epi != CUBLASLT_EPILOGUE_DEFAULT) {
    const int64_t n = g.m * g.n;
    const int64_t blocks = (n + 255) / 256, cap = int64_t(dense::sm_count()) * 16;
    bias_relu_kernel<<<int(blocks < cap ? blocks : cap), 256, 0, stream>>>(g.d, g.ldd, g.m, g.n, g.bias, g.relu);
    CUDA_CHECK_LAUNCH("bias_relu_kernel");
  }
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(la));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(lb));
  CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(ld));
  CUBLAS_CHECK(cublasLtMatmulDescDestroy(op));
}

void activation_bias_backward_cuda(const LinearDims& d, GemmType t, Activation act, const float* y, const float* dy,
                                   float* dpre, uint16_t* dpre16, float* db, Stream stream) {
  // without a 16-bit copy the type is not read: the bf16 instance serves fp32
  dense::with_half(dpre16 ? t : GemmType::bf16, [&](auto h) {
    ActivationGrad<decltype(h)> op{y, dy, dpre, dpre16, act == Activation::relu};
    dense::column_sums(op, d.batch, d.out, db, stream, "activation_bias_backward (column_sum_kernel)");
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
