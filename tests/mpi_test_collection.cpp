// The embedding collection (src/embedding_collection.h) under MPI, every placement and a mix of them, against a
// single-rank reference computed here independently: a plain host model (std::map key → row initialised with
// kernels/key_init.h's initial_value, pooled by hand, SGD and Adagrad applied by hand) over the global batch.
//
// Exactness. The forward of a fresh table is compared bit for bit for dispatch, localized, replicated and hybrid
// (each pools a bag's vectors in key order from 0.0f, as the reference does); distributed adds a bag's keys per
// owner and then over ranks, so it is compared within 1e-6 + 1e-5|ref|. Table contents and later forwards are
// compared within 1e-5 + 1e-5|ref|: dispatch, hybrid and distributed sum a row's gradients per rank and then
// over ranks, and even where a row is summed in the global batch's order (localized, replicated, one rank), a row
// of more than 128 gradients (kernels/embedding_backward.h, the fixed order) adds partial sums, where the
// reference adds one gradient after the other.
//
// Data: fresh random keys (64-bit, negative ones too, power law), 0..3 keys per slot, a hot key in slot 0 of
// every nonempty sample (so every rank shares it), every 7th sample empty, a table with fewer rows than ranks, a
// table shared by two slots, local batches differing by one. Outputs are poisoned (NaN) before every forward.
#include <mpi.h>

#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <tuple>

#include "comm/communicator.h"
#include "kernels/key_init.h"
#include "src/base/check.h"
#include "src/base/half.h"
#include "src/embedding_collection.h"
#include "src/placement_common.h"
#include "src/planner.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

// SPARTA_TEST_SHARED_GPU=1 lets the cuda cases run more ranks than there are GPUs (tests/testing.h).
const bool kSharesGpus = testing::accept_shared_gpus();

// ---------------------------------------------------------------------------------------------------------
// A world (a sub-communicator of the first `ranks` ranks) with its device and communicator.
//
// A cuda world is built once per (ranks, mode, ranks per node) and kept for the later cases: an NCCL communicator
// connects every algorithm and peer when it is built (comm/communicator.h, "Connections"), which takes seconds on
// two GPUs, more than a check's training. A case leaves nothing behind in its world: the collection's errors are
// agreed on and thrown on every rank at the same point, so every rank's communicator has made the same calls; and
// every rank runs the same cases, so the worlds are built in the same order everywhere. cpu worlds are built per
// check, as they cost nothing. WorldsFixture drops the kept ones before MPI ends.

struct WorldState {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  Topology topo;
  Device dev;
  std::unique_ptr<Communicator> communicator;

  // ranks_per_node > 0 cuts the host into emulated nodes, so that hier takes its inter-node path here too.
  WorldState(Backend backend, int ranks, CommMode mode, int ranks_per_node) {
    MPI_Comm_split(MPI_COMM_WORLD, testing::world_rank() < ranks ? 0 : MPI_UNDEFINED, testing::world_rank(), &comm);
    if (comm == MPI_COMM_NULL) return;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    topo = make_topology(comm, ranks_per_node);
    if (backend == Backend::cuda) {
      dev = open_device(Backend::cuda, testing::gpu_of_local_rank(topo.host_rank));
      if (testing::shared_gpus())
        mode = CommMode::mpi;  // NCCL takes one rank per GPU
      else if (mode == CommMode::mpi)
        mode = CommMode::nccl;
    }
    if (size > 1) {  // one rank: the collection must not need a communicator at all
      CommOptions o;
      o.mode = mode;
      o.timeout_s = 120;
      // SPARTA_TEST_LAZY_CONNECT=1: NCCL connects on first use (set NCCL_RUNTIME_CONNECT=1 too), to compare with
      // the eager connections of the default (comm/communicator.h, "Connections")
      if (const char* l = std::getenv("SPARTA_TEST_LAZY_CONNECT")) o.eager_connect = std::string(l) != "1";
      communicator = std::make_unique<Communicator>(topo, dev, o);
    }
  }
  ~WorldState() {
    if (comm == MPI_COMM_NULL) return;
    communicator.reset();
    if (dev.is_cuda()) close_device(dev);
    free_topology(topo);
    MPI_Comm_free(&comm);
  }
};

std::map<std::tuple<int, int, int>, std::shared_ptr<WorldState>>& kept_cuda_worlds() {
  static std::map<std::tuple<int, int, int>, std::shared_ptr<WorldState>> kept;
  return kept;
}

std::shared_ptr<WorldState> world_state(Backend backend, int ranks, CommMode mode, int ranks_per_node) {
  if (backend != Backend::cuda) return std::make_shared<WorldState>(backend, ranks, mode, ranks_per_node);
  std::shared_ptr<WorldState>& w = kept_cuda_worlds()[{ranks, int(mode), ranks_per_node}];
  if (!w) w = std::make_shared<WorldState>(backend, ranks, mode, ranks_per_node);
  return w;
}

struct WorldsFixture {
  ~WorldsFixture() { kept_cuda_worlds().clear(); }
};
BOOST_TEST_GLOBAL_FIXTURE(WorldsFixture);

struct World {
  std::shared_ptr<WorldState> state;
  const MPI_Comm& comm;
  const int &rank, &size;
  const Topology& topo;
  const Device& dev;
  const std::unique_ptr<Communicator>& communicator;
  bool in() const { return comm != MPI_COMM_NULL; }

  World(Backend backend, int ranks, CommMode mode = CommMode::mpi, int ranks_per_node = 0)
      : state(world_state(backend, ranks, mode, ranks_per_node)),
        comm(state->comm),
        rank(state->rank),
        size(state->size),
        topo(state->topo),
        dev(state->dev),
        communicator(state->communicator) {}
};

// ---------------------------------------------------------------------------------------------------------
// The configuration under test: five tables, six slots.

struct TableDef {
  const char* name;
  int64_t rows;
  int dim;
  Combiner combiner;
  OptimizerKind opt;
  std::vector<int> slots;
  size_t pool;  // distinct keys drawn
  int64_t key_bound = 0;  // keys drawn in [0, key_bound); 0: any 64-bit key
  bool direct = false;    // a direct index (key_bound must then be rows)
};
const std::vector<TableDef> kTables = {
    {"user", 1000, 8, Combiner::sum, OptimizerKind::sgd, {0}, 300},
    {"item", 500, 4, Combiner::mean, OptimizerKind::adagrad, {1, 2}, 200},  // one table, two slots
    {"tiny", 3, 5, Combiner::sum, OptimizerKind::sgd, {3}, 3},               // fewer rows than ranks
    {"geo", 200, 8, Combiner::mean, OptimizerKind::sgd, {4}, 100},
    {"cat", 400, 3, Combiner::sum, OptimizerKind::rowwise_adagrad, {5}, 150},
};
constexpr int kSlots = 6;

CollectionConfig make_config(uint64_t seed, const std::vector<std::string>& placements,
                             const std::vector<TableDef>& defs = kTables, int slots = kSlots) {
  CollectionConfig c;
  c.num_slots = slots;
  c.seed = seed;
  for (size_t i = 0; i < defs.size(); ++i) {
    const TableDef& d = defs[i];
    CollectionTableConfig t;
    t.name = d.name;
    t.rows = d.rows;
    t.dim = d.dim;
    t.combiner = d.combiner;
    t.optimizer.kind = d.opt;
    t.optimizer.lr = d.opt == OptimizerKind::sgd ? 0.5f : 0.1f;
    t.optimizer.initial_accumulator = 0.1f;
    t.optimizer.epsilon = 1e-7f;
    t.slots = d.slots;
    t.placement = placements[i % placements.size()];
    t.hot_rows = 6;
    t.init_scale = 0.5f;
    t.key_bound = d.key_bound;
    t.direct_index = d.direct;
    c.tables.push_back(t);
  }
  return c;
}

// The global batch: CSR over rows sample * kSlots + slot.
struct Batch {
  int64_t samples = 0;
  int slots = kSlots;
  std::vector<int64_t> offsets, keys;
};

// Key pools per table, the same on every rank (drawn from a seed rank 0 picked).
struct Data {
  std::mt19937_64 g;
  std::vector<TableDef> defs;
  int num_slots;
  std::vector<std::vector<int64_t>> pools;
  explicit Data(uint64_t seed, const std::vector<TableDef>& tables = kTables, int slots = kSlots)
      : g(seed), defs(tables), num_slots(slots) {
    for (const TableDef& d : defs) {
      std::vector<int64_t> pool;
      while (pool.size() < d.pool) {
        int64_t k = static_cast<int64_t>(g());
        if (d.key_bound > 0) k = static_cast<int64_t>(uint64_t(k) % uint64_t(d.key_bound));
        if (std::find(pool.begin(), pool.end(), k) == pool.end()) pool.push_back(k);
      }
      pools.push_back(pool);
    }
  }
  int table_of(int slot) const {
    for (size_t t = 0; t < defs.size(); ++t)
      for (int s : defs[t].slots)
        if (s == slot) return int(t);
    return -1;
  }
  Batch next(int64_t samples) {
    Batch b;
    b.samples = samples;
    b.slots = num_slots;
    b.offsets.push_back(0);
    std::uniform_int_distribution<int> len(0, 3);
    for (int64_t s = 0; s < samples; ++s)
      for (int slot = 0; slot < num_slots; ++slot) {
        if (s % 7 != 3) {
          const std::vector<int64_t>& pool = pools[size_t(table_of(slot))];
          if (slot == 0) b.keys.push_back(pool[0]);  // the hot key
          int n = len(g);
          for (int i = 0; i < n; ++i) {
            // power law over the pool: index floor(pool * u^3)
            double u = std::uniform_real_distribution<double>(0, 1)(g);
            b.keys.push_back(pool[std::min(pool.size() - 1, size_t(double(pool.size()) * u * u * u))]);
          }
        }
        b.offsets.push_back(int64_t(b.keys.size()));
      }
    return b;
  }
};

// A rank's slice: samples [first, first + count), local batches differing by one.
struct Slice {
  int64_t first = 0, count = 0;
};
Slice slice_of(int64_t samples, int rank, int world) {
  int64_t base = samples / world, extra = samples % world;
  Slice s;
  s.count = base + (rank < extra ? 1 : 0);
  s.first = rank * base + std::min<int64_t>(rank, extra);
  return s;
}

// ---------------------------------------------------------------------------------------------------------
// The reference: one host model over the global batch.

struct Reference {
  CollectionConfig cfg;
  std::vector<std::map<int64_t, std::vector<float>>> w, st;  // per table: values and adagrad accumulators
  std::vector<int64_t> cols;
  int64_t width = 0;

