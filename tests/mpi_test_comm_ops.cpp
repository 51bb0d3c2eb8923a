// The communicator under mpiexec: every operation in every mode the backend supports, with ranks_per_node 0
// (one node), 1 and 2 (emulated nodes: the inter-node and hierarchical paths), MPI direct and staged in tiny
// chunks, random counts with zeros, element types float32/bf16/fp16/int64/int32, against values each rank
// computes on its own (element = f(source rank, destination rank, index)). Outputs are poisoned first.
// Every check has a cpu case and a cuda case (SPARTA_MPI_BACKEND_CASES): the cuda case runs the operation
// on the GPUs in every mode (sizes of several MiB, so that the pipelines work on several chunks) and requires
// identical bytes across modes; it is reported as skipped, never passed, without a GPU per rank. Operations
// run on the stream of the Device the check is given (the stream contract of communicator.h).
#include <mpi.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "src/context.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

// Values exact in every type, sums over up to 16 ranks included: small integers for the 16-bit floats and
// uint8, halves for float32, wide values for the integers.
double value(DataType t, int a, int b, size_t i, int salt) {
  long h = static_cast<long>(a) * 7 + static_cast<long>(b) * 3 + static_cast<long>(i) * 5 + salt;
  switch (t) {
    case DataType::f32: return static_cast<double>(h % 2001 - 1000) * 0.5;
    case DataType::bf16:
    case DataType::f16: return static_cast<double>(h % 17) - 8;
    case DataType::i64:
      return static_cast<double>((static_cast<int64_t>(a) << 36) + (static_cast<int64_t>(b) << 20) +
                                 static_cast<int64_t>(i % 1000) * 7 + salt);
    case DataType::i32: return static_cast<double>(a * 100000 + b * 1000 + static_cast<long>(i % 997));
    case DataType::u8: return static_cast<double>(h % 15);
  }
  return 0;
}

