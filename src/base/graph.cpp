// graph.cpp: see graph.h.
#include "src/base/graph.h"

#include <cstring>
#include <utility>

#include "src/base/check.h"

#if SPARTA_CUDA
#include <cuda_runtime_api.h>
#endif

namespace sparta {

uint64_t key_word(float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

StreamGraphs::StreamGraphs(const Device& dev, int pieces, bool enabled)
    : dev_(dev), enabled_(enabled && dev.is_cuda()), pieces_(static_cast<size_t>(pieces)) {}

StreamGraphs::~StreamGraphs() { release(); }

StreamGraphs::StreamGraphs(StreamGraphs&& o) noexcept { *this = std::move(o); }

StreamGraphs& StreamGraphs::operator=(StreamGraphs&& o) noexcept {
  if (this != &o) {
    release();
    dev_ = o.dev_;
    enabled_ = o.enabled_;
    pieces_ = std::move(o.pieces_);
    replays_ = o.replays_, captures_ = o.captures_, direct_ = o.direct_;
    o.pieces_.clear();
  }
  return *this;
}

void StreamGraphs::release() {
#if SPARTA_CUDA
  // an executable graph still running is freed once it completes (cudaGraphExecDestroy): no wait here
  for (Piece& p : pieces_)
    if (p.exec) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(p.exec));
#endif
  pieces_.clear();
}

void StreamGraphs::run(int piece, const Key& key, Stream stream, const std::function<void()>& work) {
  SPARTA_ASSERT(piece >= 0 && size_t(piece) < pieces_.size(), "graphs: piece %d of %zu", piece, pieces_.size());
  if (!enabled_) {
    work();
    return;
  }
#if SPARTA_CUDA
  Piece& p = pieces_[size_t(piece)];
  if (p.valid && p.key == key) {
    CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(p.exec), stream));
    ++replays_;
    return;
  }
  if (!p.has_seen || p.seen != key) {
    for (Piece& q : pieces_) q.valid = false;  // what the held graphs read may change under them now
    work();
    p.seen = key;
    p.has_seen = true;
    ++direct_;
    return;
  }
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    work();
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);  // leave the stream usable; the error goes on
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = static_cast<cudaGraphExec_t>(p.exec);
  bool updated = false;
  if (exec) {
    cudaGraphExecUpdateResultInfo info;
    updated = cudaGraphExecUpdate(exec, graph, &info) == cudaSuccess;
    if (!updated) {
      cudaGetLastError();  // a graph of another shape: made anew below (a launch in flight finishes first)
      CUDA_CHECK(cudaGraphExecDestroy(exec));
    }
  }
  if (!updated) CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_CHECK(cudaGraphDestroy(graph));
  p.exec = exec;
  p.key = key;
  p.valid = true;
  CUDA_CHECK(cudaGraphLaunch(exec, stream));
  ++captures_;
#else
  (void)piece, (void)key, (void)stream, (void)work;
#endif
}

}  // namespace sparta
