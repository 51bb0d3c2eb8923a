// sparta-convert: Criteo click logs (TSV) into the sparta dataset format with the MLPerf preprocessing
// (io/criteo.h), streaming in constant memory. Runs on one process (under mpiexec, rank 0 converts and the
// other ranks wait for its verdict). A bad input ends it with the message and exit status 1.
//   sparta-convert --out day_0.h5 --max-index 40000000 day_0.tsv
//   zcat day_1.gz | sparta-convert --out day_1.h5 -
#include <mpi.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "io/criteo.h"
#include "io/outputs.h"
#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/base/log.h"
#include "src/context.h"
#include "src/options.h"

int main(int argc, char** argv) {
  sparta::MpiSession mpi(&argc, &argv);
  sparta::ContextOptions copt;
  copt.device = "cpu";
  sparta::Context ctx(copt);
  sparta::CriteoOptions co;
  std::vector<std::string> inputs;
  std::string out, level;
  sparta::po::options_description desc("sparta-convert options");
  desc.add_options()("help,h", "print this help")(
      "input", sparta::po::value<std::vector<std::string>>(&inputs), "input TSV files, in order ('-': stdin); also positional")(
      "out", sparta::po::value<std::string>(&out)->required(), "output HDF5 file")(
      "max-index", sparta::po::value<int64_t>(&co.max_index)->default_value(0),
      "keys modulo this (MLPerf: 40000000); 0: no modulo, unbounded cardinality")(
      "skip-bad", sparta::po::bool_switch(&co.skip_bad), "skip and count malformed lines instead of stopping")(
      "progress", sparta::po::bool_switch(&co.progress), "progress bar on stderr (default: when stderr is a TTY)")(
      "chunk", sparta::po::value<int64_t>(&co.write.chunk_rows)->default_value(65536), "samples per HDF5 chunk")(
      "gzip", sparta::po::value<int>(&co.write.gzip)->default_value(0), "gzip level 1..9 (0: none)")(
      "fletcher32", sparta::po::bool_switch(&co.write.fletcher32), "a Fletcher32 checksum per chunk")(
      "log-level", sparta::po::value<std::string>(&level)->default_value("info"), "debug | info | warn | error");
  sparta::po::positional_options_description pos;
  pos.add("input", -1);
  return sparta::run_program("sparta-convert", [&] {
    sparta::po::variables_map vm;
    bool help = false;
    // Every rank parses the same options: agreeing on the verdict lets a bad one end the job with status 1.
    sparta::agree_on_error(MPI_COMM_WORLD, sparta::guarded([&] {
      help = !sparta::parse_options(argc, argv, desc, vm, "usage: sparta-convert --out FILE [options] INPUT.tsv...", &pos);
    }), "convert (options)");
    if (help) return 0;
    co.progress = co.progress || sparta::ProgressBar::stderr_is_tty();
    sparta::ConvertStats s;
    // Rank 0 converts while the others wait for its verdict: a bad input ends every rank with one Error. The
    // output never replaces an input, is written under a temporary name and renamed once complete (io/outputs.h).
    sparta::agree_on_error(MPI_COMM_WORLD, sparta::guarded([&] {
                             if (!ctx.is_root()) return;
                             std::vector<sparta::NamedPath> named;
                             uint64_t input_bytes = 0;
                             for (const std::string& in : inputs) {
                               named.push_back({"input", in});
                               std::error_code ec;
                               if (in != "-" && std::filesystem::is_regular_file(in, ec))
                                 input_bytes += std::filesystem::file_size(in, ec);
                             }
                             sparta::require_output_not_input({"--out", out}, named);
                             // A sample takes at least the bytes of its text line (less with --gzip).
                             sparta::require_free_space({"--out", out}, input_bytes / (co.write.gzip > 0 ? 8 : 1),
                                                        sparta::strprintf("converting %.3g GB of text", input_bytes / 1e9));
                             sparta::StagedOutput staged(out);
                             s = sparta::convert_criteo(inputs, staged.path(), co);
                             SPARTA_REQUIRE(s.samples > 0,
                                            "%s: no sample to write: %lld line(s) read, %lld malformed%s; nothing written",
                                            out.c_str(), (long long)s.lines, (long long)s.skipped,
                                            co.skip_bad ? " and skipped (--skip-bad)" : "");
                             staged.commit();
                           }), "convert");
    LOG_INFO("sparta-convert: wrote %s: %lld samples from %lld lines (%lld malformed skipped), %.1f MB in %.1f s (%.2f M lines/s)",
             out.c_str(), (long long)s.samples, (long long)s.lines, (long long)s.skipped, s.bytes / 1e6, s.seconds,
             s.lines / std::max(s.seconds, 1e-9) / 1e6);
    return 0;
  });
}