void put(DataType t, char* p, double v) {
  switch (t) {
    case DataType::f32: {
      float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    case DataType::bf16: {
      uint16_t h = float_to_bf16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DataType::f16: {
      uint16_t h = float_to_f16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DataType::i64: {
      int64_t x = static_cast<int64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case DataType::i32: {
      int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case DataType::u8: *reinterpret_cast<uint8_t*>(p) = static_cast<uint8_t>(v); break;
  }
}

double get(DataType t, const char* p) {
  switch (t) {
    case DataType::f32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DataType::bf16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_float(h);
    }
    case DataType::f16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_to_float(h);
    }
    case DataType::i64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case DataType::i32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case DataType::u8: return *reinterpret_cast<const uint8_t*>(p);
  }
  return 0;
}

// Builds and drops a communicator (for checks that a set-up is refused).
void construct(const Topology& topo, const Device& dev, const CommOptions& o) { Communicator c(topo, dev, o); }

size_t uniform(size_t lo, size_t hi) { return std::uniform_int_distribution<size_t>(lo, hi)(testing::rng()); }
// A count, zero about a third of the time (drawn identically on every rank: the seed is shared).
size_t some_count(size_t hi) { return uniform(0, 2) == 0 ? 0 : uniform(1, hi); }

// A device buffer of bytes (at least one, so that no pointer is null), filled from host or poisoned.
Buffer<char> device_bytes(const Device& dev, const std::vector<char>& host) {
  Buffer<char> b(dev, std::max<size_t>(host.size(), 1));
  if (!host.empty()) b.upload(host.data(), host.size());
  return b;
}
Buffer<char> poisoned(const Device& dev, size_t bytes) {
  Buffer<char> b(dev, std::max<size_t>(bytes, 1));
  b.fill_bytes(0xFF);
  return b;
}

// Compares got (bytes) with want (values), exactly; reports the first mismatches.
size_t mismatches(DataType t, const std::vector<char>& got, const std::vector<double>& want, const std::string& what) {
  const size_t es = dtype_size(t);
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double g = get(t, got.data() + i * es);
    if (!(g == want[i])) {
      if (bad < 4) BOOST_TEST_MESSAGE(what << " [" << i << "] = " << g << ", expected " << want[i]);
      ++bad;
    }
  }
  if (bad) BOOST_ERROR(what << ": " << bad << " of " << want.size() << " elements wrong on rank " << testing::world_rank());
  return bad;
}

std::vector<char> encode(DataType t, const std::vector<double>& v) {
  std::vector<char> out(v.size() * dtype_size(t));
  for (size_t i = 0; i < v.size(); ++i) put(t, out.data() + i * dtype_size(t), v[i]);
  return out;
}

std::vector<char> download(const Buffer<char>& b, size_t bytes) {
  std::vector<char> all = b.download();
  all.resize(bytes);
  return all;
}

// ---------------------------------------------------------------------------------------------------------
// One check per operation. Each returns the result bytes (for comparisons across modes) and counts errors.

struct Outcome {
  std::vector<char> bytes;
  size_t bad = 0;
};

enum class A2a { known, exchange, fixed };

Outcome check_all_to_all(Communicator& comm, const Device& dev, DataType t, A2a form, size_t max_count, int salt,
                         const std::string& what) {
  const int W = comm.size(), me = comm.rank();
  const size_t es = dtype_size(t);
  std::vector<size_t> M(static_cast<size_t>(W) * W);  // M[a*W + b]: elements a sends to b
  size_t fixed = uniform(0, max_count);
  for (size_t& x : M) x = form == A2a::fixed ? fixed : some_count(max_count);
  std::vector<size_t> sc(W), rc(W);
  for (int p = 0; p < W; ++p) sc[p] = M[me * W + p], rc[p] = M[p * W + me];
  std::vector<double> send, want;
  for (int b = 0; b < W; ++b)
    for (size_t i = 0; i < sc[b]; ++i) send.push_back(value(t, me, b, i, salt));
  for (int a = 0; a < W; ++a)
    for (size_t i = 0; i < rc[a]; ++i) want.push_back(value(t, a, me, i, salt));
  Buffer<char> s = device_bytes(dev, encode(t, send));
  const size_t spare = 3;
  Buffer<char> r = poisoned(dev, (want.size() + spare) * es);
  if (form == A2a::known) comm.all_to_all_v(s.data(), sc, r.data(), rc, t, dev.stream);
  if (form == A2a::fixed) comm.all_to_all(s.data(), r.data(), fixed, t, dev.stream);
  if (form == A2a::exchange) {
    std::vector<size_t> got = comm.all_to_all_v(s.data(), sc, r.data(), want.size() + spare, t, dev.stream);
    BOOST_CHECK_MESSAGE(got == rc, what << ": exchanged counts differ from the expected ones");
  }
  // No wait: the download below is queued on dev.stream, which the operation orders after itself.
  Outcome o;
  o.bytes = download(r, want.size() * es);
  o.bad = mismatches(t, o.bytes, want, what);
  return o;
}

Outcome check_reduce_scatter(Communicator& comm, const Device& dev, DataType t, size_t rc, int salt,
                             const std::string& what) {
  const int W = comm.size(), me = comm.rank();
  std::vector<double> send, want(rc, 0.0);
  for (int b = 0; b < W; ++b)
    for (size_t i = 0; i < rc; ++i) send.push_back(value(t, me, b, i, salt));
  for (int a = 0; a < W; ++a)
    for (size_t i = 0; i < rc; ++i) want[i] += value(t, a, me, i, salt);
  Buffer<char> s = device_bytes(dev, encode(t, send));
  Buffer<char> r = poisoned(dev, rc * dtype_size(t));
  comm.reduce_scatter(s.data(), r.data(), rc, t, dev.stream);
  comm.synchronize(dev.stream);  // the fault-aware host wait; the download then finds the stream done
  Outcome o;
  o.bytes = download(r, rc * dtype_size(t));
  o.bad = mismatches(t, o.bytes, want, what);
  return o;
}

Outcome check_all_reduce(Communicator& comm, const Device& dev, DataType t, size_t count, bool in_place, int salt,
                         const std::string& what) {
  const int W = comm.size(), me = comm.rank();
  std::vector<double> send, want(count, 0.0);
  for (size_t i = 0; i < count; ++i) send.push_back(value(t, me, 0, i, salt));
  for (int a = 0; a < W; ++a)
    for (size_t i = 0; i < count; ++i) want[i] += value(t, a, 0, i, salt);
  Buffer<char> s = device_bytes(dev, encode(t, send));
  Buffer<char> r = in_place ? Buffer<char>() : poisoned(dev, count * dtype_size(t));
  Buffer<char>& out = in_place ? s : r;
  comm.all_reduce(s.data(), out.data(), count, t, dev.stream);
  Outcome o;
  o.bytes = download(out, count * dtype_size(t));
  o.bad = mismatches(t, o.bytes, want, what);
  return o;
}

Outcome check_all_gather(Communicator& comm, const Device& dev, DataType t, bool variable, bool in_place,
                         size_t max_count, int salt, const std::string& what) {
  const int W = comm.size(), me = comm.rank();
  const size_t es = dtype_size(t);
  std::vector<size_t> counts(W, uniform(0, max_count));
  if (variable)
    for (size_t& c : counts) c = some_count(max_count);
  std::vector<size_t> d(W, 0);
  for (int p = 1; p < W; ++p) d[p] = d[p - 1] + counts[p - 1];
  const size_t total = d[W - 1] + counts[W - 1];
  std::vector<double> send, want;
  for (size_t i = 0; i < counts[me]; ++i) send.push_back(value(t, me, 0, i, salt));
  for (int a = 0; a < W; ++a)
    for (size_t i = 0; i < counts[a]; ++i) want.push_back(value(t, a, 0, i, salt));
  Buffer<char> s = device_bytes(dev, encode(t, send));
  Buffer<char> r = poisoned(dev, total * es);
  const char* src = s.data();
  if (in_place) {
    std::vector<char> mine = encode(t, send);
    if (!mine.empty()) r.upload(mine.data(), mine.size(), d[me] * es);
    src = r.data() + d[me] * es;
  }
  if (variable) comm.all_gather_v(src, r.data(), counts, t, dev.stream);
  else comm.all_gather(src, r.data(), counts[0], t, dev.stream);
  Outcome o;
  o.bytes = download(r, total * es);
  o.bad = mismatches(t, o.bytes, want, what);
  return o;
}

Outcome check_broadcast(Communicator& comm, const Device& dev, DataType t, size_t count, int root, int salt,
                        const std::string& what) {
  std::vector<double> want;
  for (size_t i = 0; i < count; ++i) want.push_back(value(t, root, 1, i, salt));
  Buffer<char> b = comm.rank() == root ? device_bytes(dev, encode(t, want)) : poisoned(dev, count * dtype_size(t));
  comm.broadcast(b.data(), count, t, root, dev.stream);
  Outcome o;
  o.bytes = download(b, count * dtype_size(t));
  o.bad = mismatches(t, o.bytes, want, what);
  return o;
}

// ---------------------------------------------------------------------------------------------------------
// Configurations: every mode the backend supports × ranks_per_node × direct or staged MPI.

struct Config {
  int ranks_per_node;
  CommMode mode;
  std::string staging;
  size_t chunk_bytes;
  std::string name() const {
    return strprintf("mode %s, ranks_per_node %d, staging %s (chunks of %zu B)", comm_mode_name(mode),
                     ranks_per_node, staging.c_str(), chunk_bytes);
  }
};

std::vector<Config> configs(const Device& dev, size_t small_chunk) {
  std::vector<Config> out;
  std::vector<CommMode> modes{CommMode::mpi, CommMode::hier};
  if (dev.is_cuda()) modes.insert(modes.begin(), CommMode::nccl);
  for (int rpn : {0, 1, 2})
    for (CommMode m : modes) {
      out.push_back({rpn, m, "auto", 8u << 20});
      if (m != CommMode::nccl) out.push_back({rpn, m, "always", small_chunk});
    }
  return out;
}

// Communicators for every configuration, built once (set-up costs more than the small operations tested).
// Hier on nodes of different sizes is refused at construction (bad_setups_are_refused_on_every_rank).
class CommSet {
 public:
  CommSet(const Device& dev, size_t small_chunk) {
    for (int rpn : {0, 1, 2}) topos_.push_back(make_topology(MPI_COMM_WORLD, rpn));
    for (const Config& c : configs(dev, small_chunk)) {
      const Topology& topo = topos_[c.ranks_per_node];
      if (c.mode == CommMode::hier && !topo.uniform) continue;
      CommOptions o;
      o.mode = c.mode;
      o.staging = c.staging;
      o.chunk_bytes = c.chunk_bytes;
      o.timeout_s = 120;
      // one node per rank: every call first checked against the other ranks' (the check finds nothing wrong);
      // nodes of two ranks: NCCL in its non-blocking mode
      o.check_calls = c.ranks_per_node == 1;
      o.nccl_blocking = c.ranks_per_node != 2;
      comms_.push_back({c.name() + (o.check_calls ? ", calls checked" : "") +
                            (o.nccl_blocking ? "" : ", NCCL non-blocking"),
                        std::make_unique<Communicator>(topo, dev, o)});
    }
  }
  ~CommSet() {
    comms_.clear();
    for (Topology& t : topos_) free_topology(t);
  }
  void each(const std::function<void(Communicator&, const std::string&)>& body) {
    for (auto& c : comms_) body(*c.second, c.first);
  }

 private:
  std::vector<Topology> topos_;
  std::vector<std::pair<std::string, std::unique_ptr<Communicator>>> comms_;
};

std::unique_ptr<CommSet>& cpu_comms() {
  static std::unique_ptr<CommSet> set;
  return set;
}

// The cuda cases' device (a GPU per rank, from a Context asked for cuda) and their communicators, built by
// the first cuda case (every rank runs it: the precondition's verdict is the same on every rank) and kept
// for the others, since NCCL set-up costs more than the operations tested.
struct GpuComms {
  std::unique_ptr<Context> ctx;
  std::unique_ptr<CommSet> set;
  const Device& dev() const { return ctx->device(); }
};

GpuComms& gpu_holder() {
  static GpuComms g;
  return g;
}

GpuComms& gpu_comms() {
  GpuComms& g = gpu_holder();
  if (!g.set) {
    ContextOptions co;
    co.device = "cuda";  // the precondition saw a GPU per rank: every rank gets one
    g.ctx = std::make_unique<Context>(co);
    g.set = std::make_unique<CommSet>(g.ctx->device(), 1u << 20);
  }
  return g;
}

// Built after MPI starts, dropped before it ends (the GPU ones only if a cuda case built them).
struct CommsFixture {
  CommsFixture() { cpu_comms() = std::make_unique<CommSet>(Device(), 36); }
  ~CommsFixture() {
    cpu_comms().reset();
    gpu_holder().set.reset();
    gpu_holder().ctx.reset();
  }
};

void for_each_cpu_config(const std::function<void(Communicator&, const std::string&)>& body) {
  cpu_comms()->each(body);
}

// The cuda cases: `run` performs one operation's checks with communicator comm on dev and returns their
// outcomes. It runs in every configuration with the same random draws, so every configuration must give
// the bytes of the first, besides the expected values.
using GpuChecks = std::function<std::vector<Outcome>(Communicator& comm, const Device& dev, const std::string& name)>;

void every_gpu_config(const GpuChecks& run) {
  GpuComms& g = gpu_comms();
  size_t bad = 0;
  std::vector<std::vector<std::vector<char>>> results;  // [config][check] bytes
  const uint64_t salt_seed = uniform(0, 1000);
  g.set->each([&](Communicator& comm, const std::string& name) {
    BOOST_TEST_MESSAGE(comm.describe());
    std::mt19937_64 saved = testing::rng();
    testing::rng().seed(salt_seed);
    std::vector<std::vector<char>> mine;
    for (Outcome& o : run(comm, g.dev(), name)) {
      bad += o.bad;
      mine.push_back(std::move(o.bytes));
    }
    results.push_back(std::move(mine));
    testing::rng() = saved;
  });
  for (size_t c = 1; c < results.size(); ++c)
    for (size_t op = 0; op < results[0].size() && op < results[c].size(); ++op)
      if (results[c][op] != results[0][op]) {
        ++bad;
        BOOST_ERROR("check " << op << " of configuration " << c << " differs from configuration 0");
      }
  BOOST_CHECK(testing::all_ranks(bad == 0));
}

const size_t kBig = 600000;  // elements of the cuda checks: 2.4 MB of float32

const std::vector<DataType> kTypes{DataType::f32, DataType::bf16, DataType::f16, DataType::i64, DataType::i32,
                                   DataType::u8};

}  // namespace


BOOST_TEST_GLOBAL_FIXTURE(CommsFixture);

BOOST_AUTO_TEST_CASE(dtype_conversions_round_to_nearest_even) {
  // Every fp16 and bf16 pattern survives the round trip through float (NaNs stay NaN).
  size_t bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f) ? !std::isnan(f16_to_float(float_to_f16(f))) : float_to_f16(f) != h) ++bad;
    float g = bf16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(g) ? !std::isnan(bf16_to_float(float_to_bf16(g))) : float_to_bf16(g) != h) ++bad;
  }
  BOOST_CHECK_EQUAL(bad, 0u);
  // Ties go to even; overflow to infinity; the smallest subnormal and below.
  BOOST_CHECK_EQUAL(float_to_f16(1.0f + 1.0f / 2048), float_to_f16(1.0f));               // tie, even below
  BOOST_CHECK_EQUAL(float_to_f16(1.0f + 3.0f / 2048), float_to_f16(1.0f + 4.0f / 2048));  // tie, even above
  BOOST_CHECK_EQUAL(float_to_f16(70000.f), 0x7c00);
  BOOST_CHECK_EQUAL(float_to_f16(5.9604645e-8f), 0x0001);
  BOOST_CHECK_EQUAL(float_to_f16(2.0e-8f), 0x0000);
  BOOST_CHECK_EQUAL(float_to_bf16(1.0f + 1.0f / 256), float_to_bf16(1.0f));
  BOOST_CHECK_EQUAL(float_to_bf16(1.0f + 3.0f / 256), float_to_bf16(1.0f + 4.0f / 256));
  BOOST_CHECK_EQUAL(f16_to_float(0x3c00), 1.0f);
  BOOST_CHECK_EQUAL(bf16_to_float(0xc000), -2.0f);
  BOOST_CHECK(parse_dtype("bf16") == DataType::bf16);
  BOOST_CHECK_THROW(parse_dtype("float128"), Error);
}

