// h5.cpp: see h5.h.
#include "io/h5.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "src/base/check.h"

#if H5_VERSION_GE(1, 13, 0)
#include <H5FDdevelop.h>  // H5FD_class_t moved here in 1.13
#endif

namespace sparta {
namespace h5 {

std::recursive_mutex& library_mutex() {
  static auto* mu = new std::recursive_mutex();  // never destroyed: handles may close during exit
  return *mu;
}

namespace {

// HDF5 prints its error stack by default; our messages say what went wrong instead.
struct Quiet {
  Quiet() {
    Lock lock;
    HDF5_CHECK(H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr));  // no file involved: an invariant, not input
  }
} quiet;

[[noreturn]] void fail(const File& f, const std::string& what) { throw Error(f.path + ": " + what); }

// An HDF5 return code (herr_t, htri_t, hid_t, hssize_t, int): negative is a failure.
template <class T>
T check(T status, const File& f, const std::string& what) {
  if (status < 0) fail(f, what);
  return status;
}

Handle make(hid_t id, const File& f, const std::string& what) {
  if (id < 0) fail(f, what);
  return Handle(id);
}

// ---- The write driver: every file this layer creates or opens for writing goes through it. It writes with
// pwrite like HDF5's sec2 driver, with two differences. (1) A failed write (a full disk, an I/O error) is not
// reported to HDF5: the driver records it and drops that write and every later one, and this layer throws the
// recorded error after the operation and at close. HDF5 1.10 does not survive a write failure inside H5Fclose
// (the file id stays half-closed and the library crashes at exit); with this driver HDF5 always closes cleanly
// and the caller learns of the failure all the same. (2) Each write is charged to the test write budget.

std::atomic<int64_t> budget_left{-1};

struct DriverFile {
  H5FD_t pub;  // first: HDF5 sees this part
  int fd = -1;
  haddr_t eoa = 0, eof = 0;
  std::string path;
  std::string error;  // the first failed write; later writes are dropped
};

DriverFile* as_driver(const H5FD_t* f) { return reinterpret_cast<DriverFile*>(const_cast<H5FD_t*>(f)); }

// The error of each file whose driver closed with one, until close() or the next create takes it.
// Never destroyed: HDF5 closes files left open at exit, after static destructors ran.
std::map<std::string, std::string>& closed_errors() {
  static auto* m = new std::map<std::string, std::string>();
  return *m;
}

void record(DriverFile* f, const std::string& what) {
  if (f->error.empty()) f->error = what;
}

H5FD_t* driver_open(const char* name, unsigned flags, hid_t, haddr_t) {
  int o = (flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY;
  if (flags & H5F_ACC_TRUNC) o |= O_TRUNC;
  if (flags & H5F_ACC_CREAT) o |= O_CREAT;
  if (flags & H5F_ACC_EXCL) o |= O_EXCL;
  int fd = ::open(name, o | O_CLOEXEC, 0666);
  if (fd < 0) return nullptr;
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return nullptr;
  }
  DriverFile* f = new DriverFile();  // value-initialized: pub is zeroed
  f->fd = fd;
  f->eof = static_cast<haddr_t>(st.st_size);
  f->path = name;
  closed_errors().erase(f->path);
  return &f->pub;
}

herr_t driver_close(H5FD_t* file) {
  DriverFile* f = as_driver(file);
  if (::close(f->fd) != 0) record(f, std::string("close: ") + std::strerror(errno));
  if (!f->error.empty()) closed_errors()[f->path] = f->error;
  delete f;
  return 0;
}

herr_t driver_query(const H5FD_t*, unsigned long* flags) {
  // What sec2 declares: HDF5 may aggregate and cache metadata and sieve raw data.
  if (flags)
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
             H5FD_FEAT_AGGREGATE_SMALLDATA;
  return 0;
}

haddr_t driver_get_eoa(const H5FD_t* file, H5FD_mem_t) { return as_driver(file)->eoa; }
herr_t driver_set_eoa(H5FD_t* file, H5FD_mem_t, haddr_t addr) {
  as_driver(file)->eoa = addr;
  return 0;
}
haddr_t driver_get_eof(const H5FD_t* file, H5FD_mem_t) { return as_driver(file)->eof; }

// The driver's own record, so that this layer can read its error.
herr_t driver_get_handle(H5FD_t* file, hid_t, void** handle) {
  *handle = as_driver(file);
  return 0;
}

herr_t driver_read(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size, void* buf) {
  DriverFile* f = as_driver(file);
  char* p = static_cast<char*>(buf);
  while (size > 0) {
    ssize_t n = ::pread(f->fd, p, size, static_cast<off_t>(addr));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) {  // past the end of the file: zeros, as sec2 reads them
      std::memset(p, 0, size);
      break;
    }
    p += n;
    addr += static_cast<haddr_t>(n);
    size -= static_cast<size_t>(n);
  }
  return 0;
}

herr_t driver_write(H5FD_t* file, H5FD_mem_t, hid_t, haddr_t addr, size_t size, const void* buf) {
  DriverFile* f = as_driver(file);
  f->eof = std::max(f->eof, addr + size);  // as HDF5 expects it, written or dropped
  if (!f->error.empty()) return 0;
  const size_t allowed = take_write_budget(size);
  const char* p = static_cast<const char*>(buf);
  size_t left = allowed;
  haddr_t at = addr;
  while (left > 0) {
    ssize_t n = ::pwrite(f->fd, p, left, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      record(f, strprintf("write of %zu bytes at offset %llu failed: %s", size, static_cast<unsigned long long>(addr),
                          n < 0 ? std::strerror(errno) : "nothing written"));
      return 0;
    }
    p += n;
    at += static_cast<haddr_t>(n);
    left -= static_cast<size_t>(n);
  }
  if (allowed < size)
    record(f, strprintf("write of %zu bytes at offset %llu failed: %s (the test write budget ran out)", size,
                        static_cast<unsigned long long>(addr), std::strerror(ENOSPC)));
  return 0;
}

herr_t driver_truncate(H5FD_t* file, hid_t, hbool_t) {
  DriverFile* f = as_driver(file);
  if (f->eoa == f->eof || !f->error.empty()) return 0;
  if (::ftruncate(f->fd, static_cast<off_t>(f->eoa)) != 0)
    record(f, std::string("truncate failed: ") + std::strerror(errno));
  f->eof = f->eoa;
  return 0;
}

// The driver's id, registered on first use (under the library lock).
hid_t write_driver(const std::string& path) {
  static hid_t id = -1;
  if (id >= 0) return id;
  static H5FD_class_t cls;  // static: zero-initialized, so every callback not set here is absent
#ifdef H5FD_CLASS_VERSION
  cls.version = H5FD_CLASS_VERSION;
  cls.value = static_cast<H5FD_class_value_t>(511);  // 256..511: for drivers outside the HDF5 registry
#endif
  cls.name = "sparta_write";
  cls.maxaddr = (haddr_t(1) << 62) - 1;
  cls.fc_degree = H5F_CLOSE_WEAK;
  cls.open = driver_open;
  cls.close = driver_close;
  cls.query = driver_query;
  cls.get_eoa = driver_get_eoa;
  cls.set_eoa = driver_set_eoa;
  cls.get_eof = driver_get_eof;
  cls.get_handle = driver_get_handle;
  cls.read = driver_read;
  cls.write = driver_write;
  cls.truncate = driver_truncate;
  const H5FD_mem_t map[] = H5FD_FLMAP_DICHOTOMY;
  std::copy(std::begin(map), std::end(map), cls.fl_map);
  id = H5FDregister(&cls);
  if (id < 0) throw Error(path + ": cannot register the HDF5 write driver");
  return id;
}

Handle write_access(const File& f) {
  Handle fapl = make(H5Pcreate(H5P_FILE_ACCESS), f, "cannot create a file access list");
  check(H5Pset_driver(fapl.id(), write_driver(f.path), nullptr), f, "cannot select the write driver");
  return fapl;
}

// Throws the write error the driver recorded for an open file (none for a file opened read-only).
void check_written(const File& f) {
  Handle fapl = make(H5Fget_access_plist(f.id()), f, "cannot read the file access list");
  if (H5Pget_driver(fapl.id()) != write_driver(f.path)) return;
  void* handle = nullptr;
  check(H5Fget_vfd_handle(f.id(), fapl.id(), &handle), f, "cannot reach the file driver");
  const DriverFile* d = static_cast<const DriverFile*>(handle);
  if (d && !d->error.empty()) fail(f, d->error);
}

// ---- Objects.

Handle open_object(const File& f, const std::string& obj) {
  if (!exists(f, obj)) fail(f, "missing object '" + obj + "'");
  return make(H5Oopen(f.id(), obj.c_str(), H5P_DEFAULT), f, "cannot open object '" + obj + "'");
}

Handle open_attr(const File& f, const std::string& obj, const std::string& name) {
  Handle o = open_object(f, obj);
  htri_t has = check(H5Aexists(o.id(), name.c_str()), f, "cannot look up attribute '" + name + "' on '" + obj + "'");
  if (!has) fail(f, "missing attribute '" + name + "' on '" + obj + "'");
  return make(H5Aopen(o.id(), name.c_str(), H5P_DEFAULT), f, "cannot open attribute '" + name + "' on '" + obj + "'");
}

void put_attr(const File& f, const std::string& obj, const std::string& name, hid_t type, hid_t space,
              const void* data) {
  const std::string what = "cannot write attribute '" + name + "' on '" + obj + "'";
  Handle o = open_object(f, obj);
  if (check(H5Aexists(o.id(), name.c_str()), f, what) > 0) check(H5Adelete(o.id(), name.c_str()), f, what);
  Handle a = make(H5Acreate2(o.id(), name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), f, what);
  bool empty = check(H5Sget_simple_extent_type(space), f, what) == H5S_NULL;  // an empty vector: nothing to write
  if (!empty) check(H5Awrite(a.id(), type, data), f, what);
  check_written(f);
}

Handle open_dataset(const File& f, const std::string& path) {
  if (!exists(f, path)) fail(f, "missing dataset '" + path + "'");
  return make(H5Dopen2(f.id(), path.c_str(), H5P_DEFAULT), f, "cannot open dataset '" + path + "'");
}

// For messages: "int64", "float32", "string8"...; "unknown" when HDF5 cannot say.
std::string type_name(hid_t t) {
  H5T_class_t c = H5Tget_class(t);
  size_t size = H5Tget_size(t);
  if (c < 0 || size == 0) return "unknown";
  std::string s = c == H5T_INTEGER ? (H5Tget_sign(t) == H5T_SGN_NONE ? "uint" : "int")
                  : c == H5T_FLOAT ? "float"
                  : c == H5T_STRING ? "string"
                                    : "other";
  return s + std::to_string(size * 8);
}

// The extent of a dataspace; rank 0 for a scalar.
std::vector<hsize_t> extent(const File& f, hid_t space, const std::string& what) {
  int rank = check(H5Sget_simple_extent_ndims(space), f, what);
  std::vector<hsize_t> dims(rank);
  if (rank > 0) check(H5Sget_simple_extent_dims(space, dims.data(), nullptr), f, what);
  return dims;
}

// Selects rows [row0, row0 + rows) of a dataset's space and returns the matching memory space.
Handle select_rows(const File& f, hid_t space, const std::vector<hsize_t>& dims, hsize_t row0, hsize_t rows,
                   const std::string& what) {
  std::vector<hsize_t> start(dims.size(), 0), count = dims;
  start[0] = row0;
  count[0] = rows;
  check(H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr), f, what);
  return make(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), f, what);
}

}  // namespace

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    o.id_ = -1;
  }
  return *this;
}

