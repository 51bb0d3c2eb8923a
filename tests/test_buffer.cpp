// Buffers, device memory copies and the fill kernel, on every backend present (GPU cases skip without one).
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#if SPARTA_CUDA
#include <cuda_runtime_api.h>
#endif

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
    fill(dev, other.data(), n, value, dev.stream);
    BOOST_CHECK_EQUAL(testing::count_mismatches(other.download(), std::vector<float>(n, value), 0, 0, "fill"), 0u);
    // int64: a value no float holds exactly, over poisoned memory; the element after the n filled stays
    Buffer<int64_t> ints(dev, n + 1);
    ints.fill_bytes(0xA5);
    const int64_t big = (int64_t(1) << 60) + 1 + int64_t(testing::rng()() % 1000);
    fill(dev, ints.data(), n, big, dev.stream);
    std::vector<int64_t> want_ints(n + 1, big);
    std::memset(&want_ints[n], 0xA5, sizeof(int64_t));
    BOOST_CHECK(ints.download() == want_ints);

    // The stream forms, on a stream of their own: set, copy, read back, all ordered on that stream.
    Stream s = create_stream(dev);
    BOOST_CHECK(s != nullptr || !dev.is_cuda());
    std::vector<float> half(n, std::nanf(""));  // poison
    memset_device(dev, other.data(), 0, other.bytes(), s);
    copy_to_device(dev, other.data(), host.data(), (n / 2) * sizeof(float), s);
    copy_on_device(dev, buf.data(), other.data(), other.bytes(), s);
    copy_to_host(dev, half.data(), buf.data(), buf.bytes(), s);
    std::vector<float> want(host.begin(), host.begin() + n / 2);
    want.resize(n, 0.f);
    BOOST_CHECK_EQUAL(testing::count_mismatches(half, want, 0, 0, "stream forms"), 0u);
    destroy_stream(dev, s);
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
  b.resize(0, dev.stream);
  BOOST_CHECK(b.empty());
  b.resize(7, dev.stream);
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
  BOOST_CHECK(create_stream(d) == nullptr);
  BOOST_CHECK_EQUAL(d.name(), "cpu");
}

#if SPARTA_CUDA
namespace {
void CUDART_CB sleep_then_mark(void* flag) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  static_cast<std::atomic<bool>*>(flag)->store(true);
}
}  // namespace
#endif

// resize frees memory a stream may still be using only once that stream is done: work queued on the stream
// before the resize (here a host function that takes 300 ms) has finished when resize returns.
BOOST_AUTO_TEST_CASE(cuda_resize_waits_for_the_stream_that_used_the_memory, *testing::needs_gpu()) {
#if SPARTA_CUDA
  Device dev = open_device(Backend::cuda, 0);
  {
    Stream s = create_stream(dev);
    Buffer<float> b(dev, 1 << 20);
    std::atomic<bool> done{false};
    fill(dev, b.data(), b.size(), 1.f, s);
    BOOST_REQUIRE(cudaLaunchHostFunc(s, sleep_then_mark, &done) == cudaSuccess);
    b.resize(1 << 10, s);
    BOOST_CHECK(done.load());
    BOOST_CHECK_EQUAL(b.size(), size_t(1) << 10);
    destroy_stream(dev, s);
  }
  close_device(dev);
#endif
}

// A SideStream's orderings: work queued on the side stream after wait_for(s) sees what s did before it, and
// work queued on s after join_into(s) sees what the side stream did before it. Each producer first sleeps 300 ms
// in a host function, so an ordering that is missing shows as the old values.
BOOST_AUTO_TEST_CASE(cuda_side_stream_orders_both_ways, *testing::needs_gpu()) {
#if SPARTA_CUDA
  Device dev = open_device(Backend::cuda, 0);
  {
    const size_t n = size_t(1) << 20;
    SideStream side(dev);
    BOOST_REQUIRE(side.stream() != nullptr && side.stream() != dev.stream);
    Buffer<float> a(dev, n), b(dev, n);
    fill(dev, a.data(), n, 1.f, dev.stream);
    fill(dev, b.data(), n, -1.f, dev.stream);
    synchronize(dev, dev.stream);
    // dev.stream produces, the side stream consumes
    std::atomic<bool> slept{false};
    BOOST_REQUIRE(cudaLaunchHostFunc(dev.stream, sleep_then_mark, &slept) == cudaSuccess);
    fill(dev, a.data(), n, 2.f, dev.stream);
    side.wait_for(dev.stream);
    copy_on_device(dev, b.data(), a.data(), n * sizeof(float), side.stream());
    std::vector<float> got(n, std::nanf(""));
    copy_to_host(dev, got.data(), b.data(), n * sizeof(float), side.stream());
    BOOST_CHECK(slept.load());
    BOOST_CHECK_EQUAL(testing::count_mismatches(got, std::vector<float>(n, 2.f), 0, 0, "wait_for"), 0u);
    // the side stream produces, dev.stream consumes
    std::atomic<bool> slept2{false};
    BOOST_REQUIRE(cudaLaunchHostFunc(side.stream(), sleep_then_mark, &slept2) == cudaSuccess);
    fill(dev, b.data(), n, 3.f, side.stream());
    side.join_into(dev.stream);
    copy_on_device(dev, a.data(), b.data(), n * sizeof(float), dev.stream);
    std::fill(got.begin(), got.end(), std::nanf(""));
    copy_to_host(dev, got.data(), a.data(), n * sizeof(float), dev.stream);
    BOOST_CHECK(slept2.load());
    BOOST_CHECK_EQUAL(testing::count_mismatches(got, std::vector<float>(n, 3.f), 0, 0, "join_into"), 0u);
    // moved-from objects hold nothing; the moved-to one keeps the stream
    SideStream moved(std::move(side));
    BOOST_CHECK(side.stream() == nullptr && moved.stream() != nullptr);
  }
  close_device(dev);
#endif
}

