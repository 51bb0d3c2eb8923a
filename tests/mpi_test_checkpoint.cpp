// io/checkpoint under MPI: exact round trips, loading onto other world sizes and placements (sub-communicators
// of 1..4 ranks, written by 1..4), the single-process tools on what was written, and bad input: every error
// thrown on every rank, naming the file and field, and the previous checkpoint left whole. Failures on one rank
// only, at each step of a save and a load, reach every rank (no rank waits in a collective); a disk that fills
// at any byte of a save leaves `latest`, the step it names and a step being replaced as they were.
#include <mpi.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "src/base/check.h"
#include "io/checkpoint.h"
#include "io/h5.h"
#include "tests/testing.h"

using namespace sparta;
namespace fs = std::filesystem;

namespace {

// A checkpoint root every rank names alike, unique per test, removed at the end of it.
struct TempRoot : testing::SharedTempPath {
  explicit TempRoot(const std::string& name) : SharedTempPath("mpi_ckpt", name) {}
};

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The whole model (every table's rows), the same on every rank: drawn from a seed rank 0 picks.
struct Model {
  ModelSpec spec;
  std::vector<TableRows> tables;  // all rows
  std::vector<DenseTensor> dense;
  CheckpointMeta meta;
};

Model make_model(int64_t step) {
  uint64_t seed = testing::rng()();
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Model m;
  struct Def {
    const char* name;
    int dim;
    const char* opt;
    int sw;
    int rows;
  };
  const Def defs[] = {{"user", 8, "adam", 16, 300}, {"item", 4, "sgd", 0, 200}, {"geo", 3, "lazy_adam", 7, 57},
                      {"empty", 2, "adagrad", 2, 0}, {"rowwise", 6, "rowwise_adagrad", 1, 90}};
  for (const Def& d : defs) {
    m.spec.tables.push_back({d.name, d.dim, d.opt, d.sw});
    TableRows t;
    t.name = d.name;
    t.dim = d.dim;
    t.optimizer = d.opt;
    t.state_width = d.sw;
    std::set<int64_t> used;
    while (static_cast<int>(t.keys.size()) < d.rows) {
      int64_t k = static_cast<int64_t>(g() >> 2);
      if (used.insert(k).second) t.keys.push_back(k);
    }
    for (int i = 0; i < d.rows * d.dim; ++i) t.values.push_back(u(g));
    for (int i = 0; i < d.rows * d.sw; ++i) t.state.push_back(u(g));
    m.tables.push_back(std::move(t));
  }
  const std::pair<const char*, std::vector<int64_t>> dense[] = {
      {"bottom.w", {4, 3}}, {"bottom.b", {3}}, {"scale", {}}, {"top.adam_m", {2, 2}}};
  for (const auto& d : dense) {
    m.spec.dense.push_back({d.first, d.second});
    DenseTensor x{d.first, d.second, {}};
    int64_t n = 1;
    for (int64_t e : d.second) n *= e;
    for (int64_t i = 0; i < n; ++i) x.data.push_back(u(g));
    m.dense.push_back(x);
  }
  m.meta.step = step;
  m.meta.plan = "user:dispatch item:replicated geo:localized empty:distributed";
  m.meta.config = "model: dlrm\nseed: " + std::to_string(seed);
  m.meta.rng_state = {int64_t(seed >> 1), 17, -3};
  m.meta.reader_position = {step * 64, 2};
  return m;
}

// The rows of t for which keep(key) holds, sorted by key.
TableRows select(const TableRows& t, const std::function<bool(int64_t)>& keep) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < t.rows(); ++i)
    if (keep(t.keys[i])) idx.push_back(i);
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return t.keys[a] < t.keys[b]; });
  TableRows s = t;
  s.keys.clear();
  s.values.clear();
  s.state.clear();
  for (size_t i : idx) {
    s.keys.push_back(t.keys[i]);
    s.values.insert(s.values.end(), t.values.begin() + i * t.dim, t.values.begin() + (i + 1) * t.dim);
    s.state.insert(s.state.end(), t.state.begin() + i * t.state_width, t.state.begin() + (i + 1) * t.state_width);
  }
  return s;
}

// Saves the model over comm, rank r of n writing the rows with key % n == r.
std::string save_model(MPI_Comm comm, const std::string& root, const Model& m,
                       const SaveOptions& opt = SaveOptions()) {
  int r = 0, n = 1;
  MPI_Comm_rank(comm, &r);
  MPI_Comm_size(comm, &n);
  std::vector<TableRows> mine;
  for (const TableRows& t : m.tables) mine.push_back(select(t, [&](int64_t k) { return k % n == r; }));
  return save_checkpoint(comm, root, m.meta, r == 0 ? m.dense : std::vector<DenseTensor>(), mine, opt);
}

