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

void check_bag_layout(const BagLayout& l, const char* what) {
  SPARTA_REQUIRE(l.contiguous() || (l.cols && l.slots > 0 && l.row > 0),
                 "%s: a bag layout needs its columns, slots > 0 and row > 0 (found %d slots, row %lld)", what, l.slots,
                 (long long)l.row);
}

}  // namespace sparta
