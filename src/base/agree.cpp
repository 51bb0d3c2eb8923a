#include "src/base/agree.h"

#include <climits>
#include <vector>

#include "src/base/deadline.h"

namespace sparta {

std::string bcast_string(MPI_Comm comm, int root, const std::string& s) {
  long long n = static_cast<long long>(s.size());
  timed_bcast(&n, 1, MPI_LONG_LONG, root, comm, "bcast_string (length)");
  std::string out = s;
  out.resize(static_cast<size_t>(n));
  if (n > 0) timed_bcast(&out[0], static_cast<int>(n), MPI_CHAR, root, comm, "bcast_string");
  return out;
}

void agree_on_error(MPI_Comm comm, const std::string& error, const char* what) {
  const std::string op = what ? std::string("agree_on_error (") + what + ")" : std::string("agree_on_error");
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  int mine = error.empty() ? INT_MAX : rank, first = INT_MAX;
  timed_allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm, op);
  if (first == INT_MAX) return;  // the common case: one small reduction
  const std::string msg = bcast_string(comm, first, error);
  // Per rank: 0 succeeded, 1 failed with the first failing rank's message, 2 failed with another message.
  int state = error.empty() ? 0 : error == msg ? 1 : 2;
  std::vector<int> states(size);
  timed_allgather(&state, 1, MPI_INT, states.data(), 1, comm, op + ": failing ranks");
  std::vector<int> same, other;
  for (int r = 0; r < size; ++r) {
    if (states[r] == 1) same.push_back(r);
    if (states[r] == 2) other.push_back(r);
  }
  auto list = [](const std::vector<int>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < 16; ++i) s += (i ? "," : "") + std::to_string(v[i]);
    if (v.size() > 16) s += strprintf(",... (%zu ranks)", v.size());
    return s;
  };
  std::string text = strprintf("%s %s: %s", same.size() == 1 ? "rank" : "ranks", list(same).c_str(), msg.c_str());
  if (!other.empty()) {
    text += strprintf(" (%s %s failed otherwise; each printed its own message)", other.size() == 1 ? "rank" : "ranks",
                      list(other).c_str());
    if (state == 2) std::fprintf(stderr, "[%s:%d] %s\n", identity_host().c_str(), identity_rank(), error.c_str());
  }
  // Raised on every rank of comm: when that is the whole world, a program may end without MPI_Abort.
  int same_comm = MPI_UNEQUAL;
  MPI_CHECK(MPI_Comm_compare(comm, MPI_COMM_WORLD, &same_comm));
  throw Error(text, same_comm == MPI_IDENT || same_comm == MPI_CONGRUENT);
}

}  // namespace sparta
