// checkpoint.cpp: see checkpoint.h. The files, field by field (version 1):
//
// manifest.h5
//   / attributes   format="sparta-checkpoint", version=1, step, world_size (ranks that wrote it), plan (text),
//                  config (text), rng_state int64[], reader_position int64[], checksum="xxh64", created_unix,
//                  num_tables, num_dense, num_files
//                  (every possibly empty int64[] attribute X comes with X_size; X itself only when X_size > 0)
//   /tables/<i>    group per table i in the writers' order: name, dim, optimizer, state_width, rows (total),
//                  shard_rows int64[world_size]
//   /dense/<i>     group per dense tensor: name, shape int64[]
//   /files/<i>     group per file: name, bytes, checksum (16 hex digits, XXH64 of the file's bytes)
// dense.h5
//   / attributes   format="sparta-checkpoint-dense", version, step, num_dense
//   /dense/<name>  float32 dataset of the tensor's shape ([1] for a scalar), attribute shape int64[] (exact)
// shard-<r>-of-<w>.h5
//   / attributes   format="sparta-checkpoint-shard", version, step, rank, world_size, num_tables
//   /tables/<name> group, attributes name, dim, optimizer, state_width, rows; datasets keys int64[n],
//                  values float32[n, dim], state float32[n, state_width]
// latest           text: "step-<n>\n"
#include "io/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>

#include "src/base/check.h"
#include "io/checksum.h"
#include "io/h5.h"
#include "src/base/agree.h"

namespace sparta {
namespace fs = std::filesystem;

namespace {

constexpr const char* kShardFormat = "sparta-checkpoint-shard";
constexpr const char* kDenseFormat = "sparta-checkpoint-dense";
constexpr const char* kExportFormat = "sparta-table-export";
constexpr const char* kManifestName = "manifest.h5";
constexpr const char* kDenseName = "dense.h5";
// Rows are routed in rounds of at most this many bytes sent per rank, so memory stays bounded and MPI's int
// counts never overflow.
constexpr int64_t kRoundBytes = 32 << 20;

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

std::string shard_name(int rank, int world) { return strprintf("shard-%d-of-%d.h5", rank, world); }
std::string step_name(int64_t step) { return strprintf("step-%lld", static_cast<long long>(step)); }

// "step-<digits>" → step, else -1.
int64_t parse_step_name(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0 || name.size() > 5 + 18) return -1;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::stoll(name.substr(5));
}

// ---- File system: what makes a checkpoint durable.

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  SPARTA_REQUIRE(fd >= 0, "%s: cannot open to fsync: %s", path.c_str(), std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  SPARTA_REQUIRE(rc == 0, "%s: fsync failed: %s", path.c_str(), std::strerror(err));
}

// fsyncs a finished file and records its size and checksum for the manifest.
CheckpointFile seal_file(const std::string& dir, const std::string& name) {
  std::string path = join(dir, name);
  fsync_path(path, false);
  CheckpointFile f;
  f.name = name;
  f.checksum = checksum_file(path, &f.bytes);
  return f;
}

void rename_path(const std::string& from, const std::string& to) {
  SPARTA_REQUIRE(::rename(from.c_str(), to.c_str()) == 0, "%s: cannot rename to %s: %s", from.c_str(), to.c_str(),
                 std::strerror(errno));
}

// Writes text to path atomically: path.tmp, fsync, rename, fsync the directory.
void write_file_atomic(const std::string& dir, const std::string& name, const std::string& text) {
  std::string path = join(dir, name), tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  SPARTA_REQUIRE(fd >= 0, "%s: cannot create: %s", tmp.c_str(), std::strerror(errno));
  ssize_t n = ::write(fd, text.data(), text.size());
  int err = errno;
  bool ok = n == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  if (!ok && n >= 0) err = errno;
  ::close(fd);
  SPARTA_REQUIRE(ok, "%s: write or fsync failed: %s", tmp.c_str(), std::strerror(err));
  rename_path(tmp, path);
  fsync_path(dir, true);
}

// The step directory name in root/latest, checked; "" when there is no latest.
std::string read_latest(const std::string& root) {
  std::string path = join(root, "latest");
  std::error_code ec;
  if (!fs::exists(path, ec)) return "";
  std::ifstream in(path);
  SPARTA_REQUIRE(in.good(), "%s: cannot read", path.c_str());
  std::string name;
  std::getline(in, name);
  SPARTA_REQUIRE(parse_step_name(name) >= 0, "%s: expected one line 'step-<n>', found '%s'", path.c_str(),
                 name.c_str());
  return name;
}

bool valid_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != ".." &&
         name.find('\n') == std::string::npos;
}

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

