// checkpoint_load.cpp: load_checkpoint: every rank reads the manifest, a share of the old shards and (rank 0)
// the dense file, then rows travel to the ranks that own them now. Every step that can fail on some ranks only
// ends in agree_on_error, so no rank waits in a collective for one that failed.
#include <algorithm>
#include <memory>
#include <numeric>

#include "io/checkpoint.h"
#include "io/checkpoint_files.h"
#include "io/checkpoint_format.h"
#include "src/base/agree.h"
#include "src/base/check.h"
#include "src/base/deadline.h"

namespace sparta {
using namespace ckpt;

namespace {

template <class T>
MPI_Datatype mpi_type();
template <> MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }

template <class T>
void bcast_vector(MPI_Comm comm, int root, std::vector<T>& v) {
  constexpr size_t kPiece = size_t(1) << 28;  // MPI counts are int
  for (size_t at = 0; at < v.size(); at += kPiece) {
    int n = static_cast<int>(std::min(kPiece, v.size() - at));
    timed_bcast(v.data() + at, n, mpi_type<T>(), root, comm, "checkpoint load (dense tensors)");
  }
}

// The model as text: every rank must expect the same one, in the same order (the collectives below follow it).
std::string model_signature(const ModelSpec& spec) {
  std::string s;
  for (const TableSpec& t : spec.tables)
    s += (s.empty() ? "" : " ") + table_text(t.name, t.dim, t.optimizer, t.state_width);
  for (const DenseSpec& d : spec.dense) s += (s.empty() ? "" : " ") + d.name + shape_text(d.shape);
  return s.empty() ? "(nothing)" : s;
}

}  // namespace

