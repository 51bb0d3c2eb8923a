// bench_alltoall: the communicator's all-to-all (and all-reduce, reduce-scatter, all-gather) in every mode,
// nccl-tests style. One row per (operation, mode, size):
//   size count type mode | time algbw busbw #wrong
// size = bytes each rank sends (all-to-all, reduce-scatter: its whole send buffer; all-reduce: the buffer;
// all-gather: the gathered buffer), algbw = size / time, busbw = algbw * (n-1)/n (all-to-all, reduce-scatter,
// all-gather) or algbw * 2(n-1)/n (all-reduce), n = ranks; time = median over repeats of the mean over
// iterations, the slowest rank's. GPU times come from CUDA events on the compute stream (each iteration: one
// operation on that stream, which orders the stream after itself), cpu times from the steady clock
// (support_bench.h's Driver, which also gives the common options). Every row is checked: one more operation on a poisoned
// output, compared with the values each rank computes on its own; #wrong > 0 fails the run (exit 1).
// Data are never zeros. Rows also go as JSON lines to --out, with every parameter and the provenance.
//
//   mpiexec -n 2 bench_alltoall --modes nccl,hier,mpi --min-bytes 1K --max-bytes 1G --out results/a2a.jsonl
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "src/context.h"
#include "src/base/log.h"
#include "src/options.h"
#include "experiments/support_bench.h"

using namespace sparta;