// int64 vectors that may be empty (a scalar's shape, no RNG state): h5::write_attr cannot write an empty one, so
// "<name>_size" is always written and "<name>" only when it has values.
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

template <class T>
MPI_Datatype mpi_type();
template <> MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }

template <class T>
void bcast_vector(MPI_Comm comm, int root, std::vector<T>& v) {
  constexpr size_t kPiece = size_t(1) << 28;  // MPI counts are int
  for (size_t at = 0; at < v.size(); at += kPiece) {
    int n = static_cast<int>(std::min(kPiece, v.size() - at));
    MPI_CHECK(MPI_Bcast(v.data() + at, n, mpi_type<T>(), root, comm));
  }
}

// ---- Checks of what callers pass to a save.

std::string table_signature(const std::vector<TableRows>& tables) {
  std::string s;
  for (const TableRows& t : tables)
    s += strprintf("%s%s(dim %d, %s, state %d)", s.empty() ? "" : " ", t.name.c_str(), t.dim, t.optimizer.c_str(),
                   t.state_width);
  return s.empty() ? "(no tables)" : s;
}

void validate_tables(const std::vector<TableRows>& tables) {
  std::set<std::string> seen;
  for (const TableRows& t : tables) {
    SPARTA_REQUIRE(valid_name(t.name), "save_checkpoint: table name '%s' is not usable as a file name",
                   t.name.c_str());
    SPARTA_REQUIRE(seen.insert(t.name).second, "save_checkpoint: table '%s' appears twice", t.name.c_str());
    SPARTA_REQUIRE(t.dim >= 1, "save_checkpoint: table '%s' field 'dim': expected >= 1, found %d", t.name.c_str(),
                   t.dim);
    SPARTA_REQUIRE(t.state_width >= 0, "save_checkpoint: table '%s' field 'state_width': expected >= 0, found %d",
                   t.name.c_str(), t.state_width);
    SPARTA_REQUIRE(!t.optimizer.empty(), "save_checkpoint: table '%s' field 'optimizer': empty", t.name.c_str());
    SPARTA_REQUIRE(t.values.size() == t.rows() * t.dim,
                   "save_checkpoint: table '%s' field 'values': expected %zu floats (%zu rows x dim %d), "
                   "found %zu", t.name.c_str(), t.rows() * t.dim, t.rows(), t.dim, t.values.size());
    SPARTA_REQUIRE(t.state.size() == t.rows() * t.state_width,
                   "save_checkpoint: table '%s' field 'state': expected %zu floats (%zu rows x state_width "
                   "%d), found %zu", t.name.c_str(), t.rows() * t.state_width, t.rows(), t.state_width,
                   t.state.size());
  }
}

void validate_dense(const std::vector<DenseTensor>& dense) {
  std::set<std::string> seen;
  for (const DenseTensor& d : dense) {
    SPARTA_REQUIRE(valid_name(d.name), "save_checkpoint: dense tensor name '%s' is not usable as a dataset name",
                   d.name.c_str());
    SPARTA_REQUIRE(seen.insert(d.name).second, "save_checkpoint: dense tensor '%s' appears twice", d.name.c_str());
    for (int64_t x : d.shape)
      SPARTA_REQUIRE(x >= 0, "save_checkpoint: dense tensor '%s' field 'shape': negative extent in %s",
                     d.name.c_str(), shape_text(d.shape).c_str());
    SPARTA_REQUIRE(static_cast<int64_t>(d.data.size()) == product(d.shape),
                   "save_checkpoint: dense tensor '%s' field 'data': expected %lld floats (shape %s), found %zu",
                   d.name.c_str(), static_cast<long long>(product(d.shape)), shape_text(d.shape).c_str(),
                   d.data.size());
  }
}

