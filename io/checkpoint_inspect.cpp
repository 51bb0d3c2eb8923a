// checkpoint_inspect.cpp: the single-process tools (sparta-ckpt and tests): resolve, list, verify, read a
// table or the dense tensors, export a table. No MPI.
#include <algorithm>
#include <filesystem>

#include "io/checkpoint.h"
#include "io/checkpoint_files.h"
#include "io/checkpoint_format.h"
#include "io/h5.h"
#include "src/base/agree.h"
#include "src/base/check.h"

namespace sparta {
namespace fs = std::filesystem;
using namespace ckpt;

std::string resolve_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(join(path, kManifestName), ec)) return path;
  SPARTA_REQUIRE(fs::is_directory(path, ec), "%s: no such directory", path.c_str());
  std::string latest = read_latest(path);
  if (!latest.empty()) {
    std::string dir = join(path, latest);
    SPARTA_REQUIRE(fs::is_directory(dir, ec), "%s: names '%s', which does not exist", join(path, kLatestName).c_str(),
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
    h5::close(f);
  } catch (const Error&) {
    std::error_code ec;
    fs::remove(out_file, ec);  // no half-written export left behind
    throw;
  }
  return t->rows;
}

}  // namespace sparta
