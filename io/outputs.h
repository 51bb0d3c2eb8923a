// outputs.h: what every program does with the files it writes, so that no input is ever overwritten and no
// failure leaves a partial file under the name the user asked for:
//   - before anything else, an output that is (or resolves to, through symbolic or hard links) one of the
//     program's inputs, or an existing directory, is refused naming both and the option;
//   - an output is written under a temporary name beside it and renamed over the final name only once it is
//     complete (a failure removes the temporary file);
//   - a program that can estimate the size of its output refuses to start when the output's file system has
//     less free space than that.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sparta {

// One input of a program, as messages name it: ("--data", "eval.h5").
struct NamedPath {
  std::string option;
  std::string path;
};

// Throws sparta::Error "<option> 'out': is the same file as <input option> 'in' ..." when out names an existing
// directory, or the same file as one of inputs (same device and inode once links are followed; inputs that do
// not exist or are "-" are skipped). Files only: a directory input (a checkpoint root) is compared with every
// file below it.
void require_output_not_input(const NamedPath& out, const std::vector<NamedPath>& inputs);

// Bytes available to this user on the file system that holds path's folder (path itself need not exist).
uint64_t free_bytes(const std::string& path);

// Throws sparta::Error when out's file system has fewer than need bytes free: names the option, the path, the
// estimate (what) and what is free. A folder that does not exist is left to the writer to report.
void require_free_space(const NamedPath& out, uint64_t need, const std::string& what);

// An output written under a temporary name ("<out>.tmp-<pid>") and renamed to out by commit(); destroyed
// without commit (an error on the way), it removes the temporary file.
class StagedOutput {
 public:
  explicit StagedOutput(std::string out);
  ~StagedOutput();
  StagedOutput(const StagedOutput&) = delete;
  StagedOutput& operator=(const StagedOutput&) = delete;
  const std::string& path() const { return tmp_; }  // where to write
  const std::string& final_path() const { return out_; }
  // fsyncs the temporary file and renames it to out; throws sparta::Error naming both on failure.
  void commit();

 private:
  std::string out_, tmp_;
  bool done_ = false;
};

}  // namespace sparta