// ---- Writers.

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
    h5::write_dataset<float>(f, g + "/values", t.values.data(), {n, hsize_t(t.dim)});
    if (t.state_width > 0)
      h5::write_dataset<float>(f, g + "/state", t.state.data(), {n, hsize_t(t.state_width)});
    else
      h5::create_dataset<float>(f, g + "/state", {n, 0});  // sgd: no state, but the same layout
  }
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
}

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
}

// ---- Readers.

void require_file_ok(const Manifest& m, const std::string& name) {
  const CheckpointFile* cf = m.find_file(name);
  SPARTA_REQUIRE(cf, "%s: file list: expected '%s', not listed", m.path.c_str(), name.c_str());
  FileStatus st = check_file(m, *cf);
  SPARTA_REQUIRE(st.ok, "%s: %s", join(m.dir, name).c_str(), st.problem.c_str());
}

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
  auto text = [](const std::vector<hsize_t>& v) {
    std::vector<int64_t> s(v.begin(), v.end());
    return shape_text(s);
  };
  SPARTA_REQUIRE(got == want, "%s: dataset '%s': expected shape %s, found %s", f.path.c_str(), path.c_str(),
                 text(want).c_str(), text(got).c_str());
}

// One old shard, opened and checked against the manifest.
class ShardReader {
 public:
  ShardReader(const Manifest& m, int shard) : shard_(shard) {
    f_ = h5::open_file(join(m.dir, shard_name(shard, m.meta.world_size)));
    require_attr_string(f_, "/", "format", kShardFormat);
    require_attr_int(f_, "/", "version", kCheckpointVersion);
    require_attr_int(f_, "/", "step", m.meta.step);
    require_attr_int(f_, "/", "rank", shard);
    require_attr_int(f_, "/", "world_size", m.meta.world_size);
    require_attr_int(f_, "/", "num_tables", int64_t(m.tables.size()));
  }

  // Checks the table's group against the manifest; returns its row count.
  int64_t check_table(const ManifestTable& t) const {
    std::string g = group(t);
    SPARTA_REQUIRE(h5::exists(f_, g), "%s: table '%s': expected group '%s', not found", f_.path.c_str(),
                   t.spec.name.c_str(), g.c_str());
    require_attr_string(f_, g, "name", t.spec.name);
    require_attr_int(f_, g, "dim", t.spec.dim);
    require_attr_string(f_, g, "optimizer", t.spec.optimizer);
    require_attr_int(f_, g, "state_width", t.spec.state_width);
    int64_t n = t.shard_rows[shard_];
    require_attr_int(f_, g, "rows", n);
    h5::expect_type<int64_t>(f_, g + "/keys");
    h5::expect_type<float>(f_, g + "/values");
    h5::expect_type<float>(f_, g + "/state");
    require_shape(f_, g + "/keys", {hsize_t(n)});
    require_shape(f_, g + "/values", {hsize_t(n), hsize_t(t.spec.dim)});
    require_shape(f_, g + "/state", {hsize_t(n), hsize_t(t.spec.state_width)});
    return n;
  }

  // Appends rows [row0, row0 + rows) of the table to out.
  void read(const ManifestTable& t, int64_t row0, int64_t rows, TableRows& out) const {
    std::string g = group(t);
    h5::read_rows<int64_t>(f_, g + "/keys", row0, rows, keys_);
    h5::read_rows<float>(f_, g + "/values", row0, rows, floats_);
    out.keys.insert(out.keys.end(), keys_.begin(), keys_.end());
    out.values.insert(out.values.end(), floats_.begin(), floats_.end());
    if (t.spec.state_width > 0) {
      h5::read_rows<float>(f_, g + "/state", row0, rows, floats_);
      out.state.insert(out.state.end(), floats_.begin(), floats_.end());
    }
  }

 private:
  static std::string group(const ManifestTable& t) { return "/tables/" + t.spec.name; }
  int shard_;
  h5::File f_;
  mutable std::vector<int64_t> keys_;
  mutable std::vector<float> floats_;
};

TableRows empty_rows(const TableSpec& s) {
  TableRows t;
  t.name = s.name;
  t.dim = s.dim;
  t.optimizer = s.optimizer;
  t.state_width = s.state_width;
  return t;
}

// dense.h5, checked against the manifest (the caller verified its checksum).
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

}  // namespace

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

