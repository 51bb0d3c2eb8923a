// table_rows.h: one embedding table's rows on the host, as checkpoints save and load them. A plain struct in a
// header of its own (no MPI, no HDF5), so that the core's tables convert to and from it without pulling in the
// checkpoint machinery.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sparta {

// One table's rows (a rank's share when saving; the rows a rank owns after loading), row-major.
struct TableRows {
  std::string name;
  int dim = 0;
  std::string optimizer;       // as kernels/embedding_types.h names it: "sgd", "adam", ...
  int state_width = 0;         // optimizer state floats per row (optimizer_state_width)
  std::string storage = "fp32";  // the table's RowStorage name ("fp32" "bf16" "fp16"); values are fp32 either way
                                 // (16-bit values widen exactly), checkpoints store them in this type
  std::vector<int64_t> keys;   // [n]
  std::vector<float> values;   // [n, dim]
  std::vector<float> state;    // [n, state_width]
  size_t rows() const { return keys.size(); }
};

}  // namespace sparta