void expect_same_rows(const TableRows& got, const TableRows& want, const std::string& what) {
  BOOST_CHECK_EQUAL(got.name, want.name);
  BOOST_CHECK_EQUAL(got.dim, want.dim);
  BOOST_CHECK_EQUAL(got.optimizer, want.optimizer);
  BOOST_CHECK_EQUAL(got.state_width, want.state_width);
  BOOST_CHECK_MESSAGE(got.keys == want.keys, what << ": keys differ (" << got.rows() << " rows, expected "
                                                  << want.rows() << ")");
  BOOST_CHECK_MESSAGE(got.values == want.values, what << ": values differ");
  BOOST_CHECK_MESSAGE(got.state == want.state, what << ": state differs");
}

// Checks a loaded checkpoint on rank r of n against the model and the owner function that loaded it.
void expect_loaded(const LoadedCheckpoint& c, const Model& m, int r, const OwnerFn& owner, int writers) {
  BOOST_CHECK_EQUAL(c.manifest.meta.step, m.meta.step);
  BOOST_CHECK_EQUAL(c.manifest.meta.world_size, writers);
  BOOST_CHECK_EQUAL(c.manifest.meta.plan, m.meta.plan);
  BOOST_CHECK_EQUAL(c.manifest.meta.config, m.meta.config);
  BOOST_CHECK(c.manifest.meta.rng_state == m.meta.rng_state);
  BOOST_CHECK(c.manifest.meta.reader_position == m.meta.reader_position);
  BOOST_CHECK_EQUAL(c.dense.size(), m.dense.size());
  for (size_t i = 0; i < std::min(c.dense.size(), m.dense.size()); ++i) {
    BOOST_CHECK_EQUAL(c.dense[i].name, m.dense[i].name);
    BOOST_CHECK(c.dense[i].shape == m.dense[i].shape);
    BOOST_CHECK_MESSAGE(c.dense[i].data == m.dense[i].data, "dense " << m.dense[i].name << " differs");
  }
  BOOST_CHECK_EQUAL(c.tables.size(), m.tables.size());
  for (size_t t = 0; t < std::min(c.tables.size(), m.tables.size()); ++t) {
    TableRows want = select(m.tables[t], [&](int64_t k) {
      int o = owner(static_cast<int>(t), k);
      return o == r || o == kEveryRank;
    });
    expect_same_rows(c.tables[t], want, "rank " + std::to_string(r) + " table " + m.tables[t].name);
  }
}

// A placement unlike key % n: a hash, with table "item" (index 1) replicated on every rank.
OwnerFn hash_owner(int n) {
  return [n](int table, int64_t key) {
    if (table == 1) return kEveryRank;
    return static_cast<int>(mix(static_cast<uint64_t>(key) + table) % static_cast<uint64_t>(n));
  };
}

// The first k ranks of the world; MPI_COMM_NULL on the others.
MPI_Comm first_ranks(int k) {
  MPI_Comm c;
  MPI_Comm_split(MPI_COMM_WORLD, testing::world_rank() < k ? 0 : MPI_UNDEFINED, testing::world_rank(), &c);
  return c;
}

// Runs f, which must throw sparta::Error containing every needle (on this rank).
template <class F>
void expect_error(F&& f, const std::vector<std::string>& needles) {
  std::string msg;
  bool threw = false;
  try {
    f();
  } catch (const Error& e) {
    threw = true;
    msg = e.what();
  }
  const int rank = testing::world_rank();
  BOOST_CHECK_MESSAGE(threw, "rank " << rank << ": no sparta::Error thrown");
  for (const std::string& n : needles)
    BOOST_CHECK_MESSAGE(msg.find(n) != std::string::npos, "rank " << rank << ": '" << n << "' missing in: " << msg);
  BOOST_TEST_MESSAGE("error as reported: " << msg);
}

OwnerFn mod_owner(int n) {
  return [n](int, int64_t key) { return static_cast<int>(key % n); };
}

void flip_byte(const std::string& path, double where) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  std::streamoff at = static_cast<std::streamoff>(static_cast<double>(f.tellg()) * where);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(~c);
  f.seekp(at);
  f.write(&c, 1);
}