Manifest read_manifest(const std::string& step_dir) {
  Manifest m;
  m.dir = step_dir;
  m.path = join(step_dir, kManifestName);
  std::error_code ec;
  SPARTA_REQUIRE(fs::exists(m.path, ec), "%s: missing (not a complete checkpoint)", m.path.c_str());
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

// ---- Save.

std::string save_checkpoint(MPI_Comm comm, const std::string& root_dir, const CheckpointMeta& meta,
                            const std::vector<DenseTensor>& dense, const std::vector<TableRows>& tables,
                            const SaveOptions& options) {
  int rank = 0, world = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &world));
  // The hook runs like every other step: a failure in it on one rank is an error on every rank.
  auto stage = [&](const char* name) {
    if (options.on_stage) agree_on_error(comm, guarded([&] { options.on_stage(name); }));
  };
  const std::string name = step_name(meta.step);
  const std::string tmp = join(root_dir, name + ".tmp"), final_dir = join(root_dir, name);
  const std::string replaced = final_dir + ".replaced";

  // Inputs: checked on every rank, and the table list must be the same everywhere.
  agree_on_error(comm, guarded([&] {
          SPARTA_REQUIRE(meta.step >= 0, "save_checkpoint: field 'step': expected >= 0, found %lld",
                         static_cast<long long>(meta.step));
          validate_tables(tables);
          if (rank == 0) validate_dense(dense);
        }));
  std::string mine = table_signature(tables);
  std::string root_sig = bcast_string(comm, 0, mine);
  agree_on_error(comm, guarded([&] {
          SPARTA_REQUIRE(mine == root_sig, "save_checkpoint: tables differ between ranks: rank 0 passes %s, rank %d "
                         "passes %s", root_sig.c_str(), rank, mine.c_str());
        }));

  // The step directory, as step-<n>.tmp.
  agree_on_error(comm, guarded([&] {
          if (rank != 0) return;
          std::error_code ec;
          fs::create_directories(root_dir, ec);
          SPARTA_REQUIRE(fs::is_directory(root_dir), "%s: cannot create the checkpoint root: %s", root_dir.c_str(),
                         ec.message().c_str());
          if (fs::exists(final_dir, ec)) {
            // A complete step-<n> that `latest` does not name: a run resumed from an earlier step, or a save that
            // crashed between its rename and `latest`. It is set aside and removed once the new one is published.
            SPARTA_REQUIRE(read_latest(root_dir) != name, "%s: is the latest checkpoint; it is never overwritten",
                           final_dir.c_str());
            fs::remove_all(replaced, ec);
            rename_path(final_dir, replaced);
          }
          fs::remove_all(tmp, ec);  // a save of this step that crashed
          SPARTA_REQUIRE(!ec, "%s: cannot remove the stale directory: %s", tmp.c_str(), ec.message().c_str());
          SPARTA_REQUIRE(fs::create_directory(tmp, ec), "%s: cannot create: %s", tmp.c_str(), ec.message().c_str());
        }));
  bool renamed = false;
  try {
    stage("tmp_created");
    // Every rank writes its shard, rank 0 also the dense file; each is fsynced and checksummed.
    std::vector<CheckpointFile> written;
    agree_on_error(comm, guarded([&] {
            std::string shard = shard_name(rank, world);
            write_shard(join(tmp, shard), meta, rank, world, tables);
            written.push_back(seal_file(tmp, shard));
            if (rank == 0) {
              write_dense(join(tmp, kDenseName), meta, dense);
              written.push_back(seal_file(tmp, kDenseName));
            }
          }));
    stage("files_written");

    // Rank 0 gathers the checksums and the row counts and writes the manifest.
    std::string records;
    for (const CheckpointFile& f : written)
      records += f.name + " " + std::to_string(f.bytes) + " " + checksum_hex(f.checksum) + "\n";
    int len = static_cast<int>(records.size());
    std::vector<int> lens(world), offsets(world);
    MPI_CHECK(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, comm));
    std::partial_sum(lens.begin(), lens.end() - 1, offsets.begin() + 1);
    std::string all_records(rank == 0 ? size_t(offsets.back() + lens.back()) : 0, '\0');
    MPI_CHECK(MPI_Gatherv(records.data(), len, MPI_CHAR, &all_records[0], lens.data(), offsets.data(), MPI_CHAR, 0,
                          comm));
    std::vector<int64_t> rows(tables.size()), rows_by_rank(rank == 0 ? tables.size() * world : 0);
    for (size_t i = 0; i < tables.size(); ++i) rows[i] = static_cast<int64_t>(tables[i].rows());
    MPI_CHECK(MPI_Gather(rows.data(), static_cast<int>(rows.size()), MPI_INT64_T, rows_by_rank.data(),
                         static_cast<int>(rows.size()), MPI_INT64_T, 0, comm));
    agree_on_error(comm, guarded([&] {
            if (rank != 0) return;
            std::vector<CheckpointFile> files;
            std::istringstream in(all_records);
            CheckpointFile cf;
            std::string hex;
            while (in >> cf.name >> cf.bytes >> hex) {
              cf.checksum = parse_checksum_hex(hex);
              files.push_back(cf);
            }
            write_manifest(join(tmp, kManifestName), meta, world, tables, rows_by_rank, dense, files);
            fsync_path(join(tmp, kManifestName), false);
            fsync_path(tmp, true);
          }));
    stage("manifest_written");

    // Publish: the rename makes the step whole at once; then `latest` moves to it.
    agree_on_error(comm, guarded([&] {
            if (rank != 0) return;
            rename_path(tmp, final_dir);
            renamed = true;
            fsync_path(root_dir, true);
          }));
    renamed = true;
    stage("renamed");
    agree_on_error(comm, guarded([&] {
            if (rank == 0) write_file_atomic(root_dir, "latest", name + "\n");
          }));
    stage("latest_written");
    if (rank == 0) {
      std::error_code ec;
      fs::remove_all(replaced, ec);
    }
  } catch (const Error&) {
    if (rank == 0 && !renamed) {
      std::error_code ec;
      fs::remove_all(tmp, ec);  // best effort: a leftover .tmp is harmless too
    }
    throw;
  }
  return final_dir;
}

