// support_bench.cpp: see support_bench.h.
#include "experiments/support_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>

#include <hdf5.h>
#include <mpi.h>

#include "src/base/agree.h"
#include "src/base/buffer.h"
#include "src/base/check.h"
#if SPARTA_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace sparta {
namespace bench {

namespace {
double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>/dev/null").c_str(), "r");
  if (!p) return out;
  char buf[256];
  while (fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' ')) out.pop_back();
  return out;
}
}  // namespace

DeviceTimer::DeviceTimer(const Device& dev) : dev_(dev) {
#if SPARTA_CUDA
  if (dev_.is_cuda()) {
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    start_event_ = a;
    stop_event_ = b;
  }
#endif
}

DeviceTimer::~DeviceTimer() {
#if SPARTA_CUDA
  if (start_event_) cudaEventDestroy(static_cast<cudaEvent_t>(start_event_));
  if (stop_event_) cudaEventDestroy(static_cast<cudaEvent_t>(stop_event_));
#endif
}

void DeviceTimer::start() {
#if SPARTA_CUDA
  if (dev_.is_cuda()) {
    CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(start_event_), dev_.stream));
    return;
  }
#endif
  t0_ms_ = now_ms();
}

double DeviceTimer::stop_ms() {
#if SPARTA_CUDA
  if (dev_.is_cuda()) {
    CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(stop_event_), dev_.stream));
    CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_event_)));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_event_), static_cast<cudaEvent_t>(stop_event_)));
    return ms;
  }
#endif
  synchronize(dev_);
  return now_ms() - t0_ms_;
}

double DeviceTimer::stop_all_ms() {
#if SPARTA_CUDA
  // every stream idle first; the stop event, recorded then, completes at once (its time: the host's few
  // microseconds from the device's last work to the record)
  if (dev_.is_cuda()) CUDA_CHECK(cudaDeviceSynchronize());
#endif
  return stop_ms();
}

double median(std::vector<double> v) {
  SPARTA_REQUIRE(!v.empty(), "median of no measurements");
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double copy_bandwidth_gbps(const Device& dev, size_t bytes, int warmup, int repeats) {
  Buffer<uint8_t> a(dev, bytes), b(dev, bytes);
  a.fill_bytes(0x3C);
  std::vector<double> ms = time_repeats(dev, warmup, repeats, [&] { copy_on_device(dev, b.data(), a.data(), bytes); });
  return 2.0 * double(bytes) / median(ms) / 1e6;
}

std::string git_revision() {
  if (const char* env = std::getenv("SPARTA_GIT_REV")) return env;
  std::string rev = shell("git rev-parse HEAD");
  if (rev.empty()) return "unknown";
  if (!shell("git status --porcelain --untracked-files=no").empty()) rev += "-dirty";
  return rev;
}

std::string command_line(int argc, char** argv) {
  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
  return cmd;
}

std::string host_name() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

std::string utc_date() {
  char stamp[64];
  std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return stamp;
}

std::string device_description(const Device& dev) {
  return dev.is_cuda() ? dev.name() + " " + gpu_name(dev.gpu) : dev.name();
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (c == '\n') o += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) o += ' ';
    else o += c;
  }
  return o;
}

namespace {
std::string json_strings(const std::vector<std::string>& v) {
  std::string d;
  for (size_t i = 0; i < v.size(); ++i) d += (i ? ",\"" : "\"") + json_escape(v[i]) + "\"";
  return "[" + d + "]";
}

#if SPARTA_CUDA
std::string cuda_version_text(int v) { return strprintf("%d.%d", v / 1000, (v % 1000) / 10); }
#endif

void add_distinct(std::vector<std::string>& v, const std::string& s) {
  if (!s.empty() && std::find(v.begin(), v.end(), s) == v.end()) v.push_back(s);
}
}  // namespace

Versions library_versions() {
  Versions v;
#if SPARTA_CUDA
  int rt = 0, drv = 0;
  if (cudaRuntimeGetVersion(&rt) == cudaSuccess) v.cuda_runtime = cuda_version_text(rt);
  // 0 (shown "0.0") when no driver is installed: the driver call succeeds and says so.
  if (cudaDriverGetVersion(&drv) == cudaSuccess) v.cuda_driver = cuda_version_text(drv);
  int nv = 0;
  if (ncclGetVersion(&nv) == ncclSuccess)
    v.nccl = nv >= 10000 ? strprintf("%d.%d.%d", nv / 10000, (nv % 10000) / 100, nv % 100)
                         : strprintf("%d.%d.%d", nv / 1000, (nv % 1000) / 100, nv % 100);
#endif
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  if (MPI_Get_library_version(mpi, &len) == MPI_SUCCESS) {
    std::string text(mpi, static_cast<size_t>(std::max(len, 0)));
    text = text.substr(0, text.find('\n'));
    while (!text.empty() && (text.back() == ' ' || text.back() == '\r' || text.back() == '\0')) text.pop_back();
    v.mpi = text;
  }
  unsigned maj = 0, min = 0, rel = 0;
  if (H5get_libversion(&maj, &min, &rel) >= 0) v.hdf5 = strprintf("%u.%u.%u", maj, min, rel);
  return v;
}

