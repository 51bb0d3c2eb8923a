// support_bench.cpp: see support_bench.h.
#include "experiments/support_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>

#include "src/base/buffer.h"
#include "src/base/check.h"
#if SPARTA_CUDA
#include <cuda_runtime_api.h>
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

std::string Provenance::json() const {
  std::string d;
  for (size_t i = 0; i < devices.size(); ++i) d += (i ? ",\"" : "\"") + json_escape(devices[i]) + "\"";
  return strprintf("\"git\":\"%s\",\"command\":\"%s\",\"host\":\"%s\",\"devices\":[%s],\"ranks\":%d,\"date\":\"%s\"",
                   json_escape(git).c_str(), json_escape(command).c_str(), json_escape(host).c_str(), d.c_str(), ranks,
                   date.c_str());
}

Provenance provenance(int argc, char** argv, const std::vector<std::string>& devices, int ranks) {
  Provenance p;
  p.git = git_revision();
  p.command = command_line(argc, argv);
  p.host = host_name();
  p.date = utc_date();
  p.devices = devices;
  p.ranks = ranks;
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

}  // namespace bench
}  // namespace sparta