  explicit Reference(const CollectionConfig& c) : cfg(c), w(c.tables.size()), st(c.tables.size()) {
    std::vector<int> dim_of(size_t(c.num_slots));
    for (const auto& t : c.tables)
      for (int s : t.slots) dim_of[size_t(s)] = t.dim;
    for (int s = 0; s < c.num_slots; ++s) cols.push_back(width), width += dim_of[size_t(s)];
  }
  std::vector<float> initial(size_t t, int64_t key) const {
    KeyInit ki;
    ki.seed = cfg.seed;
    ki.table_id = uint32_t(t);
    ki.scale = cfg.tables[t].init_scale;
    std::vector<float> r(size_t(cfg.tables[t].dim));
    for (int e = 0; e < cfg.tables[t].dim; ++e) r[size_t(e)] = initial_value(ki, uint64_t(key), uint32_t(e));
    return r;
  }
  // A direct table holds every key from the start: a lookup of a key never trained gives its initial values.
  const std::vector<float>* row(size_t t, int64_t key, bool insert) {
    auto it = w[t].find(key);
    if (it != w[t].end()) return &it->second;
    if (!insert && !cfg.tables[t].direct_index) return nullptr;
    w[t][key] = initial(t, key);
    st[t][key] = std::vector<float>(size_t(cfg.tables[t].dim), cfg.tables[t].optimizer.initial_accumulator);
    return &w[t][key];
  }
  // [samples, width]
  std::vector<float> forward(const Batch& b, bool train) {
    std::vector<float> out(size_t(b.samples * width), 0.f);
    for (size_t t = 0; t < cfg.tables.size(); ++t) {
      const int dim = cfg.tables[t].dim;
      for (int64_t s = 0; s < b.samples; ++s)
        for (int slot : cfg.tables[t].slots) {
          int64_t r = s * cfg.num_slots + slot;
          std::vector<float> acc(size_t(dim), 0.f);
          for (int64_t i = b.offsets[size_t(r)]; i < b.offsets[size_t(r) + 1]; ++i) {
            const std::vector<float>* v = row(t, b.keys[size_t(i)], train);
            if (v)
              for (int e = 0; e < dim; ++e) acc[size_t(e)] += (*v)[size_t(e)];
          }
          int64_t n = b.offsets[size_t(r) + 1] - b.offsets[size_t(r)];
          for (int e = 0; e < dim; ++e) {
            float x = acc[size_t(e)];
            if (cfg.tables[t].combiner == Combiner::mean && n > 0) x = x / float(n);
            out[size_t(s * width + cols[size_t(slot)] + e)] = x;
          }
        }
    }
    return out;
  }
  void backward(const Batch& b, const std::vector<float>& grad) {
    for (size_t t = 0; t < cfg.tables.size(); ++t) {
      const CollectionTableConfig& tc = cfg.tables[t];
      const int dim = tc.dim;
      std::map<int64_t, std::vector<float>> sum;  // each row's gradient, added in the global batch's order
      for (int64_t s = 0; s < b.samples; ++s)
        for (int slot : tc.slots) {
          int64_t r = s * cfg.num_slots + slot;
          int64_t n = b.offsets[size_t(r) + 1] - b.offsets[size_t(r)];
          for (int64_t i = b.offsets[size_t(r)]; i < b.offsets[size_t(r) + 1]; ++i) {
            std::vector<float>& g = sum[b.keys[size_t(i)]];
            g.resize(size_t(dim), 0.f);
            for (int e = 0; e < dim; ++e) {
              float x = grad[size_t(s * width + cols[size_t(slot)] + e)];
              if (tc.combiner == Combiner::mean) x = x * (1.0f / float(n));
              g[size_t(e)] += x;
            }
          }
        }
      for (auto& kg : sum) {
        std::vector<float>& v = w[t][kg.first];
        std::vector<float>& a = st[t][kg.first];
        float row_lr = 0;  // rowwise_adagrad: one accumulator (a[0]) per row, the mean square gradient added
        if (tc.optimizer.kind == OptimizerKind::rowwise_adagrad) {
          double square_sum = 0;
          for (int e = 0; e < dim; ++e) square_sum += double(kg.second[size_t(e)]) * kg.second[size_t(e)];
          a[0] = a[0] + float(square_sum / dim);
          row_lr = tc.optimizer.lr / (std::sqrt(a[0]) + tc.optimizer.epsilon);
        }
        for (int e = 0; e < dim; ++e) {
          float g = kg.second[size_t(e)];
          if (tc.optimizer.kind == OptimizerKind::sgd) {
            v[size_t(e)] = v[size_t(e)] - tc.optimizer.lr * g;
          } else if (tc.optimizer.kind == OptimizerKind::rowwise_adagrad) {
            v[size_t(e)] = v[size_t(e)] - row_lr * g;
          } else {  // adagrad
            a[size_t(e)] = a[size_t(e)] + g * g;
            v[size_t(e)] = v[size_t(e)] - (tc.optimizer.lr * g) / (std::sqrt(a[size_t(e)]) + tc.optimizer.epsilon);
          }
        }
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------------------
// Running the collection on a world and comparing.

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

uint64_t shared_seed() {
  uint64_t s = testing::rng()();
  MPI_Bcast(&s, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  return s;
}

// This rank's slice of a global batch, uploaded.
struct LocalBatch {
  int64_t count = 0;
  Buffer<int64_t> offsets, keys;
  LocalBatch(const Device& dev, const Batch& b, const Slice& s) {
    count = s.count;
    const int64_t r0 = s.first * b.slots, r1 = (s.first + s.count) * b.slots;
    std::vector<int64_t> off(b.offsets.begin() + r0, b.offsets.begin() + r1 + 1);
    const int64_t base = off[0];
    for (int64_t& o : off) o -= base;
    std::vector<int64_t> k(b.keys.begin() + base, b.keys.begin() + b.offsets[size_t(r1)]);
    if (k.empty()) k.push_back(0);  // never read: keeps the device pointer valid
    offsets = Buffer<int64_t>(dev, off);
    keys = Buffer<int64_t>(dev, k);
  }
};

std::vector<float> rows_of(const std::vector<float>& all, int64_t width, const Slice& s) {
  return std::vector<float>(all.begin() + s.first * width, all.begin() + (s.first + s.count) * width);
}

// The tolerance of values that are not compared bit for bit: 1e-5 + 1e-5|ref| (summation order), or under
// exchange = bf16 on more than one rank 6e-2 + 1e-2|ref|: every vector and gradient that crosses ranks is
// rounded to bf16 (relative error <= 2^-9), and the hot key's row takes some 10-40 gradients of magnitude < 1 a
// step at lr 0.5, each off by up to 2e-3 after rounding, over 4 steps. The errors add like a random walk: about
// 1e-2 typically, 3.4e-2 seen in about one run of ten at 4 ranks (the bound, every error of one sign, is 0.16).
// A key routed to the wrong place or a lost gradient moves a value by order 0.1-1 (init_scale 0.5, SGD lr 0.5).
struct Tol {
  double abs = 1e-5, rel = 1e-5;
};
Tol tolerance_of(const CollectionConfig& cfg, int world) {
  return cfg.exchange == DataType::bf16 && world > 1 ? Tol{6e-2, 1e-2} : Tol{};
}

// Compares this rank's output with the reference's columns; exact for the slots of `exact` tables.
void compare_output(const std::vector<float>& got, const std::vector<float>& want, const CollectionConfig& cfg,
                    const Reference& ref, const std::vector<bool>& exact, const std::string& what,
                    const Tol& tol = Tol{}) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  const int64_t n = ref.width ? int64_t(got.size()) / ref.width : 0;
  for (size_t t = 0; t < cfg.tables.size(); ++t) {
    std::vector<float> g, w;
    for (int64_t s = 0; s < n; ++s)
      for (int slot : cfg.tables[t].slots)
        for (int e = 0; e < cfg.tables[t].dim; ++e) {
          g.push_back(got[size_t(s * ref.width + ref.cols[size_t(slot)] + e)]);
          w.push_back(want[size_t(s * ref.width + ref.cols[size_t(slot)] + e)]);
        }
    std::string name = what + " table " + cfg.tables[t].name;
    if (exact[t]) {
      size_t diff = 0;
      for (size_t i = 0; i < g.size(); ++i) diff += std::memcmp(&g[i], &w[i], sizeof(float)) != 0;
      BOOST_CHECK_MESSAGE(diff == 0, name << ": " << diff << " of " << g.size() << " values not bit-identical");
    } else {
      BOOST_CHECK_EQUAL(testing::count_mismatches(g, w, tol.abs, tol.rel, name), 0u);
    }
  }
}

// Every row a rank holds equals the reference's; every reference row is held by its owner (counted over ranks).
void compare_tables(EmbeddingCollection& coll, Reference& ref, MPI_Comm comm, const std::string& what,
                    const Tol& tol = Tol{}) {
  for (size_t t = 0; t < ref.cfg.tables.size(); ++t) {
    TableRows r = coll.held_rows(int(t));
    const int dim = ref.cfg.tables[t].dim;
    std::vector<float> got, want, got_st, want_st;
    int64_t owned = 0, unknown = 0;
    for (size_t i = 0; i < r.rows(); ++i) {
      int64_t k = r.keys[i];
      auto it = ref.w[t].find(k);
      if (it == ref.w[t].end()) {
        if (ref.cfg.tables[t].direct_index) {  // a row no batch touched: its initial values and state
          const std::vector<float> v = ref.initial(t, k);
          got.insert(got.end(), r.values.begin() + i * dim, r.values.begin() + (i + 1) * dim);
          want.insert(want.end(), v.begin(), v.end());
          if (r.state_width == dim) {
            got_st.insert(got_st.end(), r.state.begin() + i * dim, r.state.begin() + (i + 1) * dim);
            want_st.insert(want_st.end(), size_t(dim), ref.cfg.tables[t].optimizer.initial_accumulator);
          } else if (r.state_width == 1) {  // rowwise_adagrad
            got_st.push_back(r.state[i]);
            want_st.push_back(ref.cfg.tables[t].optimizer.initial_accumulator);
          }
        } else {
          ++unknown;
        }
        continue;
      }
      int o = coll.owner_of(int(t), k);
      if (o == coll.rank() || (o == kEveryRank && coll.rank() == 0)) ++owned;
      got.insert(got.end(), r.values.begin() + i * dim, r.values.begin() + (i + 1) * dim);
      want.insert(want.end(), it->second.begin(), it->second.end());
      if (r.state_width == dim) {
        got_st.insert(got_st.end(), r.state.begin() + i * dim, r.state.begin() + (i + 1) * dim);
        want_st.insert(want_st.end(), ref.st[t][k].begin(), ref.st[t][k].end());
      } else if (r.state_width == 1) {  // rowwise_adagrad: the accumulator the reference keeps at st[0]
        got_st.push_back(r.state[i]);
        want_st.push_back(ref.st[t][k][0]);
      }
    }
    std::string name = what + " table " + ref.cfg.tables[t].name;
    BOOST_CHECK_MESSAGE(unknown == 0, name << ": " << unknown << " rows the reference never saw");
    BOOST_CHECK_EQUAL(testing::count_mismatches(got, want, tol.abs, tol.rel, name + " values"), 0u);
    BOOST_CHECK_EQUAL(testing::count_mismatches(got_st, want_st, tol.abs, tol.rel, name + " state"), 0u);
    MPI_Allreduce(MPI_IN_PLACE, &owned, 1, MPI_INT64_T, MPI_SUM, comm);
    BOOST_CHECK_MESSAGE(owned == int64_t(ref.w[t].size()),
                        name << ": " << owned << " rows held by their owners, the reference has " << ref.w[t].size());
  }
}

// Every replicated table's copy (keys, values, optimizer state) is the same bits on every rank: a row sums its
// ranks' contributions in the same order on every copy (src/placement_common.h, ReplicaShard), and the backward's
// order does not depend on the row ids, which differ between copies (kernels/embedding_backward.h).
void compare_replicas(EmbeddingCollection& coll, const Plan& plan, MPI_Comm comm, const std::string& what) {
  for (size_t t = 0; t < plan.tables.size(); ++t) {
    if (plan.tables[t].placement != Placement::replicated) continue;
    TableRows r = coll.held_rows(int(t));
    std::vector<size_t> order(r.rows());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return r.keys[a] < r.keys[b]; });
    std::vector<char> bytes;
    auto put = [&](const void* p, size_t n) { bytes.insert(bytes.end(), (const char*)p, (const char*)p + n); };
    for (size_t i : order) {
      put(&r.keys[i], sizeof(int64_t));
      put(&r.values[i * r.dim], sizeof(float) * size_t(r.dim));
      if (r.state_width > 0) put(&r.state[i * size_t(r.state_width)], sizeof(float) * size_t(r.state_width));
    }
    int64_t n = int64_t(bytes.size()), n0 = n;
    MPI_Bcast(&n0, 1, MPI_INT64_T, 0, comm);
    std::vector<char> first = bytes;
    first.resize(size_t(n0));
    MPI_Bcast(first.data(), int(n0), MPI_CHAR, 0, comm);
    BOOST_CHECK_MESSAGE(n == n0 && first == bytes, what << " table " << r.name << ": this rank's replica ("
                                                       << r.rows() << " rows) differs from rank 0's");
  }
}

// Train `steps` steps on w (forward compared, random gradient, backward), reference alongside.
void train(EmbeddingCollection& coll, Reference& ref, Data& data, const World& w, int steps, int64_t first_step,
           const std::string& what) {
  const int64_t width = coll.output_width();
  BOOST_REQUIRE_EQUAL(width, ref.width);
  std::vector<bool> exact(ref.cfg.tables.size());
  const Tol tol = tolerance_of(ref.cfg, w.size);
  const bool rounded = ref.cfg.exchange == DataType::bf16 && w.size > 1;  // vectors cross ranks in bf16
  for (size_t t = 0; t < exact.size(); ++t)
    exact[t] = coll.plan().tables[t].placement != Placement::distributed && ref.w[t].empty() && !rounded;
  std::uniform_int_distribution<int64_t> extra(0, 2 * w.size);
  for (int step = 0; step < steps; ++step) {
    const int64_t samples = 3 * w.size + extra(data.g);
    Batch b = data.next(samples);
    std::vector<float> grad(size_t(samples * width));
    for (float& x : grad) x = std::uniform_real_distribution<float>(-1, 1)(data.g);
    Slice s = slice_of(samples, w.rank, w.size);
    LocalBatch lb(w.dev, b, s);
    Buffer<float> out(w.dev, size_t(std::max<int64_t>(1, s.count * width)));
    out.fill_bytes(0xFF);
    coll.forward(lb.offsets.data(), lb.keys.data(), s.count, out.data());
    std::vector<float> want = rows_of(ref.forward(b, true), width, s);
    std::vector<float> got = out.download();
    got.resize(want.size());
    std::string tag = what + " step " + std::to_string(first_step + step);
    compare_output(got, want, ref.cfg, ref, exact, tag, tol);
    std::fill(exact.begin(), exact.end(), false);  // trained rows: within the tolerance
    std::vector<float> mine(grad.begin() + s.first * width, grad.begin() + (s.first + s.count) * width);
    if (mine.empty()) mine.push_back(0.f);  // keeps the device pointer valid
    Buffer<float> g(w.dev, mine);
    coll.backward(g.data(), first_step + step);
    ref.backward(b, grad);
  }
}

Plan plan_for(const CollectionConfig& cfg, const World& w, Data& data) {
  // key statistics from a sample batch (the hybrid tables' hot set), then the plan
  Batch sample = data.next(8 * w.size);
  Slice s = slice_of(sample.samples, w.rank, w.size);
  const int64_t r0 = s.first * sample.slots, r1 = (s.first + s.count) * sample.slots;
  std::vector<int64_t> off(sample.offsets.begin() + r0, sample.offsets.begin() + r1 + 1);
  const int64_t base = off[0];
  for (int64_t& o : off) o -= base;
  std::vector<int64_t> keys(sample.keys.begin() + base, sample.keys.begin() + sample.offsets[size_t(r1)]);
  std::vector<TableKeyStats> stats = count_keys(w.comm, cfg, off, keys, s.count, 64);
  PlannerOptions po;
  po.world = w.size;
  po.global_batch = 4 * w.size;
  return make_plan(cfg, po, stats);
}

// Every placement alone, and all five in one collection: forward, tables after several steps, and an eval pass.
// rows_in_use counts the rows held_rows lists.
void compare_rows_in_use(EmbeddingCollection& coll, const CollectionConfig& cfg, const std::string& what) {
  int64_t want = 0;
  for (size_t t = 0; t < cfg.tables.size(); ++t) want += int64_t(coll.held_rows(int(t)).rows());
  BOOST_CHECK_MESSAGE(coll.rows_in_use() == want,
                      what << ": rows_in_use " << coll.rows_in_use() << ", the held rows count " << want);
}

void check_placements(Backend backend, const std::vector<std::string>& placements, CommMode mode,
                      int ranks_per_node = 0, const std::vector<TableDef>& defs = kTables, int slots = kSlots,
                      int groups = 0, DataType exchange = DataType::f32) {
  const uint64_t seed = shared_seed();
  World w(backend, testing::world_size(), mode, ranks_per_node);
  CollectionConfig cfg = make_config(seed, placements, defs, slots);
  cfg.exchange = exchange;
  const Tol tol = tolerance_of(cfg, w.size);
  Data data(seed ^ 0x5eed, defs, slots);
  Plan plan = plan_for(cfg, w, data);
  for (size_t t = 0; t < cfg.tables.size(); ++t) {
    std::string p = cfg.tables[t].placement;
    if (p != "auto") BOOST_CHECK_EQUAL(placement_name(plan.tables[t].placement), p.substr(0, p.find(':')));
    if (plan.tables[t].placement == Placement::hybrid) BOOST_CHECK(!plan.tables[t].hot_keys.empty());
  }
  if (w.rank == 0) BOOST_TEST_MESSAGE(format_plan(cfg, plan));
  EmbeddingCollection coll(w.comm, w.communicator.get(), w.dev, cfg, plan);
  BOOST_CHECK_EQUAL(coll.groups(), groups > 0 ? groups : int(cfg.tables.size()));
  // what the planner estimated is what the shards allocate (tables alone: a group's shards are sized for it)
  size_t planned = 0;
  for (const TablePlan& t : plan.tables)
    planned += t.placement != Placement::localized || t.owner == w.rank ? t.memory_bytes : 0;
  // (a direct index's key % world shards: rank 0's is the largest, the one the plan counts)
  bool direct = false;
  for (const auto& t : cfg.tables) direct = direct || t.direct_index;
  if (coll.groups() == int(cfg.tables.size()) && !direct) BOOST_CHECK_EQUAL(coll.memory_bytes(), planned);
  if (direct) BOOST_CHECK_LE(coll.memory_bytes(), planned);
  if (plan.tables[0].placement == Placement::hybrid)  // the key in every sample is among the hot ones
    BOOST_CHECK(std::binary_search(plan.tables[0].hot_keys.begin(), plan.tables[0].hot_keys.end(), data.pools[0][0]));
  Reference ref(cfg);
  std::string what = "placements " + placements[0] + (placements.size() > 1 ? "+..." : "");
  train(coll, ref, data, w, 4, 1, what);
  compare_tables(coll, ref, w.comm, what, tol);
  compare_replicas(coll, plan, w.comm, what);
  compare_rows_in_use(coll, cfg, what);
  // eval: keys never trained give zeros (a direct index: their initial values), nothing is inserted
  Batch b = data.next(2 * w.size + 1);
  Slice s = slice_of(b.samples, w.rank, w.size);
  LocalBatch lb(w.dev, b, s);
  Buffer<float> out(w.dev, size_t(std::max<int64_t>(1, s.count * coll.output_width())));
  out.fill_bytes(0xFF);
  coll.forward(lb.offsets.data(), lb.keys.data(), s.count, out.data(), LookupMode::eval);
  std::vector<float> want = rows_of(ref.forward(b, false), ref.width, s), got = out.download();
  got.resize(want.size());
  compare_output(got, want, cfg, ref, std::vector<bool>(cfg.tables.size(), false), what + " eval", tol);
  compare_tables(coll, ref, w.comm, what + " after eval", tol);
  compare_rows_in_use(coll, cfg, what + " after eval");
  // the routes now hold the eval batch: a backward is refused (on every rank alike)
  Buffer<float> g(w.dev, size_t(std::max<int64_t>(1, s.count * coll.output_width())));
  std::string e = error_of([&] { coll.backward(g.data(), 5); });
  BOOST_CHECK_MESSAGE(e.find("no train forward") != std::string::npos, e);
}

void dispatch_only(Backend b) { check_placements(b, {"dispatch"}, CommMode::mpi); }
void localized_only(Backend b) {
  // owners spread over the ranks (table i on rank i % world)
  std::vector<std::string> p;
  for (int i = 0; i < 5; ++i) p.push_back("localized:" + std::to_string(i % testing::world_size()));
  check_placements(b, p, CommMode::mpi);
}
void replicated_only(Backend b) { check_placements(b, {"replicated"}, CommMode::mpi); }
void distributed_only(Backend b) { check_placements(b, {"distributed"}, CommMode::mpi); }
void hybrid_only(Backend b) { check_placements(b, {"hybrid"}, CommMode::mpi); }
void mixed(Backend b) {
  std::string owner = "localized:" + std::to_string(testing::world_size() - 1);
  // hier over emulated nodes of two ranks where they come out even (hier needs nodes of one size)
  const int rpn = testing::world_size() % 2 == 0 ? 2 : 0;
  check_placements(b, {"hybrid", "distributed", owner, "replicated", "dispatch"}, CommMode::hier, rpn);
}
void mixed_auto(Backend b) { check_placements(b, {"auto", "dispatch", "auto", "hybrid", "auto"}, CommMode::mpi); }

// The same tables with a direct index (keys in [0, rows)): every placement alone, mixed, and the planner's choice.
std::vector<TableDef> direct_tables() {
  std::vector<TableDef> d = kTables;
  for (TableDef& t : d) t.key_bound = t.rows, t.direct = true;
  return d;
}
void direct_each(Backend b) {
  const std::string owner = "localized:" + std::to_string(testing::world_size() - 1);
  for (const std::vector<std::string>& p : std::vector<std::vector<std::string>>{
           {"dispatch"}, {"distributed"}, {"replicated"}, {owner}, {"hybrid"},
           {"hybrid", "distributed", owner, "replicated", "auto"}})
    check_placements(b, p, CommMode::mpi, 0, direct_tables());
}
SPARTA_MPI_BACKEND_CASES(direct_index_tables_match_reference, direct_each)

SPARTA_MPI_BACKEND_CASES(dispatch_matches_reference, dispatch_only)
SPARTA_MPI_BACKEND_CASES(localized_matches_reference, localized_only)
SPARTA_MPI_BACKEND_CASES(replicated_matches_reference, replicated_only)
SPARTA_MPI_BACKEND_CASES(distributed_matches_reference, distributed_only)
SPARTA_MPI_BACKEND_CASES(hybrid_matches_reference, hybrid_only)
SPARTA_MPI_BACKEND_CASES(mixed_placements_match_reference, mixed)
SPARTA_MPI_BACKEND_CASES(auto_and_explicit_placements_match_reference, mixed_auto)

// ---- exchange = bf16: every placement alone and the mix against the reference within the bf16 tolerance
// (tolerance_of); then the same training under f32 and bf16 side by side: with one rank bit for bit, with more
// some values differ (the wire format is in effect).

void bf16_each_placement(Backend b) {
  const int world = testing::world_size();
  std::vector<std::string> loc;
  for (int i = 0; i < 5; ++i) loc.push_back("localized:" + std::to_string(i % world));
  for (const std::vector<std::string>& p : std::vector<std::vector<std::string>>{
           {"dispatch"}, loc, {"replicated"}, {"distributed"}, {"hybrid"}})
    check_placements(b, p, CommMode::mpi, 0, kTables, kSlots, 0, DataType::bf16);
  const int rpn = world % 2 == 0 ? 2 : 0;
  check_placements(b, {"hybrid", "distributed", "localized:" + std::to_string(world - 1), "replicated", "dispatch"},
                   CommMode::hier, rpn, kTables, kSlots, 0, DataType::bf16);
}
SPARTA_MPI_BACKEND_CASES(bf16_exchange_matches_reference, bf16_each_placement)

void bf16_against_f32(Backend backend) {
  const uint64_t seed = shared_seed();
  World w(backend, testing::world_size(), CommMode::mpi);
  for (std::string p : {"dispatch", "localized", "replicated", "hybrid"}) {
    std::vector<std::vector<float>> outs(2), rows(2);
    for (int e = 0; e < 2; ++e) {
      CollectionConfig cfg = make_config(seed, {p == "localized" ? "localized:" + std::to_string(w.size - 1) : p});
      cfg.exchange = e ? DataType::bf16 : DataType::f32;
      Data data(seed ^ 0x5eed, kTables, kSlots);
      Plan plan = plan_for(cfg, w, data);
      EmbeddingCollection coll(w.comm, w.communicator.get(), w.dev, cfg, plan);
      Reference ref(cfg);
      train(coll, ref, data, w, 3, 1, p + (e ? " bf16" : " f32"));
      Batch b = data.next(2 * w.size + 1);
      Slice s = slice_of(b.samples, w.rank, w.size);
      LocalBatch lb(w.dev, b, s);
      Buffer<float> out(w.dev, size_t(std::max<int64_t>(1, s.count * coll.output_width())));
      out.fill_bytes(0xFF);
      coll.forward(lb.offsets.data(), lb.keys.data(), s.count, out.data(), LookupMode::eval);
      outs[size_t(e)] = out.download();
      for (size_t t = 0; t < cfg.tables.size(); ++t) {
        TableRows r = coll.held_rows(int(t));
        std::vector<std::pair<int64_t, size_t>> order;  // by key: the two runs may hold rows in other orders
        for (size_t i = 0; i < r.rows(); ++i) order.push_back({r.keys[i], i});
        std::sort(order.begin(), order.end());
        const int dim = cfg.tables[t].dim;
        for (const auto& o : order)
          rows[size_t(e)].insert(rows[size_t(e)].end(), r.values.begin() + o.second * dim,
                                 r.values.begin() + (o.second + 1) * dim);
      }
    }
    BOOST_REQUIRE_EQUAL(outs[0].size(), outs[1].size());
    BOOST_REQUIRE_EQUAL(rows[0].size(), rows[1].size());
    int64_t diff = 0;
    for (size_t i = 0; i < outs[0].size(); ++i) diff += std::memcmp(&outs[0][i], &outs[1][i], 4) != 0;
    for (size_t i = 0; i < rows[0].size(); ++i) diff += std::memcmp(&rows[0][i], &rows[1][i], 4) != 0;
    MPI_Allreduce(MPI_IN_PLACE, &diff, 1, MPI_INT64_T, MPI_SUM, w.comm);
    if (w.size == 1) {
      BOOST_CHECK_MESSAGE(diff == 0, p << ": one rank, " << diff << " values differ between f32 and bf16 exchange");
    } else {
      BOOST_CHECK_MESSAGE(diff > 0, p << ": " << w.size << " ranks, bf16 exchange changed no value");
    }
  }
}
SPARTA_MPI_BACKEND_CASES(bf16_exchange_is_bit_identical_on_one_rank_and_rounds_on_more, bf16_against_f32)

void bad_exchange_type(Backend backend) {
  World w(backend, testing::world_size());
  for (DataType t : {DataType::f16, DataType::i64}) {
    CollectionConfig cfg = make_config(shared_seed(), {"dispatch"});
    cfg.exchange = t;
    std::string e = error_of([&] { check_collection_config(cfg); });
    BOOST_CHECK_MESSAGE(e.find("exchange") != std::string::npos && e.find(dtype_name(t)) != std::string::npos, e);
    PlannerOptions po;
    po.world = w.size;
    e = error_of([&] { EmbeddingCollection coll(w.comm, w.communicator.get(), w.dev, cfg, make_plan(cfg, po, {})); });
    BOOST_CHECK_MESSAGE(e.find("exchange") != std::string::npos, "rank " << w.rank << ": " << e);
  }
}
SPARTA_MPI_BACKEND_CASES(an_exchange_type_other_than_f32_or_bf16_is_an_error, bad_exchange_type)

// ---- output = bf16 / f16: a 16-bit collection beside a float32 one of the same configuration and plan, fed the
// same batches. Its output (poisoned before every forward) is the float output rounded to the type (src/base/
// half.h, nearest even), bit for bit; its backward with a 16-bit gradient leaves the same tables (values and
// optimizer state, bit for bit, by key) as the float backward fed that gradient widened. Every placement alone
// (each table a group of some slots: the slots put into the output), and one group of all slots (the float
// output written by the placement directly, the 16-bit one through the group's buffer).

uint16_t round_to(OutputType t, float v) { return t == OutputType::bf16 ? float_to_bf16(v) : float_to_f16(v); }
float widen(OutputType t, uint16_t h) { return t == OutputType::bf16 ? bf16_to_float(h) : f16_to_float(h); }

// A wide 16-bit output (wide_col > 0: CollectionConfig::output_col wide_col, output_row wide_col + width +
// wide_pad, float_gradient, as the trainer's DCNv2 x0): the slots in their columns, the others untouched (their
// poison kept), and the float gradient [local_batch, output_width].
void half_against_f32(Backend backend, OutputType type, const std::vector<std::string>& placements,
                      const std::vector<TableDef>& defs, int slots, int groups = 0, int wide_col = 0,
                      int wide_pad = 0) {
  const uint64_t seed = shared_seed();
  World w(backend, testing::world_size(), CommMode::mpi);
  CollectionConfig cfg = make_config(seed, placements, defs, slots);
  CollectionConfig half = cfg;
  half.output = type;
  Data data(seed ^ 0x4a1f, defs, slots);
  Plan plan = plan_for(cfg, w, data);
  EmbeddingCollection a(w.comm, w.communicator.get(), w.dev, cfg, plan);
  const int64_t width = a.output_width();
  if (wide_col > 0) {
    half.output_col = wide_col;
    half.output_row = wide_col + width + wide_pad;
    half.float_gradient = true;
  }
  EmbeddingCollection h(w.comm, w.communicator.get(), w.dev, half, plan);
  BOOST_CHECK(a.output_type() == OutputType::f32 && h.output_type() == type);
  BOOST_CHECK_EQUAL(h.groups(), groups > 0 ? groups : int(cfg.tables.size()));
  BOOST_REQUIRE_EQUAL(h.output_width(), width);
  const int64_t row = h.output_row(), col = wide_col;
  BOOST_REQUIRE_EQUAL(row, wide_col > 0 ? wide_col + width + wide_pad : width);
  const std::string what = std::string(output_type_name(type)) + " output" +
                           (wide_col > 0 ? " at column " + std::to_string(col) + " of " + std::to_string(row) : "") +
                           ", placements " + placements[0];
  for (int step = 1; step <= 3; ++step) {
    const bool eval = step == 3;  // two train steps, then an eval forward of trained and unseen keys
    Batch b = data.next(3 * w.size + step);
    Slice s = slice_of(b.samples, w.rank, w.size);
    LocalBatch lb(w.dev, b, s);
    const size_t n = size_t(s.count * width);
    Buffer<float> out(w.dev, std::max<size_t>(n, 1));
    Buffer<uint16_t> out16(w.dev, std::max<size_t>(size_t(s.count * row), 1));
    out.fill_bytes(0xFF);
    out16.fill_bytes(0xFF);
    const LookupMode mode = eval ? LookupMode::eval : LookupMode::train;
    a.forward(lb.offsets.data(), lb.keys.data(), s.count, out.data(), mode);
    h.forward(lb.offsets.data(), lb.keys.data(), s.count, out16.data(), mode);
    std::vector<float> got32 = out.download();
    std::vector<uint16_t> got16 = out16.download();
    size_t nan = 0, diff = 0, touched = 0;
    for (size_t i = 0; i < n; ++i) {
      nan += std::isnan(got32[i]);  // the float output was written everywhere (else the rounding of its poison
                                    // could match the 16-bit poison)
      diff += got16[size_t(int64_t(i) / width * row + col + int64_t(i) % width)] != round_to(type, got32[i]);
    }
    for (int64_t r = 0; r < s.count; ++r)
      for (int64_t c = 0; c < row; ++c)
        touched += (c < col || c >= col + width) && got16[size_t(r * row + c)] != 0xFFFF;
    BOOST_CHECK_MESSAGE(nan == 0, what << " step " << step << ": " << nan << " float outputs never written");
    BOOST_CHECK_MESSAGE(diff == 0, what << " step " << step << ": " << diff << " of " << n
                                        << " 16-bit outputs differ from the float output rounded");
    BOOST_CHECK_MESSAGE(touched == 0, what << " step " << step << ": " << touched
                                           << " values written outside the slots' columns");
    if (eval) break;
    // the global batch's gradient (every rank draws alike), in the output type, and widened for the float one
    std::vector<uint16_t> grad16(size_t(b.samples * width));
    for (uint16_t& x : grad16) x = round_to(type, std::uniform_real_distribution<float>(-1, 1)(data.g));
    std::vector<uint16_t> mine16(grad16.begin() + s.first * width, grad16.begin() + (s.first + s.count) * width);
    if (mine16.empty()) mine16.push_back(0);  // keeps the device pointer valid
    std::vector<float> mine32;
    for (uint16_t x : mine16) mine32.push_back(widen(type, x));
    Buffer<uint16_t> g16(w.dev, mine16);
    Buffer<float> g32(w.dev, mine32);
    a.backward(g32.data(), step);
    if (wide_col > 0) {
      Buffer<float> g32h(w.dev, mine32);
      h.backward(g32h.data(), step);
    } else {
      h.backward(g16.data(), step);
    }
  }
  auto by_key = [](const TableRows& r) {  // row ids may differ between the collections (a GPU insert's order)
    std::map<int64_t, std::pair<std::vector<float>, std::vector<float>>> m;
    for (size_t i = 0; i < r.rows(); ++i)
      m[r.keys[i]] = {std::vector<float>(r.values.begin() + i * r.dim, r.values.begin() + (i + 1) * r.dim),
                      std::vector<float>(r.state.begin() + i * size_t(r.state_width),
                                         r.state.begin() + (i + 1) * size_t(r.state_width))};
    return m;
  };
  int64_t rows = 0;
  for (size_t t = 0; t < cfg.tables.size(); ++t) {
    auto ra = by_key(a.held_rows(int(t))), rh = by_key(h.held_rows(int(t)));
    rows += int64_t(ra.size());
    size_t diff = 0;  // keys held by one only, or any value or state bit apart
    for (const auto& kv : ra) {
      auto it = rh.find(kv.first);
      diff += it == rh.end() || kv.second.first.size() != it->second.first.size() ||
              kv.second.second.size() != it->second.second.size() ||
              std::memcmp(kv.second.first.data(), it->second.first.data(), 4 * kv.second.first.size()) != 0 ||
              std::memcmp(kv.second.second.data(), it->second.second.data(), 4 * kv.second.second.size()) != 0;
    }
    diff += rh.size() > ra.size() ? rh.size() - ra.size() : 0;
    BOOST_CHECK_MESSAGE(diff == 0, what << " table " << cfg.tables[t].name << ": " << diff << " of " << ra.size()
                                        << " rows differ after the 16-bit and the float backward");
  }
  MPI_Allreduce(MPI_IN_PLACE, &rows, 1, MPI_INT64_T, MPI_SUM, w.comm);
  BOOST_CHECK_MESSAGE(rows > 0, what << ": no rows compared");
}

void half_output_every_placement(Backend backend, OutputType type) {
  const int world = testing::world_size();
  std::vector<std::string> loc;
  for (int i = 0; i < 5; ++i) loc.push_back("localized:" + std::to_string(i % world));
  for (const std::vector<std::string>& p : std::vector<std::vector<std::string>>{
           {"dispatch"}, loc, {"replicated"}, {"distributed"}, {"hybrid"}})
    half_against_f32(backend, type, p, kTables, kSlots);
  const std::vector<TableDef> all = {{"x", 300, 4, Combiner::sum, OptimizerKind::sgd, {0}, 120, 1000},
                                     {"y", 300, 4, Combiner::sum, OptimizerKind::sgd, {1, 2}, 120, 1000}};
  half_against_f32(backend, type, {"dispatch"}, all, 3, 1);  // one group of all slots
  // wide outputs: aligned (the trainer's shape: column and row multiples of 8) and not; replicated pools into a
  // 16-bit output in place, the others through their groups' buffers
  for (const std::vector<std::string>& p : std::vector<std::vector<std::string>>{
           {"replicated"}, {"dispatch"}, loc, {"hybrid"}})
    half_against_f32(backend, type, p, kTables, kSlots, 0, 8, 8);
  half_against_f32(backend, type, {"replicated"}, kTables, kSlots, 0, 3, 1);
  half_against_f32(backend, type, {"replicated"}, all, 3, 1, 5, 2);  // one group of all slots, wide
}
void bf16_output(Backend b) { half_output_every_placement(b, OutputType::bf16); }
void f16_output(Backend b) { half_output_every_placement(b, OutputType::f16); }
SPARTA_MPI_BACKEND_CASES(bf16_output_is_the_f32_output_rounded_and_its_backward_the_same, bf16_output)
SPARTA_MPI_BACKEND_CASES(f16_output_is_the_f32_output_rounded_and_its_backward_the_same, f16_output)

// A bad output type is refused by the configuration check and the constructor (on every rank); a float pointer
// given to a 16-bit collection's forward or backward is refused too, naming the output type.
void bad_output_type(Backend backend) {
  World w(backend, testing::world_size());
  CollectionConfig cfg = make_config(shared_seed(), {"dispatch"});
  PlannerOptions po;
  po.world = w.size;
  Plan plan = make_plan(cfg, po, {});
  CollectionConfig bad = cfg;
  bad.output = static_cast<OutputType>(7);
  std::string e = error_of([&] { check_collection_config(bad); });
  BOOST_CHECK_MESSAGE(e.find("output must be f32, bf16 or f16") != std::string::npos && e.find("7") != std::string::npos,
                      e);
  e = error_of([&] { EmbeddingCollection coll(w.comm, w.communicator.get(), w.dev, bad, plan); });
  BOOST_CHECK_MESSAGE(e.find("output") != std::string::npos, "rank " << w.rank << ": " << e);
  for (OutputType t : {OutputType::bf16, OutputType::f16}) {
    CollectionConfig half = cfg;
    half.output = t;
    EmbeddingCollection coll(w.comm, w.communicator.get(), w.dev, half, plan);
    Data data(shared_seed());
    Batch b = data.next(2 * w.size);
    LocalBatch lb(w.dev, b, slice_of(b.samples, w.rank, w.size));
    Buffer<float> out(w.dev, size_t(std::max<int64_t>(1, lb.count * coll.output_width())));
    e = error_of([&] { coll.forward(lb.offsets.data(), lb.keys.data(), lb.count, out.data()); });
    BOOST_CHECK_MESSAGE(e.find("float output") != std::string::npos && e.find(output_type_name(t)) != std::string::npos,
                        e);
    Buffer<uint16_t> out16(w.dev, out.size());
    coll.forward(lb.offsets.data(), lb.keys.data(), lb.count, out16.data());
    e = error_of([&] { coll.backward(out.data(), 1); });
    BOOST_CHECK_MESSAGE(e.find("float gradient") != std::string::npos && e.find(output_type_name(t)) != std::string::npos,
                        e);
    coll.backward(out16.data(), 1);  // the train forward still waits for its backward, which goes through
  }
}
SPARTA_MPI_BACKEND_CASES(an_output_type_other_than_f32_bf16_or_f16_is_an_error, bad_output_type)

// ---------------------------------------------------------------------------------------------------------
// Checkpoints: save on all ranks with one plan, load on 1..world ranks with another, continue: the same results
// as the reference, which never went through a checkpoint.

std::vector<std::string> plan_b(int world) {
  return {"distributed", "localized:" + std::to_string(world - 1), "replicated", "hybrid", "dispatch"};
}

void check_checkpoint_of(Backend backend, const std::vector<std::string>& plan_a,
                         const std::vector<TableDef>& defs, int slots,
                         const std::function<std::vector<std::string>(int)>& plan_b_of) {
  const uint64_t seed = shared_seed();
  testing::SharedTempPath root("mpi_collection", "ckpt");
  CollectionConfig cfg_a = make_config(seed, plan_a, defs, slots);
  Data data(seed ^ 0xC4EC, defs, slots);
  Reference ref(cfg_a);
  std::string written_plan;
  {
    World w(backend, testing::world_size());
    Plan plan = plan_for(cfg_a, w, data);
    written_plan = plan_summary(cfg_a, plan);
    EmbeddingCollection coll(w.comm, w.communicator.get(), w.dev, cfg_a, plan);
    train(coll, ref, data, w, 3, 1, "before save");
    CheckpointMeta meta;
    meta.step = 3;
    meta.config = "collection test";
    coll.save(root.path, meta);
  }
  for (int ranks = 1; ranks <= testing::world_size(); ++ranks) {
    Data d = data;
    Reference r = ref;
    World w(backend, ranks);
    // an error inside the sub-world fails the case there, and the ranks outside still meet at the barrier below
    if (w.in()) try {
      CollectionConfig cfg_b = make_config(seed, plan_b_of(ranks), defs, slots);
      Data sample = d;
      Plan plan = plan_for(cfg_b, w, sample);
      EmbeddingCollection coll(w.comm, w.communicator.get(), w.dev, cfg_b, plan);
      CheckpointMeta m = coll.load(root.path);
      BOOST_CHECK_EQUAL(m.step, 3);
      BOOST_CHECK_EQUAL(m.world_size, testing::world_size());
      BOOST_CHECK_EQUAL(m.plan, written_plan);
      BOOST_CHECK_EQUAL(m.config, "collection test");
      std::string what = "loaded on " + std::to_string(ranks) + " rank(s)";
      compare_tables(coll, r, w.comm, what);
      train(coll, r, d, w, 2, 4, what);
      compare_tables(coll, r, w.comm, what + ", trained on");
    } catch (const Error& e) {
      BOOST_ERROR("loaded on " << ranks << " rank(s): " << e.what());
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}
void check_checkpoint(Backend backend) {
  check_checkpoint_of(backend, {"hybrid", "dispatch", "localized:0", "replicated", "distributed"}, kTables, kSlots,
                      plan_b);
}
SPARTA_MPI_BACKEND_CASES(checkpoint_reshards_to_other_world_sizes_and_plans, check_checkpoint)
// Direct-index tables (every row saved) to other world sizes and plans.
void check_direct_checkpoint(Backend backend) {
  check_checkpoint_of(backend, {"hybrid", "localized:0", "replicated", "distributed", "dispatch"}, direct_tables(),
                      kSlots, [](int world) {
                        return std::vector<std::string>{"distributed", "localized:" + std::to_string(world - 1),
                                                        "hybrid", "replicated", "dispatch"};
                      });
}
SPARTA_MPI_BACKEND_CASES(direct_index_checkpoint_reshards_to_other_world_sizes_and_plans, check_direct_checkpoint)

// ---------------------------------------------------------------------------------------------------------
// Errors reach every rank: a full table on its owner only, bad offsets on one rank only, a backward without a
// train forward. No rank is left waiting in a collective (the case would hang).

void check_errors(Backend backend) {
  World w(backend, testing::world_size());
  CollectionConfig cfg;
  cfg.num_slots = 2;
  CollectionTableConfig small;
  small.name = "small";
  small.rows = 2;
  small.dim = 4;
  small.slots = {0};
  small.placement = "localized:" + std::to_string(w.size - 1);
  CollectionTableConfig other = small;
  other.name = "other";
  other.rows = 100;
  other.slots = {1};
  other.placement = "dispatch";
  cfg.tables = {small, other};
  PlannerOptions po;
  po.world = w.size;
  Plan plan = make_plan(cfg, po, {});
  EmbeddingCollection coll(w.comm, w.communicator.get(), w.dev, cfg, plan);
  // backward before any train forward
  std::string e = error_of([&] { coll.backward(static_cast<const float*>(nullptr), 1); });
  BOOST_CHECK_MESSAGE(e.find("no train forward") != std::string::npos, e);
  // one sample per rank; rank r's slot-0 keys: r, r + 1, r + 2 → the whole world asks for 3+ distinct rows of 2
  std::vector<int64_t> off{0, 3, 4};
  std::vector<int64_t> keys{w.rank, w.rank + 1, w.rank + 2, 7};
  Buffer<int64_t> o(w.dev, off), k(w.dev, keys);
  Buffer<float> out(w.dev, size_t(coll.output_width()));
  e = error_of([&] { coll.forward(o.data(), k.data(), 1, out.data()); });
  BOOST_CHECK_MESSAGE(e.find("'small'") != std::string::npos && e.find("full") != std::string::npos &&
                          e.find("rank " + std::to_string(w.size - 1)) != std::string::npos,
                      "rank " << w.rank << ": " << e);
  BOOST_TEST_MESSAGE("full table, as reported: " << e);
  // decreasing offsets on the last rank only
  std::vector<int64_t> bad{0, 1, 1};
  if (w.rank == w.size - 1) bad = {0, 2, 1};
  Buffer<int64_t> ob(w.dev, bad);
  e = error_of([&] { coll.forward(ob.data(), k.data(), 1, out.data()); });
  BOOST_CHECK_MESSAGE(e.find("offsets decrease") != std::string::npos &&
                          e.find("rank " + std::to_string(w.size - 1)) != std::string::npos,
                      "rank " << w.rank << ": " << e);
  BOOST_TEST_MESSAGE("bad offsets, as reported: " << e);
}
SPARTA_MPI_BACKEND_CASES(errors_are_thrown_on_every_rank, check_errors)


// ---------------------------------------------------------------------------------------------------------
// Placement groups: tables with bounded keys and the same settings and placement share one physical table
// (tagged keys). Six tables, seven slots: a and b (b serves two slots) group; c has unbounded keys (alone); d
// and e (another dim, mean) group; f (adagrad) is alone, tagged. The model equals the reference all the same.

const std::vector<TableDef> kGrouped = {
    {"a", 300, 4, Combiner::sum, OptimizerKind::sgd, {0}, 120, 1000},
    {"b", 200, 4, Combiner::sum, OptimizerKind::sgd, {1, 5}, 100, 500},  // one table, two slots
    {"c", 100, 4, Combiner::sum, OptimizerKind::sgd, {2}, 60, 0},        // unbounded: a group of its own
    {"d", 150, 8, Combiner::mean, OptimizerKind::sgd, {3}, 80, int64_t(1) << 56},
    {"e", 150, 8, Combiner::mean, OptimizerKind::sgd, {4}, 80, 300},
    {"f", 200, 4, Combiner::sum, OptimizerKind::adagrad, {6}, 90, 400},
};
constexpr int kGroupedSlots = 7;

void grouped_same_placement(Backend b) {
  const std::string owner = "localized:" + std::to_string(testing::world_size() - 1);
  for (const std::string& p : {std::string("dispatch"), std::string("replicated"), std::string("hybrid"),
                               std::string("distributed"), owner})
    check_placements(b, {p}, CommMode::mpi, 0, kGrouped, kGroupedSlots, 4);
}
void grouped_mixed(Backend b) {
  // a and b group (hybrid), d and e (distributed); c and f alone
  check_placements(b, {"hybrid", "hybrid", "dispatch", "distributed", "distributed", "replicated"}, CommMode::mpi, 0,
                   kGrouped, kGroupedSlots, 4);
  // different placements: no two tables group
  check_placements(b, {"dispatch", "replicated", "dispatch", "hybrid", "distributed", "replicated"}, CommMode::mpi, 0,
                   kGrouped, kGroupedSlots, 6);
}
// One group of every slot in order: the batch's offsets and the output are the group's own (no cut).
void grouped_all_slots(Backend b) {
  const std::vector<TableDef> defs = {{"x", 300, 4, Combiner::sum, OptimizerKind::sgd, {0}, 120, 1000},
                                      {"y", 300, 4, Combiner::sum, OptimizerKind::sgd, {1, 2}, 120, 1000}};
  check_placements(b, {"dispatch"}, CommMode::mpi, 0, defs, 3, 1);
  check_placements(b, {"hybrid"}, CommMode::mpi, 0, defs, 3, 1);
}
SPARTA_MPI_BACKEND_CASES(grouped_tables_match_reference, grouped_same_placement)
SPARTA_MPI_BACKEND_CASES(grouped_mixed_placements_match_reference, grouped_mixed)
SPARTA_MPI_BACKEND_CASES(one_group_of_all_slots_matches_reference, grouped_all_slots)

// Saved grouped, loaded on 1..world ranks grouped otherwise (and ungrouped where placements differ).
void grouped_checkpoint(Backend b) {
  check_checkpoint_of(b, {"dispatch"}, kGrouped, kGroupedSlots, [](int ranks) {
    return std::vector<std::string>{"replicated", "hybrid", "distributed", "localized:" + std::to_string(ranks - 1),
                                    "dispatch", "hybrid"};
  });
  check_checkpoint_of(b, {"hybrid", "replicated", "dispatch", "distributed", "localized:0", "dispatch"}, kGrouped,
                      kGroupedSlots, [](int) { return std::vector<std::string>{"distributed"}; });
}
SPARTA_MPI_BACKEND_CASES(grouped_checkpoint_reshards, grouped_checkpoint)

// Direct-index tables group too, their keys end to end in one direct index (each segment's initial values its
// own table's; hybrid's hot copy hashed over the same keys): a, b and c (dim 4, sum, sgd), d and e; f alone.
// Saved grouped, loaded grouped otherwise.
std::vector<TableDef> grouped_direct() {
  std::vector<TableDef> d = kGrouped;
  for (TableDef& t : d) t.key_bound = t.rows, t.direct = true;
  return d;
}
void grouped_direct_placements(Backend b) {
  const std::string owner = "localized:" + std::to_string(testing::world_size() - 1);
  for (const std::string& p : {std::string("dispatch"), std::string("replicated"), std::string("distributed"), owner,
                               std::string("hybrid")})
    check_placements(b, {p}, CommMode::mpi, 0, grouped_direct(), kGroupedSlots, 3);
  // a and b (replicated), d and e (distributed) group; c and f alone
  check_placements(b, {"replicated", "replicated", "dispatch", "distributed", "distributed", "replicated"},
                   CommMode::mpi, 0, grouped_direct(), kGroupedSlots, 4);
  check_checkpoint_of(b, {"dispatch"}, grouped_direct(), kGroupedSlots, [](int ranks) {
    return std::vector<std::string>{"replicated", "hybrid", "distributed", "localized:" + std::to_string(ranks - 1),
                                    "distributed", "hybrid"};
  });
}
SPARTA_MPI_BACKEND_CASES(grouped_direct_index_tables_match_reference, grouped_direct_placements)

// Localized tables of several owners group: each owner holds its own tables, and one all-to-all each way reaches
// every owner (src/placement_localized.cpp). Table i on rank i % ranks: hashed, a and b group, d and e (on 2 ranks
// e's owner comes before d's), c and f alone; direct, a, b and c group (on 2 and 4 ranks a and c on rank 0, b on
// rank 1: each owner's keys one range, out of table order), d and e, f alone. Either wire type, and hier over
// emulated nodes; saved so and loaded on 1..world ranks under another plan, and the other way round.
std::vector<std::string> spread_owners(int ranks) {
  std::vector<std::string> p;
  for (size_t i = 0; i < kGrouped.size(); ++i) p.push_back("localized:" + std::to_string(int(i) % ranks));
  return p;
}
void localized_owner_groups(Backend b) {
  const int world = testing::world_size();
  for (DataType wire : {DataType::f32, DataType::bf16}) {
    check_placements(b, spread_owners(world), CommMode::mpi, 0, kGrouped, kGroupedSlots, 4, wire);
    check_placements(b, spread_owners(world), CommMode::mpi, 0, grouped_direct(), kGroupedSlots, 3, wire);
  }
  const int rpn = world % 2 == 0 ? 2 : 0;
  check_placements(b, spread_owners(world), CommMode::hier, rpn, grouped_direct(), kGroupedSlots, 3);
  check_checkpoint_of(b, spread_owners(world), kGrouped, kGroupedSlots,
                      [](int) { return std::vector<std::string>{"distributed"}; });
  check_checkpoint_of(b, {"dispatch"}, grouped_direct(), kGroupedSlots, spread_owners);
}
SPARTA_MPI_BACKEND_CASES(localized_tables_of_several_owners_group, localized_owner_groups)

// With the bf16 wire every pooled vector of a localized table is rounded once on its way, whichever rank looks
// it up for whichever rank: a fresh collection's forward under bf16 equals its forward under f32 rounded to bf16,
// bit for bit, on every rank (an owner's own bags, which it looks up in place, included).
void localized_bf16_rounds_every_bag_once(Backend b) {
  const uint64_t seed = shared_seed();
  const int world = testing::world_size();
  World w(b, world, CommMode::mpi);
  for (const std::vector<TableDef>& defs : {kGrouped, grouped_direct()}) {
    std::vector<std::vector<float>> outs(2);
    for (int e = 0; e < 2; ++e) {
      CollectionConfig cfg = make_config(seed, spread_owners(world), defs, kGroupedSlots);
      cfg.exchange = e ? DataType::bf16 : DataType::f32;
      Data data(seed ^ 0xB16, defs, kGroupedSlots);
      Plan plan = plan_for(cfg, w, data);
      EmbeddingCollection coll(w.comm, w.communicator.get(), w.dev, cfg, plan);
      Batch batch = data.next(3 * w.size + 1);
      Slice s = slice_of(batch.samples, w.rank, w.size);
      LocalBatch lb(w.dev, batch, s);
      Buffer<float> out(w.dev, size_t(std::max<int64_t>(1, s.count * coll.output_width())));
      out.fill_bytes(0xFF);
      coll.forward(lb.offsets.data(), lb.keys.data(), s.count, out.data(), LookupMode::train);
      outs[size_t(e)] = out.download();
    }
    int64_t diff = 0;
    for (size_t i = 0; i < outs[0].size(); ++i) {
      const float want = world == 1 ? outs[0][i] : bf16_to_float(float_to_bf16(outs[0][i]));
      diff += std::memcmp(&want, &outs[1][i], 4) != 0;
    }
    BOOST_CHECK_MESSAGE(diff == 0, "rank " << w.rank << ": " << diff << " of " << outs[0].size()
                                           << " pooled values are not the f32 forward's rounded to bf16 once");
  }
}
SPARTA_MPI_BACKEND_CASES(localized_bf16_wire_rounds_every_bag_once, localized_bf16_rounds_every_bag_once)

// A key outside its table's key_bound (on the last rank only) is an error on every rank, naming table and key.
void key_outside_bound(Backend backend) {
  World w(backend, testing::world_size());
  CollectionConfig cfg;
  cfg.num_slots = 2;
  CollectionTableConfig t0;
  t0.name = "first";
  t0.rows = 100;
  t0.dim = 4;
  t0.slots = {0};
  t0.placement = "dispatch";
  t0.key_bound = 10;
  CollectionTableConfig t1 = t0;
  t1.name = "second";
  t1.slots = {1};
  cfg.tables = {t0, t1};
  PlannerOptions po;
  po.world = w.size;
  Plan plan = make_plan(cfg, po, {});
  EmbeddingCollection coll(w.comm, w.communicator.get(), w.dev, cfg, plan);
  BOOST_CHECK_EQUAL(coll.groups(), 1);
  const bool last = w.rank == w.size - 1;
  for (int64_t bad : {int64_t(10), int64_t(-3), int64_t(1) << 56}) {
    for (LookupMode mode : {LookupMode::train, LookupMode::eval}) {
      std::vector<int64_t> off{0, 1, 3, 4, 5};
      std::vector<int64_t> keys{1, 2, last ? bad : 9, 0, 3};
      Buffer<int64_t> o(w.dev, off), k(w.dev, keys);
      Buffer<float> out(w.dev, size_t(2 * coll.output_width()));
      std::string e = error_of([&] { coll.forward(o.data(), k.data(), 2, out.data(), mode); });
      BOOST_CHECK_MESSAGE(e.find("table 'second'") != std::string::npos &&
                              e.find("key " + std::to_string(bad)) != std::string::npos &&
                              e.find("[0, 10)") != std::string::npos &&
                              e.find("rank " + std::to_string(w.size - 1)) != std::string::npos,
                          "rank " << w.rank << ": " << e);
    }
  }
  // keys within their bounds go through
  std::vector<int64_t> off{0, 1, 2}, keys{9, 0};
  Buffer<int64_t> o(w.dev, off), k(w.dev, keys);
  Buffer<float> out(w.dev, size_t(coll.output_width()));
  BOOST_CHECK_EQUAL(error_of([&] { coll.forward(o.data(), k.data(), 1, out.data()); }), "");
}
SPARTA_MPI_BACKEND_CASES(key_outside_its_bound_is_an_error_on_every_rank, key_outside_bound)

// The learning-rate factor: 0 leaves the tables as the forward made them; 0.5 equals a table of half the lr.
void lr_scale_applies(Backend backend) {
  const uint64_t seed = shared_seed();
  World w(backend, testing::world_size());
  std::vector<TableDef> defs;
  for (TableDef d : kTables)
    if (d.opt == OptimizerKind::sgd) defs.push_back(d);
  std::vector<TableDef> grouped;  // grouped too: a, b and d, e
  for (TableDef d : kGrouped)
    if (d.opt == OptimizerKind::sgd) grouped.push_back(d);
  for (const std::vector<TableDef>& ds : {defs, grouped}) {
    // the sgd tables, their slots renumbered densely
    std::vector<TableDef> used = ds;
    int slots = 0;
    for (TableDef& d : used)
      for (int& s : d.slots) s = slots++;
    CollectionConfig cfg = make_config(seed, {"dispatch", "replicated", "hybrid"}, used, slots);
    CollectionConfig half = cfg;
    for (CollectionTableConfig& t : half.tables) t.optimizer.lr = t.optimizer.lr * 0.5f;
    Data data(seed ^ 0x1a, used, slots);
    Data sample = data;
    Plan plan = plan_for(cfg, w, sample);
    EmbeddingCollection zero(w.comm, w.communicator.get(), w.dev, cfg, plan);
    EmbeddingCollection scaled(w.comm, w.communicator.get(), w.dev, cfg, plan);
    EmbeddingCollection halved(w.comm, w.communicator.get(), w.dev, half, plan);
    Reference ref(cfg);
    for (int step = 1; step <= 3; ++step) {
      Batch b = data.next(3 * w.size + 1);
      Slice s = slice_of(b.samples, w.rank, w.size);
      LocalBatch lb(w.dev, b, s);
      const int64_t width = zero.output_width();
      Buffer<float> out(w.dev, size_t(std::max<int64_t>(1, s.count * width)));
      std::vector<float> grad(size_t(b.samples * width));  // the global batch's: every rank draws alike
      for (float& x : grad) x = std::uniform_real_distribution<float>(-1, 1)(data.g);
      std::vector<float> mine(grad.begin() + s.first * width, grad.begin() + (s.first + s.count) * width);
      if (mine.empty()) mine.push_back(0.f);
      Buffer<float> g(w.dev, mine);
      ref.forward(b, true);  // inserts the rows; no update
      for (auto [c, scale] : {std::pair<EmbeddingCollection*, float>{&zero, 0.f}, {&scaled, 0.5f}, {&halved, 1.f}}) {
        c->forward(lb.offsets.data(), lb.keys.data(), s.count, out.data());
        c->backward(g.data(), step, scale);
      }
    }
    compare_tables(zero, ref, w.comm, "lr_scale 0");
    // By key: row ids (the export's order) depend on which insert won on a GPU, and differ between collections.
    auto by_key = [](const TableRows& r) {
      std::map<int64_t, std::vector<float>> m;
      for (size_t i = 0; i < r.rows(); ++i)
        m[r.keys[i]].assign(r.values.begin() + i * r.dim, r.values.begin() + (i + 1) * r.dim);
      return m;
    };
    for (size_t t = 0; t < cfg.tables.size(); ++t) {
      auto a = by_key(scaled.held_rows(int(t))), h = by_key(halved.held_rows(int(t))), z = by_key(zero.held_rows(int(t)));
      BOOST_CHECK_MESSAGE(a == h, "table " << cfg.tables[t].name << ": lr_scale 0.5 != half the lr");
      BOOST_CHECK_MESSAGE(a != z || a.empty(), "table " << cfg.tables[t].name << " never moved");
    }
  }
}
SPARTA_MPI_BACKEND_CASES(lr_scale_scales_every_tables_learning_rate, lr_scale_applies)

// Rows that differ in any bit between two collections of the same tables (a row one holds and the other lacks
// counts), and the rows compared, over every rank.
std::pair<int64_t, int64_t> differing_rows(EmbeddingCollection& x, EmbeddingCollection& y, const CollectionConfig& cfg,
                                           MPI_Comm comm) {
  int64_t diff = 0, compared = 0;
  for (size_t t = 0; t < cfg.tables.size(); ++t) {
    TableRows a = x.held_rows(int(t)), c = y.held_rows(int(t));
    std::map<int64_t, size_t> at;
    for (size_t i = 0; i < c.rows(); ++i) at[c.keys[i]] = i;
    const int dim = cfg.tables[t].dim;
    for (size_t i = 0; i < a.rows(); ++i) {
      auto it = at.find(a.keys[i]);
      if (it == at.end()) {
        ++diff;
        continue;
      }
      diff += std::memcmp(&a.values[i * dim], &c.values[it->second * dim], sizeof(float) * dim) != 0;
      ++compared;
    }
    diff += int64_t(a.rows()) != int64_t(c.rows());
  }
  MPI_Allreduce(MPI_IN_PLACE, &diff, 1, MPI_INT64_T, MPI_SUM, comm);
  MPI_Allreduce(MPI_IN_PLACE, &compared, 1, MPI_INT64_T, MPI_SUM, comm);
  return {diff, compared};
}

// prepare_backward (the gradient-free part of the backward queued after the forward) changes no bit: a
// collection that calls it trains as one that does not. At step 2 it also prepares a forward of an older batch
// (whose keys are all held, so nothing new is inserted) and then forwards this step's batch without preparing:
// the older batch's prepare must not be used by this step's backward.
void prepared_backward_equals_backward(Backend backend) {
  const uint64_t seed = shared_seed();
  World w(backend, testing::world_size());
  const std::vector<std::vector<std::string>> mixes = {
      {"replicated"}, {"dispatch", "replicated", "hybrid", "distributed", "localized:" + std::to_string(w.size - 1)}};
  for (const std::vector<std::string>& p : mixes) {
    CollectionConfig cfg = make_config(seed, p);
    Data data(seed ^ 0x9e9, kTables, kSlots);
    Data sample = data;
    Plan plan = plan_for(cfg, w, sample);
    EmbeddingCollection plain(w.comm, w.communicator.get(), w.dev, cfg, plan);
    EmbeddingCollection prep(w.comm, w.communicator.get(), w.dev, cfg, plan);
    const int64_t width = plain.output_width();
    Batch first = data.next(3 * w.size + 1);
    for (int step = 1; step <= 3; ++step) {
      Batch b = step == 1 ? first : data.next(3 * w.size + 2);
      Slice s = slice_of(b.samples, w.rank, w.size);
      LocalBatch lb(w.dev, b, s);
      std::vector<float> grad(size_t(b.samples * width));
      for (float& x : grad) x = std::uniform_real_distribution<float>(-1, 1)(data.g);
      std::vector<float> mine(grad.begin() + s.first * width, grad.begin() + (s.first + s.count) * width);
      if (mine.empty()) mine.push_back(0.f);
      Buffer<float> g(w.dev, mine);
      Buffer<float> out(w.dev, size_t(std::max<int64_t>(1, s.count * width)));
      if (step == 2) {  // a prepared forward of the first batch, then this step's forward unprepared
        Slice s1 = slice_of(first.samples, w.rank, w.size);
        LocalBatch lb1(w.dev, first, s1);
        Buffer<float> out1(w.dev, size_t(std::max<int64_t>(1, s1.count * width)));
        prep.forward(lb1.offsets.data(), lb1.keys.data(), s1.count, out1.data());
        prep.prepare_backward();
        prep.forward(lb.offsets.data(), lb.keys.data(), s.count, out.data());
      } else {
        prep.forward(lb.offsets.data(), lb.keys.data(), s.count, out.data());
        prep.prepare_backward();
      }
      prep.backward(g.data(), step);
      plain.forward(lb.offsets.data(), lb.keys.data(), s.count, out.data());
      plain.backward(g.data(), step);
    }
    auto [diff, compared] = differing_rows(plain, prep, cfg, w.comm);
    BOOST_CHECK_GT(compared, 0);
    BOOST_CHECK_MESSAGE(diff == 0, p[0] << (p.size() > 1 ? "+..." : "") << ": " << diff
                                        << " rows differ with prepare_backward");
  }
}
SPARTA_MPI_BACKEND_CASES(prepare_backward_changes_no_bit, prepared_backward_equals_backward)

// A collection's shape for the cases that compare two ways of running it: placements, tables, wire and output.
struct WireCase {
  std::vector<std::string> placements;
  std::vector<TableDef> defs;
  int slots;
  DataType wire;
  OutputType output;
};

// n gradient values uniform in [-1, 1), in the output's type (f32, or bf16's bits), on the device.
Buffer<uint16_t> random_gradient(const Device& dev, size_t n, OutputType output, std::mt19937_64& g) {
  const bool f32 = output == OutputType::f32;
  std::vector<uint16_t> grad(f32 ? 2 * n : n);
  for (size_t i = 0; i < n; ++i) {
    const float x = std::uniform_real_distribution<float>(-1, 1)(g);
    if (f32)
      std::memcpy(&grad[2 * i], &x, 4);
    else
      grad[i] = float_to_bf16(x);
  }
  return Buffer<uint16_t>(dev, grad);
}

// Routing a batch ahead (EmbeddingCollection::route_ahead: between a step's forward and its backward, the next
// step's batch) changes no bit: forward outputs at every step and the tables after four steps equal a twin's that
// routes every batch at its forward. In between: an evaluation forward of another batch after a backward (it
// must leave the routed batch's cut and route alone), a route ahead replaced by another before any forward takes
// it. The route is taken, not redone: a forward that starts from one marks no key sort
// of its own (the trace), while the route ahead did. After the backward of steps 1 and 3 the next batch is also
// looked up ahead (look_up_ahead: where every group routes ahead), and a forward or a route ahead of
// another batch before its own forward is an error on every rank. A batch with bad offsets on one rank is refused on every rank
// (false), and its forward throws the usual error.
void route_ahead_equals_plain(Backend backend) {
  const uint64_t seed = shared_seed();
  World w(backend, testing::world_size());
  const std::string last = "localized:" + std::to_string(w.size - 1);
  const std::vector<WireCase> cases = {
      {{"dispatch", "replicated", "hybrid", "distributed", last}, kTables, kSlots, DataType::f32, OutputType::f32},
      {{"dispatch", "replicated", "dispatch", "replicated", "dispatch"}, kTables, kSlots, DataType::bf16, OutputType::bf16},
      {{"dispatch", "dispatch", "replicated", "dispatch", "dispatch", "dispatch"}, kGrouped, kGroupedSlots,
       DataType::f32, OutputType::f32},
      {{"dispatch", "dispatch", "dispatch", "replicated", "replicated", "dispatch"}, grouped_direct(), kGroupedSlots,
       DataType::f32, OutputType::f32}};
  for (const WireCase& k : cases) {
    CollectionConfig cfg = make_config(seed, k.placements, k.defs, k.slots);
    cfg.exchange = k.wire;
    cfg.output = k.output;
    Data data(seed ^ 0xa4ead, k.defs, k.slots);
    Data sample = data;
    Plan plan = plan_for(cfg, w, sample);
    EmbeddingCollection ahead(w.comm, w.communicator.get(), w.dev, cfg, plan);
    EmbeddingCollection plain(w.comm, w.communicator.get(), w.dev, cfg, plan);
    const int64_t width = ahead.output_width();
    const size_t value_bytes = k.output == OutputType::f32 ? 4 : 2;
    const std::string what = k.placements[0] + "+... (" + dtype_name(k.wire) + ")";
    // every batch on the device until the end: a batch routed ahead must stay where it was
    std::vector<std::unique_ptr<LocalBatch>> batches;
    auto upload = [&](int64_t samples) {
      Batch b = data.next(samples);
      batches.push_back(std::make_unique<LocalBatch>(w.dev, b, slice_of(b.samples, w.rank, w.size)));
      return batches.back().get();
    };
    constexpr int kSteps = 4;
    std::vector<LocalBatch*> train;
    for (int i = 0; i < kSteps; ++i) train.push_back(upload(3 * w.size + 1 + i % 2));
    LocalBatch* eval = upload(2 * w.size + 1);
    LocalBatch* dropped = upload(w.size + 1);
    int64_t out_diff = 0, refused = 0, resorted = 0, routed_sorts = 0;
    // (hybrid routes its cold keys with dispatch's route, at its forward: no route ahead)
    const bool dispatching = std::count(k.placements.begin(), k.placements.end(), "dispatch") > 0 &&
                             std::count(k.placements.begin(), k.placements.end(), "hybrid") == 0;
    // the output of a forward looked up ahead: the buffer look_up_ahead was given
    std::unique_ptr<Buffer<uint16_t>> ahead_out;
    int64_t looked_up = 0;
    const bool may_look_up = std::all_of(k.placements.begin(), k.placements.end(), [](const std::string& p) {
                               return p == "dispatch" || p == "replicated";
                             });
    auto run_forward = [&](EmbeddingCollection& c, const LocalBatch& lb, LookupMode mode, Buffer<uint16_t>* given) {
      const size_t n = size_t(std::max<int64_t>(1, lb.count * width));
      Buffer<uint16_t> own(w.dev, given ? 1 : n * value_bytes / 2);
      Buffer<uint16_t>& out = given ? *given : own;
      if (!given) out.fill_bytes(0xFF);
      c.forward(lb.offsets.data(), lb.keys.data(), lb.count, static_cast<void*>(out.data()), mode);
      return out.download();
    };
    auto sorts_in = [](const std::vector<StreamClock::Point>& pts) {
      int64_t n = 0;
      for (const StreamClock::Point& p : pts) n += p.label == "dispatch: keys sorted";
      return n;
    };
    for (int step = 1; step <= kSteps; ++step) {
      const LocalBatch& lb = *train[size_t(step - 1)];
      Buffer<uint16_t> g = random_gradient(w.dev, size_t(std::max<int64_t>(1, lb.count * width)), k.output, data.g);
      // the forward of a batch routed ahead at the step before (all but the first)
      ahead.trace(true);
      (void)ahead.read_trace();
      if (ahead_out) {  // looked up ahead: another batch's forward or route first is refused everywhere
        const std::string e = error_of([&] { run_forward(ahead, *eval, LookupMode::eval, nullptr); });
        BOOST_CHECK_MESSAGE(e.find("looked up ahead") != std::string::npos, what << ": " << e);
        const std::string r =
            error_of([&] { ahead.route_ahead(eval->offsets.data(), eval->keys.data(), eval->count); });
        BOOST_CHECK_MESSAGE(r.find("looked up ahead") != std::string::npos, what << ": " << r);
      }
      const std::vector<uint16_t> a = run_forward(ahead, lb, LookupMode::train, ahead_out.get());
      ahead_out.reset();
      if (step > 1) resorted += sorts_in(ahead.read_trace());
      const std::vector<uint16_t> p = run_forward(plain, lb, LookupMode::train, nullptr);
      out_diff += a != p;
      if (step < kSteps) {
        if (step == 1) refused += !ahead.route_ahead(dropped->offsets.data(), dropped->keys.data(), dropped->count);
        const LocalBatch& next = *train[size_t(step)];
        refused += !ahead.route_ahead(next.offsets.data(), next.keys.data(), next.count);
        routed_sorts += sorts_in(ahead.read_trace());
      }
      ahead.trace(false);
      ahead.backward(static_cast<const void*>(g.data()), step);
      plain.backward(static_cast<const void*>(g.data()), step);
      if (step == 2)
        out_diff += run_forward(ahead, *eval, LookupMode::eval, nullptr) !=
                    run_forward(plain, *eval, LookupMode::eval, nullptr);
      else if (step < kSteps) {  // the next batch's lookups now; its forward pools into this buffer
        const size_t n = size_t(std::max<int64_t>(1, train[size_t(step)]->count * width));
        ahead_out = std::make_unique<Buffer<uint16_t>>(w.dev, n * value_bytes / 2);
        ahead_out->fill_bytes(0xFF);
        const bool ok = ahead.look_up_ahead(static_cast<void*>(ahead_out->data()));
        looked_up += ok;
        if (!ok) ahead_out.reset();
      }
    }
    MPI_Allreduce(MPI_IN_PLACE, &out_diff, 1, MPI_INT64_T, MPI_SUM, w.comm);
    auto [diff, compared] = differing_rows(ahead, plain, cfg, w.comm);
    BOOST_CHECK_GT(compared, 0);
    BOOST_CHECK_MESSAGE(refused == 0, what << ": " << refused << " good batches refused");
    BOOST_CHECK_MESSAGE(looked_up == (may_look_up ? 2 : 0), what << ": " << looked_up << " batches looked up ahead");
    BOOST_CHECK_MESSAGE(out_diff == 0, what << ": " << out_diff << " forward outputs differ with route ahead");
    BOOST_CHECK_MESSAGE(diff == 0, what << ": " << diff << " rows differ with route ahead");
    if (dispatching) {
      BOOST_CHECK_MESSAGE(resorted == 0, what << ": " << resorted << " keys' sorts in forwards routed ahead");
      BOOST_CHECK_MESSAGE(routed_sorts > 0, what << ": no keys' sort in the routes ahead");
    }
  }
  // a bad batch on rank 0 only: refused everywhere, then its forward fails everywhere with the offsets' error
  CollectionConfig cfg = make_config(seed, {"dispatch", "replicated"});
  Data data(seed ^ 0xbad0, kTables, kSlots);
  Data sample = data;
  Plan plan = plan_for(cfg, w, sample);
  EmbeddingCollection coll(w.comm, w.communicator.get(), w.dev, cfg, plan);
  Batch b = data.next(3 * w.size);
  if (w.rank == 0) b.offsets[2] = b.offsets[1] + 5, b.offsets[3] = b.offsets[1];  // row 2 decreases
  LocalBatch lb(w.dev, b, slice_of(b.samples, w.rank, w.size));
  BOOST_CHECK(!coll.route_ahead(lb.offsets.data(), lb.keys.data(), lb.count));
  Buffer<float> out(w.dev, size_t(std::max<int64_t>(1, lb.count * coll.output_width())));
  const std::string e = error_of([&] { coll.forward(lb.offsets.data(), lb.keys.data(), lb.count, out.data()); });
  BOOST_CHECK_MESSAGE(e.find("offsets decrease") != std::string::npos, e);
}
SPARTA_MPI_BACKEND_CASES(route_ahead_changes_no_bit, route_ahead_equals_plain)

// The step's timeline (EmbeddingCollection::trace): points from the start of the forward to the end of the
// update, the first at 0, every one finite and not negative, a stream's later points not earlier (the compute
// stream's forward and backward), the grouped localized exchange's point on the communication stream with more
// than one rank; nothing while off. Marking changes no bit: forward outputs and tables equal an untraced twin's.
void trace_marks_the_step(Backend backend) {
  const uint64_t seed = shared_seed();
  World w(backend, testing::world_size());
  const std::string last = "localized:" + std::to_string(w.size - 1);
  CollectionConfig cfg = make_config(seed, {"dispatch", "localized:0", "replicated", "distributed", last});
  Data data(seed ^ 0x7ace);
  Data sample = data;
  Plan plan = plan_for(cfg, w, sample);
  EmbeddingCollection traced(w.comm, w.communicator.get(), w.dev, cfg, plan);
  EmbeddingCollection plain(w.comm, w.communicator.get(), w.dev, cfg, plan);
  const int64_t width = traced.output_width();
  int64_t out_diff = 0;
  for (int step = 1; step <= 3; ++step) {
    const bool on = step != 2;  // on, off, on again
    traced.trace(on);
    Batch b = data.next(3 * w.size + 1);
    Slice sl = slice_of(b.samples, w.rank, w.size);
    LocalBatch lb(w.dev, b, sl);
    const size_t n = size_t(std::max<int64_t>(1, sl.count * width));
    Buffer<float> g(w.dev, testing::random_floats(n));
    std::vector<std::vector<float>> outs;
    for (EmbeddingCollection* c : {&traced, &plain}) {
      Buffer<float> out(w.dev, n);
      out.fill_bytes(0xFF);
      c->forward(lb.offsets.data(), lb.keys.data(), sl.count, out.data());
      outs.push_back(out.download());
      c->backward(g.data(), step);
    }
    out_diff += std::memcmp(outs[0].data(), outs[1].data(), n * 4) != 0;
    const std::vector<StreamClock::Point> pts = traced.read_trace();
    if (!on) {
      BOOST_CHECK_MESSAGE(pts.empty(), "step " << step << ": " << pts.size() << " points while the trace is off");
      continue;
    }
    std::map<std::string, double> at;
    for (const StreamClock::Point& p : pts) {
      BOOST_CHECK_MESSAGE(std::isfinite(p.ms) && p.ms >= 0, p.label << " at " << p.ms << " ms");
      at[p.label] = p.ms;
    }
    BOOST_REQUIRE(!pts.empty());
    BOOST_CHECK_EQUAL(pts.front().label, "forward");
    BOOST_CHECK_EQUAL(pts.front().ms, 0.0);
    for (const char* label : {"forward: batch checked", "forward: pooled", "backward", "backward: updated"})
      BOOST_CHECK_MESSAGE(at.count(label) == 1, "no point '" << label << "'");
    BOOST_CHECK_LE(at["forward: batch checked"], at["forward: pooled"]);
    BOOST_CHECK_LE(at["forward: pooled"], at["backward"]);
    BOOST_CHECK_LE(at["backward"], at["backward: updated"]);
    if (w.size > 1) {
      BOOST_CHECK_MESSAGE(at.count("localized: vectors exchanged") == 1, "no point of the localized exchange");
      BOOST_CHECK_MESSAGE(at.count("localized: other ranks' bags pooled") == 1, "no point of the owner's lookup");
      BOOST_CHECK_LE(at["localized: other ranks' bags pooled"], at["forward: pooled"]);
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, &out_diff, 1, MPI_INT64_T, MPI_SUM, w.comm);
  auto [diff, compared] = differing_rows(traced, plain, cfg, w.comm);
  BOOST_CHECK_GT(compared, 0);
  BOOST_CHECK_MESSAGE(out_diff == 0, out_diff << " forward outputs differ with the trace on");
  BOOST_CHECK_MESSAGE(diff == 0, diff << " rows differ with the trace on");
}
SPARTA_MPI_BACKEND_CASES(trace_changes_no_bit, trace_marks_the_step)

// GroupSums::prepare (dispatch queues it while the forward's vectors travel) changes no bit: after the prepare of
// the same batch, a sum only reduces, and equals a sum with no prepare; after the prepare of another batch (other
// ids, another length), a sum does both parts and is that batch's own. Each against the sums computed here in key
// order (groups of at most 128 keys: one item, added one after the other from 0.0f), sum and mean. Every rank on
// its own (an exchange of one rank).
void group_sums_prepare(Backend backend) {
  World w(backend, testing::world_size());
  Exchange ex(nullptr, w.dev, MPI_COMM_SELF);
  const int dim = 8;
  struct Case {
    std::vector<int64_t> offsets, ids;
    std::vector<float> grad;
    int64_t bags, groups;
  };
  auto make = [&](int64_t bags, int64_t groups) {
    Case c;
    c.bags = bags;
    c.groups = groups;
    c.offsets.push_back(0);
    for (int64_t b = 0; b < bags; ++b) c.offsets.push_back(c.offsets.back() + testing::random_ints(1, 0, 25)[0]);
    c.ids = testing::random_ints(size_t(std::max<int64_t>(1, c.offsets.back())), 0, groups - 1);
    c.grad = testing::random_floats(size_t(bags * dim));
    return c;
  };
  // expected: the groups with keys, ascending, and each one's sum in key order
  auto want = [&](const Case& c, Combiner combiner) {
    std::map<int64_t, std::vector<float>> sums;
    for (int64_t b = 0; b < c.bags; ++b)
      for (int64_t i = c.offsets[size_t(b)]; i < c.offsets[size_t(b) + 1]; ++i) {
        std::vector<float>& s = sums[c.ids[size_t(i)]];
        s.resize(size_t(dim), 0.0f);
        const float scale = 1.0f / float(c.offsets[size_t(b) + 1] - c.offsets[size_t(b)]);
        for (int e = 0; e < dim; ++e) {
          const float g = c.grad[size_t(b * dim + e)];
          s[size_t(e)] += combiner == Combiner::mean ? g * scale : g;
        }
      }
    return sums;
  };
  for (Combiner combiner : {Combiner::sum, Combiner::mean}) {
    const Case a = make(40, 60), other = make(33, 50);
    BOOST_REQUIRE_LE(*std::max_element(a.ids.begin(), a.ids.end()), 59);
    const int64_t n = a.offsets.back(), n_other = other.offsets.back();
    Buffer<int64_t> off(w.dev, a.offsets), ids(w.dev, a.ids), off2(w.dev, other.offsets), ids2(w.dev, other.ids);
    Buffer<float> grad(w.dev, a.grad);
    const std::map<int64_t, std::vector<float>> expect = want(a, combiner);
    auto check = [&](GroupSums& gs, const char* what) {
      synchronize(w.dev);
      int32_t count = 0;
      copy_to_host(w.dev, &count, gs.count(), sizeof(count));
      BOOST_REQUIRE_EQUAL(size_t(count), expect.size());
      std::vector<int64_t> groups(static_cast<size_t>(count));
      std::vector<float> sums(static_cast<size_t>(count) * dim);
      copy_to_host(w.dev, groups.data(), gs.groups(), groups.size() * sizeof(int64_t));
      copy_to_host(w.dev, sums.data(), gs.sums(), sums.size() * sizeof(float));
      size_t wrong = 0, u = 0;
      for (const auto& [g, s] : expect) {
        wrong += groups[u] != g;
        wrong += std::memcmp(s.data(), &sums[u * dim], sizeof(float) * dim) != 0;
        ++u;
      }
      BOOST_CHECK_MESSAGE(wrong == 0, what << ", " << combiner_name(combiner) << ": " << wrong << " wrong");
    };
    GroupSums plain(ex, dim), prepared(ex, dim), stale(ex, dim);
    plain.sum(off.data(), a.bags, ids.data(), n, a.groups, grad.data(), combiner);
    check(plain, "no prepare");
    prepared.prepare(off.data(), a.bags, ids.data(), n, a.groups, combiner);
    prepared.sum(off.data(), a.bags, ids.data(), n, a.groups, grad.data(), combiner);
    check(prepared, "prepared");
    stale.prepare(off2.data(), other.bags, ids2.data(), n_other, other.groups, combiner);
    stale.sum(off.data(), a.bags, ids.data(), n, a.groups, grad.data(), combiner);
    check(stale, "another batch prepared");
  }
}
SPARTA_MPI_BACKEND_CASES(group_sums_prepare_changes_no_bit, group_sums_prepare)

// count_keys merges every rank's counts: the same statistics as counting the global sample by hand.
BOOST_AUTO_TEST_CASE(key_statistics_merge_every_rank) {
  const uint64_t seed = shared_seed();
  World w(Backend::cpu, testing::world_size());
  CollectionConfig cfg = make_config(seed, {"auto"});
  Data data(seed);
  Batch b = data.next(5 * w.size + 2);
  Slice s = slice_of(b.samples, w.rank, w.size);
  const int64_t r0 = s.first * kSlots, r1 = (s.first + s.count) * kSlots;
  std::vector<int64_t> off(b.offsets.begin() + r0, b.offsets.begin() + r1 + 1);
  for (int64_t& x : off) x -= b.offsets[size_t(r0)];
  std::vector<int64_t> keys(b.keys.begin() + b.offsets[size_t(r0)], b.keys.begin() + b.offsets[size_t(r1)]);
  std::vector<TableKeyStats> st = count_keys(w.comm, cfg, off, keys, s.count, 1000);
  BOOST_REQUIRE_EQUAL(st.size(), cfg.tables.size());
  for (size_t t = 0; t < cfg.tables.size(); ++t) {
    std::map<int64_t, int64_t> c;
    int64_t n = 0;
    for (int64_t smp = 0; smp < b.samples; ++smp)
      for (int slot : cfg.tables[t].slots)
        for (int64_t i = b.offsets[size_t(smp * kSlots + slot)]; i < b.offsets[size_t(smp * kSlots + slot) + 1]; ++i)
          ++c[b.keys[size_t(i)]], ++n;
    BOOST_CHECK_EQUAL(st[t].samples, b.samples);
    BOOST_CHECK_EQUAL(st[t].keys, n);
    BOOST_CHECK_EQUAL(st[t].top.size(), c.size());
    for (size_t i = 0; i < st[t].top.size(); ++i) {
      BOOST_CHECK_EQUAL(st[t].top[i].second, c[st[t].top[i].first]);
      if (i > 0) {
        const auto& a = st[t].top[i - 1];
        const auto& z = st[t].top[i];
        BOOST_CHECK(a.second > z.second || (a.second == z.second && a.first < z.first));
      }
    }
  }
  // table 0's hot key is in every nonempty sample: it comes first
  BOOST_CHECK_EQUAL(st[0].top[0].first, data.pools[0][0]);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// 16-bit storage (src/embedding_table.h EmbeddingTableConfig::storage): every placement on this world against the
// same collection on one rank, given the same global batches and gradients. Where a row's gradient is summed in
// the same order on any number of ranks (localized: the owner takes every bag's gradient in rank order, which is
// the global batch's order) the rows are the same bits; elsewhere (dispatch, replicated and hybrid sum each rank's
// keys first, distributed pools partial sums) an fp32 sum that differs in its last bit may round to the other 16-bit
// neighbour and draws other random bits. The gradients do not depend on the values, so the two runs' values part
// by at most one 16-bit gap a step, the gap at the magnitude the value had then (a tiny table's rows swing far from
// where they end): D_t = D_{t-1} + eps (|v_t| + D_{t-1}) + fp32 slack, with v_t the one-rank run's value after step
// t, eps 2^-7 (bf16) or 2^-10 (fp16); fp32 state takes fp32 slack only. A lost or misrouted gradient moves a value
// by lr 0.5 x a gradient in [-1, 1]. Every copy of a row on any rank is the same bits.

namespace {

const std::vector<TableDef> k16Tables = {
    {"user", 1000, 8, Combiner::sum, OptimizerKind::sgd, {0}, 300},
    {"item", 500, 4, Combiner::mean, OptimizerKind::rowwise_adagrad, {1, 2}, 200},
    {"tiny", 3, 6, Combiner::sum, OptimizerKind::sgd, {3}, 3},
    {"geo", 200, 8, Combiner::mean, OptimizerKind::rowwise_adagrad, {4}, 100},
    {"cat", 400, 2, Combiner::sum, OptimizerKind::sgd, {5}, 150},
};

CollectionConfig config_16(uint64_t seed, const std::vector<std::string>& placements) {
  CollectionConfig c = make_config(seed, placements, k16Tables);
  for (size_t i = 0; i < c.tables.size(); ++i) c.tables[i].storage = i % 2 ? RowStorage::fp16 : RowStorage::bf16;
  return c;
}

// Steps of global batches whose size does not depend on the world, a random gradient each.
// after_step (optional) runs after each step, on every rank.
void train_plain(EmbeddingCollection& coll, Data& data, const World& w, int steps, int64_t first_step,
                 const std::function<void()>& after_step = {}) {
  const int64_t width = coll.output_width();
  for (int step = 0; step < steps; ++step) {
    const int64_t samples = 10 + std::uniform_int_distribution<int64_t>(0, 6)(data.g);
    Batch b = data.next(samples);
    std::vector<float> grad(size_t(samples * width));
    for (float& x : grad) x = std::uniform_real_distribution<float>(-1, 1)(data.g);
    Slice s = slice_of(samples, w.rank, w.size);
    LocalBatch lb(w.dev, b, s);
    Buffer<float> out(w.dev, size_t(std::max<int64_t>(1, s.count * width)));
    coll.forward(lb.offsets.data(), lb.keys.data(), s.count, out.data());
    std::vector<float> mine(grad.begin() + s.first * width, grad.begin() + (s.first + s.count) * width);
    if (mine.empty()) mine.push_back(0.f);
    Buffer<float> g(w.dev, mine);
    coll.backward(g.data(), first_step + step);
    if (after_step) after_step();
  }
}

// Every table's rows over the ranks, on rank 0: key -> values, state (the first copy of a key). Counts the copies
// of a key that differ from its first in any bit (on rank 0; 0 elsewhere).
using RowsByKey = std::map<int64_t, std::vector<float>>;
std::vector<RowsByKey> gather_rows(EmbeddingCollection& coll, const World& w, size_t tables, size_t& differing) {
  std::vector<RowsByKey> out(tables);
  differing = 0;
  for (size_t t = 0; t < tables; ++t) {
    TableRows r = coll.held_rows(int(t));
    const int width = r.dim + r.state_width;
    std::vector<float> mine;
    for (size_t i = 0; i < r.rows(); ++i) {
      mine.insert(mine.end(), r.values.begin() + i * r.dim, r.values.begin() + (i + 1) * r.dim);
      mine.insert(mine.end(), r.state.begin() + i * r.state_width, r.state.begin() + (i + 1) * r.state_width);
    }
    int n = int(r.rows());
    std::vector<int> counts(size_t(w.size)), first(size_t(w.size), 0);
    MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, w.comm);
    for (int i = 1; i < w.size; ++i) first[size_t(i)] = first[size_t(i) - 1] + counts[size_t(i) - 1];
    const int total = first.back() + counts.back();
    std::vector<int64_t> keys(size_t(std::max(1, total)));
    std::vector<float> vals(size_t(std::max(1, total * width)));
    MPI_Gatherv(r.keys.data(), n, MPI_INT64_T, keys.data(), counts.data(), first.data(), MPI_INT64_T, 0, w.comm);
    std::vector<int> vcounts = counts, vfirst = first;
    for (int& x : vcounts) x *= width;
    for (int& x : vfirst) x *= width;
    MPI_Gatherv(mine.data(), n * width, MPI_FLOAT, vals.data(), vcounts.data(), vfirst.data(), MPI_FLOAT, 0, w.comm);
    if (w.rank != 0) continue;
    for (int i = 0; i < total; ++i) {
      std::vector<float> v(vals.begin() + size_t(i) * width, vals.begin() + size_t(i + 1) * width);
      auto [it, fresh] = out[t].try_emplace(keys[size_t(i)], v);
      if (!fresh) differing += std::memcmp(it->second.data(), v.data(), sizeof(float) * size_t(width)) != 0;
    }
  }
  return out;
}

// The bound above, element by element (key -> the row's values then its state), grown by one step of the one-rank
// run whose rows after that step are rows.
void grow_bound(std::vector<RowsByKey>& bound, const std::vector<RowsByKey>& rows, const CollectionConfig& c) {
  for (size_t t = 0; t < rows.size(); ++t) {
    const double eps = c.tables[t].storage == RowStorage::bf16 ? 0x1p-7 : 0x1p-10;
    const size_t dim = size_t(c.tables[t].dim);
    for (const auto& [k, v] : rows[t]) {
      std::vector<float>& d = bound[t].try_emplace(k, v.size(), 0.f).first->second;
      for (size_t e = 0; e < v.size(); ++e) {
        const double m = std::fabs(double(v[e])), slack = 1e-5 * (m + 1);
        d[e] = float(e < dim ? d[e] + eps * (m * (1 + eps) + d[e]) + slack + 0x1p-24 : d[e] + slack);
      }
    }
  }
}

// Values and state of rank 0's gathered rows against the one-rank run's: exact, or within bound (same layout).
void compare_gathered(const std::vector<RowsByKey>& got, const std::vector<RowsByKey>& want, bool exact,
                      const std::string& what, const std::vector<RowsByKey>* bound = nullptr) {
  for (size_t t = 0; t < got.size(); ++t) {
    size_t missing = 0, bad = 0;
    for (const auto& [k, v] : want[t]) {
      auto it = got[t].find(k);
      if (it == got[t].end() || it->second.size() != v.size()) {
        ++missing;
        continue;
      }
      const std::vector<float>* d = nullptr;
      if (!exact) {
        auto b = bound->at(t).find(k);
        BOOST_REQUIRE(b != bound->at(t).end());
        d = &b->second;
      }
      for (size_t e = 0; e < v.size(); ++e) {
        const float g = it->second[e];
        const bool ok = exact ? std::memcmp(&g, &v[e], sizeof g) == 0 : std::fabs(double(g) - v[e]) <= (*d)[e];
        if (!ok && bad++ < 5)
          BOOST_TEST_MESSAGE(what << " table " << k16Tables[t].name << " key " << k << "[" << e << "] = " << g
                                  << ", expected " << v[e] << (exact ? " bit for bit" : " within ")
                                  << (exact ? 0.f : (*d)[e]));
      }
    }
    const std::string name = what + " table " + k16Tables[t].name;
    BOOST_CHECK_MESSAGE(missing == 0 && got[t].size() == want[t].size(),
                        name << ": " << got[t].size() << " rows, the one-rank run has " << want[t].size());
    BOOST_CHECK_MESSAGE(bad == 0, name << ": " << bad << " elements differ" << (exact ? "" : " beyond the bound"));
  }
}

void sixteen_bit_against_one_rank(Backend backend, const std::vector<std::string>& placements) {
  const uint64_t seed = shared_seed();
  CollectionConfig cfg = config_16(seed, placements);
  const Data start(seed ^ 0x16B1, k16Tables);
  const int steps = 4;
  std::vector<RowsByKey> many;
  bool exact = true;
  {
    World w(backend, testing::world_size());
    Data d = start, sample = start;
    Plan plan = plan_for(cfg, w, sample);
    for (const TablePlan& p : plan.tables)
      exact = exact && (w.size == 1 || p.placement == Placement::localized);
    EmbeddingCollection coll(w.comm, w.communicator.get(), w.dev, cfg, plan);
    train_plain(coll, d, w, steps, 1);
    size_t differing = 0;
    many = gather_rows(coll, w, cfg.tables.size(), differing);
    BOOST_CHECK_MESSAGE(differing == 0, placements[0] << ": " << differing << " copies of a row differ from its first");
  }
  World one(backend, 1);
  if (one.in()) try {
    std::vector<std::string> p1 = placements;  // one rank owns every localized table
    for (std::string& p : p1)
      if (p.rfind("localized", 0) == 0) p = "localized:0";
    CollectionConfig c1 = config_16(seed, p1);
    Data d = start, sample = start;
    Plan plan = plan_for(c1, one, sample);
    EmbeddingCollection coll(one.comm, one.communicator.get(), one.dev, c1, plan);
    std::vector<RowsByKey> bound(c1.tables.size());
    size_t differing = 0;
    train_plain(coll, d, one, steps, 1, [&] { grow_bound(bound, gather_rows(coll, one, c1.tables.size(), differing), c1); });
    std::vector<RowsByKey> single = gather_rows(coll, one, c1.tables.size(), differing);
    compare_gathered(many, single, exact,
                     placements[0] + " on " + std::to_string(testing::world_size()) + " rank(s) against one", &bound);
  } catch (const Error& e) {
    BOOST_ERROR("one rank: " << e.what());
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

void sixteen_bit_every_placement(Backend b) {
  for (const char* p : {"dispatch", "replicated", "distributed", "hybrid"}) sixteen_bit_against_one_rank(b, {p});
  std::vector<std::string> owners;
  for (int i = 0; i < 5; ++i) owners.push_back("localized:" + std::to_string(i % testing::world_size()));
  sixteen_bit_against_one_rank(b, owners);
}

// A 16-bit collection saved on this world, loaded on 1..world ranks with another plan into the same storage (the
// same bits), into fp32 (the same values, widened) and into the other 16-bit type (rounded to nearest).
void sixteen_bit_checkpoint(Backend backend) {
  const uint64_t seed = shared_seed();
  testing::SharedTempPath root("mpi_collection", "ckpt16");
  CollectionConfig cfg = config_16(seed, {"hybrid", "dispatch", "localized:0", "replicated", "distributed"});
  std::vector<RowsByKey> saved;
  {
    World w(backend, testing::world_size());
    Data d(seed ^ 0xC16, k16Tables), sample = d;
    Plan plan = plan_for(cfg, w, sample);
    EmbeddingCollection coll(w.comm, w.communicator.get(), w.dev, cfg, plan);
    train_plain(coll, d, w, 3, 1);
    CheckpointMeta meta;
    meta.step = 3;
    coll.save(root.path, meta);
    size_t differing = 0;
    saved = gather_rows(coll, w, cfg.tables.size(), differing);
  }
  for (int ranks = 1; ranks <= testing::world_size(); ++ranks) {
    World w(backend, ranks);
    for (int into = 0; into < 3; ++into) {
      if (w.in()) try {
        CollectionConfig c = config_16(seed, plan_b(ranks));
        std::vector<RowsByKey> want = saved;
        for (size_t t = 0; t < c.tables.size(); ++t) {
          const RowStorage from = c.tables[t].storage;
          const RowStorage to = into == 0 ? from : into == 1 ? RowStorage::fp32
                                : from == RowStorage::bf16 ? RowStorage::fp16 : RowStorage::bf16;
          c.tables[t].storage = to;
          if (to == RowStorage::fp32 || to == from) continue;
          for (auto& [k, v] : want[t])
            for (int e = 0; e < c.tables[t].dim; ++e)
              v[size_t(e)] = to == RowStorage::bf16 ? bf16_to_float(float_to_bf16(v[size_t(e)]))
                                                     : f16_to_float(float_to_f16(v[size_t(e)]));
        }
        Data sample(seed ^ 0xC16, k16Tables);
        Plan plan = plan_for(c, w, sample);
        EmbeddingCollection coll(w.comm, w.communicator.get(), w.dev, c, plan);
        coll.load(root.path);
        size_t differing = 0;
        std::vector<RowsByKey> got = gather_rows(coll, w, c.tables.size(), differing);
        if (w.rank == 0)
          compare_gathered(got, want, true, "loaded on " + std::to_string(ranks) + " rank(s), storage case " +
                                                std::to_string(into));
      } catch (const Error& e) {
        BOOST_ERROR("loaded on " << ranks << " rank(s): " << e.what());
      }
      MPI_Barrier(MPI_COMM_WORLD);
    }
  }
}

}  // namespace

SPARTA_MPI_BACKEND_CASES(sixteen_bit_storage_every_placement_against_one_rank, sixteen_bit_every_placement)
SPARTA_MPI_BACKEND_CASES(sixteen_bit_checkpoint_loads_into_every_storage_and_world_size, sixteen_bit_checkpoint)
