// h5.cpp: see h5.h.
#include "io/h5.h"

#include "src/base/check.h"

namespace sparta {
namespace h5 {
namespace {

// HDF5 prints its error stack by default; our messages say what went wrong instead.
struct Quiet {
  Quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }
} quiet;

[[noreturn]] void fail(const File& f, const std::string& what) { throw Error(f.path + ": " + what); }

Handle open_object(const File& f, const std::string& obj) {
  hid_t id = H5Oopen(f.id(), obj.c_str(), H5P_DEFAULT);
  if (id < 0) fail(f, "missing object '" + obj + "'");
  return Handle(id);
}

Handle open_attr(const File& f, const std::string& obj, const std::string& name) {
  Handle o = open_object(f, obj);
  if (H5Aexists(o.id(), name.c_str()) <= 0) fail(f, "missing attribute '" + name + "' on '" + obj + "'");
  hid_t a = H5Aopen(o.id(), name.c_str(), H5P_DEFAULT);
  if (a < 0) fail(f, "cannot open attribute '" + name + "' on '" + obj + "'");
  return Handle(a);
}

void put_attr(const File& f, const std::string& obj, const std::string& name, hid_t type, hid_t space,
              const void* data) {
  Handle o = open_object(f, obj);
  if (H5Aexists(o.id(), name.c_str()) > 0) H5Adelete(o.id(), name.c_str());
  Handle a(H5Acreate2(o.id(), name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT));
  bool empty = H5Sget_simple_extent_type(space) == H5S_NULL;  // an empty vector: nothing to write
  if (!a.valid() || (!empty && H5Awrite(a.id(), type, data) < 0))
    fail(f, "cannot write attribute '" + name + "' on '" + obj + "'");
}

Handle open_dataset(const File& f, const std::string& path) {
  if (!exists(f, path)) fail(f, "missing dataset '" + path + "'");
  hid_t d = H5Dopen2(f.id(), path.c_str(), H5P_DEFAULT);
  if (d < 0) fail(f, "cannot open dataset '" + path + "'");
  return Handle(d);
}

std::string type_name(hid_t t) {
  H5T_class_t c = H5Tget_class(t);
  size_t size = H5Tget_size(t);
  std::string s = c == H5T_INTEGER ? (H5Tget_sign(t) == H5T_SGN_NONE ? "uint" : "int")
                  : c == H5T_FLOAT ? "float"
                  : c == H5T_STRING ? "string"
                                    : "other";
  return s + std::to_string(size * 8);
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

void Handle::reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: H5Fclose(id_); break;
    case H5I_GROUP: H5Gclose(id_); break;
    case H5I_DATASET: H5Dclose(id_); break;
    case H5I_DATASPACE: H5Sclose(id_); break;
    case H5I_ATTR: H5Aclose(id_); break;
    case H5I_DATATYPE: H5Tclose(id_); break;
    case H5I_GENPROP_LST: H5Pclose(id_); break;
    default: H5Oclose(id_); break;
  }
  id_ = -1;
}

File create_file(const std::string& path) {
  File f;
  f.path = path;
  f.handle = Handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!f.handle.valid()) throw Error(path + ": cannot create HDF5 file (does the directory exist and is it writable?)");
  return f;
}

File open_file(const std::string& path, bool writable) {
  File f;
  f.path = path;
  if (H5Fis_hdf5(path.c_str()) <= 0) throw Error(path + ": missing, unreadable, truncated or not an HDF5 file");
  f.handle = Handle(H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f.handle.valid()) throw Error(path + ": cannot open HDF5 file (truncated or corrupted?)");
  return f;
}

void flush(const File& f) {
  if (H5Fflush(f.id(), H5F_SCOPE_GLOBAL) < 0) fail(f, "flush failed");
}

template <> hid_t native_type<float>() { return H5T_NATIVE_FLOAT; }
template <> hid_t native_type<double>() { return H5T_NATIVE_DOUBLE; }
template <> hid_t native_type<int64_t>() { return H5T_NATIVE_INT64; }
template <> hid_t native_type<int32_t>() { return H5T_NATIVE_INT32; }
template <> hid_t native_type<uint64_t>() { return H5T_NATIVE_UINT64; }
template <> hid_t native_type<uint8_t>() { return H5T_NATIVE_UINT8; }

