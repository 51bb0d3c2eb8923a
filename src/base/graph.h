// graph.h: pieces of one stream's work recorded once as CUDA graphs and replayed while what they read is the
// same: one launch instead of a launch per kernel and GEMM.
//
// A piece is a function that queues work on a stream; the caller names it by an index and describes what its
// launches depend on by a key (pointers, sizes, scalars: everything the function passes to a launch, and
// anything that changes the host state the function leaves behind). run() then
//   - replays the piece's graph when one is held for this key;
//   - otherwise runs the function as is the first time it sees the key (lazy allocations and algorithm
//     choices happen there, outside any capture) and records it into a graph the next time (cudaStream
//     capture, thread-local mode), reusing the executable graph by cudaGraphExecUpdate where it can.
// Any piece run as is makes every held graph stale: the pieces of a set are run in one order (forward,
// loss, backward) and each reads what the others left behind, so a replay is only trusted while nothing ran
// outside the graphs since they were recorded.
//
// The cpu backend, and a set made with enabled = false, run every function as is.
// Base layer: includes no other project header but device.h and check.h.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "src/base/device.h"

namespace sparta {

class StreamGraphs {
 public:
  using Key = std::vector<uint64_t>;

  StreamGraphs() = default;
  StreamGraphs(const Device& dev, int pieces, bool enabled);
  ~StreamGraphs();
  StreamGraphs(StreamGraphs&& o) noexcept;
  StreamGraphs& operator=(StreamGraphs&& o) noexcept;
  StreamGraphs(const StreamGraphs&) = delete;
  StreamGraphs& operator=(const StreamGraphs&) = delete;

  // Queues piece `piece` on stream: replayed, recorded and launched, or run as is (see above).
  void run(int piece, const Key& key, Stream stream, const std::function<void()>& work);

  bool enabled() const { return enabled_; }
  // How the pieces ran so far (for tests and benchmarks).
  int64_t replays() const { return replays_; }
  int64_t captures() const { return captures_; }
  int64_t direct_runs() const { return direct_; }

 private:
  struct Piece {
    Key key, seen;          // the held graph's key; the key last run as is
    bool valid = false;     // exec holds key's graph and nothing ran as is since
    bool has_seen = false;
    void* exec = nullptr;   // cudaGraphExec_t
  };
  void release();

  Device dev_;
  bool enabled_ = false;
  std::vector<Piece> pieces_;
  int64_t replays_ = 0, captures_ = 0, direct_ = 0;
};

// A key's words: pointers, integers and floats (by their bits).
inline uint64_t key_word(const void* p) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)); }
inline uint64_t key_word(int64_t v) { return static_cast<uint64_t>(v); }
uint64_t key_word(float v);

}  // namespace sparta
