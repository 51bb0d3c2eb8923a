// support_bench.h: what every benchmark binary shares: the Driver (common options, MPI and device set-up,
// warm-up and timing, result checking, JSON-line reporting), timing (CUDA events on the device's stream, or
// the steady clock around a synchronized call on cpu; warm-up, then the median of repeats), provenance (git
// revision, command line, host, GPUs, ranks, nodes, library versions), JSON-line output and the device's copy
// bandwidth. Linked into every experiment binary (experiments/support_*.cpp).
//
// Every bench_* main has the same shape:
//
//   int main(int argc, char** argv) {
//     bench::Driver d("bench_x", argc, argv, {/*warmup*/ 5, /*repeats*/ 20});
//     d.options().add_options()("rows", po::value(&rows), "...");        // the bench's own options
//     return d.run("usage: mpiexec -n N bench_x [options]", [&] {
//       std::vector<double> ms = d.time([&] { kernel(d.device()); });   // --warmup untimed, --repeats timed
//       d.add_wrong(count_wrong(...));                                   // checked against a reference
//       d.record(strprintf("\"bench\":\"x\",\"ms\":%g", median(ms)));   // one JSON line (rank 0)
//     });
//   }
//
// Options every bench takes: --out FILE (append JSON lines; rank 0), --warmup, --repeats (or the bench's name
// for its timed repeats: bench_train's --steps, bench_collection's --iters), --iters (benches that time several
// calls per repeat), --tag TEXT (copied into every line: sweeps name their points with it),
// --device cpu|cuda|auto, --ranks-per-node, --log-level, --help.
#pragma once

#include <cstddef>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/base/device.h"
#include "src/context.h"
#include "src/options.h"

namespace sparta {
namespace bench {

// Measures the time between start() and stop_ms(): CUDA events recorded on dev.stream (cuda), or the steady
// clock with the device synchronized at stop (cpu; CUDA=0 builds have only this). stop_all_ms ends the time when
// every stream of the device is idle, so that work a call leaves running beside dev.stream (a host tier's
// write-back to host memory, src/host_tier.h) counts in it rather than in the untimed gap before the next start.
class DeviceTimer {
 public:
  explicit DeviceTimer(const Device& dev);
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;
  void start();
  double stop_ms();      // waits for the work enqueued on dev.stream since start()
  double stop_all_ms();  // waits for all of the device's work, every stream's

 private:
  Device dev_;
  void* start_event_ = nullptr;  // cudaEvent_t (an opaque pointer) on cuda
  void* stop_event_ = nullptr;
  double t0_ms_ = 0;
};

// Milliseconds one call of f takes on dev; every_stream: until every stream of dev is idle
// (DeviceTimer::stop_all_ms).
template <class F>
double time_ms(const Device& dev, F&& f, bool every_stream = false) {
  DeviceTimer t(dev);
  t.start();
  f();
  return every_stream ? t.stop_all_ms() : t.stop_ms();
}

// warmup untimed calls of f, then repeats timed ones: their times in ms, in order.
template <class F>
std::vector<double> time_repeats(const Device& dev, int warmup, int repeats, F&& f) {
  DeviceTimer t(dev);
  std::vector<double> ms;
  for (int r = 0; r < warmup + repeats; ++r) {
    t.start();
    f();
    double x = t.stop_ms();
    if (r >= warmup) ms.push_back(x);
  }
  return ms;
}

double median(std::vector<double> v);  // upper median; v non-empty

// Device-to-device copy bandwidth of dev, (read + written bytes) / time, GB/s: median of repeats of a copy of
// `bytes` non-zero bytes after warmup copies.
double copy_bandwidth_gbps(const Device& dev, size_t bytes, int warmup, int repeats);

// ---- provenance ----

// SPARTA_GIT_REV when set (a carried build has no .git), else `git rev-parse HEAD` in the working directory
// at run time (with "-dirty" when tracked files differ), else "unknown".
std::string git_revision();
std::string command_line(int argc, char** argv);
std::string host_name();
std::string utc_date();  // 2024-05-01T12:00:00Z
// "cpu" or "cuda:0 NVIDIA H100 80GB HBM3".
std::string device_description(const Device& dev);
std::string json_escape(const std::string& s);

// Versions of the libraries this process runs with (not those it was compiled against, where they differ):
// CUDA runtime and driver ("12.4"; "none" in a CPU-only build, "0.0" for a driver when none is installed),
// NCCL ("2.21.5"; "none" in a CPU-only build), MPI (MPI_Get_library_version's first line) and HDF5
// (H5get_libversion). None of these calls creates a CUDA context.
struct Versions {
  std::string cuda_runtime = "none", cuda_driver = "none", nccl = "none", mpi, hdf5;
};
Versions library_versions();

struct Provenance {
  std::string git, command, host, date;
  std::vector<std::string> devices;  // one per rank: "host cuda:0 NVIDIA H100 80GB HBM3" (or "... cpu")
  std::vector<std::string> hosts;    // distinct host names, in rank order
  std::vector<std::string> gpus;     // distinct GPU names over the ranks (empty when every rank is on the cpu)
  int ranks = 1, nodes = 1, ranks_per_node = 1;
  Versions versions;
  // "git":...,"command":...,"host":...,"hosts":[...],"devices":[...],"gpus":[...],"ranks":n,"nodes":n,
  // "ranks_per_node":n,"cuda_runtime":...,"cuda_driver":...,"nccl":...,"mpi":...,"hdf5":...,"date":...
  // (no braces)
  std::string json() const;
};
// Provenance of a one-process measurement (or of rank 0 only): devices as given, one node, library versions
// taken now.
Provenance provenance(int argc, char** argv, const std::vector<std::string>& devices, int ranks = 1);
// Every rank's string, on every rank (in rank order).
std::vector<std::string> all_gather_strings(const std::string& mine, MPI_Comm comm);
// Collective: every rank's timeline points (StreamClock::read), printed by rank 0 as "# trace rank R:   ms  label".
void print_traces(const std::vector<StreamClock::Point>& mine, MPI_Comm comm);
// Collective over ctx's world: every rank's host and device gathered, the nodes of ctx's topology; the result
// on every rank.
Provenance gather_provenance(int argc, char** argv, const Context& ctx);

// ---- output ----

// Appends one JSON object per measurement to a file (nothing when the path is empty): the measurement's
// fields, then the provenance. Throws sparta::Error naming the file when it cannot be opened or written.
class JsonLines {
 public:
  JsonLines(const std::string& path, const Provenance& prov);
  bool enabled() const { return !path_.empty(); }
  // fields: "name":value,... without braces.
  void write(const std::string& fields);

