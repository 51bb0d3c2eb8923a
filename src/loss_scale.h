// loss_scale.h: dynamic loss scaling for fp16 training. The loss gradient is multiplied by the scale S before
// the dense backward, so that small gradients survive fp16's range; after it the gradients are divided by S
// (exact: S is a power of two) unless one of them overflowed (NaN or ±inf), in which case the step is skipped.
// The scale follows the outcomes:
//   an overflow           S = max(S / 2, 1), the run of good steps restarts
//   `window` good steps    in a row: S = 2 S (at most 2^64)
// Host state only; the trainer (src/trainer.cpp) runs the device side (kernels/grad_scale.h) and agrees the
// outcome over ranks before update(), so every rank's scaler holds the same state.
#pragma once

#include <cstdint>

namespace sparta {

class LossScaler {
 public:
  static constexpr double kMaxScale = 18446744073709551616.0;  // 2^64

  // Throws sparta::Error unless init is a power of two in [1, 2^64] and window >= 1.
  LossScaler(double init, int64_t window);

  float scale() const { return float(scale_); }
  // The outcome of one step: finite → a good step (the scale grows after `window` in a row), else an overflow
  // (skipped, the scale halves). Returns finite: whether the step's updates are applied.
  bool update(bool finite);

  int64_t skipped() const { return skipped_; }     // overflowed steps so far
  int64_t good_run() const { return good_run_; }   // good steps since the last change of scale
  int log2_scale() const;                           // the scale is 2^log2_scale()
  // A checkpoint's state: scale 2^log2_scale, good_run good steps since it changed. Throws sparta::Error naming
  // the value unless 0 <= log2_scale <= 64 and 0 <= good_run < window.
  void restore(int64_t log2_scale, int64_t good_run);

 private:
  double scale_;
  int64_t window_;
  int64_t good_run_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace sparta