bool exists(const File& f, const std::string& object_path) {
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
  if (exists(f, group_path)) return;
  Handle g(H5Gcreate2(f.id(), group_path.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!g.valid()) fail(f, "cannot create group '" + group_path + "'");
}

void write_attr(const File& f, const std::string& obj, const std::string& name, const std::string& value) {
  Handle type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.id(), value.empty() ? 1 : value.size());
  H5Tset_strpad(type.id(), H5T_STR_NULLPAD);
  Handle space(H5Screate(H5S_SCALAR));
  std::string v = value.empty() ? std::string(1, '\0') : value;
  put_attr(f, obj, name, type.id(), space.id(), v.data());
}

void write_attr(const File& f, const std::string& obj, const std::string& name, int64_t value) {
  Handle space(H5Screate(H5S_SCALAR));
  put_attr(f, obj, name, H5T_NATIVE_INT64, space.id(), &value);
}

void write_attr(const File& f, const std::string& obj, const std::string& name, double value) {
  Handle space(H5Screate(H5S_SCALAR));
  put_attr(f, obj, name, H5T_NATIVE_DOUBLE, space.id(), &value);
}

void write_attr(const File& f, const std::string& obj, const std::string& name, const std::vector<int64_t>& value) {
  hsize_t n = value.size();
  Handle space(n ? H5Screate_simple(1, &n, nullptr) : H5Screate(H5S_NULL));
  put_attr(f, obj, name, H5T_NATIVE_INT64, space.id(), value.data());
}

bool has_attr(const File& f, const std::string& obj, const std::string& name) {
  if (!exists(f, obj)) return false;
  Handle o = open_object(f, obj);
  return H5Aexists(o.id(), name.c_str()) > 0;
}

std::string read_attr_string(const File& f, const std::string& obj, const std::string& name) {
  Handle a = open_attr(f, obj, name);
  Handle type(H5Aget_type(a.id()));
  if (H5Tget_class(type.id()) != H5T_STRING)
    fail(f, "attribute '" + name + "': expected a string, found " + type_name(type.id()));
  if (H5Tis_variable_str(type.id()) > 0) {
    char* s = nullptr;
    Handle mem(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.id(), H5T_VARIABLE);
    if (H5Aread(a.id(), mem.id(), &s) < 0) fail(f, "cannot read attribute '" + name + "'");
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  size_t size = H5Tget_size(type.id());
  std::string out(size, '\0');
  if (H5Aread(a.id(), type.id(), &out[0]) < 0) fail(f, "cannot read attribute '" + name + "'");
  return out.substr(0, out.find('\0'));
}

namespace {
template <class T>
std::vector<T> read_attr_numbers(const File& f, const std::string& obj, const std::string& name, hid_t mem, H5T_class_t cls) {
  Handle a = open_attr(f, obj, name);
  Handle type(H5Aget_type(a.id()));
  if (H5Tget_class(type.id()) != cls)
    fail(f, "attribute '" + name + "': expected " + (cls == H5T_INTEGER ? "an integer" : "a float") + ", found " +
                type_name(type.id()));
  Handle space(H5Aget_space(a.id()));
  hssize_t n = H5Sget_simple_extent_npoints(space.id());
  std::vector<T> v(n > 0 ? n : 0);
  if (n > 0 && H5Aread(a.id(), mem, v.data()) < 0) fail(f, "cannot read attribute '" + name + "'");
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
  std::vector<hsize_t> maxdims = dims;
  if (growable) maxdims[0] = H5S_UNLIMITED;
  Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), maxdims.data()));
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE));
  hsize_t chunk_rows = opt.chunk_rows ? opt.chunk_rows : (growable || opt.gzip || opt.fletcher32 ? 65536 : 0);
  if (chunk_rows) {
    std::vector<hsize_t> chunk = dims;
    chunk[0] = std::max<hsize_t>(1, std::min<hsize_t>(chunk_rows, growable ? chunk_rows : std::max<hsize_t>(dims[0], 1)));
    for (size_t i = 1; i < chunk.size(); ++i) chunk[i] = std::max<hsize_t>(chunk[i], 1);
    H5Pset_chunk(dcpl.id(), static_cast<int>(chunk.size()), chunk.data());
    if (opt.fletcher32) H5Pset_fletcher32(dcpl.id());
    if (opt.gzip > 0) H5Pset_deflate(dcpl.id(), opt.gzip);
  }
  Handle d(H5Dcreate2(f.id(), path.c_str(), native_type<T>(), space.id(), H5P_DEFAULT, dcpl.id(), H5P_DEFAULT));
  if (!d.valid()) fail(f, "cannot create dataset '" + path + "'");
}