// Runs on rank 0 only, then every rank waits, so the others see the damage. An exception is a failure of the
// case, not a reason to skip the barrier (the other ranks would wait forever).
template <class F>
void on_root(F&& f) {
  if (testing::world_rank() == 0) {
    try {
      f();
    } catch (const std::exception& e) {
      BOOST_ERROR("rank 0: " << e.what());
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace

BOOST_AUTO_TEST_CASE(round_trip_is_exact) {
  TempRoot root("round_trip");
  const int w = testing::world_size(), r = testing::world_rank();
  Model m = make_model(42);
  std::string dir = save_model(MPI_COMM_WORLD, root.path, m);
  BOOST_CHECK_EQUAL(dir, root.path + "/step-42");
  BOOST_CHECK(fs::is_directory(dir));
  BOOST_CHECK(!fs::exists(root.path + "/step-42.tmp"));
  CheckpointList list = list_checkpoints(root.path);
  BOOST_CHECK(list.steps == std::vector<int64_t>{42});
  BOOST_CHECK_EQUAL(list.latest, 42);
  BOOST_CHECK(list.incomplete.empty());
  // By the root (through `latest`) and by the step directory, with the placement it was written with.
  expect_loaded(load_checkpoint(MPI_COMM_WORLD, root.path, m.spec, mod_owner(w)), m, r, mod_owner(w), w);
  expect_loaded(load_checkpoint(MPI_COMM_WORLD, dir, m.spec, mod_owner(w)), m, r, mod_owner(w), w);
}

BOOST_AUTO_TEST_CASE(load_onto_other_world_sizes_and_placements) {
  const int w = testing::world_size(), r = testing::world_rank();
  std::vector<int> writer_sizes{w};
  if (w >= 2) writer_sizes.push_back(w - 1);  // then the load grows the world too
  for (int writers : writer_sizes) {
    TempRoot root("reshard_" + std::to_string(writers));
    Model m = make_model(7 + writers);
    MPI_Comm wc = first_ranks(writers);
    if (wc != MPI_COMM_NULL) {
      save_model(wc, root.path, m);
      MPI_Comm_free(&wc);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (int readers = 1; readers <= w; ++readers) {
      BOOST_TEST_CONTEXT("written by " << writers << " ranks, loaded on " << readers) {
        MPI_Comm rc = first_ranks(readers);
        if (rc != MPI_COMM_NULL) {
          expect_loaded(load_checkpoint(rc, root.path, m.spec, hash_owner(readers)), m, r, hash_owner(readers),
                        writers);
          MPI_Comm_free(&rc);
        }
        MPI_Barrier(MPI_COMM_WORLD);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(latest_moves_and_earlier_steps_stay) {
  TempRoot root("latest");
  const int w = testing::world_size(), r = testing::world_rank();
  Model a = make_model(10), b = make_model(20);
  save_model(MPI_COMM_WORLD, root.path, a);
  save_model(MPI_COMM_WORLD, root.path, b);
  CheckpointList list = list_checkpoints(root.path);
  BOOST_CHECK(list.steps == (std::vector<int64_t>{10, 20}));
  BOOST_CHECK_EQUAL(list.latest, 20);
  expect_loaded(load_checkpoint(MPI_COMM_WORLD, root.path, b.spec, mod_owner(w)), b, r, mod_owner(w), w);
  expect_loaded(load_checkpoint(MPI_COMM_WORLD, root.path + "/step-10", a.spec, mod_owner(w)), a, r, mod_owner(w), w);
  // The latest step is never overwritten; an older one (a run resumed from an earlier step) is replaced.
  expect_error([&] { save_model(MPI_COMM_WORLD, root.path, b); }, {"step-20", "latest checkpoint", "never overwritten"});
  Model a2 = make_model(10);
  save_model(MPI_COMM_WORLD, root.path, a2);
  MPI_Barrier(MPI_COMM_WORLD);  // rank 0 removes the replaced step after the save returned
  BOOST_CHECK_EQUAL(list_checkpoints(root.path).latest, 10);
  BOOST_CHECK(!fs::exists(root.path + "/step-10.replaced"));
  expect_loaded(load_checkpoint(MPI_COMM_WORLD, root.path, a2.spec, mod_owner(w)), a2, r, mod_owner(w), w);
}

BOOST_AUTO_TEST_CASE(single_process_tools_read_what_was_written) {
  TempRoot root("tools");
  Model m = make_model(5);
  std::string dir = save_model(MPI_COMM_WORLD, root.path, m);
  on_root([&] {
    BOOST_CHECK_EQUAL(resolve_checkpoint_dir(root.path), dir);
    VerifyReport v = verify_checkpoint(root.path);
    BOOST_CHECK_MESSAGE(v.ok(), "verify found problems: " << (v.problems.empty() ? "" : v.problems[0]));
    BOOST_CHECK_EQUAL(v.files.size(), static_cast<size_t>(testing::world_size() + 1));
    Manifest man = read_manifest(dir);
    BOOST_CHECK(man.model_spec().tables.size() == m.spec.tables.size());
    for (size_t t = 0; t < m.tables.size(); ++t) {
      TableRows all = read_table(man, m.tables[t].name);
      expect_same_rows(select(all, [](int64_t) { return true; }), select(m.tables[t], [](int64_t) { return true; }),
                       "read_table " + m.tables[t].name);
      std::string out = root.path + "/export_" + m.tables[t].name + ".h5";
      BOOST_CHECK_EQUAL(export_table(root.path, m.tables[t].name, out), static_cast<int64_t>(m.tables[t].rows()));
      h5::File f = h5::open_file(out);
      BOOST_CHECK_EQUAL(h5::read_attr_string(f, "/", "table"), m.tables[t].name);
      TableRows ex = all;
      ex.keys = h5::read_all<int64_t>(f, "/keys");
      ex.values = h5::read_all<float>(f, "/values");
      ex.state = m.tables[t].state_width ? h5::read_all<float>(f, "/state") : std::vector<float>();
      BOOST_CHECK(h5::shape(f, "/state") == (std::vector<hsize_t>{m.tables[t].rows(), hsize_t(m.tables[t].state_width)}));
      expect_same_rows(ex, all, "export " + m.tables[t].name);
    }
    std::vector<DenseTensor> d = read_dense(man);
    BOOST_CHECK_EQUAL(d.size(), m.dense.size());
    for (size_t i = 0; i < std::min(d.size(), m.dense.size()); ++i) BOOST_CHECK(d[i].data == m.dense[i].data);
    expect_error([&] { export_table(root.path, "nope", root.path + "/x.h5"); }, {"table 'nope'", "user, item, geo"});
  });
}

BOOST_AUTO_TEST_CASE(corrupted_shard_is_rejected_on_every_rank) {
  TempRoot root("corrupt");
  const int w = testing::world_size();
  Model m = make_model(3);
  std::string dir = save_model(MPI_COMM_WORLD, root.path, m);
  std::string shard = "shard-" + std::to_string(w - 1) + "-of-" + std::to_string(w) + ".h5";
  on_root([&] { flip_byte(dir + "/" + shard, 0.6); });
  expect_error([&] { load_checkpoint(MPI_COMM_WORLD, root.path, m.spec, mod_owner(w)); },
               {shard, "checksum mismatch", "expected"});
  on_root([&] {
    VerifyReport v = verify_checkpoint(dir);
    BOOST_CHECK(!v.ok());
    BOOST_CHECK(!v.problems.empty() && v.problems[0].find(shard) != std::string::npos);
  });
}

BOOST_AUTO_TEST_CASE(truncated_manifest_is_rejected) {
  TempRoot root("truncated");
  const int w = testing::world_size();
  Model m = make_model(3);
  std::string dir = save_model(MPI_COMM_WORLD, root.path, m);
  on_root([&] { fs::resize_file(dir + "/manifest.h5", fs::file_size(dir + "/manifest.h5") / 2); });
  expect_error([&] { load_checkpoint(MPI_COMM_WORLD, root.path, m.spec, mod_owner(w)); }, {"manifest.h5"});
}

BOOST_AUTO_TEST_CASE(missing_shard_is_rejected) {
  TempRoot root("missing");
  const int w = testing::world_size();
  Model m = make_model(3);
  std::string dir = save_model(MPI_COMM_WORLD, root.path, m);
  std::string shard = "shard-0-of-" + std::to_string(w) + ".h5";
  on_root([&] { fs::remove(dir + "/" + shard); });
  expect_error([&] { load_checkpoint(MPI_COMM_WORLD, root.path, m.spec, mod_owner(w)); }, {shard, "missing"});
}

BOOST_AUTO_TEST_CASE(unknown_version_is_rejected) {
  TempRoot root("version");
  const int w = testing::world_size();
  Model m = make_model(3);
  std::string dir = save_model(MPI_COMM_WORLD, root.path, m);
  on_root([&] {
    {
      h5::File f = h5::open_file(dir + "/manifest.h5", true);
      h5::write_attr(f, "/", "version", int64_t(99));
    }
    // The edit alone is refused by the manifest's checksum (manifest.xxh64) ...
    try {
      read_manifest(dir);
      BOOST_ERROR("an edited manifest was read");
    } catch (const Error& e) {
      BOOST_CHECK_MESSAGE(std::string(e.what()).find("manifest.h5: checksum mismatch") != std::string::npos, e.what());
    }
    reseal_manifest(dir);  // ... and once resealed, by the version check
  });
  expect_error([&] { load_checkpoint(MPI_COMM_WORLD, root.path, m.spec, mod_owner(w)); },
               {"manifest.h5", "'version'", "expected 1", "found 99"});
}

BOOST_AUTO_TEST_CASE(checkpoint_of_another_model_is_rejected) {
  TempRoot root("model");
  const int w = testing::world_size();
  Model m = make_model(3);
  save_model(MPI_COMM_WORLD, root.path, m);
  auto load = [&](const ModelSpec& s) { load_checkpoint(MPI_COMM_WORLD, root.path, s, mod_owner(w)); };
  ModelSpec s = m.spec;
  s.tables[0].dim = 16;
  expect_error([&] { load(s); }, {"manifest.h5", "table 'user'", "'dim'", "expected 16", "found 8"});
  s = m.spec;
  s.tables[2].optimizer = "adam";
  expect_error([&] { load(s); }, {"table 'geo'", "'optimizer'", "expected 'adam'", "found 'lazy_adam'"});
  s = m.spec;  // a full Adagrad table does not load as row-wise: the error names both
  s.tables[3].optimizer = "rowwise_adagrad";
  s.tables[3].state_width = 1;
  expect_error([&] { load(s); }, {"table 'empty'", "'optimizer'", "expected 'rowwise_adagrad'", "found 'adagrad'"});
  s = m.spec;
  s.tables[0].state_width = 8;
  expect_error([&] { load(s); }, {"table 'user'", "'state_width'", "expected 8", "found 16"});
  s = m.spec;
  s.tables.push_back({"extra", 4, "sgd", 0});
  expect_error([&] { load(s); }, {"table 'extra'", "not in the checkpoint"});
  s = m.spec;
  s.tables.erase(s.tables.begin() + 1);
  expect_error([&] { load(s); }, {"table 'item'", "not in the model configuration"});
  s = m.spec;
  s.dense[0].shape = {3, 4};
  expect_error([&] { load(s); }, {"dense tensor 'bottom.w'", "'shape'", "expected [3, 4]", "found [4, 3]"});
}

BOOST_AUTO_TEST_CASE(failed_save_leaves_the_previous_checkpoint) {
  TempRoot root("failed_save");
  const int w = testing::world_size(), r = testing::world_rank();
  Model a = make_model(1), b = make_model(2);
  save_model(MPI_COMM_WORLD, root.path, a);
  // The last rank passes a table whose values do not match its rows.
  std::vector<TableRows> mine;
  for (const TableRows& t : b.tables) mine.push_back(select(t, [&](int64_t k) { return k % w == r; }));
  if (r == w - 1) mine[0].values.pop_back();
  expect_error([&] { save_checkpoint(MPI_COMM_WORLD, root.path, b.meta, r == 0 ? b.dense : std::vector<DenseTensor>(), mine); },
               {"rank " + std::to_string(w - 1), "table 'user'", "'values'"});
  // Tables that differ between ranks (another dim on the last rank), when there are two ranks to differ.
  if (w > 1) {
    mine.clear();
    for (const TableRows& t : b.tables) mine.push_back(select(t, [&](int64_t k) { return k % w == r; }));
    if (r == w - 1) {
      mine[2].dim = 1;
      mine[2].values.resize(mine[2].rows());
    }
    expect_error([&] { save_checkpoint(MPI_COMM_WORLD, root.path, b.meta, r == 0 ? b.dense : std::vector<DenseTensor>(), mine); },
                 {"tables differ between ranks", "geo(dim 1"});
  }
  // A failure on one rank after the step directory exists: the hook throws on the last rank at each stage
  // before the rename; the .tmp directory is removed again.
  for (const char* when : {"tmp_created", "files_written", "manifest_written"}) {
    SaveOptions boom;
    boom.on_stage = [&](const std::string& stage) {
      if (stage == when && r == w - 1) throw Error("planted failure at " + stage);
    };
    expect_error([&] { save_model(MPI_COMM_WORLD, root.path, b, boom); },
                 {"rank " + std::to_string(w - 1), std::string("planted failure at ") + when});
    MPI_Barrier(MPI_COMM_WORLD);  // rank 0 removes the .tmp directory as the error leaves the save
    BOOST_CHECK(!fs::exists(root.path + "/step-2.tmp"));
  }
  // Whatever failed, `latest` and step 1 are as they were, and no step-2 appeared.
  BOOST_CHECK_EQUAL(list_checkpoints(root.path).latest, 1);
  BOOST_CHECK(!fs::exists(root.path + "/step-2"));
  expect_loaded(load_checkpoint(MPI_COMM_WORLD, root.path, a.spec, mod_owner(w)), a, r, mod_owner(w), w);
}

BOOST_AUTO_TEST_CASE(bad_owner_and_duplicate_keys_are_errors_on_every_rank) {
  TempRoot root("owner");
  const int w = testing::world_size(), r = testing::world_rank();
  Model m = make_model(4);
  save_model(MPI_COMM_WORLD, root.path, m);
  OwnerFn bad = [w](int, int64_t key) { return key % 5 == 0 ? w : 0; };
  expect_error([&] { load_checkpoint(MPI_COMM_WORLD, root.path, m.spec, bad); }, {"owner of key", "expected a rank in [0, " + std::to_string(w) + ")"});
  // Key 42 written by rank 0 and by the last rank (twice by rank 0 when it is alone).
  TempRoot dup("dup");
  std::vector<TableRows> mine;
  for (const TableRows& t : m.tables) mine.push_back(select(t, [&](int64_t k) { return k % w == r; }));
  if (r == 0 || r == w - 1) {
    int copies = w == 1 ? 2 : 1;
    for (int c = 0; c < copies; ++c) {
      mine[1].keys.push_back(42);
      mine[1].values.insert(mine[1].values.end(), mine[1].dim, 0.5f);
    }
  }
  save_checkpoint(MPI_COMM_WORLD, dup.path, m.meta, r == 0 ? m.dense : std::vector<DenseTensor>(), mine);
  expect_error([&] { load_checkpoint(MPI_COMM_WORLD, dup.path, m.spec, mod_owner(w)); },
               {"table 'item'", "key 42 appears more than once"});
}

BOOST_AUTO_TEST_CASE(paths_that_are_not_checkpoints_are_errors) {
  TempRoot root("paths");
  const int w = testing::world_size();
  Model m = make_model(6);
  expect_error([&] { load_checkpoint(MPI_COMM_WORLD, root.path + "/none", m.spec, mod_owner(w)); }, {"/none", "no such directory"});
  on_root([&] { fs::create_directories(root.path); });
  expect_error([&] { load_checkpoint(MPI_COMM_WORLD, root.path, m.spec, mod_owner(w)); }, {"not a checkpoint", "latest"});
  on_root([&] { std::ofstream(root.path + "/latest") << "step-9\n"; });
  expect_error([&] { load_checkpoint(MPI_COMM_WORLD, root.path, m.spec, mod_owner(w)); }, {"latest", "step-9", "does not exist"});
  on_root([&] { std::ofstream(root.path + "/latest") << "../etc\n"; });
  expect_error([&] { load_checkpoint(MPI_COMM_WORLD, root.path, m.spec, mod_owner(w)); }, {"latest", "expected one line 'step-<n>'", "../etc"});
}

namespace {

// The root as a failed save must leave it: latest is step `latest`, no leftovers of step n, and step n (when
// `previous` is given) the checkpoint that was there before, whole. Rank 0 looks; every rank waits.
void expect_rolled_back(const std::string& root, int64_t latest, int64_t n, const Model* previous,
                        const std::string& when) {
  on_root([&] {
    BOOST_TEST_CONTEXT(when) {
      std::string dir = root + "/step-" + std::to_string(n);
      BOOST_CHECK_EQUAL(list_checkpoints(root).latest, latest);
      BOOST_CHECK(!fs::exists(dir + ".tmp"));
      BOOST_CHECK(!fs::exists(dir + ".replaced"));
      BOOST_CHECK(!fs::exists(root + "/latest.tmp"));
      if (!previous) {
        BOOST_CHECK_MESSAGE(!fs::exists(dir), dir << " exists after a failed save");
      } else {
        VerifyReport v = verify_checkpoint(dir);
        BOOST_CHECK_MESSAGE(v.ok(), "verify " << dir << ": " << (v.problems.empty() ? "" : v.problems[0]));
        BOOST_CHECK_EQUAL(v.manifest.meta.config, previous->meta.config);
      }
    }
  });
}

// Steps 1 and 2 saved, then `latest` set back to step 1: what a crash between the rename and `latest` leaves,
// or a run resumed from step 1. The next save of step 2 sets the old one aside.
void make_replaceable_step_2(const std::string& root, const Model& a, const Model& old2) {
  save_model(MPI_COMM_WORLD, root, a);
  save_model(MPI_COMM_WORLD, root, old2);
  on_root([&] { std::ofstream(root + "/latest") << "step-1\n"; });
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_failed_save_puts_a_set_aside_step_back) {
  TempRoot root("set_aside");
  const int w = testing::world_size(), r = testing::world_rank();
  Model a = make_model(1), old2 = make_model(2), b = make_model(2);
  make_replaceable_step_2(root.path, a, old2);
  // A save killed right after it set step 2 aside left step-2.replaced: the next save treats it as step 2.
  on_root([&] { fs::rename(root.path + "/step-2", root.path + "/step-2.replaced"); });
  for (const char* when : {"tmp_created", "files_written", "manifest_written", "renamed"}) {
    SaveOptions boom;
    boom.on_stage = [&](const std::string& stage) {
      if (stage == when && r == w - 1) throw Error("planted failure at " + stage);
    };
    expect_error([&] { save_model(MPI_COMM_WORLD, root.path, b, boom); },
                 {"rank " + std::to_string(w - 1), std::string("planted failure at ") + when});
    expect_rolled_back(root.path, 1, 2, &old2, std::string("failed at ") + when);
  }
  // The old step 2 loads with its own content.
  expect_loaded(load_checkpoint(MPI_COMM_WORLD, root.path + "/step-2", old2.spec, mod_owner(w)), old2, r,
                mod_owner(w), w);
  // A failure once `latest` moved: the save happened (and is reported); the set-aside step is gone.
  SaveOptions late;
  late.on_stage = [&](const std::string& stage) {
    if (stage == "latest_written" && r == w - 1) throw Error("planted failure after latest");
  };
  expect_error([&] { save_model(MPI_COMM_WORLD, root.path, b, late); }, {"planted failure after latest"});
  MPI_Barrier(MPI_COMM_WORLD);
  BOOST_CHECK_EQUAL(list_checkpoints(root.path).latest, 2);
  BOOST_CHECK(!fs::exists(root.path + "/step-2.replaced"));
  expect_loaded(load_checkpoint(MPI_COMM_WORLD, root.path, b.spec, mod_owner(w)), b, r, mod_owner(w), w);
}

BOOST_AUTO_TEST_CASE(a_full_disk_at_any_byte_of_a_save_leaves_the_root_as_it_was) {
  const int w = testing::world_size(), r = testing::world_rank();
  std::vector<int> targets{0};
  if (w > 1) targets.push_back(w - 1);  // rank 0 writes shard 0, dense, manifest, latest; the last its shard
  for (bool replacing : {false, true}) {
    for (int target : targets) {
      BOOST_TEST_CONTEXT((replacing ? "replacing step 2" : "new step 2") << ", disk full on rank " << target) {
        Model a = make_model(1), old2 = make_model(2), b = make_model(2);
        // The bytes rank `target` writes up to each stage of this save, measured on a root like the real one.
        std::vector<int64_t> used(3, 0);
        {
          TempRoot scratch("full_measure");
          save_model(MPI_COMM_WORLD, scratch.path, a);
          const int64_t plenty = int64_t(1) << 40;
          SaveOptions o;
          if (r == target) o.write_budget = plenty;
          o.on_stage = [&](const std::string& stage) {
            int i = stage == "files_written" ? 0 : stage == "manifest_written" ? 1 : stage == "latest_written" ? 2 : -1;
            if (i >= 0 && r == target) used[i] = plenty - h5::write_budget();
          };
          save_model(MPI_COMM_WORLD, scratch.path, b, o);
          MPI_Bcast(used.data(), 3, MPI_INT64_T, target, MPI_COMM_WORLD);
        }
        BOOST_TEST_MESSAGE("rank " << target << " writes " << used[0] << " bytes of data files, " << used[1]
                                   << " with the manifest, " << used[2] << " with latest");
        // Budgets: the first bytes, evenly through every file, each side of each file's end, every byte of
        // `latest`.
        std::set<int64_t> budgets{0, 1, 2};
        int64_t start = 0;
        for (int64_t end : used) {
          for (int k = 0; k < 24 && end > start; ++k) budgets.insert(start + (end - start) * k / 24);
          for (int64_t d = -2; d <= 1; ++d)
            if (end + d >= 0 && end + d < used[2]) budgets.insert(end + d);
          start = end;
        }
        for (int64_t x = used[1]; x < used[2]; ++x) budgets.insert(x);
        TempRoot root("full");
        if (replacing)
          make_replaceable_step_2(root.path, a, old2);
        else
          save_model(MPI_COMM_WORLD, root.path, a);
        for (int64_t budget : budgets) {
          SaveOptions o;
          if (r == target) o.write_budget = budget;
          expect_error([&] { save_model(MPI_COMM_WORLD, root.path, b, o); },
                       {"rank " + std::to_string(target), "No space left on device"});
          // Every file the save opened is closed again (nothing left for HDF5 to flush at exit).
          BOOST_CHECK_EQUAL(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0);
          expect_rolled_back(root.path, 1, 2, replacing ? &old2 : nullptr,
                             "budget " + std::to_string(budget) + " of " + std::to_string(used[2]));
        }
        // The whole budget is enough, and the step then loads exactly.
        SaveOptions o;
        if (r == target) o.write_budget = used[2];
        save_model(MPI_COMM_WORLD, root.path, b, o);
        MPI_Barrier(MPI_COMM_WORLD);
        BOOST_CHECK_EQUAL(list_checkpoints(root.path).latest, 2);
        expect_loaded(load_checkpoint(MPI_COMM_WORLD, root.path, b.spec, mod_owner(w)), b, r, mod_owner(w), w);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_save_failing_on_one_rank_fails_on_every_rank) {
  const int w = testing::world_size(), r = testing::world_rank();
  const int last = w - 1;
  TempRoot root("one_rank_save");
  Model a = make_model(1), b = make_model(2);
  save_model(MPI_COMM_WORLD, root.path, a);
  // A hook that throws something other than a std::exception, on the last rank only.
  for (const char* when : {"tmp_created", "manifest_written", "renamed"}) {
    SaveOptions odd;
    odd.on_stage = [&](const std::string& stage) {
      if (stage == when && r == last) throw 42;
    };
    expect_error([&] { save_model(MPI_COMM_WORLD, root.path, b, odd); },
                 {"rank " + std::to_string(last), "non-standard exception", when});
    expect_rolled_back(root.path, 1, 2, nullptr, std::string("non-standard exception at ") + when);
  }
  // The last rank's disk is full from the start: its shard cannot be created or written.
  SaveOptions full;
  if (r == last) full.write_budget = 0;
  expect_error([&] { save_model(MPI_COMM_WORLD, root.path, b, full); },
               {"rank " + std::to_string(last), "shard-" + std::to_string(last) + "-of-", "No space left on device"});
  expect_rolled_back(root.path, 1, 2, nullptr, "last rank's disk full");
  // Ranks that disagree on the step.
  if (w > 1) {
    Model c = b;
    if (r == last) c.meta.step = 3;
    expect_error([&] { save_model(MPI_COMM_WORLD, root.path, c); },
                 {"ranks save different checkpoints", "rank 0 saves step-2", "saves step-3"});
    expect_rolled_back(root.path, 1, 2, nullptr, "different steps");
  }
  // Rank 0 alone creates the root: a root that is a regular file fails there, and everywhere.
  TempRoot file_root("root_is_a_file");
  on_root([&] { std::ofstream(file_root.path) << "not a directory\n"; });
  expect_error([&] { save_model(MPI_COMM_WORLD, file_root.path, b); },
               {"rank 0", file_root.path, "cannot create the checkpoint root"});
  // After all of that, the next save works.
  save_model(MPI_COMM_WORLD, root.path, b);
  MPI_Barrier(MPI_COMM_WORLD);
  BOOST_CHECK_EQUAL(list_checkpoints(root.path).latest, 2);
}

BOOST_AUTO_TEST_CASE(a_load_failing_on_one_rank_fails_on_every_rank) {
  const int w = testing::world_size(), r = testing::world_rank();
  const int last = w - 1;
  TempRoot root("one_rank_load");
  Model m = make_model(3);
  std::string dir = save_model(MPI_COMM_WORLD, root.path, m);
  // The owner function fails on the last rank only: a sparta::Error, then something else.
  OwnerFn throws_error = [&](int, int64_t key) -> int {
    if (r == last) throw Error("planted owner failure");
    return static_cast<int>(key % w);
  };
  expect_error([&] { load_checkpoint(MPI_COMM_WORLD, root.path, m.spec, throws_error); },
               {"rank " + std::to_string(last), "planted owner failure"});
  OwnerFn throws_odd = [&](int, int64_t key) -> int {
    if (r == last) throw 7;
    return static_cast<int>(key % w);
  };
  expect_error([&] { load_checkpoint(MPI_COMM_WORLD, root.path, m.spec, throws_odd); },
               {"rank " + std::to_string(last), "owner function threw a non-standard exception"});
  // Ranks that expect different models (the last one lists the dense tensors in another order).
  if (w > 1) {
    ModelSpec other = m.spec;
    if (r == last) std::reverse(other.dense.begin(), other.dense.end());
    expect_error([&] { load_checkpoint(MPI_COMM_WORLD, root.path, other, mod_owner(w)); },
                 {"ranks expect different models", "rank " + std::to_string(last) + " expects"});
  }
  // dense.h5 is read by rank 0 only.
  on_root([&] { flip_byte(dir + "/dense.h5", 0.5); });
  expect_error([&] { load_checkpoint(MPI_COMM_WORLD, root.path, m.spec, mod_owner(w)); },
               {"rank 0", "dense.h5", "checksum mismatch"});
  // A shard that only the first rank reads (when loading on one rank fewer than wrote it, rank 0 reads two).
  TempRoot root2("one_rank_load_shard");
  Model m2 = make_model(4);
  std::string dir2 = save_model(MPI_COMM_WORLD, root2.path, m2);
  on_root([&] { fs::resize_file(dir2 + "/shard-0-of-" + std::to_string(w) + ".h5", 100); });
  expect_error([&] { load_checkpoint(MPI_COMM_WORLD, root2.path, m2.spec, mod_owner(w)); },
               {"rank 0", "shard-0-of-" + std::to_string(w) + ".h5", "size"});
}