std::string Provenance::json() const {
  return strprintf(
      "\"git\":\"%s\",\"command\":\"%s\",\"host\":\"%s\",\"hosts\":%s,\"devices\":%s,\"gpus\":%s,\"ranks\":%d,"
      "\"nodes\":%d,\"ranks_per_node\":%d,\"cuda_runtime\":\"%s\",\"cuda_driver\":\"%s\",\"nccl\":\"%s\",\"mpi\":\"%s\","
      "\"hdf5\":\"%s\",\"date\":\"%s\"",
      json_escape(git).c_str(), json_escape(command).c_str(), json_escape(host).c_str(), json_strings(hosts).c_str(),
      json_strings(devices).c_str(), json_strings(gpus).c_str(), ranks, nodes, ranks_per_node,
      json_escape(versions.cuda_runtime).c_str(), json_escape(versions.cuda_driver).c_str(),
      json_escape(versions.nccl).c_str(), json_escape(versions.mpi).c_str(), json_escape(versions.hdf5).c_str(),
      date.c_str());
}

Provenance provenance(int argc, char** argv, const std::vector<std::string>& devices, int ranks) {
  Provenance p;
  p.git = git_revision();
  p.command = command_line(argc, argv);
  p.host = host_name();
  p.date = utc_date();
  p.devices = devices;
  p.hosts = {p.host};
  p.ranks = ranks;
  p.ranks_per_node = ranks;
  p.versions = library_versions();
  return p;
}

std::vector<std::string> all_gather_strings(const std::string& mine, MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(size), displs(size, 0);
  MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm));
  int total = 0;
  for (int r = 0; r < size; ++r) displs[r] = total, total += lens[r];
  std::vector<char> all(std::max(total, 1));
  MPI_CHECK(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, comm));
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r) out.emplace_back(all.data() + displs[r], lens[r]);
  return out;
}

void print_traces(const std::vector<StreamClock::Point>& mine, MPI_Comm comm) {
  std::string text;
  for (const StreamClock::Point& p : mine) text += strprintf("%9.3f  %s\n", p.ms, p.label.c_str());
  const std::vector<std::string> all = all_gather_strings(text, comm);
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  if (rank != 0) return;
  for (size_t q = 0; q < all.size(); ++q) {
    std::istringstream lines(all[q]);
    for (std::string l; std::getline(lines, l);) std::printf("# trace rank %zu: %s\n", q, l.c_str());
  }
  std::fflush(stdout);
}

Provenance gather_provenance(int argc, char** argv, const Context& ctx) {
  const Topology& t = ctx.topo();
  Provenance p = provenance(argc, argv, {}, t.size);
  // Rank 0's revision and date for all: a rank on another node may see another working tree or clock.
  p.git = bcast_string(t.world, 0, p.git);
  p.date = bcast_string(t.world, 0, p.date);
  const Device& dev = ctx.device();
  const std::string gpu = dev.is_cuda() ? gpu_name(dev.gpu) : "";
  const std::vector<std::string> devices = all_gather_strings(t.hostname + " " + device_description(dev), t.world);
  const std::vector<std::string> hosts = all_gather_strings(t.hostname, t.world);
  const std::vector<std::string> gpus = all_gather_strings(gpu, t.world);
  p.devices = devices;
  p.hosts.clear();
  for (const std::string& h : hosts) add_distinct(p.hosts, h);
  for (const std::string& g : gpus) add_distinct(p.gpus, g);
  p.nodes = t.num_nodes;
  int most = t.local_size;  // the largest node: nodes may be uneven when the ranks do not divide evenly
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_INT, MPI_MAX, t.world));
  p.ranks_per_node = most;
  return p;
}

JsonLines::JsonLines(const std::string& path, const Provenance& prov) : path_(path), prov_(prov.json()) {
  if (path_.empty()) return;
  out_.open(path_, std::ios::app);
  SPARTA_REQUIRE(out_.good(), "--out: cannot open '%s' for appending", path_.c_str());
}

void JsonLines::write(const std::string& fields) {
  if (path_.empty()) return;
  out_ << "{" << fields << "," << prov_ << "}\n";
  out_.flush();
  SPARTA_REQUIRE(out_.good(), "--out: writing '%s' failed", path_.c_str());
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) v.push_back(item);
  return v;
}