LoadedCheckpoint load_checkpoint(MPI_Comm comm, const std::string& path, const ModelSpec& expected,
                                 const OwnerFn& owner) {
  int rank = 0, world = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &world));
  LoadedCheckpoint out;

  // Rank 0 resolves `latest` once, so a save running beside this load cannot split the ranks over two steps.
  const std::string mine = model_signature(expected), root_model = bcast_string(comm, 0, mine);
  std::string dir;
  agree_on_error(comm, guarded([&] {
          SPARTA_REQUIRE(mine == root_model, "load_checkpoint: ranks expect different models: rank 0 expects %s, "
                         "rank %d expects %s", root_model.c_str(), rank, mine.c_str());
          if (rank == 0) dir = resolve_checkpoint_dir(path);
        }), "checkpoint load");
  dir = bcast_string(comm, 0, dir);
  Manifest& m = out.manifest;
  agree_on_error(comm, guarded([&] {
          m = read_manifest(dir);
          check_model_spec(m, expected);
        }), "checkpoint load");
  const int old_world = m.meta.world_size;

  // This rank's old shards, checked whole (checksum) and in structure; rank 0 reads the dense file.
  std::vector<int> my_shards;
  for (int s = rank; s < old_world; s += world) my_shards.push_back(s);
  std::vector<const ManifestTable*> mtables;
  for (const TableSpec& t : expected.tables) mtables.push_back(m.find_table(t.name));
  std::vector<std::unique_ptr<ShardReader>> readers;
  agree_on_error(comm, guarded([&] {
          for (int s : my_shards) {
            require_file_ok(m, shard_name(s, old_world));
            readers.push_back(std::make_unique<ShardReader>(m, s));
            for (const ManifestTable* t : mtables) readers.back()->check_table(*t);
          }
          if (rank == 0) {
            require_file_ok(m, kDenseName);
            std::vector<DenseTensor> all = read_dense_file(m);
            for (const DenseSpec& want : expected.dense)
              for (DenseTensor& d : all)
                if (d.name == want.name) out.dense.push_back(std::move(d));
          }
        }), "checkpoint load");

  // Dense tensors to every rank (data-parallel); their shapes are known everywhere from the manifest.
  if (rank != 0) {
    for (const DenseSpec& s : expected.dense) {
      DenseTensor d;
      d.name = s.name;
      d.shape = s.shape;
      d.data.resize(static_cast<size_t>(product(s.shape)));
      out.dense.push_back(std::move(d));
    }
  }
  for (DenseTensor& d : out.dense) bcast_vector(comm, 0, d.data);

  // Tables: read in rounds, route each row to its owner now.
  for (size_t ti = 0; ti < expected.tables.size(); ++ti) {
    const ManifestTable& mt = *mtables[ti];
    const int dim = mt.spec.dim, sw = mt.spec.state_width;
    TableRows result = empty_rows(mt.spec);
    int64_t local_rows = 0;
    for (int s : my_shards) local_rows += mt.shard_rows[s];
    const int64_t row_bytes = 8 + 4 * int64_t(dim + sw);
    // A round sends at most kRoundBytes per rank and receives at most 2^30 elements (W senders, each possibly
    // sending every row to every rank for kEveryRank).
    int64_t chunk = std::max<int64_t>(
        1, std::min<int64_t>(kRoundBytes / row_bytes, (int64_t(1) << 30) / (int64_t(dim + sw + 1) * world)));
    int64_t my_rounds = (local_rows + chunk - 1) / chunk, rounds = 0;
    timed_allreduce(&my_rounds, &rounds, 1, MPI_INT64_T, MPI_MAX, comm, "checkpoint load (rounds)");
    size_t shard_at = 0;
    int64_t row_at = 0;
    for (int64_t round = 0; round < rounds; ++round) {
      TableRows batch = empty_rows(mt.spec);
      std::vector<int> dest;
      agree_on_error(comm, guarded([&] {
              while (static_cast<int64_t>(batch.rows()) < chunk && shard_at < my_shards.size()) {
                int64_t n = mt.shard_rows[my_shards[shard_at]];
                int64_t take = std::min(n - row_at, chunk - static_cast<int64_t>(batch.rows()));
                if (take > 0) readers[shard_at]->read(mt, row_at, take, batch);
                row_at += take;
                if (row_at >= n) {
                  ++shard_at;
                  row_at = 0;
                }
              }
              dest.resize(batch.rows());
              for (size_t i = 0; i < batch.rows(); ++i) {
                int o = 0;
                try {
                  o = owner(static_cast<int>(ti), batch.keys[i]);
                } catch (const std::exception&) {
                  throw;
                } catch (...) {  // guarded() sees std::exception only: anything else would escape this rank alone
                  throw Error("load_checkpoint: table '" + mt.spec.name + "': the owner function threw a "
                              "non-standard exception for key " + std::to_string(batch.keys[i]));
                }
                SPARTA_REQUIRE(o == kEveryRank || (o >= 0 && o < world),
                               "load_checkpoint: table '%s': owner of key %lld is %d; expected a rank in [0, %d) or "
                               "kEveryRank", mt.spec.name.c_str(), static_cast<long long>(batch.keys[i]), o, world);
                dest[i] = o;
              }
            }), "checkpoint load");
      // Pack by destination.
      std::vector<int> send_rows(world, 0), recv_rows(world, 0);
      for (int o : dest) {
        if (o == kEveryRank)
          for (int r = 0; r < world; ++r) ++send_rows[r];
        else
          ++send_rows[o];
      }
      std::vector<int> first(world, 0);
      std::partial_sum(send_rows.begin(), send_rows.end() - 1, first.begin() + 1);
      int total_send = first.back() + send_rows.back();
      std::vector<int64_t> skeys(total_send);
      std::vector<float> svalues(size_t(total_send) * dim), sstate(size_t(total_send) * sw);
      std::vector<int> fill = first;
      auto put = [&](size_t i, int r) {
        int at = fill[r]++;
        skeys[at] = batch.keys[i];
        std::copy_n(batch.values.begin() + i * dim, dim, svalues.begin() + size_t(at) * dim);
        std::copy_n(batch.state.begin() + i * sw, sw, sstate.begin() + size_t(at) * sw);
      };
      for (size_t i = 0; i < dest.size(); ++i) {
        if (dest[i] == kEveryRank)
          for (int r = 0; r < world; ++r) put(i, r);
        else
          put(i, dest[i]);
      }
      timed_alltoall(send_rows.data(), 1, MPI_INT, recv_rows.data(), 1, comm, "checkpoint load (row counts)");
      std::vector<int> rfirst(world, 0);
      std::partial_sum(recv_rows.begin(), recv_rows.end() - 1, rfirst.begin() + 1);
      int total_recv = rfirst.back() + recv_rows.back();
      size_t base = result.rows();
      result.keys.resize(base + total_recv);
      result.values.resize((base + total_recv) * dim);
      result.state.resize((base + total_recv) * sw);
      timed_alltoallv(skeys.data(), send_rows.data(), first.data(), MPI_INT64_T, result.keys.data() + base,
                      recv_rows.data(), rfirst.data(), comm, "checkpoint load (keys)");
      auto scaled = [](std::vector<int> v, int k) {
        for (int& x : v) x *= k;
        return v;
      };
      timed_alltoallv(svalues.data(), scaled(send_rows, dim).data(), scaled(first, dim).data(), MPI_FLOAT,
                      result.values.data() + base * dim, scaled(recv_rows, dim).data(), scaled(rfirst, dim).data(),
                      comm, "checkpoint load (values)");
      if (sw > 0)
        timed_alltoallv(sstate.data(), scaled(send_rows, sw).data(), scaled(first, sw).data(), MPI_FLOAT,
                        result.state.data() + base * sw, scaled(recv_rows, sw).data(), scaled(rfirst, sw).data(), comm,
                        "checkpoint load (optimizer state)");
    }

    // Sorted by key, so the result does not depend on how the old shards were split; a key twice is an error.
    std::vector<size_t> order(result.rows());
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return result.keys[a] < result.keys[b]; });
    TableRows sorted = empty_rows(mt.spec);
    sorted.keys.resize(result.rows());
    sorted.values.resize(result.values.size());
    sorted.state.resize(result.state.size());
    std::string dup;
    for (size_t i = 0; i < order.size(); ++i) {
      size_t j = order[i];
      sorted.keys[i] = result.keys[j];
      std::copy_n(result.values.begin() + j * dim, dim, sorted.values.begin() + i * dim);
      std::copy_n(result.state.begin() + j * sw, sw, sorted.state.begin() + i * sw);
      if (i > 0 && sorted.keys[i] == sorted.keys[i - 1] && dup.empty())
        dup = strprintf("%s: table '%s': key %lld appears more than once in the checkpoint", dir.c_str(),
                        mt.spec.name.c_str(), static_cast<long long>(sorted.keys[i]));
    }
    agree_on_error(comm, dup, "checkpoint load");
    out.tables.push_back(std::move(sorted));
  }
  return out;
}

}  // namespace sparta
