// metrics.h: what the trainer and sparta-predict report about a model on an evaluation set: the exact AUC over
// the whole set (every rank's predictions gathered, then one sort: io/synthetic.h exact_auc, ties counting one
// half), the log-loss and the accuracy; and the JSON lines they are written as.
//
// Gathering keeps each sample's index in the file, so the root holds the predictions in file order whatever
// the rank count and the slicing of batches (sparta-predict writes them so). The CPU path here is the
// reference; a GPU sort may replace the sort later, not the definition.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sparta {

// One rank's predictions (or, after gathering, everyone's): sample index in the file, probability, label.
struct Predictions {
  std::vector<int64_t> sample;
  std::vector<float> prob;
  std::vector<float> label;
  size_t size() const { return prob.size(); }
  void clear();
};

// Collective over comm: rank root gets every rank's predictions sorted by sample index (other ranks get an
// empty set). Throws sparta::Error on root (after the gather, so no rank waits) when a sample index appears
// twice.
Predictions gather_predictions(MPI_Comm comm, const Predictions& local, int root);

struct EvalMetrics {
  int64_t samples = 0;
  double auc = 0.5;         // exact, ties count one half; 0.5 when one class is absent
  double logloss = 0;       // mean of -(y log p + (1 - y) log(1 - p)), p clamped to [1e-7, 1 - 1e-7]
  double accuracy = 0;      // share of samples where (p > 0.5) equals (y > 0.5)
  double positive_rate = 0; // share of labels > 0.5
};

// The metrics of a whole set of predictions.
EvalMetrics evaluate(const std::vector<float>& prob, const std::vector<float>& label);
constexpr double kLoglossClamp = 1e-7;

// Collective over comm: gathers to rank 0, evaluates there and gives every rank the same metrics.
EvalMetrics evaluate_distributed(MPI_Comm comm, const Predictions& local);

// A JSON object on one line, built field by field: {"record":"eval","step":100,"auc":0.79,...}.
class JsonLine {
 public:
  explicit JsonLine(const std::string& record);
  JsonLine& add(const std::string& key, double v);
  JsonLine& add(const std::string& key, int64_t v);
  JsonLine& add(const std::string& key, int v) { return add(key, int64_t(v)); }
  JsonLine& add(const std::string& key, const std::string& v);
  JsonLine& add(const std::string& key, const char* v) { return add(key, std::string(v)); }
  std::string str() const { return s_ + "}"; }

 private:
  std::string s_;
};
std::string json_string(const std::string& s);  // quoted and escaped

}  // namespace sparta
