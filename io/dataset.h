// dataset.h: the sparta dataset format (one HDF5 file per split), its schema, a writer, and the checks every
// reader and writer applies.
//
// Format, version 1 ("sparta-dataset"):
//
//   / attributes
//     format          string  "sparta-dataset"
//     version         int64   1
//     num_samples     int64   N (-1 while a writer has not finished: an incomplete file)
//     num_dense       int64   dense features per sample (>= 1)
//     num_slots       int64   sparse slots (categorical features) per sample (>= 1)
//     cardinality     int64[num_slots]  keys of slot s lie in [0, cardinality[s]); 0: unbounded hashed keys
//     hotness         int64[num_slots]  most keys one sample has in slot s (1: one-hot)
//     preprocessing   string  how the raw data became these values (free text)
//     generator       string  synthetic data only: the generator's settings, "key=value" separated by spaces
//     teacher_auc     double  synthetic data only: AUC of the planted teacher's probability on this file's labels
//     seed            int64   synthetic data only: the sample stream's seed (a uint64, stored bit for bit)
//     teacher_seed    int64   synthetic data only: the planted teacher's seed (a uint64, stored bit for bit);
//                             files sharing it are splits of one task. Files written before it existed lack
//                             it (and seed): their generator attribute's seed is both.
//   /label            float32 [N]               click (0 or 1; any value in [0, 1] is accepted)
//   /dense            float32 [N, num_dense]    finite values
//   /sparse/offsets   int64   [N*num_slots + 1] CSR offsets over rows r = sample*num_slots + slot:
//                                               the keys of row r are keys[offsets[r] .. offsets[r+1]);
//                                               offsets[0] = 0, non-decreasing, offsets[N*num_slots] = nnz
//   /sparse/keys      int64   [nnz]             keys >= 0 (and < cardinality of their slot when it is > 0)
//
// Element types on read: the types above are what sparta writes; a reader takes what h5py, numpy and pandas
// write by default too. /label and /dense may hold any float or integer type (float64 is rounded to the nearest
// float32), /sparse/offsets and /sparse/keys any integer type (int32 keys widen exactly). A value that does not
// fit (a finite float64 beyond float32's range, a uint64 key beyond int64's) is an Error naming the file, the
// dataset, the element and the value; a float type for keys or offsets is refused (io/h5.h read_converted).
//
// Every dataset is chunked along its first dimension (chunk_rows samples; offsets and keys by chunk_rows *
// num_slots elements); gzip compression and Fletcher32 checksums per chunk are optional. Any HDF5 tool
// reads the files (h5dump, h5py).
//
// Checks (sparta::Error naming the file, the field, the sample, what was expected and what was found):
// unknown format or version, missing attributes or datasets, wrong shapes or element types, values the types
// read cannot hold, offsets that are not monotone or point beyond nnz, more keys in a slot than its hotness,
// keys < 0 or >= cardinality, NaN or Inf in dense features or labels, labels outside [0, 1]. Readers check every batch they deliver;
// the writer checks every block it appends.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "io/h5.h"
#include "src/base/random.h"  // splitmix64, hash_mix, unit_double

namespace sparta {

constexpr const char* kDatasetFormat = "sparta-dataset";
constexpr int64_t kDatasetVersion = 1;

// Everything the root attributes say about a file.
struct DatasetSchema {
  int64_t num_samples = 0;
  int64_t num_dense = 0;
  int64_t num_slots = 0;
  std::vector<int64_t> cardinality;  // [num_slots]; 0: unbounded
  std::vector<int64_t> hotness;      // [num_slots]; max keys per sample in the slot
  std::string preprocessing;
  std::string generator;             // "" unless synthetic
  double teacher_auc = -1;           // < 0: none recorded
  std::optional<uint64_t> seed;          // synthetic only: the sample stream's seed
  std::optional<uint64_t> teacher_seed;  // synthetic only: the teacher's seed
  int64_t num_keys = 0;              // nnz: length of /sparse/keys (read from the file, not an attribute)

  // sum(hotness): the most keys one sample can have.
  int64_t max_keys_per_sample() const;
  // Throws Error naming where (a file or "options") if the sizes are inconsistent or out of range.
  void check(const std::string& where) const;
};

// Samples in host memory, laid out as in the file: what generators and converters produce and writers append.
struct SampleBlock {
  int64_t num_dense = 0;
  int64_t num_slots = 0;
  std::vector<float> labels;     // [n]
  std::vector<float> dense;      // [n, num_dense]
  std::vector<int64_t> offsets;  // [n*num_slots + 1], offsets[0] == 0
  std::vector<int64_t> keys;     // [nnz]