bool Handle::close() {
  if (id_ < 0) return true;
  Lock lock;
  herr_t rc = -1;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: rc = H5Fclose(id_); break;
    case H5I_GROUP: rc = H5Gclose(id_); break;
    case H5I_DATASET: rc = H5Dclose(id_); break;
    case H5I_DATASPACE: rc = H5Sclose(id_); break;
    case H5I_ATTR: rc = H5Aclose(id_); break;
    case H5I_DATATYPE: rc = H5Tclose(id_); break;
    case H5I_GENPROP_LST: rc = H5Pclose(id_); break;
    default: rc = H5Oclose(id_); break;
  }
  id_ = -1;
  return rc >= 0;
}

void Handle::reset() { close(); }

File create_file(const std::string& path) {
  Lock lock;
  File f;
  f.path = path;
  Handle fapl = write_access(f);
  f.handle = Handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.id()));
  if (!f.handle.valid())
    throw Error(path + ": cannot create HDF5 file (does the directory exist, is it writable, is the disk full?)");
  return f;
}

File open_file(const std::string& path, bool writable) {
  Lock lock;
  File f;
  f.path = path;
  if (H5Fis_hdf5(path.c_str()) <= 0) throw Error(path + ": missing, unreadable, truncated or not an HDF5 file");
  Handle fapl;
  if (writable) fapl = write_access(f);
  f.handle =
      Handle(H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, writable ? fapl.id() : H5P_DEFAULT));
  if (!f.handle.valid()) throw Error(path + ": cannot open HDF5 file (truncated or corrupted?)");
  return f;
}

