// checkpoint_format.cpp: see checkpoint_format.h (the manifest's writer and reader are in checkpoint_manifest.cpp).
#include "io/checkpoint_format.h"

#include "io/checkpoint_files.h"
#include "src/base/check.h"
#include "src/base/half.h"

namespace sparta {
namespace ckpt {

int64_t product(const std::vector<int64_t>& shape) {
  int64_t p = 1;
  for (int64_t d : shape) p *= d;
  return p;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

TableRows empty_rows(const TableSpec& s) {
  TableRows t;
  t.name = s.name;
  t.dim = s.dim;
  t.optimizer = s.optimizer;
  t.state_width = s.state_width;
  return t;
}

std::string table_text(const std::string& name, int dim, const std::string& optimizer, int state_width) {
  return strprintf("%s(dim %d, %s, state %d)", name.c_str(), dim, optimizer.c_str(), state_width);
}

void write_ints(const h5::File& f, const std::string& obj, const std::string& name, const std::vector<int64_t>& v) {
  h5::write_attr(f, obj, name + "_size", int64_t(v.size()));
  if (!v.empty()) h5::write_attr(f, obj, name, v);
}

std::vector<int64_t> read_ints(const h5::File& f, const std::string& obj, const std::string& name) {
  int64_t n = h5::read_attr_int(f, obj, name + "_size");
  std::vector<int64_t> v;
  if (n > 0) v = h5::read_attr_ints(f, obj, name);
  SPARTA_REQUIRE(static_cast<int64_t>(v.size()) == n, "%s: '%s' attribute '%s': expected %lld values (%s_size), found %zu",
                 f.path.c_str(), obj.c_str(), name.c_str(), static_cast<long long>(n), name.c_str(), v.size());
  return v;
}

// ---- Writers.

namespace {
// The value storages a checkpoint knows (TableRows::storage; kernels/embedding_types.h RowStorage names them).
bool is_bf16(const std::string& s) { return s == "bf16"; }
void require_storage(const std::string& s, const std::string& where) {
  SPARTA_REQUIRE(s == "fp32" || s == "bf16" || s == "fp16", "%s: storage: expected fp32, bf16 or fp16, found '%s'",
                 where.c_str(), s.c_str());
}

// A table's values as the table stores them: float32, or (storage bf16 / fp16) uint16 bits with the group's
// attribute 'storage' naming the format (HDF5 1.10 has no 16-bit float type). The values are widened 16-bit
// values, so rounding them back to nearest is exact.
void write_values(const h5::File& f, const std::string& g, const TableRows& t) {
  require_storage(t.storage, "save_checkpoint: table '" + t.name + "'");
  h5::write_attr(f, g, "storage", t.storage);
  const std::vector<hsize_t> dims = {hsize_t(t.rows()), hsize_t(t.dim)};
  if (t.storage == "fp32") return h5::write_dataset<float>(f, g + "/values", t.values.data(), dims);
  std::vector<uint16_t> bits(t.values.size());
  for (size_t i = 0; i < bits.size(); ++i)
    bits[i] = is_bf16(t.storage) ? float_to_bf16(t.values[i]) : float_to_f16(t.values[i]);
  h5::write_dataset<uint16_t>(f, g + "/values", bits.data(), dims);
}
}  // namespace

void write_shard(const std::string& path, const CheckpointMeta& meta, int rank, int world,
                 const std::vector<TableRows>& tables) {
  h5::File f = h5::create_file(path);
  h5::write_attr(f, "/", "format", std::string(kShardFormat));
  h5::write_attr(f, "/", "version", kCheckpointVersion);
  h5::write_attr(f, "/", "step", meta.step);
  h5::write_attr(f, "/", "rank", int64_t(rank));
  h5::write_attr(f, "/", "world_size", int64_t(world));
  h5::write_attr(f, "/", "num_tables", int64_t(tables.size()));
  h5::create_group(f, "/tables");
  for (const TableRows& t : tables) {
    std::string g = "/tables/" + t.name;
    hsize_t n = t.rows();
    h5::create_group(f, g);
    h5::write_attr(f, g, "name", t.name);
    h5::write_attr(f, g, "dim", int64_t(t.dim));
    h5::write_attr(f, g, "optimizer", t.optimizer);
    h5::write_attr(f, g, "state_width", int64_t(t.state_width));
    h5::write_attr(f, g, "rows", int64_t(n));
    h5::write_dataset<int64_t>(f, g + "/keys", t.keys.data(), {n});
    write_values(f, g, t);
    if (t.state_width > 0)
      h5::write_dataset<float>(f, g + "/state", t.state.data(), {n, hsize_t(t.state_width)});
    else
      h5::create_dataset<float>(f, g + "/state", {n, 0});  // sgd: no state, but the same layout
  }
  h5::close(f);
}

void write_dense(const std::string& path, const CheckpointMeta& meta, const std::vector<DenseTensor>& dense) {
  h5::File f = h5::create_file(path);
  h5::write_attr(f, "/", "format", std::string(kDenseFormat));
  h5::write_attr(f, "/", "version", kCheckpointVersion);
  h5::write_attr(f, "/", "step", meta.step);
  h5::write_attr(f, "/", "num_dense", int64_t(dense.size()));
  h5::create_group(f, "/dense");
  for (const DenseTensor& d : dense) {
    std::string p = "/dense/" + d.name;
    std::vector<hsize_t> dims;
    for (int64_t x : d.shape) dims.push_back(hsize_t(x));
    if (dims.empty()) dims.push_back(1);
    h5::write_dataset<float>(f, p, d.data.data(), dims);
    write_ints(f, p, "shape", d.shape);
  }
  h5::close(f);
}

// ---- Readers.

void require_file_ok(const Manifest& m, const std::string& name) {
  const CheckpointFile* cf = m.find_file(name);
  SPARTA_REQUIRE(cf, "%s: file list: expected '%s', not listed", m.path.c_str(), name.c_str());
  FileStatus st = check_file(m, *cf);
  SPARTA_REQUIRE(st.ok, "%s: %s", join(m.dir, name).c_str(), st.problem.c_str());
}

namespace {

void require_attr_int(const h5::File& f, const std::string& obj, const std::string& name, int64_t want) {
  int64_t got = h5::read_attr_int(f, obj, name);
  SPARTA_REQUIRE(got == want, "%s: '%s' attribute '%s': expected %lld (manifest.h5), found %lld", f.path.c_str(),
                 obj.c_str(), name.c_str(), static_cast<long long>(want), static_cast<long long>(got));
}

void require_attr_string(const h5::File& f, const std::string& obj, const std::string& name, const std::string& want) {
  std::string got = h5::read_attr_string(f, obj, name);
  SPARTA_REQUIRE(got == want, "%s: '%s' attribute '%s': expected '%s', found '%s'", f.path.c_str(), obj.c_str(),
                 name.c_str(), want.c_str(), got.c_str());
}

void require_shape(const h5::File& f, const std::string& path, const std::vector<hsize_t>& want) {
  std::vector<hsize_t> got = h5::shape(f, path);
  auto text = [](const std::vector<hsize_t>& v) { return shape_text(std::vector<int64_t>(v.begin(), v.end())); };
  SPARTA_REQUIRE(got == want, "%s: dataset '%s': expected shape %s, found %s", f.path.c_str(), path.c_str(),
                 text(want).c_str(), text(got).c_str());
}

std::string table_group(const ManifestTable& t) { return "/tables/" + t.spec.name; }

}  // namespace

ShardReader::ShardReader(const Manifest& m, int shard) : shard_(shard) {
  f_ = h5::open_file(join(m.dir, shard_name(shard, m.meta.world_size)));
  require_attr_string(f_, "/", "format", kShardFormat);
  require_attr_int(f_, "/", "version", kCheckpointVersion);
  require_attr_int(f_, "/", "step", m.meta.step);
  require_attr_int(f_, "/", "rank", shard);
  require_attr_int(f_, "/", "world_size", m.meta.world_size);
  require_attr_int(f_, "/", "num_tables", int64_t(m.tables.size()));
}

std::string ShardReader::storage(const ManifestTable& t) const {
  const std::string g = table_group(t);
  if (!h5::has_attr(f_, g, "storage")) return "fp32";  // written before 16-bit storage
  const std::string s = h5::read_attr_string(f_, g, "storage");
  require_storage(s, f_.path + ": '" + g + "' attribute 'storage'");
  return s;
}

int64_t ShardReader::check_table(const ManifestTable& t) const {
  std::string g = table_group(t);
  SPARTA_REQUIRE(h5::exists(f_, g), "%s: table '%s': expected group '%s', not found", f_.path.c_str(),
                 t.spec.name.c_str(), g.c_str());
  require_attr_string(f_, g, "name", t.spec.name);
  require_attr_int(f_, g, "dim", t.spec.dim);
  require_attr_string(f_, g, "optimizer", t.spec.optimizer);
  require_attr_int(f_, g, "state_width", t.spec.state_width);
  int64_t n = t.shard_rows[shard_];
  require_attr_int(f_, g, "rows", n);
  h5::expect_type<int64_t>(f_, g + "/keys");
  if (storage(t) == "fp32")
    h5::expect_type<float>(f_, g + "/values");
  else
    h5::expect_type<uint16_t>(f_, g + "/values");
  h5::expect_type<float>(f_, g + "/state");
  require_shape(f_, g + "/keys", {hsize_t(n)});
  require_shape(f_, g + "/values", {hsize_t(n), hsize_t(t.spec.dim)});
  require_shape(f_, g + "/state", {hsize_t(n), hsize_t(t.spec.state_width)});
  return n;
}

void ShardReader::read(const ManifestTable& t, int64_t row0, int64_t rows, TableRows& out) const {
  std::string g = table_group(t);
  h5::read_rows<int64_t>(f_, g + "/keys", row0, rows, keys_);
  const std::string s = storage(t);
  if (s == "fp32") {
    h5::read_rows<float>(f_, g + "/values", row0, rows, floats_);
  } else {  // 16-bit values widen exactly
    h5::read_rows<uint16_t>(f_, g + "/values", row0, rows, bits_);
    floats_.resize(bits_.size());
    for (size_t i = 0; i < bits_.size(); ++i) floats_[i] = is_bf16(s) ? bf16_to_float(bits_[i]) : f16_to_float(bits_[i]);
  }
  out.keys.insert(out.keys.end(), keys_.begin(), keys_.end());
  out.values.insert(out.values.end(), floats_.begin(), floats_.end());
  if (t.spec.state_width > 0) {
    h5::read_rows<float>(f_, g + "/state", row0, rows, floats_);
    out.state.insert(out.state.end(), floats_.begin(), floats_.end());
  }
}

std::vector<DenseTensor> read_dense_file(const Manifest& m) {
  h5::File f = h5::open_file(join(m.dir, kDenseName));
  require_attr_string(f, "/", "format", kDenseFormat);
  require_attr_int(f, "/", "version", kCheckpointVersion);
  require_attr_int(f, "/", "step", m.meta.step);
  require_attr_int(f, "/", "num_dense", int64_t(m.dense.size()));
  std::vector<DenseTensor> out;
  for (const DenseSpec& s : m.dense) {
    std::string p = "/dense/" + s.name;
    SPARTA_REQUIRE(h5::exists(f, p), "%s: dense tensor '%s': expected dataset '%s', not found", f.path.c_str(),
                   s.name.c_str(), p.c_str());
    h5::expect_type<float>(f, p);
    std::vector<int64_t> shape = read_ints(f, p, "shape");
    SPARTA_REQUIRE(shape == s.shape, "%s: dense tensor '%s' field 'shape': expected %s (manifest.h5), found %s",
                   f.path.c_str(), s.name.c_str(), shape_text(s.shape).c_str(), shape_text(shape).c_str());
    DenseTensor d;
    d.name = s.name;
    d.shape = s.shape;
    d.data = h5::read_all<float>(f, p);
    SPARTA_REQUIRE(static_cast<int64_t>(d.data.size()) == product(s.shape),
                   "%s: dense tensor '%s': expected %lld floats (shape %s), found %zu", f.path.c_str(), s.name.c_str(),
                   static_cast<long long>(product(s.shape)), shape_text(s.shape).c_str(), d.data.size());
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace ckpt
}  // namespace sparta
