// sparta-convert: raw data into the sparta dataset format, streaming in constant memory.
//   --format criteo (default): Criteo click logs (TSV) with the MLPerf preprocessing (io/criteo.h)
//   --format csv: delimited text with a header, columns given roles (io/csv.h)
// With --out, the inputs go into one file, converted by rank 0 (under mpiexec the other ranks wait for its
// verdict). With --out-dir (csv), every input becomes a file of its own there (x.csv -> DIR/x.h5), the inputs
// shared out over the ranks: mpiexec -n 8 converts 8 files at once. A bad input ends every rank with the
// message and exit status 1.
//   sparta-convert --out day_0.h5 --max-index 40000000 day_0.tsv
//   zcat day_1.gz | sparta-convert --out day_1.h5 -
//   sparta-convert --format csv --label clicked --dense age,price --categorical city,device --multi tags
//       --out train.h5 train.csv
#include <mpi.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "io/criteo.h"
#include "io/csv.h"
#include "io/outputs.h"
#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/base/deadline.h"
#include "src/base/log.h"
#include "src/context.h"
#include "src/options.h"

namespace {

std::vector<std::string> split_names(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

char one_char(const char* option, const std::string& text) {
  if (text == "\\t" || text == "tab") return '\t';
  SPARTA_REQUIRE(text.size() == 1, "%s: expected one character (or \\t), found '%s'", option, text.c_str());
  return text[0];
}

// DIR/<input's name without its directory and last extension>.h5
std::string output_in(const std::string& dir, const std::string& input) {
  std::string base = input.substr(input.find_last_of('/') + 1);
  const size_t dot = base.find_last_of('.');
  if (dot != std::string::npos && dot > 0) base = base.substr(0, dot);
  return dir + "/" + base + ".h5";
}

}  // namespace

int main(int argc, char** argv) {
  sparta::MpiSession mpi(&argc, &argv);
  sparta::ContextOptions copt;
  copt.device = "cpu";
  sparta::Context ctx(copt);
  sparta::CriteoOptions co;
  sparta::CsvOptions cv;
  std::vector<std::string> inputs;
  std::string out, out_dir, level, format, dense, categorical, multi, delimiter, separator;
  bool no_header = false;
  sparta::po::options_description desc("sparta-convert options");
  desc.add_options()("help,h", "print this help")(
      "input", sparta::po::value<std::vector<std::string>>(&inputs), "input files, in order ('-': stdin); also positional")(
      "format", sparta::po::value<std::string>(&format)->default_value("criteo"),
      "criteo (Criteo TSV, MLPerf preprocessing) | csv (delimited text, the columns' roles given below)")(
      "out", sparta::po::value<std::string>(&out)->default_value(""), "output HDF5 file (every input into it)")(
      "out-dir", sparta::po::value<std::string>(&out_dir)->default_value(""),
      "csv: one output per input in this existing folder (x.csv -> DIR/x.h5), the inputs shared out over the ranks")(
      "max-index", sparta::po::value<int64_t>(&co.max_index)->default_value(0),
      "keys modulo this (MLPerf: 40000000); 0: no modulo, unbounded cardinality")(
      "skip-bad", sparta::po::bool_switch(&co.skip_bad), "skip and count malformed lines instead of stopping")(
      "progress", sparta::po::bool_switch(&co.progress), "progress bar on stderr (default: when stderr is a TTY)")(
      "chunk", sparta::po::value<int64_t>(&co.write.chunk_rows)->default_value(65536), "samples per HDF5 chunk")(
      "gzip", sparta::po::value<int>(&co.write.gzip)->default_value(0), "gzip level 1..9 (0: none)")(
      "fletcher32", sparta::po::bool_switch(&co.write.fletcher32), "a Fletcher32 checksum per chunk")(
      "log-level", sparta::po::value<std::string>(&level)->default_value("info"), "debug | info | warn | error");
  sparta::po::options_description csv("csv columns (names from the header line; 0-based indices with --no-header)");
  csv.add_options()("label", sparta::po::value<std::string>(&cv.label)->default_value(""),
                    "the label column: 0 or 1 (a number in [0, 1]; true/false)")(
      "dense", sparta::po::value<std::string>(&dense)->default_value(""),
      "dense columns, comma-separated: numbers, taken as they are (empty: --missing-dense)")(
      "categorical", sparta::po::value<std::string>(&categorical)->default_value(""),
      "categorical columns, comma-separated: one slot each, the field's text one key (empty: no key)")(
      "multi", sparta::po::value<std::string>(&multi)->default_value(""),
      "multi-valued categorical columns, comma-separated: one slot each, a key per value (values split by "
      "--multi-separator)")(
      "multi-separator", sparta::po::value<std::string>(&separator)->default_value("|"), "between the values of a --multi field")(
      "delimiter", sparta::po::value<std::string>(&delimiter)->default_value(","), "between fields (\\t: tab)")(
      "no-header", sparta::po::bool_switch(&no_header), "the first line is data; columns are 0-based indices")(
      "missing-dense", sparta::po::value<float>(&cv.missing_dense)->default_value(0.f, "0"), "an empty dense field's value")(
      "keys", sparta::po::value<std::string>(&cv.keys)->default_value("hash"),
      "hash (XXH64 of the text, --max-index applies; every file alike, parallel) | vocabulary (values numbered in "
      "order of appearance, one pass)")(
      "vocabulary-out", sparta::po::value<std::string>(&cv.vocabulary_out)->default_value(""),
      "vocabulary: write it to this file (to convert the eval split with it)")(
      "vocabulary-in", sparta::po::value<std::string>(&cv.vocabulary_in)->default_value(""),
      "vocabulary: use this one as it is (values it lacks share its last key)");
  desc.add(csv);
  sparta::po::positional_options_description pos;
  pos.add("input", -1);
  return sparta::run_program("sparta-convert", [&] {
    sparta::po::variables_map vm;
    bool help = false;
    // Every rank parses the same options: agreeing on the verdict lets a bad one end the job with status 1.
    sparta::agree_on_error(MPI_COMM_WORLD, sparta::guarded([&] {
      help = !sparta::parse_options(argc, argv, desc, vm, "usage: sparta-convert --out FILE [options] INPUT...", &pos);
    }), "convert (options)");
    if (help) return 0;
    co.progress = co.progress || sparta::ProgressBar::stderr_is_tty();
    std::vector<std::pair<std::string, std::string>> jobs;  // (inputs joined in one output) this rank converts
    sparta::agree_on_error(MPI_COMM_WORLD, sparta::guarded([&] {
      SPARTA_REQUIRE(format == "criteo" || format == "csv", "--format: expected criteo or csv, found '%s'",
                     format.c_str());
      SPARTA_REQUIRE(out.empty() != out_dir.empty(), "--out, --out-dir: expected one of them, found %s",
                     out.empty() ? "neither" : "both");
      SPARTA_REQUIRE(out_dir.empty() || format == "csv", "--out-dir: applies to --format csv");
      SPARTA_REQUIRE(format == "csv" || vm["label"].defaulted(), "--label: applies to --format csv");
      cv.dense = split_names(dense);
      cv.categorical = split_names(categorical);
      cv.multi = split_names(multi);
      cv.header = !no_header;
      cv.delimiter = one_char("--delimiter", delimiter);
      cv.multi_separator = one_char("--multi-separator", separator);
      cv.max_index = co.max_index;
      cv.skip_bad = co.skip_bad;
      cv.progress = co.progress;
      cv.write = co.write;
      SPARTA_REQUIRE(out_dir.empty() || cv.keys == "hash" || !cv.vocabulary_in.empty(),
                     "--out-dir with --keys vocabulary: a vocabulary grows over one output; convert into one --out, "
                     "or give --vocabulary-in, or use --keys hash");
      SPARTA_REQUIRE(out_dir.empty() || std::count(inputs.begin(), inputs.end(), "-") == 0,
                     "--out-dir: stdin ('-') has no file name to name its output by");
    }), "convert (options)");
    // One output from its inputs: never one of them, enough free space, written under a temporary name and renamed
    // once complete (io/outputs.h), and never empty.
    auto convert_one = [&](const std::vector<std::string>& ins, const std::string& dest) {
      std::vector<sparta::NamedPath> named;
      uint64_t input_bytes = 0;
      for (const std::string& in : ins) {
        named.push_back({"input", in});
        std::error_code ec;
        if (in != "-" && std::filesystem::is_regular_file(in, ec)) input_bytes += std::filesystem::file_size(in, ec);
      }
      const sparta::NamedPath dest_named{out.empty() ? "--out-dir" : "--out", dest};
      sparta::require_output_not_input(dest_named, named);
      // A sample takes at least the bytes of its text line (less with --gzip).
      sparta::require_free_space(dest_named, input_bytes / (co.write.gzip > 0 ? 8 : 1),
                                 sparta::strprintf("converting %.3g GB of text", input_bytes / 1e9));
      sparta::StagedOutput staged(dest);
      sparta::ConvertStats one = format == "csv" ? sparta::convert_csv(ins, staged.path(), cv)
                                                 : sparta::convert_criteo(ins, staged.path(), co);
      SPARTA_REQUIRE(one.samples > 0, "%s: no sample to write: %lld line(s) read, %lld malformed%s; nothing written",
                     dest.c_str(), (long long)one.lines, (long long)one.skipped,
                     co.skip_bad ? " and skipped (--skip-bad)" : "");
      staged.commit();
      return one;
    };
    sparta::ConvertStats s;
    const bool one_output = !out.empty();
    sparta::agree_on_error(MPI_COMM_WORLD, sparta::guarded([&] {
      if (one_output) {
        if (!ctx.is_root()) return;
        s = convert_one(inputs, out);
        return;
      }
      for (size_t i = size_t(ctx.rank()); i < inputs.size(); i += size_t(ctx.world())) {
        const sparta::ConvertStats one = convert_one({inputs[i]}, output_in(out_dir, inputs[i]));
        s.lines += one.lines, s.samples += one.samples, s.skipped += one.skipped, s.bytes += one.bytes;
        s.seconds = std::max(s.seconds, one.seconds);
      }
    }), "convert");
    int64_t mine[4] = {s.lines, s.samples, s.skipped, s.bytes}, all[4] = {0, 0, 0, 0};
    sparta::timed_reduce(mine, all, 4, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD, "convert: counts");
    double seconds = 0;
    sparta::timed_reduce(&s.seconds, &seconds, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD, "convert: seconds");
    LOG_INFO("sparta-convert: wrote %s: %lld samples from %lld lines (%lld malformed skipped), %.1f MB in %.1f s "
             "(%.2f M lines/s)",
             one_output ? out.c_str() : (std::to_string(inputs.size()) + " file(s) in " + out_dir).c_str(),
             (long long)all[1], (long long)all[0], (long long)all[2], all[3] / 1e6, seconds,
             all[0] / std::max(seconds, 1e-9) / 1e6);
    return 0;
  });
}