BOOST_AUTO_TEST_CASE(bad_setups_are_refused_on_every_rank) {
  BOOST_CHECK(parse_comm_mode("hier") == CommMode::hier);
  BOOST_CHECK_THROW(parse_comm_mode("ring"), Error);
  Device cpu;
  Topology topo = make_topology(MPI_COMM_WORLD, 0);
  CommOptions o;
  o.mode = CommMode::nccl;
  BOOST_CHECK_THROW(construct(topo, cpu, o), Error);  // nccl needs GPUs
  o.mode = CommMode::mpi;
  o.timeout_s = 0;
  BOOST_CHECK_THROW(construct(topo, cpu, o), Error);
  o.timeout_s = 10;
  o.staging = "sometimes";
  BOOST_CHECK_THROW(construct(topo, cpu, o), Error);
  o.staging = "auto";
  o.chunk_bytes = 0;
  BOOST_CHECK_THROW(construct(topo, cpu, o), Error);
  free_topology(topo);
  // Nodes of 2 and 1 ranks: hier refuses, mpi accepts.
  if (testing::world_size() == 3) {
    Topology t3 = make_topology(MPI_COMM_WORLD, 2);
    CommOptions h;
    h.mode = CommMode::hier;
    try {
      Communicator c(t3, cpu, h);
      BOOST_ERROR("hier accepted nodes of different sizes");
    } catch (const Error& e) {
      BOOST_CHECK_MESSAGE(std::string(e.what()).find("same number of ranks") != std::string::npos, e.what());
    }
    h.mode = CommMode::mpi;
    Communicator ok(t3, cpu, h);
    BOOST_CHECK_EQUAL(ok.size(), 3);
    free_topology(t3);
  }
}