std::vector<double> parse_list(const std::string& s, const char* option) {
  std::vector<double> v;
  for (const std::string& item : split_list(s)) {
    size_t used = 0;
    double x = 0;
    try {
      x = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SPARTA_REQUIRE(used == item.size() && used > 0, "--%s: expected numbers separated by commas, found '%s'", option,
                   item.c_str());
    v.push_back(x);
  }
  SPARTA_REQUIRE(!v.empty(), "--%s: empty list '%s'", option, s.c_str());
  return v;
}

// ---- the driver ----

Driver::Driver(const std::string& program, int& argc, char**& argv, const DriverDefaults& defaults)
    : program_(program),
      argc_(argc),
      argv_(argv),
      defaults_(defaults),
      mpi_(&argc, &argv),
      desc_(program + " options") {
  copt_.device = defaults_.device;
  add_common_options(desc_, copt_, log_level_);
  desc_.add_options()("out", po::value(&out_), "append JSON lines here (rank 0)")(
      "tag", po::value(&tag_), "text copied into every JSON line (sweeps name their points with it)")(
      "warmup", po::value(&warmup_)->default_value(defaults_.warmup), "untimed calls first")(
      defaults_.repeats_option.c_str(), po::value(&repeats_)->default_value(defaults_.repeats),
      defaults_.repeats_help.c_str());
  SPARTA_REQUIRE(defaults_.iters == 0 || defaults_.repeats_option != "iters",
                 "%s: the repeats option cannot be --iters when the bench takes --iters", program.c_str());
  if (defaults_.iters > 0)
    desc_.add_options()("iters", po::value(&iters_)->default_value(defaults_.iters), "calls per timed repeat");
  // MpiSession may have rewritten argc/argv: the provenance shows what the bench saw.
  argc_ = argc;
  argv_ = argv;
}

Driver::~Driver() {
  json_.reset();
  ctx_.reset();  // before MPI ends (mpi_ is destroyed after this body)
}

int Driver::run(const std::string& usage, const std::function<void()>& body) {
  return run_program(program_, [&] {
    try {
      if (!parse_options(argc_, argv_, desc_, vm_, usage)) return 0;
      if (vm_["device"].defaulted()) copt_.device = defaults_.device;
      SPARTA_REQUIRE(warmup_ >= 0, "--warmup: expected >= 0, found %d", warmup_);
      SPARTA_REQUIRE(repeats_ >= 1, "--%s: expected >= 1, found %d", defaults_.repeats_option.c_str(), repeats_);
      SPARTA_REQUIRE(iters_ >= 1, "--iters: expected >= 1, found %d", iters_);
      SPARTA_REQUIRE(copt_.device == "cpu" || copt_.device == "cuda" || copt_.device == "auto",
                     "--device: expected cpu, cuda or auto, found '%s'", copt_.device.c_str());
    } catch (const Error& e) {
      throw Error(e.what(), true);  // every rank parses the same command line and fails alike
    } catch (const std::exception& e) {
      throw Error(std::string("options: ") + e.what(), true);
    }
    ctx_ = std::make_unique<Context>(copt_);
    prov_ = gather_provenance(argc_, argv_, *ctx_);
    agree_on_error(MPI_COMM_WORLD, guarded([&] {
                     json_ = std::make_unique<JsonLines>(ctx_->is_root() ? out_ : std::string(), prov_);
                   }));
    if (ctx_->is_root()) {
      std::printf("# %s: %d rank(s) on %d node(s), backend %s, warmup %d, repeats %d%s%s\n", program_.c_str(),
                  prov_.ranks, prov_.nodes, device().is_cuda() ? "cuda" : "cpu", warmup_, repeats_,
                  defaults_.iters > 0 ? strprintf(", iters %d", iters_).c_str() : "",
                  tag_.empty() ? "" : (", tag " + tag_).c_str());
      std::printf("# git %s; %s\n", prov_.git.c_str(), prov_.command.c_str());
      std::printf("# CUDA runtime %s, driver %s; NCCL %s; HDF5 %s; %s\n", prov_.versions.cuda_runtime.c_str(),
                  prov_.versions.cuda_driver.c_str(), prov_.versions.nccl.c_str(), prov_.versions.hdf5.c_str(),
                  prov_.versions.mpi.c_str());
      for (const std::string& d : prov_.devices) std::printf("#   %s\n", d.c_str());
      std::fflush(stdout);
    }
    body();
    long long wrong = wrong_;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD));
    if (ctx_->is_root()) {
      std::printf("# %s: %lld wrong value(s)\n", wrong ? "FAILED" : "checked", wrong);
      std::fflush(stdout);
    }
    if (wrong && ctx_->is_root()) std::fprintf(stderr, "%s: %lld wrong value(s)\n", program_.c_str(), wrong);
    return wrong ? 1 : 0;
  });
}

void Driver::record(const std::string& fields) {
  if (!json_ || !json_->enabled()) return;
  std::string head = strprintf("\"program\":\"%s\",\"tag\":\"%s\",\"backend\":\"%s\",\"warmup\":%d,\"repeats\":%d,",
                               program_.c_str(), json_escape(tag_).c_str(), device().is_cuda() ? "cuda" : "cpu",
                               warmup_, repeats_);
  if (defaults_.iters > 0) head += strprintf("\"iters\":%d,", iters_);
  if (defaults_.repeats_option != "repeats") head += strprintf("\"%s\":%d,", defaults_.repeats_option.c_str(), repeats_);
  json_->write(head + fields);
}

}  // namespace bench
}  // namespace sparta