  // Empties the block for samples of the given shape (offsets = {0}).
  void reset(int64_t dense_features, int64_t slots);
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
};

// A read-only view of samples: offsets may start anywhere (raw file offsets); keys[0] is the key at offsets[0].
struct BlockView {
  int64_t num_samples = 0;
  const float* labels = nullptr;     // [n]
  const float* dense = nullptr;       // [n, num_dense]
  const int64_t* offsets = nullptr;  // [n*num_slots + 1]
  const int64_t* keys = nullptr;     // [offsets[n*num_slots] - offsets[0]]
};
BlockView view_of(const SampleBlock& b);

// Checks offsets of samples [first_sample, first_sample+n): offsets[0] >= 0, non-decreasing, at most hotness
// keys per (sample, slot), and the last offset <= total_keys (the nnz of the file). Throws Error naming path.
void check_offsets(const DatasetSchema& s, const std::string& path, int64_t first_sample, int64_t n,
                   const int64_t* offsets, int64_t total_keys);
// Checks labels (finite, in [0, 1]), dense features (finite) and keys (>= 0, < cardinality) of a block whose
// offsets already passed check_offsets. Throws Error naming path, field and sample.
void check_values(const DatasetSchema& s, const std::string& path, int64_t first_sample, const BlockView& b);

// Reads and checks the attributes and the shapes and element types of every dataset, and that
// offsets[0] == 0 and offsets[last] == nnz. Throws Error naming the file and the field.
DatasetSchema read_schema(const h5::File& f);
DatasetSchema read_schema(const std::string& path);

// Throws Error unless a file (an eval split, say) has the shape of another: num_dense, num_slots, cardinality.
void check_compatible(const DatasetSchema& a, const std::string& path_a, const DatasetSchema& b,
                      const std::string& path_b);

// Per-feature sums of /dense over the file's first `samples` samples (all when <= 0 or more than it holds), of
// the blocks of 65536 samples that rank of world takes (block b goes to rank b % world): every rank's sums added
// up cover those samples once. For dense normalization (sparta-train data.normalize). Throws Error naming path.
struct DenseSums {
  std::vector<double> sum, sum_squares;  // [num_dense]
  int64_t count = 0;                     // samples summed
};
DenseSums dense_sums(const std::string& path, int64_t samples, int rank, int world);

struct WriteOptions {
  int64_t chunk_rows = 65536;  // samples per chunk (offsets and keys: chunk_rows * num_slots elements)
  int gzip = 0;                // 0: none; 1..9: deflate level
  bool fletcher32 = false;     // a checksum per chunk, verified on every read
};

// Writes a dataset file block by block in constant memory.
class DatasetWriter {
 public:
  // Creates path (truncating it) and writes the schema's attributes with num_samples = -1 (incomplete).
  DatasetWriter(const std::string& path, const DatasetSchema& schema, const WriteOptions& opt = WriteOptions());
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;
  // Checks the samples against the schema and appends them.
  void append(const SampleBlock& block);
  void append(const BlockView& block);
  // The attributes finish() writes (teacher_auc, generator and preprocessing may change until then).
  DatasetSchema& schema() { return schema_; }
  int64_t samples_written() const { return samples_; }
  int64_t keys_written() const { return keys_; }
  // Writes num_samples and the other attributes, and closes the file. Not calling it leaves num_samples = -1.
  void finish();
  const std::string& path() const { return file_.path; }

 private:
  void write_attributes();
  h5::File file_;
  DatasetSchema schema_;
  int64_t samples_ = 0;
  int64_t keys_ = 0;
  std::vector<int64_t> shifted_;  // offsets of the block being appended, moved to file positions
};

// A progress line on stderr ("label  [=====>    ] 45.1%  1.2 M/s  ETA 0:13"), redrawn at most every 0.25 s.
// Draws only when enabled (the caller decides: a TTY or --progress). total <= 0: no bar, no ETA.
class ProgressBar {
 public:
  ProgressBar(const std::string& label, double total, const std::string& unit, bool enabled);
  ~ProgressBar();
  void update(double done, bool force = false);
  void finish();  // draws the final state and ends the line
  static bool stderr_is_tty();

 private:
  std::string label_, unit_;
  double total_, done_ = 0, start_, last_draw_ = -1;
  bool enabled_, finished_ = false;
};

}  // namespace sparta