void flush(const File& f) {
  Lock lock;
  check(H5Fflush(f.id(), H5F_SCOPE_GLOBAL), f, "flush failed");
  check_written(f);
}

void close(File& f) {
  Lock lock;
  if (!f.handle.valid()) return;
  bool closed = f.handle.close();
  auto it = closed_errors().find(f.path);
  if (it != closed_errors().end()) {
    std::string error = it->second;
    closed_errors().erase(it);
    fail(f, error);
  }
  if (!closed) fail(f, "close failed");
}

template <> hid_t native_type<float>() { return H5T_NATIVE_FLOAT; }
template <> hid_t native_type<double>() { return H5T_NATIVE_DOUBLE; }
template <> hid_t native_type<int64_t>() { return H5T_NATIVE_INT64; }
template <> hid_t native_type<int32_t>() { return H5T_NATIVE_INT32; }
template <> hid_t native_type<uint64_t>() { return H5T_NATIVE_UINT64; }
template <> hid_t native_type<uint8_t>() { return H5T_NATIVE_UINT8; }
template <> hid_t native_type<uint16_t>() { return H5T_NATIVE_UINT16; }

bool exists(const File& f, const std::string& object_path) {
  Lock lock;
  // Walk the path: H5Lexists fails on a missing intermediate group.
  size_t pos = 0;
  while (true) {
    pos = object_path.find('/', pos + 1);
    std::string prefix = object_path.substr(0, pos);
    if (!prefix.empty() && prefix != "/" && H5Lexists(f.id(), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (pos == std::string::npos) return true;
  }
}

void create_group(const File& f, const std::string& group_path) {
  Lock lock;
  if (exists(f, group_path)) return;
  make(H5Gcreate2(f.id(), group_path.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), f,
       "cannot create group '" + group_path + "'");
  check_written(f);
}

void write_attr(const File& f, const std::string& obj, const std::string& name, const std::string& value) {
  Lock lock;
  const std::string what = "cannot write attribute '" + name + "' on '" + obj + "'";
  Handle type = make(H5Tcopy(H5T_C_S1), f, what);
  check(H5Tset_size(type.id(), value.empty() ? 1 : value.size()), f, what);
  check(H5Tset_strpad(type.id(), H5T_STR_NULLPAD), f, what);
  Handle space = make(H5Screate(H5S_SCALAR), f, what);
  std::string v = value.empty() ? std::string(1, '\0') : value;
  put_attr(f, obj, name, type.id(), space.id(), v.data());
}

void write_attr(const File& f, const std::string& obj, const std::string& name, int64_t value) {
  Lock lock;
  Handle space = make(H5Screate(H5S_SCALAR), f, "cannot write attribute '" + name + "' on '" + obj + "'");
  put_attr(f, obj, name, H5T_NATIVE_INT64, space.id(), &value);
}

void write_attr(const File& f, const std::string& obj, const std::string& name, double value) {
  Lock lock;
  Handle space = make(H5Screate(H5S_SCALAR), f, "cannot write attribute '" + name + "' on '" + obj + "'");
  put_attr(f, obj, name, H5T_NATIVE_DOUBLE, space.id(), &value);
}

void write_attr(const File& f, const std::string& obj, const std::string& name, const std::vector<int64_t>& value) {
  Lock lock;
  hsize_t n = value.size();
  Handle space = make(n ? H5Screate_simple(1, &n, nullptr) : H5Screate(H5S_NULL), f,
                      "cannot write attribute '" + name + "' on '" + obj + "'");
  put_attr(f, obj, name, H5T_NATIVE_INT64, space.id(), value.data());
}

bool has_attr(const File& f, const std::string& obj, const std::string& name) {
  Lock lock;
  if (!exists(f, obj)) return false;
  Handle o = open_object(f, obj);
  return check(H5Aexists(o.id(), name.c_str()), f, "cannot look up attribute '" + name + "' on '" + obj + "'") > 0;
}

std::string read_attr_string(const File& f, const std::string& obj, const std::string& name) {
  Lock lock;
  const std::string what = "cannot read attribute '" + name + "' on '" + obj + "'";
  Handle a = open_attr(f, obj, name);
  Handle type = make(H5Aget_type(a.id()), f, what);
  if (check(H5Tget_class(type.id()), f, what) != H5T_STRING)
    fail(f, "attribute '" + name + "': expected a string, found " + type_name(type.id()));
  Handle space = make(H5Aget_space(a.id()), f, what);
  hssize_t n = check(H5Sget_simple_extent_npoints(space.id()), f, what);
  if (n != 1) fail(f, "attribute '" + name + "': expected one string, found " + std::to_string(n));
  // The memory type keeps the file's character set: HDF5 does not convert between ASCII and UTF-8.
  H5T_cset_t cset = check(H5Tget_cset(type.id()), f, what);
  if (check(H5Tis_variable_str(type.id()), f, what) > 0) {
    Handle mem = make(H5Tcopy(H5T_C_S1), f, what);
    check(H5Tset_size(mem.id(), H5T_VARIABLE), f, what);
    check(H5Tset_cset(mem.id(), cset), f, what);
    char* s = nullptr;
    check(H5Aread(a.id(), mem.id(), &s), f, what);
    std::string out = s ? s : "";
    // The library allocated the string; it frees it as it would any variable-length data it read.
#if H5_VERSION_GE(1, 12, 0)
    herr_t freed = H5Treclaim(mem.id(), space.id(), H5P_DEFAULT, &s);
#else
    herr_t freed = H5Dvlen_reclaim(mem.id(), space.id(), H5P_DEFAULT, &s);
#endif
    check(freed, f, what);
    return out;
  }
  size_t size = H5Tget_size(type.id());
  if (size == 0) fail(f, what);
  Handle mem = make(H5Tcopy(H5T_C_S1), f, what);
  check(H5Tset_size(mem.id(), size), f, what);
  check(H5Tset_strpad(mem.id(), H5T_STR_NULLPAD), f, what);
  check(H5Tset_cset(mem.id(), cset), f, what);
  std::string out(size, '\0');
  check(H5Aread(a.id(), mem.id(), &out[0]), f, what);
  return out.substr(0, out.find('\0'));
}

namespace {
template <class T>
std::vector<T> read_attr_numbers(const File& f, const std::string& obj, const std::string& name, hid_t mem,
                                 H5T_class_t cls) {
  Lock lock;
  const std::string what = "cannot read attribute '" + name + "' on '" + obj + "'";
  Handle a = open_attr(f, obj, name);
  Handle type = make(H5Aget_type(a.id()), f, what);
  if (check(H5Tget_class(type.id()), f, what) != cls)
    fail(f, "attribute '" + name + "': expected " + (cls == H5T_INTEGER ? "an integer" : "a float") + ", found " +
                type_name(type.id()));
  Handle space = make(H5Aget_space(a.id()), f, what);
  hssize_t n = check(H5Sget_simple_extent_npoints(space.id()), f, what);
  std::vector<T> v(n);
  if (n > 0) check(H5Aread(a.id(), mem, v.data()), f, what);
  return v;
}
}  // namespace

int64_t read_attr_int(const File& f, const std::string& obj, const std::string& name) {
  auto v = read_attr_numbers<int64_t>(f, obj, name, H5T_NATIVE_INT64, H5T_INTEGER);
  if (v.size() != 1) fail(f, "attribute '" + name + "': expected one value, found " + std::to_string(v.size()));
  return v[0];
}

double read_attr_double(const File& f, const std::string& obj, const std::string& name) {
  auto v = read_attr_numbers<double>(f, obj, name, H5T_NATIVE_DOUBLE, H5T_FLOAT);
  if (v.size() != 1) fail(f, "attribute '" + name + "': expected one value, found " + std::to_string(v.size()));
  return v[0];
}

std::vector<int64_t> read_attr_ints(const File& f, const std::string& obj, const std::string& name) {
  return read_attr_numbers<int64_t>(f, obj, name, H5T_NATIVE_INT64, H5T_INTEGER);
}

template <class T>
void create_dataset(const File& f, const std::string& path, const std::vector<hsize_t>& dims,
                    const DatasetOptions& opt, bool growable) {
  Lock lock;
  const std::string what = "cannot create dataset '" + path + "'";
  if (dims.empty()) fail(f, what + ": no dimensions");
  std::vector<hsize_t> maxdims = dims;
  if (growable) maxdims[0] = H5S_UNLIMITED;
  Handle space = make(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), maxdims.data()), f, what);
  Handle dcpl = make(H5Pcreate(H5P_DATASET_CREATE), f, what);
  hsize_t chunk_rows = opt.chunk_rows ? opt.chunk_rows : (growable || opt.gzip || opt.fletcher32 ? 65536 : 0);
  if (chunk_rows) {
    std::vector<hsize_t> chunk = dims;
    chunk[0] = std::max<hsize_t>(1, std::min<hsize_t>(chunk_rows, growable ? chunk_rows : std::max<hsize_t>(dims[0], 1)));
    for (size_t i = 1; i < chunk.size(); ++i) chunk[i] = std::max<hsize_t>(chunk[i], 1);
    check(H5Pset_chunk(dcpl.id(), static_cast<int>(chunk.size()), chunk.data()), f, what + ": chunk layout");
    if (opt.fletcher32) check(H5Pset_fletcher32(dcpl.id()), f, what + ": fletcher32 filter");
    if (opt.gzip > 0) check(H5Pset_deflate(dcpl.id(), opt.gzip), f, what + ": gzip filter");
  }
  make(H5Dcreate2(f.id(), path.c_str(), native_type<T>(), space.id(), H5P_DEFAULT, dcpl.id(), H5P_DEFAULT), f, what);
  check_written(f);
}

