// loss_scale.cpp: see loss_scale.h.
#include "src/loss_scale.h"

#include <cmath>

#include "src/base/check.h"

namespace sparta {

LossScaler::LossScaler(double init, int64_t window) : scale_(init), window_(window) {
  int e = 0;
  SPARTA_REQUIRE(init >= 1 && init <= kMaxScale && std::frexp(init, &e) == 0.5,
                 "train.loss_scale_init: expected a power of two in [1, 2^64], found %g", init);
  SPARTA_REQUIRE(window >= 1, "train.loss_scale_window: expected >= 1, found %lld", (long long)window);
}

bool LossScaler::update(bool finite) {
  if (!finite) {
    ++skipped_;
    good_run_ = 0;
    scale_ = scale_ > 1 ? scale_ / 2 : 1;
    return false;
  }
  if (++good_run_ >= window_) {
    good_run_ = 0;
    if (scale_ < kMaxScale) scale_ *= 2;
  }
  return true;
}

int LossScaler::log2_scale() const {
  int e = 0;
  std::frexp(scale_, &e);
  return e - 1;
}

void LossScaler::restore(int64_t log2_scale, int64_t good_run) {
  SPARTA_REQUIRE(log2_scale >= 0 && log2_scale <= 64,
                 "checkpoint loss_scale: expected log2 of the scale in [0, 64], found %lld", (long long)log2_scale);
  SPARTA_REQUIRE(good_run >= 0 && good_run < window_,
                 "checkpoint loss_scale: expected good steps in [0, %lld) (train.loss_scale_window), found %lld",
                 (long long)window_, (long long)good_run);
  scale_ = std::ldexp(1.0, int(log2_scale));
  good_run_ = good_run;
}

}  // namespace sparta