namespace {

void all_to_all_cases(Backend backend) {
  if (backend == Backend::cuda) {
    every_gpu_config([](Communicator& comm, const Device& dev, const std::string& name) {
      return std::vector<Outcome>{
          check_all_to_all(comm, dev, DataType::f32, A2a::known, kBig / 2, 1, "all_to_all_v, " + name),
          check_all_to_all(comm, dev, DataType::bf16, A2a::exchange, 1000, 2, "all_to_all_v exchange, " + name),
          check_all_to_all(comm, dev, DataType::i64, A2a::fixed, kBig / 4, 3, "all_to_all, " + name)};
    });
    return;
  }
  Device cpu;
  size_t bad = 0;
  for_each_cpu_config([&](Communicator& comm, const std::string& name) {
    for (DataType t : {DataType::f32, DataType::i64, DataType::bf16}) {
      std::string what = name + ", " + dtype_name(t);
      bad += check_all_to_all(comm, cpu, t, A2a::known, 9, 1, "all_to_all_v (counts known), " + what).bad;
      bad += check_all_to_all(comm, cpu, t, A2a::exchange, 9, 2, "all_to_all_v (exchange counts), " + what).bad;
      bad += check_all_to_all(comm, cpu, t, A2a::fixed, 5, 3, "all_to_all (fixed), " + what).bad;
    }
  });
  BOOST_CHECK(testing::all_ranks(bad == 0));
}

void reduce_scatter_cases(Backend backend) {
  if (backend == Backend::cuda) {
    every_gpu_config([](Communicator& comm, const Device& dev, const std::string& name) {
      return std::vector<Outcome>{
          check_reduce_scatter(comm, dev, DataType::f32, kBig / 2 + 3, 4, "reduce_scatter, " + name),
          check_reduce_scatter(comm, dev, DataType::bf16, 1001, 4, "reduce_scatter bf16, " + name)};
    });
    return;
  }
  Device cpu;
  size_t bad = 0;
  for_each_cpu_config([&](Communicator& comm, const std::string& name) {
    for (DataType t : kTypes) {
      bad += check_reduce_scatter(comm, cpu, t, some_count(11), 4, "reduce_scatter, " + name + ", " + dtype_name(t)).bad;
    }
  });
  BOOST_CHECK(testing::all_ranks(bad == 0));
}

// Several all-reduces in flight on the stream, then one download: the stream sees every one of them, in order.
size_t check_chained_all_reduce(Communicator& comm, const Device& dev) {
  std::vector<float> ones(4096, 1.0f);
  Buffer<float> a(dev, ones), b(dev, ones);
  comm.all_reduce(a.data(), a.data(), ones.size(), DataType::f32, dev.stream);
  comm.all_reduce(b.data(), b.data(), ones.size(), DataType::f32, dev.stream);
  comm.all_reduce(a.data(), a.data(), ones.size(), DataType::f32, dev.stream);
  const float W = static_cast<float>(comm.size());
  return testing::count_mismatches(a.download(), std::vector<float>(ones.size(), W * W), 0, 0, "chained all_reduce") +
         testing::count_mismatches(b.download(), std::vector<float>(ones.size(), W), 0, 0, "second all_reduce");
}

void all_reduce_cases(Backend backend) {
  if (backend == Backend::cuda) {
    every_gpu_config([](Communicator& comm, const Device& dev, const std::string& name) {
      Outcome chained;
      chained.bad = check_chained_all_reduce(comm, dev);
      return std::vector<Outcome>{
          check_all_reduce(comm, dev, DataType::f32, kBig + 1, false, 5, "all_reduce, " + name),
          check_all_reduce(comm, dev, DataType::f16, kBig / 2 + 1, true, 5, "all_reduce f16 in place, " + name),
          check_all_reduce(comm, dev, DataType::i64, 999, false, 5, "all_reduce i64, " + name), std::move(chained)};
    });
    return;
  }
  Device cpu;
  size_t bad = 0;
  for_each_cpu_config([&](Communicator& comm, const std::string& name) {
    for (DataType t : kTypes)
      for (bool in_place : {false, true}) {
        // Counts that are and are not multiples of the node size, and zero.
        size_t count = some_count(41);
        bad += check_all_reduce(comm, cpu, t, count, in_place, 5,
                                strprintf("all_reduce%s of %zu, ", in_place ? " (in place)" : "", count) + name +
                                    ", " + dtype_name(t))
                   .bad;
      }
    bad += check_chained_all_reduce(comm, cpu);
  });
  BOOST_CHECK(testing::all_ranks(bad == 0));
}

void all_gather_cases(Backend backend) {
  if (backend == Backend::cuda) {
    every_gpu_config([](Communicator& comm, const Device& dev, const std::string& name) {
      return std::vector<Outcome>{
          check_all_gather(comm, dev, DataType::f32, false, false, kBig / 2, 6, "all_gather, " + name),
          check_all_gather(comm, dev, DataType::f32, true, true, kBig / 2, 6, "all_gather_v in place, " + name)};
    });
    return;
  }
  Device cpu;
  size_t bad = 0;
  for_each_cpu_config([&](Communicator& comm, const std::string& name) {
    for (DataType t : {DataType::f32, DataType::f16, DataType::i64})
      for (bool variable : {false, true})
        for (bool in_place : {false, true}) {
          std::string what = std::string(variable ? "all_gather_v" : "all_gather") + (in_place ? " (in place), " : ", ") +
                             name + ", " + dtype_name(t);
          bad += check_all_gather(comm, cpu, t, variable, in_place, 13, 6, what).bad;
        }
  });
  BOOST_CHECK(testing::all_ranks(bad == 0));
}

void broadcast_cases(Backend backend) {
  if (backend == Backend::cuda) {
    every_gpu_config([](Communicator& comm, const Device& dev, const std::string& name) {
      std::vector<Outcome> out;
      for (int root : {comm.size() - 1, 0})
        out.push_back(check_broadcast(comm, dev, DataType::f32, kBig + 5, root, 7,
                                      strprintf("broadcast from %d, ", root) + name));
      return out;
    });
    return;
  }
  Device cpu;
  size_t bad = 0;
  for_each_cpu_config([&](Communicator& comm, const std::string& name) {
    for (int root = 0; root < comm.size(); ++root) {
      DataType t = root % 2 ? DataType::bf16 : DataType::f32;
      size_t count = some_count(40);
      bad += check_broadcast(comm, cpu, t, count, root, 7, strprintf("broadcast from %d, ", root) + name).bad;
    }
  });
  BOOST_CHECK(testing::all_ranks(bad == 0));
}

}  // namespace

