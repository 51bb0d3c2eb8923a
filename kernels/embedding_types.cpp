// embedding_types.cpp: names of combiners and optimizers (see embedding_types.h).
#include "kernels/embedding_types.h"

#include "src/base/check.h"

namespace sparta {

const char* combiner_name(Combiner c) { return c == Combiner::sum ? "sum" : "mean"; }

Combiner parse_combiner(const std::string& name) {
  if (name == "sum") return Combiner::sum;
  if (name == "mean") return Combiner::mean;
  throw Error("combiner: expected sum or mean, found '" + name + "'");
}

const char* optimizer_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::sgd: return "sgd";
    case OptimizerKind::momentum: return "momentum";
    case OptimizerKind::nesterov: return "nesterov";
    case OptimizerKind::adagrad: return "adagrad";
    case OptimizerKind::adam: return "adam";
    case OptimizerKind::lazy_adam: return "lazy_adam";
    case OptimizerKind::rowwise_adagrad: return "rowwise_adagrad";
  }
  return "?";
}

OptimizerKind parse_optimizer(const std::string& name) {
  for (OptimizerKind k : {OptimizerKind::sgd, OptimizerKind::momentum, OptimizerKind::nesterov, OptimizerKind::adagrad,
                          OptimizerKind::adam, OptimizerKind::lazy_adam, OptimizerKind::rowwise_adagrad})
    if (name == optimizer_name(k)) return k;
  throw Error("optimizer: expected sgd, momentum, nesterov, adagrad, rowwise_adagrad, adam or lazy_adam, found '" +
              name + "'");
}

const char* row_storage_name(RowStorage s) {
  switch (s) {
    case RowStorage::fp32: return "fp32";
    case RowStorage::bf16: return "bf16";
    case RowStorage::fp16: return "fp16";
  }
  return "?";
}

RowStorage parse_row_storage(const std::string& name) {
  for (RowStorage s : {RowStorage::fp32, RowStorage::bf16, RowStorage::fp16})
    if (name == row_storage_name(s)) return s;
  throw Error("storage: expected fp32, bf16 or fp16, found '" + name + "'");
}

void check_row_storage(RowStorage s, const OptimizerConfig& opt, int dim, const char* what) {
  if (s == RowStorage::fp32) return;
  SPARTA_REQUIRE(opt.kind == OptimizerKind::sgd || opt.kind == OptimizerKind::rowwise_adagrad,
                 "%s: storage %s takes the optimizers sgd and rowwise_adagrad only (a full-row optimizer state is not "
                 "kept in 16 bits), found %s",
                 what, row_storage_name(s), optimizer_name(opt.kind));
  SPARTA_REQUIRE(!opt.atomic_update,
                 "%s: storage %s does not take atomic_update (a 16-bit row is rounded once per update, not per key)",
                 what, row_storage_name(s));
  SPARTA_REQUIRE(dim % 2 == 0, "%s: storage %s needs an even dim (rows are read and written in pairs), found %d", what,
                 row_storage_name(s), dim);
}

void check_bag_layout(const BagLayout& l, const char* what) {
  SPARTA_REQUIRE(l.contiguous() || (l.cols && l.slots > 0 && l.row > 0),
                 "%s: a bag layout needs its columns, slots > 0 and row > 0 (found %d slots, row %lld)", what, l.slots,
                 (long long)l.row);
}

}  // namespace sparta
