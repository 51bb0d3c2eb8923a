// sparta-ckpt: looks into checkpoints (io/checkpoint.h) on one rank.
//   sparta-ckpt list ROOT                                  the steps under a checkpoint root and which is latest
//   sparta-ckpt verify PATH                                a step directory (or a root: its latest): step, world
//                                                          size, tables, rows, sizes, and every file's checksum
//   sparta-ckpt export PATH --table NAME --out FILE.h5     one table merged over the shards, as plain HDF5
// Exit status: 0 when fine; 1 on a bad checkpoint (a checksum mismatch, a missing or malformed file); 2 on bad
// usage. May run under `mpiexec -n 1`.
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "io/outputs.h"
#include "src/base/check.h"
#include "io/checkpoint.h"
#include "io/checksum.h"
#include "src/context.h"
#include "src/options.h"

namespace {

const char* kUsage =
    "usage: sparta-ckpt list ROOT\n"
    "       sparta-ckpt verify PATH            (a step directory, or a root: its latest step)\n"
    "       sparta-ckpt export PATH --table NAME --out FILE.h5";

std::string ints_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string first_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  return line.size() > 100 ? line.substr(0, 100) + "..." : line;
}

int list(const std::string& root) {
  sparta::CheckpointList l = sparta::list_checkpoints(root);
  std::printf("checkpoint root %s\n", root.c_str());
  for (int64_t s : l.steps) std::printf("  step-%lld%s\n", static_cast<long long>(s), s == l.latest ? "   (latest)" : "");
  for (const std::string& t : l.incomplete) std::printf("  %s   (incomplete: a save that did not finish)\n", t.c_str());
  if (l.latest >= 0)
    std::printf("latest: step-%lld\n", static_cast<long long>(l.latest));
  else
    std::printf("latest: none\n");
  return 0;
}

int verify(const std::string& path) {
  sparta::VerifyReport r = sparta::verify_checkpoint(path);
  const sparta::Manifest& m = r.manifest;
  std::printf("checkpoint %s\n", m.dir.c_str());
  std::printf("  format %s version %lld, step %lld, written by %d rank(s)\n", sparta::kCheckpointFormat,
              static_cast<long long>(m.version), static_cast<long long>(m.meta.step), m.meta.world_size);
  std::printf("  plan: %s\n", first_line(m.meta.plan).c_str());
  std::printf("  config: %zu bytes, first line: %s\n", m.meta.config.size(), first_line(m.meta.config).c_str());
  std::printf("  rng_state %s, reader_position %s\n", ints_text(m.meta.rng_state).c_str(),
              ints_text(m.meta.reader_position).c_str());
  for (const sparta::ManifestTable& t : m.tables) {
    double mb = double(t.rows) * (8 + 4.0 * (t.spec.dim + t.spec.state_width)) / 1e6;
    std::printf("  table %-16s dim %4d  %-10s state_width %4d  rows %12lld  %10.2f MB  per shard %s\n",
                t.spec.name.c_str(), t.spec.dim, t.spec.optimizer.c_str(), t.spec.state_width,
                static_cast<long long>(t.rows), mb, ints_text(t.shard_rows).c_str());
  }
  for (const sparta::DenseSpec& d : m.dense) std::printf("  dense %-24s shape %s\n", d.name.c_str(), ints_text(d.shape).c_str());
  std::printf("  files (xxh64):\n");
  for (const sparta::FileStatus& f : r.files)
    std::printf("    %-4s %-24s %12llu bytes  %s%s%s\n", f.ok ? "ok" : "BAD", f.expected.name.c_str(),
                static_cast<unsigned long long>(f.expected.bytes), sparta::checksum_hex(f.expected.checksum).c_str(),
                f.ok ? "" : "  ", f.problem.c_str());
  for (const std::string& p : r.problems) std::printf("problem: %s\n", p.c_str());
  std::printf("verify: %s\n", r.ok() ? "ok" : (std::to_string(r.problems.size()) + " problem(s)").c_str());
  return r.ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  sparta::MpiSession mpi(&argc, &argv);
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 1) {
    std::fprintf(stderr, "sparta-ckpt: runs on one rank, found %d\n", world);
    return 2;
  }
  std::string command = argc > 1 ? argv[1] : "", path = argc > 2 ? argv[2] : "";
  if (command == "-h" || command == "--help") {
    std::printf("%s\n", kUsage);
    return 0;
  }
  if (path.empty() || path[0] == '-' || (command != "list" && command != "verify" && command != "export")) {
    std::fprintf(stderr, "%s\n", kUsage);
    return 2;
  }
  std::string table, out;
  sparta::po::options_description desc("sparta-ckpt export options");
  desc.add_options()("help,h", "print this help")("table", sparta::po::value<std::string>(&table), "table to export")(
      "out", sparta::po::value<std::string>(&out), "output HDF5 file");
  std::vector<char*> rest{argv[0]};
  for (int i = 3; i < argc; ++i) rest.push_back(argv[i]);
  try {
    sparta::po::variables_map vm;
    if (!sparta::parse_options(static_cast<int>(rest.size()), rest.data(), desc, vm, kUsage)) return 0;
  } catch (const sparta::Error& e) {
    std::fprintf(stderr, "sparta-ckpt: %s\n%s\n", e.what(), kUsage);
    return 2;
  }
  try {
    if (command == "list") return list(path);
    if (command == "verify") return verify(path);
    if (table.empty() || out.empty()) {
      std::fprintf(stderr, "sparta-ckpt export: --table and --out are required\n%s\n", kUsage);
      return 2;
    }
    // The output never replaces a file of the checkpoint, and appears only once whole (io/outputs.h).
    sparta::require_output_not_input({"--out", out}, {{"checkpoint", path}});
    sparta::StagedOutput staged(out);
    int64_t rows = sparta::export_table(path, table, staged.path());
    staged.commit();
    std::printf("exported table '%s': %lld rows to %s\n", table.c_str(), static_cast<long long>(rows), out.c_str());
    return 0;
  } catch (const sparta::Error& e) {
    std::fprintf(stderr, "sparta-ckpt: %s\n", e.what());
    return 1;
  }
}