SPARTA_MPI_BACKEND_CASES(all_to_all_every_mode, all_to_all_cases)
SPARTA_MPI_BACKEND_CASES(reduce_scatter_every_mode, reduce_scatter_cases)
SPARTA_MPI_BACKEND_CASES(all_reduce_every_mode, all_reduce_cases)
SPARTA_MPI_BACKEND_CASES(all_gather_every_mode, all_gather_cases)
SPARTA_MPI_BACKEND_CASES(broadcast_from_roots, broadcast_cases)

BOOST_AUTO_TEST_CASE(exchange_counts_and_barrier_cpu) {
  Device cpu;
  size_t bad = 0;
  for_each_cpu_config([&](Communicator& comm, const std::string& name) {
    const int W = comm.size(), me = comm.rank();
    std::vector<size_t> send(W);
    for (int p = 0; p < W; ++p) send[p] = static_cast<size_t>(me) * 1000003u + p * 7 + (size_t(1) << 40);
    std::vector<size_t> got = comm.exchange_counts(send);
    for (int p = 0; p < W; ++p)
      if (got[p] != static_cast<size_t>(p) * 1000003u + me * 7 + (size_t(1) << 40)) ++bad;
    BOOST_CHECK_MESSAGE(bad == 0, "exchange_counts, " << name);
    comm.barrier();
  });
  BOOST_CHECK(testing::all_ranks(bad == 0));
}