template <class T>
void write_dataset(const File& f, const std::string& path, const T* data, const std::vector<hsize_t>& dims,
                   const DatasetOptions& opt) {
  Lock lock;
  create_dataset<T>(f, path, dims, opt, false);
  if (dims.empty() || dims[0] == 0) return;
  write_rows<T>(f, path, data, 0, dims[0]);
}

template <class T>
void write_rows(const File& f, const std::string& path, const T* data, hsize_t row0, hsize_t rows) {
  if (rows == 0) return;
  Lock lock;
  const std::string what =
      "cannot write rows " + std::to_string(row0) + ".." + std::to_string(row0 + rows) + " of '" + path + "'";
  Handle d = open_dataset(f, path);
  Handle space = make(H5Dget_space(d.id()), f, what);
  std::vector<hsize_t> dims = extent(f, space.id(), what);
  if (dims.empty()) fail(f, what + ": a scalar");
  if (row0 + rows > dims[0]) {
    dims[0] = row0 + rows;
    check(H5Dset_extent(d.id(), dims.data()), f, "cannot grow dataset '" + path + "'");
    space = make(H5Dget_space(d.id()), f, what);
  }
  Handle mem = select_rows(f, space.id(), dims, row0, rows, what);
  check(H5Dwrite(d.id(), native_type<T>(), mem.id(), space.id(), H5P_DEFAULT, data), f, what);
  check_written(f);
}

