// Buffers, device memory copies and the fill kernel, on every backend present (GPU cases skip without one).
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>

#include "src/base/buffer.h"
#include "src/context.h"
#include "kernels/fill.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

void round_trip(Backend backend) {
  Device dev = open_device(backend, backend == Backend::cuda ? 0 : -1);
  for (size_t n : {size_t(1), size_t(1000), size_t(3 << 20)}) {
    std::vector<float> host = testing::random_floats(n);
    Buffer<float> buf(dev, n);
    buf.fill_bytes(0xFF);  // poison: any element the upload misses stays NaN
    buf.upload(host);
    std::vector<float> back = buf.download();
    BOOST_CHECK_EQUAL(testing::count_mismatches(back, host, 0, 0, "round trip"), 0u);

    Buffer<float> other(dev, n);
    other.fill_bytes(0xFF);
    copy_on_device(dev, other.data(), buf.data(), buf.bytes());
    BOOST_CHECK_EQUAL(testing::count_mismatches(other.download(), host, 0, 0, "device copy"), 0u);

    float value = testing::random_floats(1)[0];
    fill(dev, other.data(), n, value);
    BOOST_CHECK_EQUAL(testing::count_mismatches(other.download(), std::vector<float>(n, value), 0, 0, "fill"), 0u);
  }
  close_device(dev);
}

}  // namespace

BOOST_AUTO_TEST_CASE(cpu_buffer_round_trip) { round_trip(Backend::cpu); }

BOOST_AUTO_TEST_CASE(cuda_buffer_round_trip, *testing::needs_gpu()) { round_trip(Backend::cuda); }

BOOST_AUTO_TEST_CASE(buffer_moves_and_resizes) {
  Device dev;
  Buffer<int64_t> a(dev, 10);
  a.fill_bytes(0);
  int64_t* p = a.data();
  Buffer<int64_t> b(std::move(a));
  BOOST_CHECK(a.data() == nullptr);
  BOOST_CHECK_EQUAL(a.size(), 0u);
  BOOST_CHECK(b.data() == p);
  BOOST_CHECK_EQUAL(b.size(), 10u);
  b.resize(0);
  BOOST_CHECK(b.empty());
  b.resize(7);
  BOOST_CHECK_EQUAL(b.bytes(), 7 * sizeof(int64_t));
  BOOST_CHECK_EQUAL(reinterpret_cast<uintptr_t>(b.data()) % 256, 0u);
}

BOOST_AUTO_TEST_CASE(pinned_buffer_holds_data) {
  PinnedBuffer<double> p(Backend::cpu, 1 << 16);
  for (size_t i = 0; i < p.size(); ++i) p[i] = double(i) * 0.5;
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i];
  BOOST_CHECK_EQUAL(sum, 0.5 * double(p.size()) * double(p.size() - 1) / 2);
}

BOOST_AUTO_TEST_CASE(cpu_device_has_no_stream) {
  Device d = open_device(Backend::cpu, -1);
  BOOST_CHECK(!d.is_cuda());
  BOOST_CHECK(d.stream == nullptr);
  BOOST_CHECK_EQUAL(d.name(), "cpu");
}

BOOST_AUTO_TEST_CASE(device_choice_maps_local_rank_to_gpu) {
  // cpu always; cuda takes GPU = host-local rank; auto takes the GPUs only when every local rank gets one.
  BOOST_CHECK(choose_device("cpu", 1, 2, 8).backend == Backend::cpu);
  DeviceChoice c = choose_device("cuda", 3, 4, 4);
  BOOST_CHECK(c.backend == Backend::cuda);
  BOOST_CHECK_EQUAL(c.gpu, 3);
  BOOST_CHECK_THROW(choose_device("cuda", 2, 4, 2), Error);
  BOOST_CHECK(choose_device("auto", 1, 2, 2).backend == Backend::cuda);
  BOOST_CHECK_EQUAL(choose_device("auto", 1, 2, 2).gpu, 1);
  BOOST_CHECK(choose_device("auto", 1, 4, 2).backend == Backend::cpu);
  BOOST_CHECK(choose_device("auto", 0, 1, 0).backend == Backend::cpu);
  try {
    choose_device("gpu", 0, 1, 1);
    BOOST_ERROR("an unknown device name was accepted");
  } catch (const Error& e) {
    BOOST_CHECK(std::string(e.what()).find("'gpu'") != std::string::npos);
  }
}
