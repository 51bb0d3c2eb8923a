// reader.cpp: see reader.h.
#include "io/reader.h"

#include <algorithm>

#include "src/base/check.h"

namespace sparta {

// The open file and its four datasets, kept open between reads. h5::read_rows reads into a std::vector and
// reopens the dataset on every call; here rows go straight into the pinned batch buffers (no second copy),
// which is what reaching the throughput target needs.
struct DatasetReader::Source {
  struct Set {
    h5::Handle dataset, space;
    std::string name;
    hsize_t width = 1;  // elements per row
    int ndims = 1;
  };
  h5::File file;
  Set label, dense, offsets, keys;
  bool filtered = false;
  hsize_t chunk = 0;  // rows per chunk of /label (0: contiguous)

  explicit Source(const std::string& path) : file(h5::open_file(path)) {}

  // Direct HDF5 calls, so under the library lock (h5.h); a failure throws naming the file and the operation.
  void open(Set& s, const std::string& name) {
    h5::Lock lock;
    auto fail = [&](const char* what) { throw Error(file.path + ": dataset '" + name + "': " + what); };
    h5::Handle dcpl;
    {
      h5::Handle d(H5Dopen2(file.id(), name.c_str(), H5P_DEFAULT));
      if (!d.valid()) fail("cannot open");
      dcpl = h5::Handle(H5Dget_create_plist(d.id()));
      if (!dcpl.valid()) fail("cannot read its creation properties");
    }
    // Compressed or checksummed chunks must be decoded whole: cache a few so that slices of one chunk read
    // by consecutive batches decode it once. Plain chunks are read directly into the caller's buffer.
    int nfilters = H5Pget_nfilters(dcpl.id());
    if (nfilters < 0) fail("cannot read its filters");
    bool has_filters = nfilters > 0;
    filtered = filtered || has_filters;
    h5::Handle dapl(H5Pcreate(H5P_DATASET_ACCESS));
    if (!dapl.valid() || H5Pset_chunk_cache(dapl.id(), 10007, has_filters ? size_t(256) << 20 : 0, 1.0) < 0)
      fail("cannot set up its chunk cache");
    s.dataset = h5::Handle(H5Dopen2(file.id(), name.c_str(), dapl.id()));
    if (!s.dataset.valid()) fail("cannot open");
    s.space = h5::Handle(H5Dget_space(s.dataset.id()));
    if (!s.space.valid()) fail("cannot read its shape");
    s.name = name;
    int ndims = H5Sget_simple_extent_ndims(s.space.id());
    if (ndims < 0 || ndims > 2) fail("cannot read its shape (expected 1 or 2 dimensions)");
    s.ndims = std::max(1, ndims);
    std::vector<hsize_t> dims(s.ndims, 1);
    if (ndims > 0 && H5Sget_simple_extent_dims(s.space.id(), dims.data(), nullptr) < 0) fail("cannot read its shape");
    s.width = s.ndims == 2 ? dims[1] : 1;
    H5D_layout_t layout = H5Pget_layout(dcpl.id());
    if (layout < 0) fail("cannot read its layout");
    if (name == "/label" && layout == H5D_CHUNKED && H5Pget_chunk(dcpl.id(), 1, &chunk) < 0)
      fail("cannot read its chunk size");
  }

