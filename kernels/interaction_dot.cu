// interaction_dot.cu: CUDA version of interaction_dot.h. One block per sample (grid-stride beyond the grid)
// copies the sample's S + 1 vectors (two contiguous spans: the bottom row and the S embedding rows) into
// shared memory; the forward computes each pair's dot product with one warp (lanes over dim, conflict-free
// shared reads, a shuffle reduction), the backward each element of dT with one thread.
#include <cmath>

#include "src/base/check.h"
#include "kernels/interaction_dot.h"

namespace sparta {

namespace {
constexpr int kBlock = 256;
}

// ----------------------------------------------------------------------------
// kernels

// Pair p of the strictly lower triangle in row-major order: (i, j) with p = i(i-1)/2 + j, j < i.
__device__ __forceinline__ void pair_of(int p, int& i, int& j) {
  i = static_cast<int>((1.0f + sqrtf(1.0f + 8.0f * float(p))) * 0.5f);
  while (i * (i - 1) / 2 > p) --i;   // float rounding of the square root, either way
  while ((i + 1) * i / 2 <= p) ++i;
  j = p - i * (i - 1) / 2;
}

// Copies sample b's vectors into t [(S+1) * dim].
__device__ __forceinline__ void load_sample(float* t, const float* bottom, const float* emb, int64_t b, int slots,
                                            int dim) {
  const float* bot = bottom + b * dim;
  const float* em = emb + b * int64_t(slots) * dim;
  for (int k = threadIdx.x; k < dim; k += blockDim.x) t[k] = bot[k];
  for (int k = threadIdx.x; k < slots * dim; k += blockDim.x) t[dim + k] = em[k];
}

__global__ void __launch_bounds__(kBlock)
    interaction_forward_kernel(const float* bottom,  // [batch, dim]
                               const float* emb,     // [batch, slots, dim]
                               float* out,           // [batch, width]
                               int64_t batch, int slots, int dim, int64_t width) {
  extern __shared__ float t[];  // [(slots + 1) * dim]
  const int pairs = (slots + 1) * slots / 2;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    __syncthreads();  // the previous sample's reads are done
    load_sample(t, bottom, emb, b, slots, dim);
    __syncthreads();
    float* o = out + b * width;
    for (int k = threadIdx.x; k < dim; k += blockDim.x) o[k] = t[k];
    for (int p = warp; p < pairs; p += warps) {
      int i, j;
      pair_of(p, i, j);
      const float* ti = t + i * dim;
      const float* tj = t + j * dim;
      float s = 0.f;
      for (int k = lane; k < dim; k += 32) s += ti[k] * tj[k];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (lane == 0) o[dim + p] = s;
    }
  }
}

__global__ void __launch_bounds__(kBlock)
    interaction_backward_kernel(const float* dout,    // [batch, width]
                                const float* bottom,  // [batch, dim]
                                const float* emb,     // [batch, slots, dim]
                                float* dbottom,       // [batch, dim]
                                float* demb,          // [batch, slots, dim]
                                int64_t batch, int slots, int dim, int64_t width) {
  extern __shared__ float t[];  // [(slots + 1) * dim], then dz [pairs]
  const int n = slots + 1, pairs = n * slots / 2;
  float* dz = t + n * dim;
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    __syncthreads();
    load_sample(t, bottom, emb, b, slots, dim);
    const float* g = dout + b * width;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) dz[p] = g[dim + p];
    __syncthreads();
    for (int e = threadIdx.x; e < n * dim; e += blockDim.x) {
      const int i = e / dim, k = e - i * dim;
      float acc = i == 0 ? g[k] : 0.f;
      const int row_i = i * (i - 1) / 2;
      for (int j = 0; j < i; ++j) acc += dz[row_i + j] * t[j * dim + k];
      for (int j = i + 1; j < n; ++j) acc += dz[j * (j - 1) / 2 + i] * t[j * dim + k];
      if (i == 0) {
        dbottom[b * dim + k] = acc;
      } else {
        demb[(b * slots + (i - 1)) * int64_t(dim) + k] = acc;
      }
    }
  }
}

// ----------------------------------------------------------------------------
// launchers

namespace {

// Blocks for one sample each, grid-stride beyond; the dynamic shared memory opted in when above 48 KiB.
template <class Kernel>
int prepare(Kernel kernel, const InteractionDims& d, size_t smem, const char* what) {
  int device = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  SPARTA_REQUIRE(smem <= size_t(optin),
                 "interaction '%s': %s needs %zu bytes of shared memory per sample ((slots + 1) x dim = %d x %d "
                 "floats), expected at most %d on this GPU",
                 d.layer, what, smem, d.slots + 1, d.dim, optin);
  if (smem > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const int64_t cap = int64_t(1) << 20;
  return static_cast<int>(d.batch < cap ? d.batch : cap);
}

}  // namespace

void interaction_dot_forward_cuda(const InteractionDims& d, const float* bottom, const float* emb, float* out,
                                  Stream stream) {
  const size_t smem = size_t(d.slots + 1) * d.dim * sizeof(float);
  const int grid = prepare(interaction_forward_kernel, d, smem, "the forward");
  if (grid == 0) return;
  interaction_forward_kernel<<<grid, kBlock, smem, stream>>>(bottom, emb, out, d.batch, d.slots, d.dim,
                                                             interaction_dot_width(d.slots, d.dim));
  CUDA_CHECK_LAUNCH("interaction_forward_kernel");
}

void interaction_dot_backward_cuda(const InteractionDims& d, const float* dout, const float* bottom,
                                   const float* emb, float* dbottom, float* demb, Stream stream) {
  const size_t pairs = size_t(d.slots + 1) * d.slots / 2;
  const size_t smem = (size_t(d.slots + 1) * d.dim + pairs) * sizeof(float);
  const int grid = prepare(interaction_backward_kernel, d, smem, "the backward");
  if (grid == 0) return;
  interaction_backward_kernel<<<grid, kBlock, smem, stream>>>(dout, bottom, emb, dbottom, demb, d.batch, d.slots,
                                                              d.dim, interaction_dot_width(d.slots, d.dim));
  CUDA_CHECK_LAUNCH("interaction_backward_kernel");
}

}  // namespace sparta
