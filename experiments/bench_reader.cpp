// bench_reader: samples/s one process reads through DatasetReader (prefetch thread, checks of every batch)
// from a file in the page cache, in the MLPerf DLRM shape (13 dense, 26 one-hot slots). Generates the file
// first (sparta-datagen's generator, preset mlperf) unless --file names an existing one; one untimed direct
// pass warms the page cache and computes the reference checksum every timed pass must reproduce.
//   bench_reader [--samples 2000000] [--batch 65536] [--world 1] [--prefetch 2] [--shuffle] [--repeats 5] [--warmup 0]
//                [--out results.jsonl]
#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/context.h"
#include "io/dataset.h"
#include "src/base/log.h"
#include "src/options.h"
#include "io/reader.h"
#include "experiments/support_bench.h"
#include "io/synthetic.h"

namespace {

// CPU seconds this process used (all threads): on a shared machine the wall clock also counts waiting for a core.
double cpu_seconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// What a pass saw: enough to catch a lost, repeated or altered batch.
struct Checksum {
  int64_t samples = 0, keys = 0, key_sum = 0;
  double label_sum = 0;
  bool operator==(const Checksum& o) const {
    return samples == o.samples && keys == o.keys && key_sum == o.key_sum && label_sum == o.label_sum;
  }
  void add(const sparta::Batch& b) {
    samples += b.size;
    keys += b.num_keys;
    int64_t s = 0;
    for (int64_t i = 0; i < b.num_keys; ++i) s += b.keys[i];
    key_sum += s;
    double l = 0;
    for (int64_t i = 0; i < b.size; ++i) l += b.labels[i];
    label_sum += l;
  }
};

}  // namespace