  template <class T>
  void read(Set& s, hsize_t row0, hsize_t rows, T* out) {
    if (rows == 0) return;
    h5::Lock lock;
    const std::string what = file.path + ": cannot read rows " + std::to_string(row0) + ".." +
                             std::to_string(row0 + rows) + " of '" + s.name + "'";
    hsize_t start[2] = {row0, 0}, count[2] = {rows, s.width};
    if (H5Sselect_hyperslab(s.space.id(), H5S_SELECT_SET, start, nullptr, count, nullptr) < 0)
      throw Error(what + " (rows out of range?)");
    h5::Handle mem(H5Screate_simple(s.ndims, count, nullptr));
    if (!mem.valid()) throw Error(what + " (cannot make the memory space)");
    h5::read_converted<T>(file, s.dataset.id(), s.name, mem.id(), s.space.id(), row0, rows, s.width, out);
  }
};

BlockView Batch::view() const {
  BlockView v;
  v.num_samples = size;
  v.labels = labels.data();
  v.dense = dense.data();
  v.offsets = offsets.data();
  v.keys = keys.data();
  return v;
}

DatasetReader::DatasetReader(const std::string& path, const ReaderOptions& opt) : path_(path), opt_(opt) {
  SPARTA_REQUIRE(opt.world >= 1 && opt.rank >= 0 && opt.rank < opt.world,
                 "%s: reader: rank %d of world %d (expected 0 <= rank < world)", path.c_str(), opt.rank, opt.world);
  SPARTA_REQUIRE(opt.global_batch >= opt.world,
                 "%s: reader: global batch %lld is smaller than the %d ranks (expected at least one sample each)",
                 path.c_str(), (long long)opt.global_batch, opt.world);
  SPARTA_REQUIRE(opt.prefetch >= 0, "%s: reader: prefetch %d (expected >= 0)", path.c_str(), opt.prefetch);
  SPARTA_REQUIRE(opt.shuffle_block >= 0, "%s: reader: shuffle block %lld (expected >= 0)", path.c_str(),
                 (long long)opt.shuffle_block);
  src_ = std::make_unique<Source>(path);
  schema_ = read_schema(src_->file);
  src_->open(src_->label, "/label");
  src_->open(src_->dense, "/dense");
  src_->open(src_->offsets, "/sparse/offsets");
  src_->open(src_->keys, "/sparse/keys");
  block_ = opt.shuffle_block > 0 ? opt.shuffle_block : (src_->chunk > 0 ? static_cast<int64_t>(src_->chunk) : 65536);
  key_capacity_ = std::min(max_local_batch() * schema_.max_keys_per_sample(), schema_.num_keys);
  slots_.reserve(opt.prefetch + 1);
  for (int i = 0; i < opt.prefetch + 1; ++i) slots_.push_back(make_batch());
}

DatasetReader::~DatasetReader() { stop_thread(); }

int64_t DatasetReader::batches_per_epoch() const {
  const int64_t N = schema_.num_samples, G = opt_.global_batch;
  return opt_.drop_last ? N / G : (N + G - 1) / G;
}

int64_t DatasetReader::global_batch_size(int64_t b) const {
  return std::min(opt_.global_batch, schema_.num_samples - b * opt_.global_batch);
}

int64_t DatasetReader::local_batch_size(int64_t b) const {
  const int64_t g = global_batch_size(b), r = opt_.rank, w = opt_.world;
  return (r + 1) * g / w - r * g / w;
}

int64_t DatasetReader::max_local_batch() const { return (opt_.global_batch + opt_.world - 1) / opt_.world; }

Batch DatasetReader::make_batch() const {
  Batch b;
  const int64_t B = max_local_batch();
  b.num_dense = schema_.num_dense;
  b.num_slots = schema_.num_slots;
  b.labels = PinnedBuffer<float>(opt_.backend, B);
  b.dense = PinnedBuffer<float>(opt_.backend, B * schema_.num_dense);
  b.offsets = PinnedBuffer<int64_t>(opt_.backend, B * schema_.num_slots + 1);
  b.keys = PinnedBuffer<int64_t>(opt_.backend, std::max<int64_t>(key_capacity_, 1));
  return b;
}

void DatasetReader::order_of(int64_t epoch, std::vector<int64_t>& order, std::vector<int64_t>& start) const {
  std::lock_guard<std::mutex> lock(order_mu_);
  if (order_epoch_ != epoch) {
    const int64_t N = schema_.num_samples, nb = (N + block_ - 1) / block_;
    order_.resize(nb);
    for (int64_t i = 0; i < nb; ++i) order_[i] = i;
    // Fisher-Yates with counter-based draws: the same permutation on every rank and machine.
    const uint64_t h = hash_mix(opt_.seed, static_cast<uint64_t>(epoch));
    for (int64_t i = nb - 1; i > 0; --i) {
      int64_t j = static_cast<int64_t>(unit_double(hash_mix(h, i)) * (i + 1));
      std::swap(order_[i], order_[std::min(j, i)]);
    }
    order_start_.assign(nb + 1, 0);
    for (int64_t i = 0; i < nb; ++i)
      order_start_[i + 1] = order_start_[i] + std::min(block_, N - order_[i] * block_);
    order_epoch_ = epoch;
  }
  order = order_;
  start = order_start_;
}

std::vector<std::pair<int64_t, int64_t>> DatasetReader::epoch_segments(int64_t epoch, int64_t pos,
                                                                       int64_t count) const {
  std::vector<std::pair<int64_t, int64_t>> segs;
  if (count <= 0) return segs;
  if (!opt_.shuffle) {
    segs.emplace_back(pos, count);
    return segs;
  }
  std::vector<int64_t> order, start;
  order_of(epoch, order, start);
  size_t i = std::upper_bound(start.begin(), start.end(), pos) - start.begin() - 1;
  while (count > 0) {
    int64_t within = pos - start[i];
    int64_t n = std::min(count, start[i + 1] - pos);
    segs.emplace_back(order[i] * block_ + within, n);
    pos += n;
    count -= n;
    ++i;
  }
  return segs;
}

void DatasetReader::read_segment(int64_t s0, int64_t n, Batch& out, int64_t at, int64_t key_at) {
  const int64_t S = schema_.num_slots, D = schema_.num_dense;
  int64_t* off = out.offsets.data() + at * S;
  src_->read<int64_t>(src_->offsets, s0 * S, n * S + 1, off);
  check_offsets(schema_, path_, s0, n, off, schema_.num_keys);
  const int64_t raw0 = off[0], nnz = off[n * S] - raw0;
  SPARTA_ASSERT(key_at + nnz <= static_cast<int64_t>(out.keys.size()), "%lld keys at %lld exceed capacity %zu",
                (long long)nnz, (long long)key_at, out.keys.size());
  src_->read<int64_t>(src_->keys, raw0, nnz, out.keys.data() + key_at);
  const int64_t shift = key_at - raw0;
  for (int64_t r = 0; r <= n * S; ++r) off[r] += shift;
  src_->read<float>(src_->label, s0, n, out.labels.data() + at);
  src_->read<float>(src_->dense, s0, n, out.dense.data() + at * D);
  BlockView v;
  v.num_samples = n;
  v.labels = out.labels.data() + at;
  v.dense = out.dense.data() + at * D;
  v.offsets = off;
  v.keys = out.keys.data() + key_at;
  check_values(schema_, path_, s0, v);
  if (!shift_.empty()) {
    float* d = out.dense.data() + at * D;
    for (int64_t i = 0; i < n; ++i, d += D)
      for (int64_t j = 0; j < D; ++j) d[j] = (d[j] - shift_[size_t(j)]) * scale_[size_t(j)];
  }
}

void DatasetReader::set_dense_transform(const std::vector<float>& shift, const std::vector<float>& scale) {
  SPARTA_REQUIRE(shift.size() == scale.size() && (shift.empty() || int64_t(shift.size()) == schema_.num_dense),
                 "%s: dense transform of %zu shifts and %zu scales, the file has %lld dense features", path_.c_str(),
                 shift.size(), scale.size(), (long long)schema_.num_dense);
  stop_thread();
  started_ = false;
  shift_ = shift;
  scale_ = scale;
}

void DatasetReader::read_batch(int64_t epoch, int64_t index, Batch& out) {
  SPARTA_REQUIRE(index >= 0 && index < batches_per_epoch(), "%s: batch %lld asked for, the epoch has %lld",
                 path_.c_str(), (long long)index, (long long)batches_per_epoch());
  SPARTA_ASSERT(out.labels.size() >= static_cast<size_t>(max_local_batch()), "batch buffers too small");
  const int64_t g = global_batch_size(index), r = opt_.rank, w = opt_.world;
  const int64_t pos = index * opt_.global_batch + r * g / w, count = local_batch_size(index);
  out.epoch = epoch;
  out.index = index;
  out.segments = epoch_segments(epoch, pos, count);
  std::lock_guard<std::mutex> lock(read_mu_);
  int64_t at = 0, key_at = 0;
  out.offsets[0] = 0;
  // Pieces of about 1 MiB of offsets: each is read, checked and rebased while it is still in the L2 cache.
  const int64_t piece = std::max<int64_t>(256, (int64_t(1) << 17) / schema_.num_slots);
  for (const auto& seg : out.segments)
    for (int64_t done = 0; done < seg.second; done += piece) {
      const int64_t n = std::min(piece, seg.second - done);
      read_segment(seg.first + done, n, out, at, key_at);
      at += n;
      key_at = out.offsets[at * schema_.num_slots];
    }
  out.size = count;
  out.num_keys = key_at;
}

void DatasetReader::stop_thread() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  stop_ = false;
}

