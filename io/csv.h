// csv.h: delimited text (CSV, TSV) with a header line into the sparta dataset format, streaming in constant
// memory (one block of samples; a vocabulary, when asked for, grows with the distinct values).
//
// Columns are chosen by name (the header's), or by 0-based index where the file has no header, and each plays a
// role; columns given no role are skipped:
//   label        one column: a number in [0, 1] ("0", "1", "0.0", "1.0"; "true"/"false" too)
//   dense        numbers (an empty field is missing_dense), written as they are (sparta-train can standardize them:
//                data.normalize)
//   categorical  one slot each: the field's text is one key (an empty field: no key)
//   multi        one slot each: the field holds several values separated by multi_separator ("a|b|c"), one key
//                each (empty values skipped); the slot's hotness is the most values a line has
// Slots are the categorical columns, then the multi columns, in the order given.
// Keys: hash (default): key = XXH64(value's bytes, seed 0) >> 1, then % max_index when max_index > 0 (cardinality
// max_index, else unbounded) — the same text gives the same key in every file, so train and eval splits convert
// apart, in parallel; vocabulary: the distinct values of each slot numbered 0, 1, 2, ... in the order they first
// appear, built in the same single pass; cardinality: the values seen + 1, the last key standing for a value
// the vocabulary lacks. vocabulary_out receives the vocabulary; a vocabulary_in is read first and used as it is
// (an eval split converted with its train split's: the same numbers, the same cardinality, and values the train
// split never had all get the last key). A vocabulary file is text, one line per value:
// "<slot>\t<key>\t<value>".
// Fields follow RFC 4180: a field in double quotes may hold the delimiter and "" for a quote (not a line break).
// A trailing '\r' is ignored; blank lines are skipped.
//
// Errors name "file:line", the column and what was found (a missing column, a field count other than the
// header's, a label or number that does not parse); with skip_bad the line is skipped and counted instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/criteo.h"  // ConvertStats
#include "io/dataset.h"

namespace sparta {

struct CsvOptions {
  char delimiter = ',';
  bool header = true;                 // the first line names the columns (false: columns are 0-based indices)
  std::string label;                  // the label column
  std::vector<std::string> dense;     // the dense columns
  std::vector<std::string> categorical;
  std::vector<std::string> multi;
  char multi_separator = '|';
  float missing_dense = 0;            // an empty dense field
  std::string keys = "hash";          // hash | vocabulary
  int64_t max_index = 0;              // hash: keys modulo this (0: unbounded)
  std::string vocabulary_in, vocabulary_out;  // vocabulary: files read before and written after ("": none)
  bool skip_bad = false;
  bool progress = false;
  int64_t block_rows = 65536;         // samples buffered before each write
  WriteOptions write;
};

// Splits one line into fields by delimiter, honouring double quotes. Returns "" or what is wrong.
std::string split_csv_line(const std::string& line, char delimiter, std::vector<std::string>& fields);

// The key of a categorical value under keys = hash.
int64_t hash_key(const std::string& value, int64_t max_index);

// Converts the inputs, in order ("-" reads stdin), into one dataset file at out. Every input must have the same
// header. On an Error the partial output file is removed.
ConvertStats convert_csv(const std::vector<std::string>& inputs, const std::string& out, const CsvOptions& o);

}  // namespace sparta