// On the cpu backend a SideStream holds nothing and its orderings do nothing (cpu work is done when its call
// returns).
BOOST_AUTO_TEST_CASE(cpu_side_stream_is_empty) {
  Device d = open_device(Backend::cpu, -1);
  SideStream side(d);
  BOOST_CHECK(side.stream() == nullptr);
  side.wait_for(d.stream);
  side.join_into(d.stream);
  close_device(d);
}

// A StreamEvent orders a later point: work queued on t after wait_in(t) sees what s did before record(s), even
// when s goes on with other work (here a second sleep and a fill that t must not see), and a second record moves
// the point. The producer first sleeps 300 ms in a host function, so a missing ordering shows as the old values.
BOOST_AUTO_TEST_CASE(cuda_stream_event_orders_a_recorded_point, *testing::needs_gpu()) {
#if SPARTA_CUDA
  Device dev = open_device(Backend::cuda, 0);
  {
    const size_t n = size_t(1) << 20;
    SideStream side(dev);
    StreamEvent ev(dev);
    BOOST_CHECK(!ev.recorded());
    ev.wait_in(dev.stream);  // never recorded: nothing to wait for
    Buffer<float> a(dev, n), b(dev, n);
    fill(dev, a.data(), n, 1.f, dev.stream);
    synchronize(dev, dev.stream);
    std::atomic<bool> slept{false};
    BOOST_REQUIRE(cudaLaunchHostFunc(side.stream(), sleep_then_mark, &slept) == cudaSuccess);
    fill(dev, a.data(), n, 2.f, side.stream());
    ev.record(side.stream());
    BOOST_CHECK(ev.recorded());
    std::atomic<bool> slept2{false};
    BOOST_REQUIRE(cudaLaunchHostFunc(side.stream(), sleep_then_mark, &slept2) == cudaSuccess);
    fill(dev, a.data(), n, 3.f, side.stream());  // after the recorded point
    ev.wait_in(dev.stream);
    copy_on_device(dev, b.data(), a.data(), n * sizeof(float), dev.stream);
    std::vector<float> got(n, std::nanf(""));
    copy_to_host(dev, got.data(), b.data(), n * sizeof(float), dev.stream);
    BOOST_CHECK(slept.load());
    BOOST_CHECK_EQUAL(testing::count_mismatches(got, std::vector<float>(n, 2.f), 0, 0, "recorded point"), 0u);
    synchronize(dev, side.stream());
    BOOST_CHECK(slept2.load());
    // moved: the event goes with it
    StreamEvent moved(std::move(ev));
    BOOST_CHECK(moved.recorded() && !ev.recorded());
  }
  close_device(dev);
#endif
}

// On the cpu backend a StreamEvent holds nothing and does nothing.
BOOST_AUTO_TEST_CASE(cpu_stream_event_is_empty) {
  Device d = open_device(Backend::cpu, -1);
  StreamEvent ev(d);
  ev.record(d.stream);
  ev.wait_in(d.stream);
  BOOST_CHECK(!ev.recorded());
  close_device(d);
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
  BOOST_CHECK(choose_device("auto", 0, 1, 0).reason.find("sees no GPU") != std::string::npos);
  BOOST_CHECK(choose_device("auto", 1, 4, 2).reason.find("4 ranks on this host but 2 GPU(s)") != std::string::npos);
  BOOST_CHECK(choose_device("cpu", 0, 1, 8).reason.find("sees 8 GPU(s)") != std::string::npos);
  try {
    choose_device("gpu", 0, 1, 1);
    BOOST_ERROR("an unknown device name was accepted");
  } catch (const Error& e) {
    BOOST_CHECK(std::string(e.what()).find("'gpu'") != std::string::npos);
  }
}

// Slurm's per-task binding (srun --gpus-per-task=1) or CUDA_VISIBLE_DEVICES set per rank: every rank of a host
// sees one GPU, its own, as GPU 0. Both auto and cuda use it whatever the host-local rank; without a GPU cuda
// is an error that says so.
BOOST_AUTO_TEST_CASE(device_choice_with_one_gpu_per_rank) {
  for (const char* device : {"auto", "cuda"})
    for (int host_size : {1, 2, 4, 8})
      for (int host_rank = 0; host_rank < host_size; ++host_rank) {
        DeviceChoice c = choose_device(device, host_rank, host_size, 1);
        BOOST_CHECK(c.backend == Backend::cuda);
        BOOST_CHECK_EQUAL(c.gpu, 0);
        BOOST_CHECK_MESSAGE(c.reason.find("the one GPU it sees") != std::string::npos, c.reason);
      }
  // Several GPUs visible to every rank (one task per node, or a per-node binding): the host-local rank's.
  DeviceChoice c = choose_device("auto", 3, 4, 8);
  BOOST_CHECK(c.backend == Backend::cuda);
  BOOST_CHECK_EQUAL(c.gpu, 3);
  BOOST_CHECK_MESSAGE(c.reason.find("GPU 3 of the 8") != std::string::npos, c.reason);
  try {
    choose_device("cuda", 1, 2, 0);
    BOOST_ERROR("--device cuda without a GPU was accepted");
  } catch (const Error& e) {
    BOOST_CHECK_MESSAGE(std::string(e.what()).find("--device cuda: this process sees no GPU") != std::string::npos,
                        e.what());
  }
}
