// support_bench.h: what every benchmark binary shares: timing (CUDA events on the device's stream, or the
// steady clock around a synchronized call on cpu; warm-up, then the median of repeats), provenance (git
// revision, command line, host, devices, ranks, date), JSON-line output and the device's copy bandwidth.
// Linked into every experiment binary (experiments/support_*.cpp).
#pragma once

#include <cstddef>
#include <fstream>
#include <string>
#include <vector>

#include "src/base/device.h"

namespace sparta {
namespace bench {

// Measures the time between start() and stop_ms(): CUDA events recorded on dev.stream (cuda), or the steady
// clock with the device synchronized at stop (cpu; CUDA=0 builds have only this).
class DeviceTimer {
 public:
  explicit DeviceTimer(const Device& dev);
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;
  void start();
  double stop_ms();  // waits for the work enqueued since start()

 private:
  Device dev_;
  void* start_event_ = nullptr;  // cudaEvent_t (an opaque pointer) on cuda
  void* stop_event_ = nullptr;
  double t0_ms_ = 0;
};

// Milliseconds one call of f takes on dev.
template <class F>
double time_ms(const Device& dev, F&& f) {
  DeviceTimer t(dev);
  t.start();
  f();
  return t.stop_ms();
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

struct Provenance {
  std::string git, command, host, date;
  std::vector<std::string> devices;  // one per rank (multi-rank benches gather them)
  int ranks = 1;
  // "git":...,"command":...,"host":...,"devices":[...],"ranks":n,"date":... (no braces)
  std::string json() const;
};
// Everything but devices and ranks, taken now.
Provenance provenance(int argc, char** argv, const std::vector<std::string>& devices, int ranks = 1);

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

}  // namespace bench
}  // namespace sparta