// ---- Load.

LoadedCheckpoint load_checkpoint(MPI_Comm comm, const std::string& path, const ModelSpec& expected,
                                 const OwnerFn& owner) {
  int rank = 0, world = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &world));
  LoadedCheckpoint out;

  // Rank 0 resolves `latest` once, so a save running beside this load cannot split the ranks over two steps.
  std::string dir;
  agree_on_error(comm, guarded([&] {
          if (rank == 0) dir = resolve_checkpoint_dir(path);
        }));
  dir = bcast_string(comm, 0, dir);
  Manifest& m = out.manifest;
  agree_on_error(comm, guarded([&] {
          m = read_manifest(dir);
          check_model_spec(m, expected);
        }));
  const int old_world = m.meta.world_size;

  // This rank's old shards, checked whole (checksum) and in structure; rank 0 reads the dense file.
  std::vector<int> my_shards;
  for (int s = rank; s < old_world; s += world) my_shards.push_back(s);
  std::vector<const ManifestTable*> mtables;
  for (const TableSpec& t : expected.tables) mtables.push_back(m.find_table(t.name));
  std::vector<std::unique_ptr<ShardReader>> readers;
  agree_on_error(comm, guarded([&] {
          for (int s : my_shards) {
            require_file_ok(m, shard_name(s, old_world));
            readers.push_back(std::make_unique<ShardReader>(m, s));
            for (const ManifestTable* t : mtables) readers.back()->check_table(*t);
          }
          if (rank == 0) {
            require_file_ok(m, kDenseName);
            std::vector<DenseTensor> all = read_dense_file(m);
            for (const DenseSpec& want : expected.dense)
              for (DenseTensor& d : all)
                if (d.name == want.name) out.dense.push_back(std::move(d));
          }
        }));

  // Dense tensors to every rank (data-parallel); their shapes are known everywhere from the manifest.
  if (rank != 0) {
    for (const DenseSpec& s : expected.dense) {
      DenseTensor d;
      d.name = s.name;
      d.shape = s.shape;
      d.data.resize(static_cast<size_t>(product(s.shape)));
      out.dense.push_back(std::move(d));
    }
  }
  for (DenseTensor& d : out.dense) bcast_vector(comm, 0, d.data);

  // Tables: read in rounds, route each row to its owner now.
  for (size_t ti = 0; ti < expected.tables.size(); ++ti) {
    const ManifestTable& mt = *mtables[ti];
    const int dim = mt.spec.dim, sw = mt.spec.state_width;
    TableRows result = empty_rows(mt.spec);
    int64_t local_rows = 0;
    for (int s : my_shards) local_rows += mt.shard_rows[s];
    const int64_t row_bytes = 8 + 4 * int64_t(dim + sw);
    // A round sends at most kRoundBytes per rank and receives at most 2^30 elements (W senders, each possibly
    // sending every row to every rank for kEveryRank).
    int64_t chunk = std::max<int64_t>(
        1, std::min<int64_t>(kRoundBytes / row_bytes, (int64_t(1) << 30) / (int64_t(dim + sw + 1) * world)));
    int64_t my_rounds = (local_rows + chunk - 1) / chunk, rounds = 0;
    MPI_CHECK(MPI_Allreduce(&my_rounds, &rounds, 1, MPI_INT64_T, MPI_MAX, comm));
    size_t shard_at = 0;
    int64_t row_at = 0;
    for (int64_t round = 0; round < rounds; ++round) {
      TableRows batch = empty_rows(mt.spec);
      std::vector<int> dest;
      agree_on_error(comm, guarded([&] {
              while (static_cast<int64_t>(batch.rows()) < chunk && shard_at < my_shards.size()) {
                int64_t n = mt.shard_rows[my_shards[shard_at]];
                int64_t take = std::min(n - row_at, chunk - static_cast<int64_t>(batch.rows()));
                if (take > 0) readers[shard_at]->read(mt, row_at, take, batch);
                row_at += take;
                if (row_at >= n) {
                  ++shard_at;
                  row_at = 0;
                }
              }
              dest.resize(batch.rows());
              for (size_t i = 0; i < batch.rows(); ++i) {
                int o = owner(static_cast<int>(ti), batch.keys[i]);
                SPARTA_REQUIRE(o == kEveryRank || (o >= 0 && o < world),
                               "load_checkpoint: table '%s': owner of key %lld is %d; expected a rank in [0, %d) or "
                               "kEveryRank", mt.spec.name.c_str(), static_cast<long long>(batch.keys[i]), o, world);
                dest[i] = o;
              }
            }));
      // Pack by destination.
      std::vector<int> send_rows(world, 0), recv_rows(world, 0);
      for (int o : dest) {
        if (o == kEveryRank)
          for (int r = 0; r < world; ++r) ++send_rows[r];
        else
          ++send_rows[o];
      }
      std::vector<int> first(world, 0);
      std::partial_sum(send_rows.begin(), send_rows.end() - 1, first.begin() + 1);
      int total_send = first.back() + send_rows.back();
      std::vector<int64_t> skeys(total_send);
      std::vector<float> svalues(size_t(total_send) * dim), sstate(size_t(total_send) * sw);
      std::vector<int> fill = first;
      auto put = [&](size_t i, int r) {
        int at = fill[r]++;
        skeys[at] = batch.keys[i];
        std::copy_n(batch.values.begin() + i * dim, dim, svalues.begin() + size_t(at) * dim);
        std::copy_n(batch.state.begin() + i * sw, sw, sstate.begin() + size_t(at) * sw);
      };
      for (size_t i = 0; i < dest.size(); ++i) {
        if (dest[i] == kEveryRank)
          for (int r = 0; r < world; ++r) put(i, r);
        else
          put(i, dest[i]);
      }
      MPI_CHECK(MPI_Alltoall(send_rows.data(), 1, MPI_INT, recv_rows.data(), 1, MPI_INT, comm));
      std::vector<int> rfirst(world, 0);
      std::partial_sum(recv_rows.begin(), recv_rows.end() - 1, rfirst.begin() + 1);
      int total_recv = rfirst.back() + recv_rows.back();
      size_t base = result.rows();
      result.keys.resize(base + total_recv);
      result.values.resize((base + total_recv) * dim);
      result.state.resize((base + total_recv) * sw);
      MPI_CHECK(MPI_Alltoallv(skeys.data(), send_rows.data(), first.data(), MPI_INT64_T, result.keys.data() + base,
                              recv_rows.data(), rfirst.data(), MPI_INT64_T, comm));
      auto scaled = [](std::vector<int> v, int k) {
        for (int& x : v) x *= k;
        return v;
      };
      MPI_CHECK(MPI_Alltoallv(svalues.data(), scaled(send_rows, dim).data(), scaled(first, dim).data(), MPI_FLOAT,
                              result.values.data() + base * dim, scaled(recv_rows, dim).data(),
                              scaled(rfirst, dim).data(), MPI_FLOAT, comm));
      if (sw > 0)
        MPI_CHECK(MPI_Alltoallv(sstate.data(), scaled(send_rows, sw).data(), scaled(first, sw).data(), MPI_FLOAT,
                                result.state.data() + base * sw, scaled(recv_rows, sw).data(),
                                scaled(rfirst, sw).data(), MPI_FLOAT, comm));
    }

    // Sorted by key, so the result does not depend on how the old shards were split; a key twice is an error.
    std::vector<size_t> order(result.rows());
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return result.keys[a] < result.keys[b]; });
    TableRows sorted = empty_rows(mt.spec);
    sorted.keys.resize(result.rows());
    sorted.values.resize(result.values.size());
    sorted.state.resize(result.state.size());
    std::string dup;
    for (size_t i = 0; i < order.size(); ++i) {
      size_t j = order[i];
      sorted.keys[i] = result.keys[j];
      std::copy_n(result.values.begin() + j * dim, dim, sorted.values.begin() + i * dim);
      std::copy_n(result.state.begin() + j * sw, sw, sorted.state.begin() + i * sw);
      if (i > 0 && sorted.keys[i] == sorted.keys[i - 1] && dup.empty())
        dup = strprintf("%s: table '%s': key %lld appears more than once in the checkpoint", dir.c_str(),
                        mt.spec.name.c_str(), static_cast<long long>(sorted.keys[i]));
    }
    agree_on_error(comm, dup);
    out.tables.push_back(std::move(sorted));
  }
  return out;
}