std::vector<hsize_t> shape(const File& f, const std::string& path) {
  Lock lock;
  Handle d = open_dataset(f, path);
  const std::string what = "cannot read the shape of dataset '" + path + "'";
  Handle space = make(H5Dget_space(d.id()), f, what);
  return extent(f, space.id(), what);
}

template <class T>
void expect_type(const File& f, const std::string& path) {
  Lock lock;
  Handle d = open_dataset(f, path);
  Handle t = make(H5Dget_type(d.id()), f, "cannot read the type of dataset '" + path + "'");
  hid_t want = native_type<T>();
  const std::string what = "cannot read the type of dataset '" + path + "'";
  H5T_class_t cls = check(H5Tget_class(t.id()), f, what);
  size_t size = H5Tget_size(t.id());
  if (size == 0) fail(f, what);
  H5T_sign_t sign = cls == H5T_INTEGER ? check(H5Tget_sign(t.id()), f, what) : H5T_SGN_ERROR;
  if (cls != H5Tget_class(want) || size != H5Tget_size(want) || (cls == H5T_INTEGER && sign != H5Tget_sign(want)))
    fail(f, "dataset '" + path + "': expected " + type_name(want) + ", found " + type_name(t.id()));
}

template <class T>
void expect_numeric(const File& f, const std::string& path) {
  Lock lock;
  Handle d = open_dataset(f, path);
  const std::string what = "cannot read the type of dataset '" + path + "'";
  Handle t = make(H5Dget_type(d.id()), f, what);
  H5T_class_t cls = check(H5Tget_class(t.id()), f, what);
  const bool want_float = H5Tget_class(native_type<T>()) == H5T_FLOAT;
  if (cls == H5T_INTEGER || (cls == H5T_FLOAT && want_float)) return;
  fail(f, "dataset '" + path + "': expected " + (want_float ? "numbers (float or integer types)" : "integers") +
              " to read as " + type_name(native_type<T>()) + ", found " + type_name(t.id()));
}

