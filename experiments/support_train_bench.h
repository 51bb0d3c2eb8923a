// support_train_bench.h: bench_train's measurement: the training step's throughput on synthetic batches held in
// memory (no files), in the MLPerf shapes by default, keys uniform (alpha 0, as the PyTorch peers draw them) or by
// a power law. Each rank generates its slice of `batches` global batches (io/synthetic.h, global batch j's samples
// [(j * world + rank) * batch, ... + batch) of the sample stream), taken in turn, one a step (1: the same batch
// every step; more: new keys each step, which a host tier's cache must fetch), the trainer is built on the first
// (the planner sees its keys), then `warmup` untimed steps (they insert the keys), then
// `steps` steps exactly as training takes them (Trainer::plain_steps: phases overlapping, the host waiting only
// at the end), which give ms_step and samples/s (the slowest rank's mean), then `steps` more with the host
// waiting after every phase (Trainer::timed_step), which split the step into data, embedding, dense and comm
// (medians, the slowest rank's; their sum, ms_phases, exceeds ms_step by the waits and the lost overlap).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/topology.h"
#include "src/base/device.h"
#include "src/train_config.h"

namespace sparta {

// The data and the steps of a run.
struct BenchmarkOptions {
  std::string preset = "mlperf";  // io/synthetic.h presets: mlperf (26 tables, 13 dense) | small
  int64_t max_rows = 4000000;     // cap on every table's rows
  std::string hotness = "1";      // keys per slot: k or a-b
  double alpha = 0;               // keys' power law (io/synthetic.h); 0: uniform
  int64_t batches = 1;            // distinct global batches, taken in turn
  int64_t batch = 65536;          // samples per rank per step
  int64_t warmup = 3;             // untimed steps
  int64_t steps = 10;             // timed steps
  int64_t trace_steps = 0;        // then steps taken as training takes them with their timeline marked (Trainer::trace)
};

struct BenchmarkResult {
  int ranks = 1;
  int64_t global_batch = 0;
  std::string placement;          // the plan's placement when every table has the same one, else "mixed"
  std::string model_shape;        // ModelConfig::describe() with the data's shapes
  double samples_per_s = 0, ms_step = 0, ms_phases = 0, ms_data = 0, ms_embedding = 0, ms_dense = 0, ms_comm = 0;
  int64_t graph_replays = 0;      // rank 0's dense model pieces replayed as CUDA graphs (train.cuda_graphs)
  int64_t wrong = 0;              // dense parameters that are not finite after the run (the run's own check)
  std::vector<StreamClock::Point> trace;  // this rank's timeline of the trace steps (BenchmarkOptions::trace_steps)
  // The '#'-headed table rank 0 prints, and the record's fields ("key":value,... without braces) with every
  // parameter of the run but those the bench driver's record has already (warmup, steps, ranks, nodes).
  std::string table(const TrainConfig& cfg, const BenchmarkOptions& o) const;
  std::string json_fields(const TrainConfig& cfg, const BenchmarkOptions& o) const;
};

// Collective over world. cfg gives the model, the tables' optimizer and placement and the communicator mode (its
// data and train sections are not used). Throws sparta::Error on every rank for bad options.
BenchmarkResult run_benchmark(MPI_Comm world, const Topology& topo, const Device& dev, TrainConfig cfg,
                              const BenchmarkOptions& o);

}  // namespace sparta