int main(int argc, char** argv) {
  int64_t samples = 2000000, batch = 65536, max_rows = 1000000;
  int world = 1, prefetch = 2;
  bool shuffle = false, keep = false;
  std::string file;
  // The reader runs on the host: --device defaults to cpu. --warmup: untimed epochs through the prefetching
  // reader (checked like the timed ones) after the direct pass.
  sparta::bench::Driver d("bench_reader", argc, argv, {/*warmup*/ 0, /*repeats*/ 5, /*iters*/ 0, "cpu"});
  d.options().add_options()(
      "samples", sparta::po::value<int64_t>(&samples)->default_value(samples), "samples in the generated file")(
      "batch", sparta::po::value<int64_t>(&batch)->default_value(batch), "global batch")(
      "world", sparta::po::value<int>(&world)->default_value(world),
      "ranks the global batch is split over (this process reads rank 0's slice)")(
      "prefetch", sparta::po::value<int>(&prefetch)->default_value(prefetch), "batches read ahead (0: synchronous)")(
      "shuffle", sparta::po::bool_switch(&shuffle), "shuffle by chunk")(
      "max-rows", sparta::po::value<int64_t>(&max_rows)->default_value(max_rows), "cap on table sizes of the generated file")(
      "file", sparta::po::value<std::string>(&file), "read this dataset instead of generating one")(
      "keep", sparta::po::bool_switch(&keep), "keep the generated file");
  return d.run("usage: [mpiexec -n N] bench_reader [options]", [&] {
    sparta::Context& ctx = d.ctx();
    const int repeats = d.repeats(), warmup = d.warmup();
    bool generated = file.empty();
    if (generated) {
      file = "/tmp/sparta_bench_reader_" + std::to_string(getpid()) + ".h5";
      sparta::SyntheticOptions so;
      so.preset = "mlperf";
      so.samples = samples;
      so.max_rows = max_rows;
      sparta::SyntheticConfig c = sparta::make_synthetic_config(so);
      sparta::WriteOptions w;
      sparta::GenerateResult g = sparta::generate_dataset(file, c, w, MPI_COMM_WORLD, sparta::ProgressBar::stderr_is_tty());
      LOG_INFO("# generated %s: %lld samples in %.1f s (teacher AUC %.3f)", file.c_str(), (long long)samples, g.seconds,
               g.teacher_auc);
    }
    // Removes the generated file however the run ends.
    struct Cleanup {
      const std::string& path;
      bool remove;
      ~Cleanup() {
        if (remove) std::remove(path.c_str());
      }
    } cleanup{file, generated && !keep && ctx.is_root()};
    // Rank 0 reads while the others wait for its verdict: a bad file ends every rank with one Error.
    sparta::agree_on_error(MPI_COMM_WORLD, sparta::guarded([&] {
      if (!ctx.is_root()) return;
      sparta::ReaderOptions ro;
      ro.global_batch = batch;
      ro.world = world;
      ro.rank = 0;
      ro.shuffle = shuffle;
      ro.prefetch = 0;
      // Untimed direct pass: warms the page cache, gives the reference checksum of each epoch's rank-0 slices.
      sparta::DatasetReader direct(file, ro);
      const sparta::DatasetSchema& s = direct.schema();
      sparta::Batch b = direct.make_batch();
      std::vector<Checksum> want(repeats);
      for (int r = 0; r < repeats; ++r) {
        if (r > 0 && !shuffle) {
          want[r] = want[0];
          continue;
        }
        for (int64_t i = 0; i < direct.batches_per_epoch(); ++i) {
          direct.read_batch(r, i, b);
          want[r].add(b);
        }
      }
      ro.prefetch = prefetch;
      sparta::DatasetReader reader(file, ro);
      std::vector<double> secs, cpus;
      int wrong = 0;
      sparta::bench::DeviceTimer timer(ctx.device());  // cpu: the steady clock
      for (int w = 0; w < warmup; ++w) {
        Checksum got;
        reader.start_epoch(0);
        while (const sparta::Batch* x = reader.next()) got.add(*x);
        wrong += !(got == want[0]);
      }
      for (int r = 0; r < repeats; ++r) {
        Checksum got;
        timer.start();
        double c0 = cpu_seconds();
        reader.start_epoch(r);
        while (const sparta::Batch* x = reader.next()) got.add(*x);
        secs.push_back(timer.stop_ms() / 1e3);
        cpus.push_back(cpu_seconds() - c0);
        wrong += !(got == want[r]);
      }
      const double med = sparta::bench::median(secs);
      const double cpu_med = sparta::bench::median(cpus);
      double load[1] = {0};
      getloadavg(load, 1);
      const int64_t per_epoch = want[0].samples;
      const double bytes_per_sample =
          4.0 + 4.0 * s.num_dense + 8.0 * s.num_slots + 8.0 * double(want[0].keys) / std::max<int64_t>(per_epoch, 1);
      const double rate = per_epoch / med;
      std::printf("# bench_reader: %s, %lld samples, %lld dense, %lld slots, file %.0f MB\n", file.c_str(),
                  (long long)s.num_samples, (long long)s.num_dense, (long long)s.num_slots,
                  s.num_samples * bytes_per_sample / 1e6);
      std::printf("# load average %.2f on %ld cores: Msamples/s is wall clock; Msamples/cpu-s divides by the CPU time used\n",
                  load[0], sysconf(_SC_NPROCESSORS_ONLN));
      std::printf("# %10s %8s %5s %8s %7s | %9s %12s %8s %8s %14s %6s\n", "samples", "batch", "world", "prefetch", "shuffle",
                  "median_s", "Msamples/s", "GB/s", "cpu_s", "Msamples/cpu-s", "#wrong");
      std::printf("  %10lld %8lld %5d %8d %7d | %9.4f %12.2f %8.2f %8.4f %14.2f %6d\n", (long long)per_epoch, (long long)batch,
                  world, prefetch, shuffle ? 1 : 0, med, rate / 1e6, rate * bytes_per_sample / 1e9, cpu_med,
                  per_epoch / cpu_med / 1e6, wrong);
      {
        std::string times;
        for (size_t i = 0; i < secs.size(); ++i) times += (i ? "," : "") + sparta::strprintf("%.6f", secs[i]);
        d.record(sparta::strprintf(
            "\"bench\":\"reader\",\"samples_per_epoch\":%lld,\"file_samples\":%lld,\"num_dense\":%lld,"
            "\"num_slots\":%lld,\"batch\":%lld,\"world\":%d,\"prefetch\":%d,\"shuffle\":%s,"
            "\"median_s\":%.6f,\"times_s\":[%s],\"samples_per_s\":%.1f,\"cpu_s\":%.6f,\"samples_per_cpu_s\":%.1f,"
            "\"load_average\":%.2f,\"bytes_per_sample\":%.1f,\"wrong\":%d,\"file\":\"%s\"",
            (long long)per_epoch, (long long)s.num_samples, (long long)s.num_dense, (long long)s.num_slots,
            (long long)batch, world, prefetch, shuffle ? "true" : "false", med, times.c_str(), rate, cpu_med,
            per_epoch / cpu_med, load[0], bytes_per_sample, wrong, sparta::bench::json_escape(file).c_str()));
      }
      if (wrong) std::fprintf(stderr, "bench_reader: %d epoch(s) delivered other data than the direct reads\n", wrong);
      d.add_wrong(wrong);
    }));
  });
}