namespace {

// What the conversion callback saw: the first value T cannot hold.
struct ConversionFault {
  bool hit = false;
  std::string value;
};

std::string element_text(hid_t type, const void* p) {
  const size_t size = H5Tget_size(type);
  if (H5Tget_class(type) == H5T_FLOAT) {
    double v = size == sizeof(double) ? *static_cast<const double*>(p)
               : size == sizeof(float) ? *static_cast<const float*>(p)
                                       : std::numeric_limits<double>::quiet_NaN();
    return strprintf("%.17g", v);
  }
  if (H5Tget_sign(type) == H5T_SGN_NONE && size == 8)
    return std::to_string(*static_cast<const uint64_t*>(p));
  if (size == 8) return std::to_string(*static_cast<const int64_t*>(p));
  return "a value";
}

// HDF5 calls this for every value a conversion cannot represent. Out of range (and finite): stop the read.
// Everything else (rounding, infinities, which a float type holds as they are) is the conversion itself.
H5T_conv_ret_t on_conversion_exception(H5T_conv_except_t kind, hid_t src, hid_t, void* src_buf, void*, void* user) {
  if (kind != H5T_CONV_EXCEPT_RANGE_HI && kind != H5T_CONV_EXCEPT_RANGE_LOW) return H5T_CONV_UNHANDLED;
  if (H5Tget_class(src) == H5T_FLOAT) {
    const size_t size = H5Tget_size(src);
    double v = size == sizeof(double) ? *static_cast<const double*>(src_buf)
               : size == sizeof(float) ? *static_cast<const float*>(src_buf) : 0.0;
    if (std::isinf(v)) return H5T_CONV_UNHANDLED;
  }
  ConversionFault* fault = static_cast<ConversionFault*>(user);
  if (!fault->hit) fault->value = element_text(src, src_buf);
  fault->hit = true;
  return H5T_CONV_ABORT;
}

// After a read stopped by on_conversion_exception: the first element of the selection that T cannot hold,
// found by reading it again in the file's own widest type.
template <class T>
std::string locate_unconvertible(hid_t dataset, hid_t mem_space, hid_t file_space, hsize_t row0, hsize_t rows,
                                 hsize_t width, hid_t file_type) {
  const size_t n = size_t(rows * width);
  long double lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
  auto where = [&](size_t i) {
    return width > 1 ? strprintf("row %llu, column %llu", (unsigned long long)(row0 + i / width),
                                 (unsigned long long)(i % width))
                     : strprintf("row %llu", (unsigned long long)(row0 + i));
  };
  if (H5Tget_class(file_type) == H5T_FLOAT) {
    std::vector<double> v(n);
    if (H5Dread(dataset, H5T_NATIVE_DOUBLE, mem_space, file_space, H5P_DEFAULT, v.data()) < 0) return "";
    for (size_t i = 0; i < n; ++i)
      if (std::isfinite(v[i]) && (v[i] < lo || v[i] > hi)) return where(i);
  } else if (H5Tget_sign(file_type) == H5T_SGN_NONE) {
    std::vector<uint64_t> v(n);
    if (H5Dread(dataset, H5T_NATIVE_UINT64, mem_space, file_space, H5P_DEFAULT, v.data()) < 0) return "";
    for (size_t i = 0; i < n; ++i)
      if (static_cast<long double>(v[i]) > hi) return where(i);
  } else {
    std::vector<int64_t> v(n);
    if (H5Dread(dataset, H5T_NATIVE_INT64, mem_space, file_space, H5P_DEFAULT, v.data()) < 0) return "";
    for (size_t i = 0; i < n; ++i)
      if (static_cast<long double>(v[i]) < lo || static_cast<long double>(v[i]) > hi) return where(i);
  }
  return "";
}

}  // namespace