namespace {

// Nodes that interleave the world order (rank r on node r % N), as a round-robin placement over hosts
// gives: blocks of one node are not contiguous, so the hierarchical algorithms place and pack by rank.
// Built by hand, since ranks_per_node always cuts contiguous slices.
Topology interleaved_topology(int num_nodes) {
  Topology t;
  MPI_Comm_dup(MPI_COMM_WORLD, &t.world);
  MPI_Comm_rank(t.world, &t.rank);
  MPI_Comm_size(t.world, &t.size);
  t.hostname = "interleaved";
  MPI_Comm_dup(t.world, &t.host_comm);
  t.host_rank = t.rank, t.host_size = t.size;
  t.node = t.rank % num_nodes, t.num_nodes = num_nodes;
  MPI_Comm_split(t.world, t.node, t.rank, &t.node_comm);
  MPI_Comm_rank(t.node_comm, &t.local_rank);
  MPI_Comm_size(t.node_comm, &t.local_size);
  t.uniform = t.size % num_nodes == 0;
  MPI_Comm_split(t.world, t.local_rank, t.node, &t.cross_comm);
  return t;
}


void interleaved_cases(Backend backend) {
  const int W = testing::world_size();
  const int N = W % 2 == 0 ? 2 : W;  // 2 nodes of W/2 ranks, or one rank per node
  Topology topo = interleaved_topology(N);
  Device cpu;
  const Device& dev = backend == Backend::cuda ? gpu_comms().dev() : cpu;
  size_t bad = 0;
  for (const char* staging : {"auto", "always"}) {
    CommOptions o;
    o.mode = CommMode::hier;
    o.staging = staging;
    o.chunk_bytes = 36;
    o.timeout_s = 120;
    Communicator comm(topo, dev, o);
    std::string name = std::string("interleaved nodes, staging ") + staging;
    for (DataType t : {DataType::f32, DataType::bf16}) {
      std::string what = name + ", " + dtype_name(t);
      bad += check_all_to_all(comm, dev, t, A2a::known, 9, 11, "all_to_all_v, " + what).bad;
      bad += check_all_to_all(comm, dev, t, A2a::fixed, 5, 12, "all_to_all, " + what).bad;
      bad += check_reduce_scatter(comm, dev, t, some_count(11), 13, "reduce_scatter, " + what).bad;
      bad += check_all_reduce(comm, dev, t, some_count(41), false, 14, "all_reduce, " + what).bad;
      bad += check_all_reduce(comm, dev, t, some_count(41), true, 15, "all_reduce in place, " + what).bad;
      bad += check_all_gather(comm, dev, t, true, false, 13, 16, "all_gather_v, " + what).bad;
      bad += check_all_gather(comm, dev, t, false, true, 13, 17, "all_gather in place, " + what).bad;
      for (int root = 0; root < W; ++root)
        bad += check_broadcast(comm, dev, t, some_count(40), root, 18, strprintf("broadcast from %d, ", root) + what).bad;
    }
  }
  free_topology(topo);
  BOOST_CHECK(testing::all_ranks(bad == 0));
}

}  // namespace

