// planner.h: picks where each table of a collection lives. `auto` tables get the placement with the smallest
// estimated step time among those that fit the device memory budget; explicit placements are honoured (and must
// fit too). A plan that does not fit is a sparta::Error naming the table and the shortfall, raised before anything
// is allocated. The cost model (bytes on the link, local device traffic, collectives, a fixed cost per group of
// tables that run one lookup together) is written out in experiments/PLANNER.md.
//
// Key statistics come from a sample of the data: keys per sample of each table (its hotness) and the most
// frequent keys (the hybrid placement's replicated set, and the share of lookups it covers).
#pragma once

#include <mpi.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "src/placement.h"

namespace sparta {

// Checks a collection's configuration (slots in range, each slot served by exactly one table, sizes, names);
// throws sparta::Error naming the table and field.
void check_collection_config(const CollectionConfig& cfg);

struct TableKeyStats {
  int64_t samples = 0;                            // samples counted, over all ranks
  int64_t keys = 0;                               // keys of this table's slots in them
  std::vector<std::pair<int64_t, int64_t>> top;   // (key, count), most frequent first (ties: smaller key first)
  double keys_per_sample() const { return samples > 0 ? double(keys) / double(samples) : 0.0; }
};

// Counts the keys of every table over a sample of the data: this rank's share, a host CSR over rows
// sample * num_slots + slot (offsets [batch * num_slots + 1], keys). Collective over comm: the counts of all
// ranks are merged, so every rank returns the same statistics. max_top bounds `top` per table.
std::vector<TableKeyStats> count_keys(MPI_Comm comm, const CollectionConfig& cfg, const std::vector<int64_t>& offsets,
                                      const std::vector<int64_t>& keys, int64_t batch, size_t max_top);

// The rates that turn the cost model's counts into seconds (experiments/PLANNER.md). The defaults are for
// H100/H200-class GPUs over NVLink: effective rates fitted (least squares of the relative error) to the 33 step times of
// one bench_collection visit on 1 and 2 H200s (revision 6bb0b44: the MLPerf v1 and DCNv2 tables of dim 128 capped
// at 4M rows, direct index at 1 and 2 GPUs and DCNv2 hashed with every key held at 2, 65536 samples per GPU, sgd,
// every placement, the plan and two mixed plans); experiments/PLANNER.md gives the error
// (7% on average). Not hardware figures:
//   link_GBps      bytes sent + received per rank per second on the link;
//   hbm_GBps       rate of the local passes counted (hash-table lookups of random rows, sorts, gathers, scatters,
//                  pooling, optimizer updates);
//   collective_us  what one more collective adds to a group's fixed cost;
//   group_us       fixed cost of one placement group per step (its launches, its host waits for counts).
struct PlannerRates {
  double link_GBps = 646;
  double hbm_GBps = 3730;
  double collective_us = 124;
  double group_us = 334;
  // host_GBps: rows a host-tier table's cache copies in and writes back per second over PCIe or C2C (a PCIe gen5
  // x16 figure, not fitted); those bytes count in the local term as the HBM bytes that would take as long.
  double host_GBps = 50;
};
// Throws sparta::Error naming the rate unless every rate is > 0 (and finite).
void check_planner_rates(const PlannerRates& r);

struct PlannerOptions {
  int world = 1;
  int64_t global_batch = 1;       // samples per step over all ranks
  // Device bytes per rank for the tables and their working memory (0: no limit; the trainer and the benches
  // pass device_memory_budget's when the user gives none).
  size_t memory_budget = 0;
  Backend backend = Backend::cpu;  // whose backward workspace layout the working memory counts
  int64_t default_hot_rows = 1024;  // hybrid tables with hot_rows 0
  PlannerRates rates;
  // Bytes per value of the vectors and gradients the exchanges carry between ranks (4, or 2 with
  // CollectionConfig::exchange = bf16; make_plan takes it from the configuration). Distributed's reduce-scatter
  // and all-gather and hybrid's hot all-reduce stay fp32.
  double wire_bytes = 4;
};

// Estimates of one table under one placement (experiments/PLANNER.md), on the busiest rank, and on the others
// where they differ (a localized table's owner against the ranks that only send it bags and get vectors back).
struct PlacementCost {
  size_t memory_busiest = 0;      // device bytes on the rank that holds the most of the table
  size_t memory_every = 0;        // device bytes on every rank (memory_busiest on every rank but a localized owner)
  // Working memory besides the table's rows, hash slots and state: the backward workspaces (kernels/
  // embedding_backward.h BackwardWorkspace::bytes) and the route buffers the placement grows in a step, sized
  // for the expected counts of the cost model (local keys, bags, distinct keys; a localized owner: every rank's).
  // On the busiest rank, and on the others (a localized table's non-owners).
  size_t work_busiest = 0;
  size_t work_every = 0;
  double bytes_per_step = 0;      // bytes the busiest rank sends plus receives in one forward and backward
  double local_bytes = 0;         // device memory bytes read plus written by its local passes
  double bytes_other = 0;         // bytes_per_step on a rank other than a localized owner (the same otherwise)
  // bytes_per_step and bytes_other by phase and direction: forward sent, forward received, backward sent,
  // backward received. A link carries both directions at once, so an exchange lasts as long as its larger
  // direction: the step's link term counts, per phase, the busiest rank's larger one (make_plan). Every placement
  // but localized sends what it receives (a quarter of its bytes in each); a localized owner sends the pooled
  // vectors and receives keys and gradients, another rank the other way round.
  std::array<double, 4> link_dir{}, link_dir_other{};
  double local_other = 0;         // local_bytes on a rank other than a localized owner (the same otherwise)
  // A host-tier table (CollectionTableConfig::tier): host bytes of its store on the busiest rank, and the bytes its
  // cache copies in and writes back per step there (the rows a step touches on that rank times the share of its
  // rows that do not fit the cache, in and out: uniform keys; skewed keys miss less). memory_* then count the cache.
  size_t host_bytes = 0;
  double host_transfer_bytes = 0;
  int collectives = 0;            // collectives of the table's group per step (0 with one rank)
  double seconds_group = 0;       // the group's fixed cost: collectives x collective_us + group_us
  // The step time of the table as a group of its own: link + local + seconds_group. A table that joins a group
  // another table of the plan opened adds seconds_per_step - seconds_group.
  double seconds_per_step = 0;
};
PlacementCost placement_cost(const CollectionTableConfig& t, Placement p, const PlannerOptions& opt,
                             const TableKeyStats& stats, int64_t hot_rows, double shard_slack);

// The plan: every table's placement, owner and (hybrid) hot keys, and its estimate (Plan::estimate). stats: per
// table (empty: one key per slot and no frequent keys known).
//
// The step's estimate keeps every rank's link bytes and local bytes: the ranks work side by side, so the step is
// the busiest rank's link bytes / link_GBps + the busiest rank's local bytes / hbm_GBps + the fixed costs of the
// groups (same placement, dim, combiner, optimizer, init_scale and max_load_factor, localized tables of any
// owners: the tables that run one lookup together; a group's first table opens it). Every placement but localized
// adds the same to every rank; a localized table adds its lookup and update to its owner only, and its exchange
// to every rank (the owner's share W - 1 times another rank's).
//
// Tables are placed largest first; each `auto` table gets the fitting placement (and, localized, the owner) that
// raises the estimate the least; an explicit localized table without an owner gets the owner that raises it the
// least. Ties: replicated, localized, dispatch, distributed, hybrid; owners: the rank with the least memory placed,
// then the lowest. The plan is the lowest estimate of that pass and of every `auto` table in one placement (for
// each placement), then improved one `auto` table at a time: a move to another placement that lowers the estimate
// stays (the owners picked again), until no single move does. A table's seconds_per_step is what it raised the estimate by, so the tables' seconds add up to
// the estimate. Tables of tier automatic are planned in HBM; one that fits no placement there goes to host memory
// (fp32 rows only) under the cache its tier asks for, else the cache the budget leaves it, and the plan is made
// again; TablePlan::tier says where each table went (experiments/PLANNER.md). Throws sparta::Error for a bad
// configuration, bad rates or a plan that does not fit.
Plan make_plan(const CollectionConfig& cfg, const PlannerOptions& opt, const std::vector<TableKeyStats>& stats);

// The default memory budget of a rank (collective over comm; every rank returns the same): the least over the
// ranks of this device's free memory (device_free_bytes: cudaMemGetInfo, or the host's available memory for the
// cpu backend), shared evenly among the ranks of one host that drive the same device, less `reserve`, the bytes
// the rest of the job will still allocate there (the dense model, its optimizer state and activations, the
// batches). At least 1 byte (0 would mean no limit).
size_t device_memory_budget(MPI_Comm comm, const Device& dev, size_t reserve);

// The table rank 0 prints: table, rows, dim, placement, owner, memory per rank, bytes moved per step, estimated
// ms per step; then the plan's totals.
std::string format_plan(const CollectionConfig& cfg, const Plan& plan);
// One line "name:placement[:owner] ..." (checkpoint metadata).
std::string plan_summary(const CollectionConfig& cfg, const Plan& plan);

}  // namespace sparta