 private:
  std::string path_, prov_;
  std::ofstream out_;
};

// Comma-separated numbers; throws sparta::Error naming the option when empty or not a number.
std::vector<double> parse_list(const std::string& s, const char* option);
std::vector<std::string> split_list(const std::string& s);

// ---- the driver ----

struct DriverDefaults {
  int warmup = 5;
  int repeats = 20;
  int iters = 0;                // 0: the bench times one call per repeat and takes no --iters
  std::string device = "auto";  // --device default
  // The option naming the timed repeats: "repeats", or the bench's own word for them ("steps": timed training
  // steps; "iters": timed steps of a bench whose repeat is one step). It cannot be "iters" when iters > 0.
  std::string repeats_option = "repeats";
  std::string repeats_help = "timed repeats (the median is reported)";
};

// One per bench process, the first object in main (it starts MPI and ends it last). Construct, add the
// bench's options to options(), then return run(usage, body) from main.
class Driver {
 public:
  Driver(const std::string& program, int& argc, char**& argv, const DriverDefaults& defaults = DriverDefaults());
  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  po::options_description& options() { return desc_; }

  // Parses the options (--help: prints usage and the options on rank 0, returns 0), checks the common ones,
  // opens the context (device per rank), gathers the provenance, opens --out on rank 0 (every rank agrees on
  // a failure), prints the provenance as #-lines on rank 0, runs body on every rank, then sums the wrong
  // values over the ranks. Returns main's exit status: 0, or 1 when any rank counted a wrong value or an
  // Error ended the run (its message printed as "[host:rank] program: message"; see src/options.h's
  // run_program for when the job is aborted instead).
  int run(const std::string& usage, const std::function<void()>& body);

  // Valid inside body.
  Context& ctx() { return *ctx_; }
  const Device& device() const { return ctx_->device(); }
  bool is_root() const { return ctx_->is_root(); }
  int warmup() const { return warmup_; }
  int repeats() const { return repeats_; }
  int iters() const { return iters_; }  // 1 when the bench takes no --iters
  const std::string& tag() const { return tag_; }
  const std::string& out_path() const { return out_; }
  const Provenance& provenance() const { return prov_; }
  const po::variables_map& vm() const { return vm_; }

  // --warmup untimed calls of f, then --repeats timed ones on this rank's device: their times in ms.
  template <class F>
  std::vector<double> time(F&& f) {
    return time_repeats(device(), warmup_, repeats_, f);
  }
  // Wrong values this rank found when checking its results against a reference (each bench prints its own
  // #wrong column); run() sums them over the ranks and fails the run when the sum is not zero.
  void add_wrong(long long n) { wrong_ += n; }
  long long wrong() const { return wrong_; }
  // One measurement. fields: "name":value,... without braces, none of the driver's or the provenance's keys.
  // Rank 0 appends one JSON object to --out:
  // {"program":...,"tag":...,"backend":...,"warmup":...,"repeats":...,"iters":..., fields, provenance}
  // ("iters" only when the bench takes --iters; a bench whose repeats option has another name also has that
  // key, with the repeats: "steps":10, or "iters":20 when --iters names the timed steps); other ranks write
  // nothing. Throws sparta::Error naming the file when writing fails.
  void record(const std::string& fields);

 private:
  std::string program_;
  int argc_;
  char** argv_;
  DriverDefaults defaults_;
  MpiSession mpi_;
  po::options_description desc_;
  po::variables_map vm_;
  ContextOptions copt_;
  std::string log_level_, out_, tag_;
  int warmup_ = 0, repeats_ = 0, iters_ = 1;
  long long wrong_ = 0;
  std::unique_ptr<Context> ctx_;
  Provenance prov_;
  std::unique_ptr<JsonLines> json_;
};

}  // namespace bench
}  // namespace sparta