// ---- Single-process tools.

std::string resolve_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(join(path, kManifestName), ec)) return path;
  SPARTA_REQUIRE(fs::is_directory(path, ec), "%s: no such directory", path.c_str());
  std::string latest = read_latest(path);
  if (!latest.empty()) {
    std::string dir = join(path, latest);
    SPARTA_REQUIRE(fs::is_directory(dir, ec), "%s: names '%s', which does not exist", join(path, "latest").c_str(),
                   latest.c_str());
    return dir;
  }
  SPARTA_REQUIRE(parse_step_name(fs::path(path).filename().string()) < 0, "%s: missing (not a complete checkpoint)",
                 join(path, kManifestName).c_str());
  throw Error(path + ": not a checkpoint: no manifest.h5 (a step directory) and no 'latest' (a checkpoint root)");
}

CheckpointList list_checkpoints(const std::string& root_dir) {
  std::error_code ec;
  SPARTA_REQUIRE(fs::is_directory(root_dir, ec), "%s: no such directory", root_dir.c_str());
  CheckpointList list;
  for (const fs::directory_entry& e : fs::directory_iterator(root_dir, ec)) {
    if (!e.is_directory(ec)) continue;
    std::string n = e.path().filename().string();
    const std::string suffix = ".tmp";
    if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        parse_step_name(n.substr(0, n.size() - suffix.size())) >= 0)
      list.incomplete.push_back(n);
    else if (parse_step_name(n) >= 0)
      list.steps.push_back(parse_step_name(n));
  }
  SPARTA_REQUIRE(!ec, "%s: cannot list: %s", root_dir.c_str(), ec.message().c_str());
  std::sort(list.steps.begin(), list.steps.end());
  std::sort(list.incomplete.begin(), list.incomplete.end());
  std::string latest = read_latest(root_dir);
  if (!latest.empty()) list.latest = parse_step_name(latest);
  return list;
}

