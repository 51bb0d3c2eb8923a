// h5.h: a thin layer over the HDF5 C API that every io/ file uses: owning handles, typed attributes and
// datasets, row ranges (hyperslabs along the first dimension).
//
// Errors: every HDF5 return code is checked. A failure on a user's file or on the file system (missing,
// truncated, corrupted, a full disk) throws sparta::Error naming the file, the object and the operation, so a
// checkpoint save can roll back and ranks can agree on the error; HDF5's own error printing is switched off.
// (check.h's HDF5_CHECK, which ends the job, is for internal invariants only.)
//
// Threads: HDF5 here is the serial build, which is not thread-safe, and the dataset reader reads on a
// background thread. Every function of this layer, and every direct H5* call elsewhere (hold an h5::Lock),
// runs under one process-wide lock.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace sparta {
namespace h5 {

// The process-wide HDF5 lock. Recursive: functions of this layer call each other.
std::recursive_mutex& library_mutex();
class Lock {
 public:
  Lock() : guard_(library_mutex()) {}

 private:
  std::lock_guard<std::recursive_mutex> guard_;
};

// An owning hid_t: closed with the right H5*close when it goes out of scope (a failed close there is ignored:
// a destructor runs on error paths; close a written file with h5::close to see its errors).
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  ~Handle() { reset(); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(o.id_) { o.id_ = -1; }
  Handle& operator=(Handle&& o) noexcept;
  hid_t id() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();
  // Closes now; false when HDF5 reports a failure (the handle is released either way).
  bool close();

 private:
  hid_t id_ = -1;
};

// A file and its path (kept for messages).
struct File {
  Handle handle;
  std::string path;
  hid_t id() const { return handle.id(); }
};

File create_file(const std::string& path);  // truncates
File open_file(const std::string& path, bool writable = false);
void flush(const File& f);
// Closes a written file: HDF5 writes its remaining metadata here, so a full disk shows up here as an Error
// naming the file. A file left to its destructor is closed too, but quietly.
void close(File& f);

// Element types the datasets and attributes use.
template <class T> hid_t native_type();

bool exists(const File& f, const std::string& object_path);  // dataset or group, e.g. "/sparse/keys"
void create_group(const File& f, const std::string& group_path);

// Attributes on the root group ("/") or any object. Strings are written fixed-length ASCII; read_attr_string
// reads fixed- and variable-length strings of either character set (h5py writes variable-length UTF-8).
void write_attr(const File& f, const std::string& obj, const std::string& name, const std::string& value);
void write_attr(const File& f, const std::string& obj, const std::string& name, int64_t value);
void write_attr(const File& f, const std::string& obj, const std::string& name, double value);
void write_attr(const File& f, const std::string& obj, const std::string& name, const std::vector<int64_t>& value);
bool has_attr(const File& f, const std::string& obj, const std::string& name);
std::string read_attr_string(const File& f, const std::string& obj, const std::string& name);
int64_t read_attr_int(const File& f, const std::string& obj, const std::string& name);
double read_attr_double(const File& f, const std::string& obj, const std::string& name);
std::vector<int64_t> read_attr_ints(const File& f, const std::string& obj, const std::string& name);

struct DatasetOptions {
  hsize_t chunk_rows = 0;  // 0: contiguous; otherwise chunked along the first dimension
  int gzip = 0;            // 1..9 compresses (needs chunking)
  bool fletcher32 = false; // checksums per chunk (needs chunking)
};

// Creates a dataset of shape dims (dims[0] may grow later when max_rows is H5S_UNLIMITED and chunked).
template <class T>
void create_dataset(const File& f, const std::string& path, const std::vector<hsize_t>& dims,
                    const DatasetOptions& opt = DatasetOptions(), bool growable = false);
// Writes a whole dataset in one call (creating it).
template <class T>
void write_dataset(const File& f, const std::string& path, const T* data, const std::vector<hsize_t>& dims,
                   const DatasetOptions& opt = DatasetOptions());
// Writes rows [row0, row0+rows) of a dataset whose other dimensions are fixed; grows a growable dataset.
template <class T>
void write_rows(const File& f, const std::string& path, const T* data, hsize_t row0, hsize_t rows);

// Shape of a dataset; throws naming the file and path if it is missing.
std::vector<hsize_t> shape(const File& f, const std::string& path);
// Checks the dataset's element class and size against T; throws naming expected and found (files sparta
// writes itself: checkpoints).
template <class T>
void expect_type(const File& f, const std::string& path);
// Checks that the dataset's elements can be read as T (files users write, e.g. with h5py or pandas): for a
// float T any float or integer type, for an integer T any integer type. Throws naming expected and found.
template <class T>
void expect_numeric(const File& f, const std::string& path);

// Reads are conversions: HDF5 converts the file's element type to T. Widening is exact; float64 into float32
// rounds to the nearest float32. A value T cannot hold at all (a finite float64 beyond float32's range, a uint64
// beyond int64's) fails the read with an Error naming the file, the dataset, the element (row and column) and
// the value. Infinities and NaN pass through (the caller's checks name them).
// read_converted is the H5Dread behind read_rows, for callers holding their own dataset and selection:
// file_space has rows [row0, row0 + rows) of `width` elements each selected, mem_space matches it.
template <class T>
void read_converted(const File& f, hid_t dataset, const std::string& path, hid_t mem_space, hid_t file_space,
                    hsize_t row0, hsize_t rows, hsize_t width, T* out);
// Reads rows [row0, row0+rows) (all of the other dimensions) into out (resized), converted as above.
template <class T>
void read_rows(const File& f, const std::string& path, hsize_t row0, hsize_t rows, std::vector<T>& out);
template <class T>
std::vector<T> read_all(const File& f, const std::string& path);

// ---- Test hook: a disk that fills up.
// After `bytes` more bytes, writes fail as they do on a full disk: those to HDF5 files that create_file made
// while a budget was set (they go through a file driver that charges the budget; a write that does not fit
// writes the part that does, then fails), and the plain-file writes that take from it (take_write_budget: a
// checkpoint's `latest`). Process-wide; -1 (the default) lifts
// the limit. Production code never sets it; a budget applies to this process only, so a test can fill the disk
// of one rank.
void set_write_budget(int64_t bytes);
int64_t write_budget();  // bytes left, -1 when unlimited
// Takes up to want bytes from the budget; returns how many may be written.
size_t take_write_budget(size_t want);
// Sets a budget for the scope's life, then lifts it (no-op for -1).
class ScopedWriteBudget {
 public:
  explicit ScopedWriteBudget(int64_t bytes);
  ~ScopedWriteBudget();
  ScopedWriteBudget(const ScopedWriteBudget&) = delete;
  ScopedWriteBudget& operator=(const ScopedWriteBudget&) = delete;

 private:
  bool active_;
};

}  // namespace h5
}  // namespace sparta