SPARTA_MPI_BACKEND_CASES(hier_with_interleaved_nodes, interleaved_cases)

// The stream contract, with a stream that is not the device's: the input is copied into place on that
// stream behind slow work, and the result copied out on it right after the call. An operation that did not
// start after the stream's work would send the poison; one that did not hold the stream back would leave the
// copy-out reading the poison. (The cpu backend ignores streams: cuda only.)
BOOST_AUTO_TEST_CASE(operations_follow_the_callers_stream_cuda, *testing::needs_gpu_per_rank()) {
  GpuComms& g = gpu_comms();
  Device side = open_device(Backend::cuda, g.dev().gpu);
  size_t bad = 0;
  const size_t n = 1 << 16;  // float32 elements per rank pair
  g.set->each([&](Communicator& comm, const std::string& name) {
    const int W = comm.size(), me = comm.rank();
    const size_t bytes = n * W * 4;
    std::vector<double> send, want_a2a, want_sum(n * W, 0.0);
    for (int b = 0; b < W; ++b)
      for (size_t i = 0; i < n; ++i) send.push_back(value(DataType::f32, me, b, i, 21));
    for (int a = 0; a < W; ++a)
      for (size_t i = 0; i < n; ++i) want_a2a.push_back(value(DataType::f32, a, me, i, 21));
    for (int a = 0; a < W; ++a)
      for (int b = 0; b < W; ++b)
        for (size_t i = 0; i < n; ++i) want_sum[b * n + i] += value(DataType::f32, a, b, i, 21);
    Buffer<char> ready = device_bytes(side, encode(DataType::f32, send));
    Buffer<char> in = poisoned(side, bytes), r = poisoned(side, bytes), out = poisoned(side, bytes);
    Buffer<char> slow(side, size_t(256) << 20);
    synchronize(side);
    auto behind_slow_work = [&] {
      for (int k = 0; k < 8; ++k) slow.fill_bytes(k);
    };

    behind_slow_work();
    copy_on_device(side, in.data(), ready.data(), bytes);
    comm.all_to_all(in.data(), r.data(), n, DataType::f32, side.stream);
    copy_on_device(side, out.data(), r.data(), bytes);
    comm.synchronize(side.stream);
    bad += mismatches(DataType::f32, download(out, bytes), want_a2a, "all_to_all on a second stream, " + name);

    in.fill_bytes(0xFF), out.fill_bytes(0xFF);
    behind_slow_work();
    copy_on_device(side, in.data(), ready.data(), bytes);
    comm.all_reduce(in.data(), in.data(), n * W, DataType::f32, side.stream);
    copy_on_device(side, out.data(), in.data(), bytes);
    comm.synchronize(side.stream);
    bad += mismatches(DataType::f32, download(out, bytes), want_sum, "all_reduce on a second stream, " + name);
  });
  close_device(side);
  BOOST_CHECK(testing::all_ranks(bad == 0));
}