template <class T>
void write_dataset(const File& f, const std::string& path, const T* data, const std::vector<hsize_t>& dims,
                   const DatasetOptions& opt) {
  create_dataset<T>(f, path, dims, opt, false);
  if (dims.empty() || dims[0] == 0) return;
  write_rows<T>(f, path, data, 0, dims[0]);
}

template <class T>
void write_rows(const File& f, const std::string& path, const T* data, hsize_t row0, hsize_t rows) {
  if (rows == 0) return;
  Handle d = open_dataset(f, path);
  Handle space(H5Dget_space(d.id()));
  int rank = H5Sget_simple_extent_ndims(space.id());
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr);
  if (row0 + rows > dims[0]) {
    dims[0] = row0 + rows;
    if (H5Dset_extent(d.id(), dims.data()) < 0) fail(f, "cannot grow dataset '" + path + "'");
    space = Handle(H5Dget_space(d.id()));
  }
  std::vector<hsize_t> start(rank, 0), count = dims;
  start[0] = row0;
  count[0] = rows;
  H5Sselect_hyperslab(space.id(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  Handle mem(H5Screate_simple(rank, count.data(), nullptr));
  if (H5Dwrite(d.id(), native_type<T>(), mem.id(), space.id(), H5P_DEFAULT, data) < 0)
    fail(f, "cannot write rows " + std::to_string(row0) + ".." + std::to_string(row0 + rows) + " of '" + path + "'");
}

std::vector<hsize_t> shape(const File& f, const std::string& path) {
  Handle d = open_dataset(f, path);
  Handle space(H5Dget_space(d.id()));
  int rank = H5Sget_simple_extent_ndims(space.id());
  std::vector<hsize_t> dims(rank > 0 ? rank : 0);
  if (rank > 0) H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr);
  return dims;
}

template <class T>
void expect_type(const File& f, const std::string& path) {
  Handle d = open_dataset(f, path);
  Handle t(H5Dget_type(d.id()));
  hid_t want = native_type<T>();
  if (H5Tget_class(t.id()) != H5Tget_class(want) || H5Tget_size(t.id()) != H5Tget_size(want) ||
      (H5Tget_class(want) == H5T_INTEGER && H5Tget_sign(t.id()) != H5Tget_sign(want)))
    fail(f, "dataset '" + path + "': expected " + type_name(want) + ", found " + type_name(t.id()));
}

template <class T>
void read_rows(const File& f, const std::string& path, hsize_t row0, hsize_t rows, std::vector<T>& out) {
  Handle d = open_dataset(f, path);
  Handle space(H5Dget_space(d.id()));
  int rank = H5Sget_simple_extent_ndims(space.id());
  std::vector<hsize_t> dims(rank);
  H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr);
  if (rank == 0 || row0 + rows > dims[0])
    fail(f, "dataset '" + path + "': rows " + std::to_string(row0) + ".." + std::to_string(row0 + rows) +
                " asked for, found " + (rank ? std::to_string(dims[0]) : std::string("a scalar")));
  size_t per_row = 1;
  for (int i = 1; i < rank; ++i) per_row *= dims[i];
  out.resize(rows * per_row);
  if (rows == 0) return;
  std::vector<hsize_t> start(rank, 0), count = dims;
  start[0] = row0;
  count[0] = rows;
  H5Sselect_hyperslab(space.id(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  Handle mem(H5Screate_simple(rank, count.data(), nullptr));
  if (H5Dread(d.id(), native_type<T>(), mem.id(), space.id(), H5P_DEFAULT, out.data()) < 0)
    fail(f, "cannot read rows " + std::to_string(row0) + ".." + std::to_string(row0 + rows) + " of '" + path +
                "' (truncated file or checksum error?)");
}

template <class T>
std::vector<T> read_all(const File& f, const std::string& path) {
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
  template void read_rows<T>(const File&, const std::string&, hsize_t, hsize_t, std::vector<T>&);                 \
  template std::vector<T> read_all<T>(const File&, const std::string&);
SPARTA_H5_INSTANTIATE(float)
SPARTA_H5_INSTANTIATE(double)
SPARTA_H5_INSTANTIATE(int64_t)
SPARTA_H5_INSTANTIATE(int32_t)
SPARTA_H5_INSTANTIATE(uint64_t)
SPARTA_H5_INSTANTIATE(uint8_t)
#undef SPARTA_H5_INSTANTIATE

}  // namespace h5
}  // namespace sparta
