// synthetic.h: synthetic CTR datasets of any size, deterministic by seed, with labels from a planted teacher.
//
// Two seeds. The teacher seed fixes the task: the planted teacher and the dense features' distributions.
// The (sample) seed fixes the sample stream. Files that share a teacher seed and shape are splits of one task
// (train on one, evaluate on another); their seeds must differ, or the splits hold the same samples.
//
// Sample i is a pure function of (teacher seed, seed, i): its values come from counter-based hashes
// (splitmix64 of the seed, the sample index and a field counter), so any rank can generate any sample range
// and the file is the same whatever the number of ranks. Per sample:
//   dense j   = log(1 + x), x ~ exponential with a per-feature mean in [1, e^6] (Criteo-like counts; the
//               means come from the teacher seed)
//   slot s    = n_s keys, n_s uniform in [hotness_min[s], hotness_max[s]]; each key drawn from a power law
//               over [0, cardinality[s]): P(key = k) ~ (k + 1)^-alpha[s] (continuous inverse-CDF sampling,
//               as HugeCTR's generator does; alpha 0 is uniform; small keys are the frequent ones)
//   label     = 1 with probability sigmoid(teacher logit + noise * N(0, 1))
// The teacher is a random DLRM-like function: a fixed random embedding of teacher_dim values per (slot, key),
// drawn from a hash of (teacher seed, slot, key) (no table in memory), pooled per slot (sum / sqrt(count)); a
// random projection of the standardized dense features; all pairwise dot products of these slot+1 vectors
// with random weights; plus a random first-order weight per key. Its noise-free probability is the best
// score a model can reach; the AUC of that score on the file's labels is recorded as the attribute
// teacher_auc, and the seeds as the attributes seed and teacher_seed (recorded_config rebuilds the teacher).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "io/dataset.h"

namespace sparta {

// The generator's settings as the user gives them (sparta-datagen's options).
struct SyntheticOptions {
  std::string preset = "small";  // small | mlperf (MLPerf DLRM v1, Criteo 1TB: 13 dense, 26 tables)
  int64_t samples = 0;
  int64_t num_dense = -1;        // -1: the preset's
  int64_t slots = -1;            // -1: the preset's; fewer takes the first tables, more repeats the list
  std::string hotness = "1";     // "k" fixed, "a-b" uniform per (sample, slot), or a comma list, one per slot
  std::string alpha = "1.1";     // power-law exponent, or a comma list, one per slot (HugeCTR: 0.9 1.1 1.3)
  int64_t max_rows = 0;          // > 0: caps every cardinality
  uint64_t seed = 1;             // the sample stream
  uint64_t teacher_seed = 1;     // the task: teacher and dense distributions (the same for train and eval)
};

// The resolved settings: one value per slot.
struct SyntheticConfig {
  std::string preset;
  int64_t num_samples = 0;
  int64_t num_dense = 0;
  std::vector<int64_t> cardinality;  // [slots]
  std::vector<int64_t> hotness_min;  // [slots]
  std::vector<int64_t> hotness_max;  // [slots]
  std::vector<double> alpha;         // [slots]
  uint64_t seed = 1;
  uint64_t teacher_seed = 1;
  int64_t max_rows = 0;
  int teacher_dim = 4;
  double teacher_scale = 2.5;        // standard deviation of the teacher's logit
  double teacher_bias = -1.0;        // its mean (a click rate near 0.3)
  double teacher_noise = 0.5;        // label noise the teacher does not see
  // Tests only: rank fail_rank (>= 0) throws an Error while generating its share of round fail_round, so a
  // test can show that a failure on one rank ends every rank's generate_dataset (no rank waits for it).
  int fail_rank = -1;
  int64_t fail_round = 0;

  int64_t num_slots() const { return static_cast<int64_t>(cardinality.size()); }
  // "key=value ..." (the generator attribute).
  std::string describe() const;
};

// The cardinalities of a preset: "mlperf" (the 26 MLPerf DLRM v1 tables) or "small" (8 tables, demos/tests).
std::vector<int64_t> preset_cardinality(const std::string& preset);
// MLPerf DLRM-DCNv2's keys per slot for the 26 "mlperf" tables (214 a sample): what the benches' DCNv2 runs use.
std::vector<int> mlperf_dcnv2_hotness();
// Resolves options into a config; throws Error naming the option on bad values.
SyntheticConfig make_synthetic_config(const SyntheticOptions& o);
// The schema of the file the config describes (teacher_auc not yet known).
DatasetSchema synthetic_schema(const SyntheticConfig& c);
// The config a synthetic file was generated with, from its generator attribute and seeds (path names the
// file in errors): Teacher(recorded_config(...)) is the file's teacher, and generate_samples with it gives
// the file's samples. A file without the teacher_seed attribute (written before teacher seeds existed) has
// teacher seed = seed. Throws Error naming the file and the key when the file is not synthetic, a setting is
// missing or malformed, or the settings disagree with the file's shape attributes.
SyntheticConfig recorded_config(const DatasetSchema& s, const std::string& path);

// The planted model (see the file comment).
class Teacher {
 public:
  explicit Teacher(const SyntheticConfig& c);
  // Noise-free logit of one sample: dense [num_dense], offsets [num_slots + 1] into keys.
  double logit(const float* dense, const int64_t* offsets, const int64_t* keys) const;

 private:
  SyntheticConfig c_;
  uint64_t seed_;
  std::vector<double> dense_mean_, dense_inv_std_;  // [num_dense]
  std::vector<double> proj_;                        // [dim, num_dense]
  std::vector<double> pair_w_;                      // [(S+1)*S/2]
  mutable std::vector<double> vec_;                 // scratch [S+1, dim] (one Teacher per thread)
};

// AUC from score histograms: mergeable across ranks by adding counts (so exact for any rank count); scores
// in [0, 1] share a bin when closer than 1/bins, and ties count one half.
struct AucHistogram {
  explicit AucHistogram(int bins = 1 << 18);
  void add(double score, float label);
  double auc() const;
  // Adds every rank's counts into rank root's (collective over comm).
  void reduce(int root, MPI_Comm comm);
  std::vector<int64_t> pos, neg;  // [bins]
};
// Exact AUC by sorting (ties count one half); for tests and small files.
double exact_auc(const std::vector<float>& scores, const std::vector<float>& labels);

// Appends samples [first, first+n) to out (reset to the config's shape when empty). When probs is given, the
// teacher's noise-free probability of each sample is appended to it.
void generate_samples(const SyntheticConfig& c, const Teacher& t, int64_t first, int64_t n, SampleBlock& out,
                      std::vector<float>* probs = nullptr);

struct GenerateResult {
  double teacher_auc = 0;
  double positive_rate = 0;
  int64_t num_keys = 0;
  double seconds = 0;
};

// Writes the whole dataset; collective over comm. Work is done in rounds: in each, every rank generates its
// share of the round's samples (chunk_rows each), the ranks agree that every share was generated, every
// rank sends its share to rank 0 (MPI point-to-point, in rank order), and rank 0 appends the shares in order
// with the serial HDF5 writer; then the ranks agree that the round was written. So a failure anywhere (a rank
// that cannot generate, an I/O error on rank 0) ends every rank's call with the same Error instead of a hang.
// Teacher AUC histograms are summed on rank 0 at the end. Returns the same result on every rank.
GenerateResult generate_dataset(const std::string& path, const SyntheticConfig& c, const WriteOptions& w,
                                MPI_Comm comm, bool progress = false);

}  // namespace sparta