void DatasetReader::start_epoch(int64_t epoch, int64_t first) {
  SPARTA_REQUIRE(first >= 0 && first <= batches_per_epoch(), "%s: start at batch %lld, the epoch has %lld",
                 path_.c_str(), (long long)first, (long long)batches_per_epoch());
  stop_thread();
  epoch_ = epoch;
  cursor_ = first;
  started_ = true;
  free_.clear();
  ready_.clear();
  held_ = -1;
  ended_ = false;
  error_ = nullptr;
  if (opt_.prefetch == 0) return;
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) free_.push_back(i);
  uint64_t gen = ++generation_;
  thread_ = std::thread(&DatasetReader::producer, this, epoch, first, gen);
}

void DatasetReader::producer(int64_t epoch, int64_t first, uint64_t generation) {
  const int64_t nb = batches_per_epoch();
  for (int64_t b = first; b < nb; ++b) {
    int slot;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !free_.empty(); });
      if (stop_ || generation != generation_) return;
      slot = free_.front();
      free_.pop_front();
    }
    try {
      read_batch(epoch, b, slots_[slot]);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
      cv_.notify_all();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(slot);
    }
    cv_.notify_all();
  }
  std::lock_guard<std::mutex> lock(mu_);
  ended_ = true;
  cv_.notify_all();
}

const Batch* DatasetReader::next() {
  SPARTA_REQUIRE(started_, "%s: next() before start_epoch()", path_.c_str());
  if (opt_.prefetch == 0) {
    if (cursor_ >= batches_per_epoch()) return nullptr;
    read_batch(epoch_, cursor_++, slots_[0]);
    return &slots_[0];
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (held_ >= 0) {
    free_.push_back(held_);
    held_ = -1;
    cv_.notify_all();
  }
  cv_.wait(lock, [&] { return !ready_.empty() || error_ || ended_; });
  if (!ready_.empty()) {
    held_ = ready_.front();
    ready_.pop_front();
    return &slots_[held_];
  }
  if (error_) std::rethrow_exception(error_);
  return nullptr;
}

}  // namespace sparta
