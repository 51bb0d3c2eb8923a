// criteo.h: Criteo click logs (TSV) into the sparta dataset format, with the MLPerf DLRM preprocessing.
//
// Input: one sample per line, 40 tab-separated fields: label (0 or 1), 13 integer features I1..I13, 26
// categorical features C1..C26 as hexadecimal strings (Criteo uses 8 digits). Empty integer and categorical
// fields are allowed; a trailing '\r' (CRLF files) is ignored. Preprocessing (as the MLPerf DLRM reference):
// integers: empty -> 0, negative -> 0, then log(x + 1); categoricals: hexadecimal -> int64 key (empty -> 0),
// then key % max_index when max_index > 0. Output: 13 dense features, 26 one-hot slots, cardinality
// max_index per slot (0, unbounded, without it).
//
// A malformed line (wrong field count, a non-integer, bad hexadecimal, a label other than 0/1) is an Error
// naming "file:line", the field and what was found; with skip_bad it is skipped and counted instead.
// Conversion streams: memory stays constant (one block of samples and a read buffer) whatever the input size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/dataset.h"

namespace sparta {

constexpr int kCriteoDense = 13;
constexpr int kCriteoSlots = 26;

struct CriteoSample {
  float label = 0;
  float dense[kCriteoDense];
  int64_t keys[kCriteoSlots];
};

// Parses one line [begin, end) (no newline). Returns "" when it is good, else what is wrong, naming the
// field ("field C3: expected hexadecimal digits, found 'zz'").
std::string parse_criteo_line(const char* begin, const char* end, int64_t max_index, CriteoSample& out);

// The schema of a converted file.
DatasetSchema criteo_schema(int64_t max_index);

struct CriteoOptions {
  int64_t max_index = 0;      // > 0: keys modulo max_index (MLPerf: 40000000)
  bool skip_bad = false;      // skip and count malformed lines instead of stopping at the first
  bool progress = false;      // a progress bar on stderr
  int64_t block_rows = 65536; // samples buffered before each write
  WriteOptions write;
};

struct ConvertStats {
  int64_t lines = 0;     // lines read
  int64_t samples = 0;   // samples written
  int64_t skipped = 0;   // malformed lines skipped (skip_bad)
  int64_t bytes = 0;     // input bytes read
  double seconds = 0;
};

// Converts the inputs, in order ("-" reads stdin), into one dataset file at out. On an Error the partial
// output file is removed.
ConvertStats convert_criteo(const std::vector<std::string>& inputs, const std::string& out, const CriteoOptions& o);

}  // namespace sparta
