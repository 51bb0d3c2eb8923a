// checkpoint_manifest.cpp: manifest.h5 (its writer, its reader and the checks against it: the model a load
// expects, the size and checksum of each listed file). Fields: checkpoint_format.h.
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>

#include "io/checkpoint.h"
#include "io/checkpoint_files.h"
#include "io/checkpoint_format.h"
#include "io/checksum.h"
#include "io/h5.h"
#include "src/base/check.h"

namespace sparta {
namespace fs = std::filesystem;
using namespace ckpt;

namespace ckpt {

void write_manifest(const std::string& path, const CheckpointMeta& meta, int world,
                    const std::vector<TableRows>& tables, const std::vector<int64_t>& rows_by_rank,
                    const std::vector<DenseTensor>& dense, const std::vector<CheckpointFile>& files) {
  h5::File f = h5::create_file(path);
  h5::write_attr(f, "/", "format", std::string(kCheckpointFormat));
  h5::write_attr(f, "/", "version", kCheckpointVersion);
  h5::write_attr(f, "/", "step", meta.step);
  h5::write_attr(f, "/", "world_size", int64_t(world));
  h5::write_attr(f, "/", "plan", meta.plan);
  h5::write_attr(f, "/", "config", meta.config);
  write_ints(f, "/", "rng_state", meta.rng_state);
  write_ints(f, "/", "reader_position", meta.reader_position);
  if (!meta.loss_scale.empty()) write_ints(f, "/", "loss_scale", meta.loss_scale);
  h5::write_attr(f, "/", "checksum", std::string("xxh64"));
  h5::write_attr(f, "/", "created_unix", int64_t(std::time(nullptr)));
  h5::write_attr(f, "/", "num_tables", int64_t(tables.size()));
  h5::write_attr(f, "/", "num_dense", int64_t(dense.size()));
  h5::write_attr(f, "/", "num_files", int64_t(files.size()));
  h5::create_group(f, "/tables");
  for (size_t i = 0; i < tables.size(); ++i) {
    const TableRows& t = tables[i];
    std::string g = "/tables/" + std::to_string(i);
    std::vector<int64_t> shard_rows(world);
    for (int r = 0; r < world; ++r) shard_rows[r] = rows_by_rank[size_t(r) * tables.size() + i];
    h5::create_group(f, g);
    h5::write_attr(f, g, "name", t.name);
    h5::write_attr(f, g, "dim", int64_t(t.dim));
    h5::write_attr(f, g, "optimizer", t.optimizer);
    h5::write_attr(f, g, "state_width", int64_t(t.state_width));
    h5::write_attr(f, g, "rows", std::accumulate(shard_rows.begin(), shard_rows.end(), int64_t(0)));
    h5::write_attr(f, g, "shard_rows", shard_rows);
  }
  h5::create_group(f, "/dense");
  for (size_t i = 0; i < dense.size(); ++i) {
    std::string g = "/dense/" + std::to_string(i);
    h5::create_group(f, g);
    h5::write_attr(f, g, "name", dense[i].name);
    write_ints(f, g, "shape", dense[i].shape);
  }
  h5::create_group(f, "/files");
  for (size_t i = 0; i < files.size(); ++i) {
    std::string g = "/files/" + std::to_string(i);
    h5::create_group(f, g);
    h5::write_attr(f, g, "name", files[i].name);
    h5::write_attr(f, g, "bytes", int64_t(files[i].bytes));
    h5::write_attr(f, g, "checksum", checksum_hex(files[i].checksum));
  }
  h5::close(f);
}

namespace {
std::string manifest_sum_text(uint64_t sum, uint64_t bytes) {
  return strprintf("xxh64 %s %llu %s\n", checksum_hex(sum).c_str(), static_cast<unsigned long long>(bytes),
                   kManifestName);
}
}  // namespace

void write_manifest_sum(const std::string& step_dir) {
  uint64_t bytes = 0;
  const uint64_t sum = checksum_file(join(step_dir, kManifestName), &bytes);
  write_file_atomic(step_dir, kManifestSumName, manifest_sum_text(sum, bytes), nullptr);
}

void verify_manifest_sum(const std::string& step_dir) {
  const std::string side = join(step_dir, kManifestSumName), path = join(step_dir, kManifestName);
  std::error_code ec;
  SPARTA_REQUIRE(fs::is_regular_file(side, ec),
                 "%s: missing: the checksum of manifest.h5 (a step written before checkpoints carried it, or damaged)",
                 side.c_str());
  std::ifstream in(side, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  SPARTA_REQUIRE(in.good() || in.eof(), "%s: cannot read", side.c_str());
  // Strict: parse, then require the canonical line byte for byte, so that no byte of the sidecar goes unchecked.
  char hex[17] = {0};
  unsigned long long bytes = 0;
  uint64_t want = 0;
  bool ok = text.size() < 128 && std::sscanf(text.c_str(), "xxh64 %16s %llu", hex, &bytes) == 2;
  if (ok) {
    try {
      want = parse_checksum_hex(hex);
    } catch (const Error&) {
      ok = false;
    }
  }
  ok = ok && text == manifest_sum_text(want, bytes);
  std::string shown = text.substr(0, 80);
  for (char& c : shown)
    if (c < 32 || c > 126) c = '?';
  SPARTA_REQUIRE(ok, "%s: expected one line 'xxh64 <16 hex digits> <bytes> manifest.h5', found '%s' (damaged)",
                 side.c_str(), shown.c_str());
  SPARTA_REQUIRE(fs::is_regular_file(path, ec), "%s: missing (not a complete checkpoint)", path.c_str());
  uint64_t found_bytes = 0;
  const uint64_t found = checksum_file(path, &found_bytes);
  SPARTA_REQUIRE(found_bytes == bytes, "%s: size: expected %llu bytes (manifest.xxh64), found %llu (truncated or "
                 "overwritten?)", path.c_str(), bytes, static_cast<unsigned long long>(found_bytes));
  SPARTA_REQUIRE(found == want, "%s: checksum mismatch: expected %s (manifest.xxh64), found %s (corrupted)",
                 path.c_str(), checksum_hex(want).c_str(), checksum_hex(found).c_str());
}

}  // namespace ckpt

// ---- Manifest.

const ManifestTable* Manifest::find_table(const std::string& name) const {
  for (const ManifestTable& t : tables)
    if (t.spec.name == name) return &t;
  return nullptr;
}

const CheckpointFile* Manifest::find_file(const std::string& name) const {
  for (const CheckpointFile& f : files)
    if (f.name == name) return &f;
  return nullptr;
}

ModelSpec Manifest::model_spec() const {
  ModelSpec s;
  for (const ManifestTable& t : tables) s.tables.push_back(t.spec);
  s.dense = dense;
  return s;
}

void reseal_manifest(const std::string& step_dir) { write_manifest_sum(step_dir); }

Manifest read_manifest(const std::string& step_dir) {
  Manifest m;
  m.dir = step_dir;
  m.path = join(step_dir, kManifestName);
  std::error_code ec;
  SPARTA_REQUIRE(fs::exists(m.path, ec), "%s: missing (not a complete checkpoint)", m.path.c_str());
  verify_manifest_sum(step_dir);  // every byte of the manifest, before any of it is believed
  h5::File f = h5::open_file(m.path);
  const char* p = m.path.c_str();
  std::string format = h5::read_attr_string(f, "/", "format");
  SPARTA_REQUIRE(format == kCheckpointFormat, "%s: attribute 'format': expected '%s', found '%s'", p,
                 kCheckpointFormat, format.c_str());
  m.version = h5::read_attr_int(f, "/", "version");
  SPARTA_REQUIRE(m.version == kCheckpointVersion,
                 "%s: attribute 'version': expected %lld (the version this build reads), found %lld", p,
                 static_cast<long long>(kCheckpointVersion), static_cast<long long>(m.version));
  m.meta.step = h5::read_attr_int(f, "/", "step");
  int64_t world = h5::read_attr_int(f, "/", "world_size");
  SPARTA_REQUIRE(world >= 1 && world <= (1 << 24), "%s: attribute 'world_size': expected >= 1, found %lld", p,
                 static_cast<long long>(world));
  m.meta.world_size = static_cast<int>(world);
  m.meta.plan = h5::read_attr_string(f, "/", "plan");
  m.meta.config = h5::read_attr_string(f, "/", "config");
  m.meta.rng_state = read_ints(f, "/", "rng_state");
  m.meta.reader_position = read_ints(f, "/", "reader_position");
  if (h5::has_attr(f, "/", "loss_scale")) m.meta.loss_scale = read_ints(f, "/", "loss_scale");
  std::string algo = h5::read_attr_string(f, "/", "checksum");
  SPARTA_REQUIRE(algo == "xxh64", "%s: attribute 'checksum': expected 'xxh64', found '%s'", p, algo.c_str());
  int64_t num_tables = h5::read_attr_int(f, "/", "num_tables");
  int64_t num_dense = h5::read_attr_int(f, "/", "num_dense");
  int64_t num_files = h5::read_attr_int(f, "/", "num_files");
  for (int64_t i = 0; i < num_tables; ++i) {
    std::string g = "/tables/" + std::to_string(i);
    ManifestTable t;
    t.spec.name = h5::read_attr_string(f, g, "name");
    t.spec.dim = static_cast<int>(h5::read_attr_int(f, g, "dim"));
    t.spec.optimizer = h5::read_attr_string(f, g, "optimizer");
    t.spec.state_width = static_cast<int>(h5::read_attr_int(f, g, "state_width"));
    t.rows = h5::read_attr_int(f, g, "rows");
    t.shard_rows = h5::read_attr_ints(f, g, "shard_rows");
    SPARTA_REQUIRE(valid_name(t.spec.name) && t.spec.dim >= 1 && t.spec.state_width >= 0,
                   "%s: table %lld: expected a name, dim >= 1 and state_width >= 0, found '%s', %d, %d", p,
                   static_cast<long long>(i), t.spec.name.c_str(), t.spec.dim, t.spec.state_width);
    SPARTA_REQUIRE(static_cast<int64_t>(t.shard_rows.size()) == world,
                   "%s: table '%s' field 'shard_rows': expected %lld values (world_size), found %zu", p,
                   t.spec.name.c_str(), static_cast<long long>(world), t.shard_rows.size());
    int64_t sum = 0;
    for (int64_t r : t.shard_rows) {
      SPARTA_REQUIRE(r >= 0, "%s: table '%s' field 'shard_rows': negative count %lld", p, t.spec.name.c_str(),
                     static_cast<long long>(r));
      sum += r;
    }
    SPARTA_REQUIRE(sum == t.rows, "%s: table '%s' field 'rows': expected %lld (sum of shard_rows), found %lld", p,
                   t.spec.name.c_str(), static_cast<long long>(sum), static_cast<long long>(t.rows));
    SPARTA_REQUIRE(!m.find_table(t.spec.name), "%s: table '%s' listed twice", p, t.spec.name.c_str());
    m.tables.push_back(std::move(t));
  }
  for (int64_t i = 0; i < num_dense; ++i) {
    std::string g = "/dense/" + std::to_string(i);
    DenseSpec d;
    d.name = h5::read_attr_string(f, g, "name");
    d.shape = read_ints(f, g, "shape");
    SPARTA_REQUIRE(valid_name(d.name), "%s: dense tensor %lld: bad name '%s'", p, static_cast<long long>(i),
                   d.name.c_str());
    m.dense.push_back(std::move(d));
  }
  for (int64_t i = 0; i < num_files; ++i) {
    std::string g = "/files/" + std::to_string(i);
    CheckpointFile cf;
    cf.name = h5::read_attr_string(f, g, "name");
    cf.bytes = static_cast<uint64_t>(h5::read_attr_int(f, g, "bytes"));
    std::string hex = h5::read_attr_string(f, g, "checksum");
    try {
      cf.checksum = parse_checksum_hex(hex);
    } catch (const Error& e) {
      throw Error(m.path + ": file '" + cf.name + "' field 'checksum': " + e.what());
    }
    SPARTA_REQUIRE(valid_name(cf.name), "%s: file %lld: bad name '%s'", p, static_cast<long long>(i),
                   cf.name.c_str());
    m.files.push_back(std::move(cf));
  }
  // Every file a load needs must have a checksum to check.
  std::vector<std::string> needed{kDenseName};
  for (int r = 0; r < m.meta.world_size; ++r) needed.push_back(shard_name(r, m.meta.world_size));
  for (const std::string& n : needed)
    SPARTA_REQUIRE(m.find_file(n), "%s: file list: expected '%s', not listed", p, n.c_str());
  return m;
}

void check_model_spec(const Manifest& m, const ModelSpec& expected) {
  const char* p = m.path.c_str();
  std::string held;
  for (const ManifestTable& t : m.tables) held += (held.empty() ? "" : ", ") + t.spec.name;
  for (const TableSpec& want : expected.tables) {
    const ManifestTable* t = m.find_table(want.name);
    SPARTA_REQUIRE(t, "%s: table '%s': expected (model configuration), not in the checkpoint (it holds: %s)", p,
                   want.name.c_str(), held.empty() ? "no tables" : held.c_str());
    SPARTA_REQUIRE(t->spec.dim == want.dim, "%s: table '%s' field 'dim': expected %d (model configuration), found %d",
                   p, want.name.c_str(), want.dim, t->spec.dim);
    SPARTA_REQUIRE(t->spec.optimizer == want.optimizer,
                   "%s: table '%s' field 'optimizer': expected '%s' (model configuration), found '%s'", p,
                   want.name.c_str(), want.optimizer.c_str(), t->spec.optimizer.c_str());
    SPARTA_REQUIRE(t->spec.state_width == want.state_width,
                   "%s: table '%s' field 'state_width': expected %d (model configuration), found %d", p,
                   want.name.c_str(), want.state_width, t->spec.state_width);
  }
  for (const ManifestTable& t : m.tables) {
    bool wanted = false;
    for (const TableSpec& want : expected.tables) wanted = wanted || want.name == t.spec.name;
    SPARTA_REQUIRE(wanted, "%s: table '%s': found in the checkpoint, not in the model configuration", p,
                   t.spec.name.c_str());
  }
  for (const DenseSpec& want : expected.dense) {
    const DenseSpec* d = nullptr;
    for (const DenseSpec& x : m.dense)
      if (x.name == want.name) d = &x;
    SPARTA_REQUIRE(d, "%s: dense tensor '%s': expected (model configuration), not in the checkpoint", p,
                   want.name.c_str());
    SPARTA_REQUIRE(d->shape == want.shape,
                   "%s: dense tensor '%s' field 'shape': expected %s (model configuration), found %s", p,
                   want.name.c_str(), shape_text(want.shape).c_str(), shape_text(d->shape).c_str());
  }
  for (const DenseSpec& d : m.dense) {
    bool wanted = false;
    for (const DenseSpec& want : expected.dense) wanted = wanted || want.name == d.name;
    SPARTA_REQUIRE(wanted, "%s: dense tensor '%s': found in the checkpoint, not in the model configuration", p,
                   d.name.c_str());
  }
}

FileStatus check_file(const Manifest& m, const CheckpointFile& file) {
  FileStatus st;
  st.expected = file;
  std::string path = join(m.dir, file.name);
  std::error_code ec;
  st.exists = fs::is_regular_file(path, ec);
  if (!st.exists) {
    st.problem = strprintf("missing (manifest.h5 lists it: %llu bytes, checksum %s)",
                           static_cast<unsigned long long>(file.bytes), checksum_hex(file.checksum).c_str());
    return st;
  }
  try {
    st.checksum = checksum_file(path, &st.bytes);
  } catch (const Error& e) {
    st.problem = e.what();
    return st;
  }
  if (st.bytes != file.bytes)
    st.problem = strprintf("size: expected %llu bytes (manifest.h5), found %llu (truncated or overwritten?)",
                           static_cast<unsigned long long>(file.bytes), static_cast<unsigned long long>(st.bytes));
  else if (st.checksum != file.checksum)
    st.problem = strprintf("checksum mismatch: expected %s (manifest.h5), found %s (corrupted)",
                           checksum_hex(file.checksum).c_str(), checksum_hex(st.checksum).c_str());
  st.ok = st.problem.empty();
  return st;
}

}  // namespace sparta