VerifyReport verify_checkpoint(const std::string& path) {
  VerifyReport r;
  r.manifest = read_manifest(resolve_checkpoint_dir(path));
  const Manifest& m = r.manifest;
  for (const CheckpointFile& f : m.files) {
    r.files.push_back(check_file(m, f));
    if (!r.files.back().ok) r.problems.push_back(join(m.dir, f.name) + ": " + r.files.back().problem);
  }
  auto intact = [&](const std::string& name) {
    for (const FileStatus& s : r.files)
      if (s.expected.name == name) return s.ok;
    return false;
  };
  for (int s = 0; s < m.meta.world_size; ++s) {
    if (!intact(shard_name(s, m.meta.world_size))) continue;
    std::string err = guarded([&] {
      ShardReader reader(m, s);
      for (const ManifestTable& t : m.tables) reader.check_table(t);
    });
    if (!err.empty()) r.problems.push_back(err);
  }
  if (intact(kDenseName)) {
    std::string err = guarded([&] { read_dense_file(m); });
    if (!err.empty()) r.problems.push_back(err);
  }
  return r;
}

TableRows read_table(const Manifest& m, const std::string& table) {
  const ManifestTable* t = m.find_table(table);
  SPARTA_REQUIRE(t, "%s: table '%s': not in the checkpoint", m.path.c_str(), table.c_str());
  TableRows out = empty_rows(t->spec);
  for (int s = 0; s < m.meta.world_size; ++s) {
    require_file_ok(m, shard_name(s, m.meta.world_size));
    ShardReader reader(m, s);
    int64_t n = reader.check_table(*t);
    reader.read(*t, 0, n, out);
  }
  return out;
}

