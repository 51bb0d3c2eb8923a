// test_dense_util.h: what the dense-layer suites (tests/test_dense_*.cpp) share: the device of a backend, bf16
// rounding of inputs, central finite differences of a forward, comparison against double-precision
// expectations, and a check that an error names what it should.
#pragma once

#include <boost/test/unit_test.hpp>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "src/base/buffer.h"
#include "src/base/check.h"
#include "src/base/device.h"
#include "src/base/half.h"
#include "kernels/dense_linear.h"
#include "tests/testing.h"

namespace dense_test {

inline sparta::Device device_for(sparta::Backend b) {
  return sparta::open_device(b, b == sparta::Backend::cuda ? 0 : -1);
}

inline std::vector<uint16_t> bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = sparta::float_to_bf16(v[i]);
  return out;
}
// v in the 16-bit type t (bf16 or f16) of kernels/dense_linear.h, and rounded to it and back: the numbers a
// 16-bit GEMM multiplies.
inline std::vector<uint16_t> half_bits(sparta::GemmType t, const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = sparta::half_from_float(t)(v[i]);
  return out;
}
inline std::vector<float> half_rounded(sparta::GemmType t, const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = sparta::half_to_float(t)(sparta::half_from_float(t)(v[i]));
  return out;
}
// v rounded to bf16 and back: the numbers a bf16 GEMM multiplies.
inline std::vector<float> bf16_rounded(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = sparta::bf16_to_float(sparta::float_to_bf16(v[i]));
  return out;
}

// A buffer of n floats on dev, every byte 0xFF (NaN): an element the code under test does not write shows.
inline sparta::Buffer<float> poisoned(const sparta::Device& dev, size_t n) {
  sparta::Buffer<float> b(dev, n);
  b.fill_bytes(0xFF);
  return b;
}

// d loss / d input[i] by central differences: loss() reads `input` (which this changes and restores) and
// returns a double. The step is the one the float input actually takes.
template <class Loss>
std::vector<double> central_differences(std::vector<float>& input, Loss loss, double h) {
  std::vector<double> grad(input.size());
  for (size_t i = 0; i < input.size(); ++i) {
    const float v = input[i];
    const float up = static_cast<float>(v + h), down = static_cast<float>(v - h);
    input[i] = up;
    const double lu = loss();
    input[i] = down;
    const double ld = loss();
    input[i] = v;
    grad[i] = (lu - ld) / (double(up) - double(down));
  }
  return grad;
}

// Σ r_i out_i in double: the scalar whose gradient with respect to out is r.
inline double weighted_sum(const std::vector<float>& out, const std::vector<float>& r) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += double(out[i]) * double(r[i]);
  return s;
}

inline size_t mismatches(const std::vector<float>& got, const std::vector<double>& want, double atol, double rtol,
                         const std::string& what) {
  return testing::count_mismatches(got, std::vector<float>(want.begin(), want.end()), atol, rtol, what);
}

// For BOOST_CHECK_EXCEPTION: the message contains every word.
struct Names {
  std::vector<std::string> words;
  Names(std::initializer_list<const char*> w) : words(w.begin(), w.end()) {}
  bool operator()(const sparta::Error& e) const {
    const std::string m = e.what();
    for (const auto& w : words)
      if (m.find(w) == std::string::npos) {
        BOOST_TEST_MESSAGE("error '" << m << "' does not name '" << w << "'");
        return false;
      }
    return true;
  }
};

}  // namespace dense_test