template <class T>
void read_converted(const File& f, hid_t dataset, const std::string& path, hid_t mem_space, hid_t file_space,
                    hsize_t row0, hsize_t rows, hsize_t width, T* out) {
  Lock lock;
  const std::string what = "cannot read rows " + std::to_string(row0) + ".." + std::to_string(row0 + rows) +
                           " of '" + path + "' (truncated file or checksum error?)";
  Handle file_type = make(H5Dget_type(dataset), f, what);
  const bool same = H5Tequal(file_type.id(), native_type<T>()) > 0;
  Handle dxpl;
  ConversionFault fault;
  if (!same) {
    dxpl = make(H5Pcreate(H5P_DATASET_XFER), f, what);
    check(H5Pset_type_conv_cb(dxpl.id(), on_conversion_exception, &fault), f, what);
  }
  // HDF5 prints the stack of an aborted conversion whatever H5Eset_auto says elsewhere: silenced here, reported below
  H5E_auto2_t printer = nullptr;
  void* printer_data = nullptr;
  H5Eget_auto2(H5E_DEFAULT, &printer, &printer_data);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const herr_t rc = H5Dread(dataset, native_type<T>(), mem_space, file_space, same ? H5P_DEFAULT : dxpl.id(), out);
  H5Eset_auto2(H5E_DEFAULT, printer, printer_data);
  if (rc >= 0) return;
  if (!fault.hit) fail(f, what);
  std::string at = locate_unconvertible<T>(dataset, mem_space, file_space, row0, rows, width, file_type.id());
  fail(f, "dataset '" + path + "'" + (at.empty() ? std::string() : ", " + at) + ": " + fault.value + " does not fit " +
              type_name(native_type<T>()) + " (the file stores " + type_name(file_type.id()) +
              "; convert or clip the values, or store them as " + type_name(native_type<T>()) + ")");
}

