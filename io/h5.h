// h5.h: a thin layer over the HDF5 C API that every io/ file uses: owning handles, typed attributes and
// datasets, row ranges (hyperslabs along the first dimension). Every failure throws sparta::Error naming the
// file, the object and what was expected and found; HDF5's own error printing is switched off.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sparta {
namespace h5 {

// An owning hid_t: closed with the right H5*close when it goes out of scope.
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

// Element types the datasets and attributes use.
template <class T> hid_t native_type();

bool exists(const File& f, const std::string& object_path);  // dataset or group, e.g. "/sparse/keys"
void create_group(const File& f, const std::string& group_path);

// Attributes on the root group ("/") or any object.
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
// Checks the dataset's element class and size against T; throws naming expected and found.
template <class T>
void expect_type(const File& f, const std::string& path);
// Reads rows [row0, row0+rows) (all of the other dimensions) into out (resized).
template <class T>
void read_rows(const File& f, const std::string& path, hsize_t row0, hsize_t rows, std::vector<T>& out);
template <class T>
std::vector<T> read_all(const File& f, const std::string& path);

}  // namespace h5
}  // namespace sparta