namespace {

struct Args {
  std::string min_bytes = "1K", max_bytes, modes, ops = "alltoall,allreduce", type = "float32", staging = "auto";
  double factor = 2, timeout = 300;
  int iters = 20, warmup = 5, repeats = 5;  // the driver's --iters, --warmup, --repeats
  std::string chunk = "8M";
  int nccl_blocking = 1;  // CommOptions' default
};

size_t parse_size(const std::string& s, const char* what) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit = end ? std::string(end) : "";
  double mul = 1;
  if (unit == "K" || unit == "KiB" || unit == "k") mul = 1024.0;
  else if (unit == "M" || unit == "MiB") mul = 1048576.0;
  else if (unit == "G" || unit == "GiB") mul = 1073741824.0;
  else if (!unit.empty() && unit != "B") throw Error(strprintf("--%s: expected bytes like 4096, 64K, 16M or 1G, found '%s'", what, s.c_str()));
  if (!(v > 0)) throw Error(strprintf("--%s: expected a positive size, found '%s'", what, s.c_str()));
  return static_cast<size_t>(v * mul);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Element values: small integers (exact in every float type, sums included), never all zeros.
float element(int src, int dst, size_t i) { return static_cast<float>((src * 131 + dst * 17 + i) % 61) - 30.f; }

void put(DataType t, char* p, float v) {
  if (t == DataType::f32) std::memcpy(p, &v, 4);
  else {
    uint16_t h = t == DataType::bf16 ? float_to_bf16(v) : float_to_f16(v);
    std::memcpy(p, &h, 2);
  }
}
float get(DataType t, const char* p) {
  if (t == DataType::f32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return t == DataType::bf16 ? bf16_to_float(h) : f16_to_float(h);
}

struct Op {
  std::string name;
  double bus_factor;  // busbw / algbw
};

class Bench {
 public:
  Bench(Context& ctx, Communicator& comm, const Args& a, DataType t) : ctx_(ctx), comm_(comm), a_(a), t_(t) {
    es_ = dtype_size(t);
  }

  // Runs one row: returns time (s) and the number of wrong elements over all ranks.
  std::pair<double, long long> row(const std::string& op, size_t bytes) {
    const int W = comm_.size(), me = comm_.rank();
    const Device& dev = ctx_.device();
    size_t count = bytes / es_;  // elements in `size`
    size_t send_n = count, recv_n = count;
    if (op == "alltoall" || op == "reducescatter") count = count / W * W, send_n = count, recv_n = op == "alltoall" ? count : count / W;
    if (op == "allgather") count = count / W * W, send_n = count / W, recv_n = count;
    // Inputs, computed on the host, uploaded once.
    std::vector<char> host(send_n * es_);
    for (size_t i = 0; i < send_n; ++i) {
      if (op == "alltoall") put(t_, host.data() + i * es_, element(me, static_cast<int>(i / (count / W)), i % (count / W)));
      else if (op == "reducescatter") put(t_, host.data() + i * es_, element(me, static_cast<int>(i / (count / W)), i % (count / W)));
      else put(t_, host.data() + i * es_, element(me, 0, i));
    }
    Buffer<char> send(dev, std::max<size_t>(host.size(), 1)), recv(dev, std::max<size_t>(recv_n * es_, 1));
    send.upload(host.data(), host.size());
    const Stream stream = dev.stream;
    auto run = [&] {
      if (op == "alltoall") comm_.all_to_all(send.data(), recv.data(), count / W, t_, stream);
      else if (op == "allreduce") comm_.all_reduce(send.data(), recv.data(), count, t_, stream);
      else if (op == "reducescatter") comm_.reduce_scatter(send.data(), recv.data(), count / W, t_, stream);
      else comm_.all_gather(send.data(), recv.data(), count / W, t_, stream);
    };
    for (int i = 0; i < a_.warmup; ++i) run();
    comm_.synchronize(stream);
    std::vector<double> times;
    for (int r = 0; r < a_.repeats; ++r) {
      comm_.barrier();
      timer_.start();
      for (int i = 0; i < a_.iters; ++i) run();
      times.push_back(timer_.stop_ms() / 1e3 / a_.iters);
    }
    double median = bench::median(times);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &median, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));

    // Check: one more operation into a poisoned output.
    recv.fill_bytes(0xFF);
    run();
    comm_.synchronize(stream);  // a failed peer ends the job here instead of hanging the download
    std::vector<char> got = recv.download();
    long long wrong = 0;
    for (size_t i = 0; i < recv_n; ++i) {
      float want = 0;
      if (op == "alltoall") want = element(static_cast<int>(i / (count / W)), me, i % (count / W));
      else if (op == "allgather") want = element(static_cast<int>(i / (count / W)), 0, i % (count / W));
      else
        for (int s = 0; s < W; ++s) want += op == "allreduce" ? element(s, 0, i) : element(s, me, i);
      if (!(get(t_, got.data() + i * es_) == want)) ++wrong;
    }
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD));
    return {median, wrong};
  }

 private:
  Context& ctx_;
  Communicator& comm_;
  const Args& a_;
  DataType t_;
  size_t es_ = 4;
  bench::DeviceTimer timer_{ctx_.device()};  // CUDA events on the compute stream, or the steady clock
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  bench::Driver d("bench_alltoall", argc, argv, {a.warmup, a.repeats, a.iters, "auto"});
  d.options().add_options()("min-bytes", po::value(&a.min_bytes)->default_value(a.min_bytes), "smallest size per rank (4096, 64K, 16M, 1G)")(
      "max-bytes", po::value(&a.max_bytes), "largest size per rank (default 1G on GPUs, 16M on the cpu)")(
      "step-factor", po::value(&a.factor)->default_value(a.factor), "size multiplier between rows")(
      "modes", po::value(&a.modes), "comma-separated nccl,mpi,hier (default: every mode the backend supports)")(
      "ops", po::value(&a.ops)->default_value(a.ops), "comma-separated alltoall,allreduce,reducescatter,allgather")(
      "type", po::value(&a.type)->default_value(a.type), "float32 | bfloat16 | float16")(
      "staging", po::value(&a.staging)->default_value(a.staging), "auto | always (MPI through pinned host memory)")(
      "chunk-bytes", po::value(&a.chunk)->default_value(a.chunk), "staging and hierarchical pipeline chunk")(
      "timeout", po::value(&a.timeout)->default_value(a.timeout), "seconds without progress before the job ends")(
      "nccl-blocking", po::value(&a.nccl_blocking)->default_value(a.nccl_blocking),
      "1: NCCL communicators in NCCL's blocking mode (launches in the calling thread), 0: non-blocking");
  return d.run("mpiexec -n N bench_alltoall [options]", [&] {
  a.iters = d.iters();
  a.warmup = d.warmup();
  a.repeats = d.repeats();
  Context& ctx = d.ctx();
  const bool cuda = ctx.device().is_cuda();
  std::vector<std::string> modes = split(a.modes.empty() ? (cuda ? "nccl,hier,mpi" : "hier,mpi") : a.modes);
  std::vector<std::string> ops = split(a.ops);
  size_t lo = 0, hi = 0, chunk = 0;
  DataType t = DataType::f32;
  try {
    lo = parse_size(a.min_bytes, "min-bytes");
    hi = parse_size(a.max_bytes.empty() ? (cuda ? "1G" : "16M") : a.max_bytes, "max-bytes");
    chunk = parse_size(a.chunk, "chunk-bytes");
    t = parse_dtype(a.type);
    SPARTA_REQUIRE(t == DataType::f32 || t == DataType::bf16 || t == DataType::f16,
                   "--type: expected float32, bfloat16 or float16, found '%s'", a.type.c_str());
    SPARTA_REQUIRE(a.factor > 1, "--step-factor: expected > 1, found %g", a.factor);
    SPARTA_REQUIRE(!modes.empty() && !ops.empty(), "--modes, --ops: expected at least one each");
    for (const std::string& m : modes) parse_comm_mode(m);
    for (const std::string& o : ops)
      SPARTA_REQUIRE(o == "alltoall" || o == "allreduce" || o == "reducescatter" || o == "allgather",
                     "--ops: expected alltoall, allreduce, reducescatter or allgather, found '%s'", o.c_str());
  } catch (const Error& e) {
    throw Error(e.what(), true);  // every rank checks the same options
  }

  const int W = ctx.world();
  if (ctx.is_root()) {
    std::printf("# bench_alltoall: type %s\n", dtype_name(t));
    std::printf("#\n# %-13s %12s %9s %6s %6s | %12s %10s %10s %7s\n", "op", "size(B)", "count", "type", "mode",
                "time(us)", "algbw GB/s", "busbw GB/s", "#wrong");
  }
  std::vector<std::string> latency;
  for (const std::string& mode_name : modes) {
    CommOptions co;
    co.mode = parse_comm_mode(mode_name);
    co.timeout_s = a.timeout;
    co.staging = a.staging;
    co.chunk_bytes = chunk;
    co.nccl_blocking = a.nccl_blocking != 0;
    std::unique_ptr<Communicator> comm;
    try {
      comm = std::make_unique<Communicator>(ctx.topo(), ctx.device(), co);
    } catch (const Error& e) {
      SPARTA_FATAL("%s", e.what());
    }
    if (ctx.is_root()) std::printf("# %s\n", comm->describe().c_str());
    Bench bench(ctx, *comm, a, t);
    for (const std::string& op : ops) {
      const double bus = op == "allreduce" ? 2.0 * (W - 1) / W : double(W - 1) / W;
      for (double b = static_cast<double>(lo); b <= static_cast<double>(hi) * 1.0000001; b *= a.factor) {
        size_t bytes = static_cast<size_t>(b) / dtype_size(t) * dtype_size(t);
        if (op != "allreduce") bytes = bytes / (dtype_size(t) * W) * dtype_size(t) * W;
        if (bytes == 0) continue;
        auto [time_s, wrong] = bench.row(op, bytes);
        // wrong is already the sum over the ranks: the driver sums rank 0's share only.
        if (ctx.is_root()) d.add_wrong(wrong);
        const double algbw = bytes / time_s / 1e9, busbw = algbw * bus;
        if (!ctx.is_root()) continue;
        std::printf("  %-13s %12zu %9zu %6s %6s | %12.2f %10.2f %10.2f %7lld\n", op.c_str(), bytes,
                    bytes / dtype_size(t), dtype_name(t), mode_name.c_str(), time_s * 1e6, algbw, busbw, wrong);
        std::fflush(stdout);
        if (bytes == (1u << 20) && op == "alltoall")
          latency.push_back(strprintf("%s %.2f us", mode_name.c_str(), time_s * 1e6));
        std::ostringstream f;
        f << "\"bench\":\"bench_alltoall\",\"op\":\"" << op << "\",\"mode\":\"" << mode_name
          << "\",\"bytes_per_rank\":" << bytes << ",\"count\":" << bytes / dtype_size(t) << ",\"type\":\""
          << dtype_name(t) << "\",\"time_us\":" << time_s * 1e6 << ",\"algbw_GBps\":" << algbw
          << ",\"busbw_GBps\":" << busbw << ",\"bus_factor\":" << bus << ",\"wrong\":" << wrong
          << ",\"ranks_per_node_option\":" << ctx.options().ranks_per_node << ",\"staging\":\"" << a.staging
          << "\",\"chunk_bytes\":" << chunk << ",\"cuda_aware_mpi\":" << (comm->cuda_aware_mpi() ? "true" : "false")
          << ",\"timeout_s\":" << a.timeout << ",\"step_factor\":" << a.factor
          << ",\"nccl_blocking\":" << a.nccl_blocking
          << ",\"timing\":\"" << (cuda ? "cuda events, median of repeats, slowest rank" : "steady clock, median of repeats, slowest rank")
          << "\"";
        d.record(f.str());
      }
    }
  }
  if (ctx.is_root() && !latency.empty()) {
    std::string l;
    for (const std::string& s : latency) l += (l.empty() ? "" : ", ") + s;
    std::printf("# all-to-all latency at 1 MiB per rank: %s\n", l.c_str());
  }
  });
}