template <class T>
void read_rows(const File& f, const std::string& path, hsize_t row0, hsize_t rows, std::vector<T>& out) {
  Lock lock;
  const std::string what = "cannot read rows " + std::to_string(row0) + ".." + std::to_string(row0 + rows) +
                           " of '" + path + "' (truncated file or checksum error?)";
  Handle d = open_dataset(f, path);
  Handle space = make(H5Dget_space(d.id()), f, what);
  std::vector<hsize_t> dims = extent(f, space.id(), what);
  if (dims.empty() || row0 + rows > dims[0])
    fail(f, "dataset '" + path + "': rows " + std::to_string(row0) + ".." + std::to_string(row0 + rows) +
                " asked for, found " + (dims.empty() ? std::string("a scalar") : std::to_string(dims[0])));
  size_t per_row = 1;
  for (size_t i = 1; i < dims.size(); ++i) per_row *= dims[i];
  out.resize(rows * per_row);
  if (rows == 0) return;
  Handle mem = select_rows(f, space.id(), dims, row0, rows, what);
  read_converted<T>(f, d.id(), path, mem.id(), space.id(), row0, rows, hsize_t(per_row), out.data());
}

template <class T>
std::vector<T> read_all(const File& f, const std::string& path) {
  Lock lock;
  std::vector<hsize_t> dims = shape(f, path);
  std::vector<T> out;
  read_rows<T>(f, path, 0, dims.empty() ? 0 : dims[0], out);
  return out;
}

#define SPARTA_H5_INSTANTIATE(T)                                                                                  \
  template void create_dataset<T>(const File&, const std::string&, const std::vector<hsize_t>&,                   \
                                  const DatasetOptions&, bool);                                                   \
  template void write_dataset<T>(const File&, const std::string&, const T*, const std::vector<hsize_t>&,          \
                                 const DatasetOptions&);                                                          \
  template void write_rows<T>(const File&, const std::string&, const T*, hsize_t, hsize_t);                       \
  template void expect_type<T>(const File&, const std::string&);                                                  \
  template void expect_numeric<T>(const File&, const std::string&);                                               \
  template void read_converted<T>(const File&, hid_t, const std::string&, hid_t, hid_t, hsize_t, hsize_t, hsize_t, \
                                  T*);                                                                            \
  template void read_rows<T>(const File&, const std::string&, hsize_t, hsize_t, std::vector<T>&);                 \
  template std::vector<T> read_all<T>(const File&, const std::string&);
SPARTA_H5_INSTANTIATE(float)
SPARTA_H5_INSTANTIATE(double)
SPARTA_H5_INSTANTIATE(int64_t)
SPARTA_H5_INSTANTIATE(int32_t)
SPARTA_H5_INSTANTIATE(uint64_t)
SPARTA_H5_INSTANTIATE(uint8_t)
SPARTA_H5_INSTANTIATE(uint16_t)
#undef SPARTA_H5_INSTANTIATE

// ---- Write budget.

void set_write_budget(int64_t bytes) { budget_left.store(bytes < 0 ? -1 : bytes); }

int64_t write_budget() { return budget_left.load(); }

size_t take_write_budget(size_t want) {
  int64_t cur = budget_left.load();
  while (true) {
    if (cur < 0) return want;
    int64_t take = std::min<int64_t>(cur, static_cast<int64_t>(want));
    if (budget_left.compare_exchange_weak(cur, cur - take)) return static_cast<size_t>(take);
  }
}

ScopedWriteBudget::ScopedWriteBudget(int64_t bytes) : active_(bytes >= 0) {
  if (active_) set_write_budget(bytes);
}

ScopedWriteBudget::~ScopedWriteBudget() {
  if (active_) set_write_budget(-1);
}

}  // namespace h5
}  // namespace sparta
