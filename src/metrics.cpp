// metrics.cpp: see metrics.h.
#include "src/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "src/base/check.h"
#include "io/synthetic.h"
#include "src/base/deadline.h"

namespace sparta {

void Predictions::clear() {
  sample.clear();
  prob.clear();
  label.clear();
}

namespace {

template <class T>
std::vector<T> gatherv(MPI_Comm comm, const std::vector<T>& v, MPI_Datatype type, int root,
                       const std::vector<int>& counts) {
  int rank = 0, world = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &world));
  std::vector<int> displs(world, 0);
  std::vector<T> out;
  if (rank == root) {
    int64_t total = 0;
    for (int p = 0; p < world; ++p) displs[p] = int(total), total += counts[p];
    out.resize(size_t(total));
  }
  timed_gatherv(v.data(), int(v.size()), type, out.data(), counts.data(), displs.data(), root, comm,
                "gather predictions");
  return out;
}

}  // namespace

Predictions gather_predictions(MPI_Comm comm, const Predictions& local, int root) {
  SPARTA_ASSERT(local.sample.size() == local.prob.size() && local.label.size() == local.prob.size(),
                "predictions of %zu samples with %zu probabilities and %zu labels", local.sample.size(),
                local.prob.size(), local.label.size());
  SPARTA_ASSERT(local.size() < size_t(1) << 31, "more than 2^31 predictions on one rank: %zu", local.size());
  int rank = 0, world = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &world));
  const int n = int(local.size());
  std::vector<int> counts(world, 0);
  timed_gather(&n, 1, MPI_INT, counts.data(), 1, root, comm, "gather predictions (counts)");
  if (rank == root) {
    int64_t total = 0;
    for (int c : counts) total += c;
    SPARTA_ASSERT(total < int64_t(1) << 31, "more than 2^31 predictions gathered: %lld", (long long)total);
  }
  std::vector<int64_t> sample = gatherv(comm, local.sample, MPI_INT64_T, root, counts);
  std::vector<float> prob = gatherv(comm, local.prob, MPI_FLOAT, root, counts);
  std::vector<float> label = gatherv(comm, local.label, MPI_FLOAT, root, counts);
  Predictions out;
  if (rank != root) return out;
  std::vector<size_t> order(sample.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sample[a] < sample[b]; });
  out.sample.reserve(order.size());
  out.prob.reserve(order.size());
  out.label.reserve(order.size());
  for (size_t i : order) {
    if (!out.sample.empty() && out.sample.back() == sample[i])
      throw Error(strprintf("predictions: sample %lld was predicted twice", (long long)sample[i]));
    out.sample.push_back(sample[i]);
    out.prob.push_back(prob[i]);
    out.label.push_back(label[i]);
  }
  return out;
}

EvalMetrics evaluate(const std::vector<float>& prob, const std::vector<float>& label) {
  SPARTA_ASSERT(prob.size() == label.size(), "%zu probabilities and %zu labels", prob.size(), label.size());
  EvalMetrics m;
  m.samples = int64_t(prob.size());
  if (prob.empty()) return m;
  double loss = 0;
  int64_t right = 0, pos = 0;
  for (size_t i = 0; i < prob.size(); ++i) {
    const double p = std::min(std::max(double(prob[i]), kLoglossClamp), 1.0 - kLoglossClamp);
    const double y = label[i];
    loss -= y * std::log(p) + (1 - y) * std::log(1 - p);
    const bool positive = label[i] > 0.5f;
    pos += positive;
    right += (prob[i] > 0.5f) == positive;
  }
  m.logloss = loss / double(prob.size());
  m.accuracy = double(right) / double(prob.size());
  m.positive_rate = double(pos) / double(prob.size());
  m.auc = exact_auc(prob, label);
  return m;
}

EvalMetrics evaluate_distributed(MPI_Comm comm, const Predictions& local) {
  Predictions all = gather_predictions(comm, local, 0);
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  EvalMetrics m;
  if (rank == 0) m = evaluate(all.prob, all.label);
  double v[5] = {double(m.samples), m.auc, m.logloss, m.accuracy, m.positive_rate};
  timed_bcast(v, 5, MPI_DOUBLE, 0, comm, "evaluation metrics");
  m.samples = int64_t(v[0]), m.auc = v[1], m.logloss = v[2], m.accuracy = v[3], m.positive_rate = v[4];
  return m;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if ((unsigned char)c < 0x20) out += strprintf("\\u%04x", c);
    else out += c;
  }
  return out + "\"";
}

JsonLine::JsonLine(const std::string& record) : s_("{\"record\":" + json_string(record)) {}

JsonLine& JsonLine::add(const std::string& key, double v) {
  // JSON has no NaN or Infinity: such values are written as null.
  s_ += "," + json_string(key) + ":" + (std::isfinite(v) ? strprintf("%.9g", v) : std::string("null"));
  return *this;
}
JsonLine& JsonLine::add(const std::string& key, int64_t v) {
  s_ += "," + json_string(key) + ":" + std::to_string(v);
  return *this;
}
JsonLine& JsonLine::add(const std::string& key, const std::string& v) {
  s_ += "," + json_string(key) + ":" + json_string(v);
  return *this;
}

}  // namespace sparta