std::vector<DenseTensor> read_dense(const Manifest& m) {
  require_file_ok(m, kDenseName);
  return read_dense_file(m);
}

int64_t export_table(const std::string& path, const std::string& table, const std::string& out_file) {
  Manifest m = read_manifest(resolve_checkpoint_dir(path));
  const ManifestTable* t = m.find_table(table);
  std::string held;
  for (const ManifestTable& x : m.tables) held += (held.empty() ? "" : ", ") + x.spec.name;
  SPARTA_REQUIRE(t, "%s: table '%s': not in the checkpoint (it holds: %s)", m.path.c_str(), table.c_str(),
                 held.empty() ? "no tables" : held.c_str());
  for (int s = 0; s < m.meta.world_size; ++s) require_file_ok(m, shard_name(s, m.meta.world_size));
  const int dim = t->spec.dim, sw = t->spec.state_width;
  try {
    h5::File f = h5::create_file(out_file);
    h5::write_attr(f, "/", "format", std::string(kExportFormat));
    h5::write_attr(f, "/", "version", kCheckpointVersion);
    h5::write_attr(f, "/", "table", t->spec.name);
    h5::write_attr(f, "/", "dim", int64_t(dim));
    h5::write_attr(f, "/", "optimizer", t->spec.optimizer);
    h5::write_attr(f, "/", "state_width", int64_t(sw));
    h5::write_attr(f, "/", "step", m.meta.step);
    h5::write_attr(f, "/", "rows", t->rows);
    h5::write_attr(f, "/", "source", m.dir);
    h5::create_dataset<int64_t>(f, "/keys", {hsize_t(t->rows)});
    h5::create_dataset<float>(f, "/values", {hsize_t(t->rows), hsize_t(dim)});
    h5::create_dataset<float>(f, "/state", {hsize_t(t->rows), hsize_t(sw)});
    const int64_t chunk = std::max<int64_t>(1, kRoundBytes / (8 + 4 * int64_t(dim + sw)));
    int64_t at = 0;
    for (int s = 0; s < m.meta.world_size; ++s) {
      ShardReader reader(m, s);
      int64_t n = reader.check_table(*t);
      for (int64_t row0 = 0; row0 < n; row0 += chunk) {
        int64_t rows = std::min(chunk, n - row0);
        TableRows part = empty_rows(t->spec);
        reader.read(*t, row0, rows, part);
        h5::write_rows<int64_t>(f, "/keys", part.keys.data(), at, rows);
        h5::write_rows<float>(f, "/values", part.values.data(), at, rows);
        if (sw > 0) h5::write_rows<float>(f, "/state", part.state.data(), at, rows);
        at += rows;
      }
    }
  } catch (const Error&) {
    std::error_code ec;
    fs::remove(out_file, ec);  // no half-written export left behind
    throw;
  }
  return t->rows;
}

}  // namespace sparta
