// deadline.cpp: see deadline.h.
#include "src/base/deadline.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

#include "src/base/check.h"

namespace sparta {
namespace {

// Roll-call tags on MPI_COMM_WORLD, kept clear of every tag the project uses for its own messages.
constexpr int kAskTag = 0x5a17;
constexpr int kAnswerTag = 0x5a18;
constexpr int kAnswerBytes = 256;

double g_timeout = kDefaultJobTimeoutSeconds;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Where this rank is, for the roll call: the wait it polls now (noted at every poll), else busy since the last.
std::mutex g_roll_mutex;
std::deque<std::string> g_answers;  // buffers of answers in flight: tiny, kept for the life of the process
std::string g_wait_op = "start-up";
Clock::time_point g_wait_seen = Clock::now();
std::thread* g_responder = nullptr;  // never destroyed: a process that ends in exit() or MPI_Abort must not join it
std::atomic<bool> g_responder_stop{false};

// "W <op>": waiting in op; "B <seconds> <op>": working, outside any wait, since it last waited in op.
std::string where_am_i() {
  const double since = seconds_since(g_wait_seen);
  if (since < 0.5) return "W " + g_wait_op;
  return strprintf("B %.0f %s", since, g_wait_op.c_str());
}

// Answers every roll call pending (g_roll_mutex held).
void answer_pending() {
  for (;;) {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    if (MPI_Improbe(MPI_ANY_SOURCE, kAskTag, MPI_COMM_WORLD, &flag, &msg, &st) != MPI_SUCCESS || !flag) return;
    int ask = 0;
    MPI_Mrecv(&ask, 1, MPI_INT, &msg, MPI_STATUS_IGNORE);
    g_answers.push_back(where_am_i().substr(0, kAnswerBytes));
    MPI_Request r = MPI_REQUEST_NULL;
    if (MPI_Isend(g_answers.back().data(), static_cast<int>(g_answers.back().size()), MPI_CHAR, st.MPI_SOURCE,
                  kAnswerTag, MPI_COMM_WORLD, &r) == MPI_SUCCESS)
      MPI_Request_free(&r);
  }
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, len);
}

// World ranks of comm's members.
std::vector<int> world_members(MPI_Comm comm) {
  MPI_Group g, w;
  int n = 0;
  MPI_Comm_group(comm, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &w);
  MPI_Group_size(g, &n);
  std::vector<int> local(n), world(n);
  for (int i = 0; i < n; ++i) local[i] = i;
  MPI_Group_translate_ranks(g, n, local.data(), w, world.data());
  MPI_Group_free(&g);
  MPI_Group_free(&w);
  return world;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 16; ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  if (ranks.size() > 16) s += strprintf(",... (%zu ranks)", ranks.size());
  return s;
}

struct RollCall {
  std::vector<int> silent;  // no answer: stopped, dead (or no responder and busy)
  std::string elsewhere;    // waiting in another operation: they will not come
  std::string busy;         // alive and working outside any wait: they may still come
  bool fatal() const { return !silent.empty() || !elsewhere.empty() || busy.empty(); }
  std::string text() const {
    std::string out;
    if (!silent.empty())
      out = strprintf("ranks that did not arrive: %s (no answer: stopped or dead)", rank_list(silent).c_str());
    if (!elsewhere.empty()) out += (out.empty() ? "ranks that did not arrive: " : "; ") + elsewhere;
    if (!busy.empty()) out += (out.empty() ? "" : "; ") + busy;
    if (out.empty()) out = "every other rank answered from this operation (a message of it was lost?)";
    return out;
  }
};

// Asks every other member of comm where it is, for a short grace: which ranks did not arrive at op, and why.
RollCall roll_call(MPI_Comm comm, const std::string& op) {
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  const std::vector<int> members = world_members(comm);
  static int ask = 0;
  std::vector<MPI_Request> recvs;
  std::vector<int> peers;
  std::vector<std::vector<char>> answers;
  answers.reserve(members.size());
  for (int m : members) {
    if (m == me || m < 0) continue;
    MPI_Request s = MPI_REQUEST_NULL, r = MPI_REQUEST_NULL;
    if (MPI_Isend(&ask, 1, MPI_INT, m, kAskTag, MPI_COMM_WORLD, &s) == MPI_SUCCESS) MPI_Request_free(&s);
    answers.emplace_back(kAnswerBytes, '\0');
    if (MPI_Irecv(answers.back().data(), kAnswerBytes, MPI_CHAR, m, kAnswerTag, MPI_COMM_WORLD, &r) != MPI_SUCCESS)
      r = MPI_REQUEST_NULL;
    recvs.push_back(r);
    peers.push_back(m);
  }
  std::vector<int> done(peers.size(), 0), length(peers.size(), 0);
  const double grace = std::min(3.0, std::max(0.5, g_timeout / 4));
  const Clock::time_point start = Clock::now();
  size_t answered = 0;
  while (answered < peers.size() && seconds_since(start) < grace) {
    for (size_t i = 0; i < peers.size(); ++i) {
      if (done[i] || recvs[i] == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Status st;
      if (MPI_Test(&recvs[i], &flag, &st) != MPI_SUCCESS) {
        recvs[i] = MPI_REQUEST_NULL;  // the peer is gone: no answer
        continue;
      }
      if (flag) {
        done[i] = 1;
        MPI_Get_count(&st, MPI_CHAR, &length[i]);
        ++answered;
      }
    }
    answer_roll_calls(op);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  RollCall rc;
  for (size_t i = 0; i < peers.size(); ++i) {
    if (!done[i]) {
      rc.silent.push_back(peers[i]);
      continue;
    }
    const std::string where(answers[i].data(), static_cast<size_t>(std::max(0, length[i])));
    if (where.compare(0, 2, "W ") == 0 && where.substr(2) == op) continue;  // arrived
    if (where.compare(0, 2, "B ") == 0) {
      const size_t sp = where.find(' ', 2);
      rc.busy += strprintf("%srank %d is working (for %s s, since it left %s)", rc.busy.empty() ? "" : "; ", peers[i],
                           where.substr(2, sp - 2).c_str(), sp == std::string::npos ? "?" : where.substr(sp + 1).c_str());
    } else {
      rc.elsewhere += strprintf("%srank %d waits in %s", rc.elsewhere.empty() ? "" : "; ", peers[i],
                                where.size() > 2 ? where.substr(2).c_str() : where.c_str());
    }
  }
  return rc;
}

[[noreturn]] void give_up(const std::string& op, const std::string& why, const RollCall& rc) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  SPARTA_FATAL("host wait failed in %s on rank %d of %d: %s; %s. Ending the job.", op.c_str(), rank, size,
               why.c_str(), rc.text().c_str());
}

// Polls test() until it reports completion; gives up after the job timeout or on an MPI error.
template <class Test>
void poll(MPI_Comm comm, const std::string& op, Test test) {
  Clock::time_point start = Clock::now();
  for (long spins = 0;; ++spins) {
    int flag = 0;
    const int rc = test(&flag);
    if (rc != MPI_SUCCESS)
      give_up(op, strprintf("MPI error %d (%s) while waiting (a peer may have died)", rc, mpi_error_text(rc).c_str()),
              roll_call(comm, op));
    if (flag) return;
    // Spin first (the common case completes in microseconds), then sleep a little so a long wait costs no core.
    if (spins < 2000) {
      if (spins % 64 == 63) answer_roll_calls(op);
      std::this_thread::yield();
      continue;
    }
    answer_roll_calls(op);
    const double waited = seconds_since(start);
    if (waited > g_timeout) {
      const RollCall rc = roll_call(comm, op);
      if (rc.fatal())
        give_up(op, strprintf("no progress for %.1f s (job timeout %g s, comm.timeout)", waited, g_timeout), rc);
      // Every missing rank answers and works on (rank 0 converting a file while the others wait): not a stall.
      int me = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &me);
      std::fprintf(stderr, "[%s:%d] %s: waited %.0f s; %s: waiting on\n", identity_host().c_str(), me, op.c_str(),
                   waited, rc.busy.c_str());
      start = Clock::now();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(spins < 20000 ? 50 : 1000));
  }
}

}  // namespace

namespace {
struct Fault {
  bool armed = false;
  int rank = -1;
  std::string how, text;
  long nth = 1, seen = 0;
};
Fault parse_fault() {
  Fault f;
  const char* env = std::getenv("SPARTA_FAULT");
  if (!env || !*env) return f;
  std::vector<std::string> parts(1);
  for (const char* c = env; *c; ++c) {
    if (*c == '|') parts.emplace_back();
    else parts.back().push_back(*c);
  }
  if (parts.size() < 3) return f;
  f.rank = std::atoi(parts[0].c_str());
  f.how = parts[1];
  f.text = parts[2];
  if (parts.size() > 3) f.nth = std::max(1L, std::atol(parts[3].c_str()));
  f.armed = true;
  return f;
}
}  // namespace

void fault_point(const std::string& op) {
  static Fault f = parse_fault();
  if (!f.armed || op.find(f.text) == std::string::npos) return;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != f.rank || ++f.seen != f.nth) return;
  std::fprintf(stderr, "[fault] rank %d: %s at '%s'\n", rank, f.how.c_str(), op.c_str());
  std::fflush(stderr);
  if (f.how == "stop") raise(SIGSTOP);
  else if (f.how == "kill") raise(SIGKILL);
  else if (f.how == "exit") _exit(3);
  else if (f.how == "busy")  // works (outside any wait) for 2.5 job timeouts, then goes on
    std::this_thread::sleep_for(std::chrono::milliseconds(int64_t(2500 * g_timeout)));
}

void set_job_timeout(double seconds) {
  SPARTA_REQUIRE(seconds > 0, "comm.timeout: expected seconds > 0, found %g", seconds);
  g_timeout = seconds;
}

double job_timeout() { return g_timeout; }

void answer_roll_calls(const std::string& op) {
  std::lock_guard<std::mutex> lock(g_roll_mutex);
  if (g_wait_op != op) g_wait_op = op;
  g_wait_seen = Clock::now();
  answer_pending();
}

void start_roll_call_responder() {
  if (g_responder) return;
  g_responder_stop = false;
  g_responder = new std::thread([] {
    while (!g_responder_stop) {
      {
        std::lock_guard<std::mutex> lock(g_roll_mutex);
        answer_pending();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
}

void stop_roll_call_responder() {
  if (!g_responder) return;
  g_responder_stop = true;
  g_responder->join();
  delete g_responder;
  g_responder = nullptr;
}

void wait_request(MPI_Request* req, MPI_Comm comm, const std::string& op) {
  poll(comm, op, [&](int* flag) { return MPI_Test(req, flag, MPI_STATUS_IGNORE); });
}

void wait_requests(std::vector<MPI_Request>& reqs, MPI_Comm comm, const std::string& op) {
  if (reqs.empty()) return;
  poll(comm, op, [&](int* flag) {
    return MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), flag, MPI_STATUSES_IGNORE);
  });
}

// Each wrapper: start the non-blocking call (a failure to start is an MPI error, fatal as with MPI_CHECK).
#define SPARTA_TIMED(call)              \
  do {                                  \
    MPI_Request req = MPI_REQUEST_NULL; \
    fault_point(op);                    \
    MPI_CHECK(call);                    \
    wait_request(&req, comm, op);       \
  } while (0)

void timed_barrier(MPI_Comm comm, const std::string& op) { SPARTA_TIMED(MPI_Ibarrier(comm, &req)); }

void timed_bcast(void* buf, int count, MPI_Datatype type, int root, MPI_Comm comm, const std::string& op) {
  SPARTA_TIMED(MPI_Ibcast(buf, count, type, root, comm, &req));
}

void timed_allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op mop, MPI_Comm comm,
                     const std::string& op) {
  SPARTA_TIMED(MPI_Iallreduce(send, recv, count, type, mop, comm, &req));
}

void timed_reduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op mop, int root, MPI_Comm comm,
                  const std::string& op) {
  SPARTA_TIMED(MPI_Ireduce(send, recv, count, type, mop, root, comm, &req));
}

void timed_gather(const void* send, int count, MPI_Datatype type, void* recv, int recv_count, int root,
                  MPI_Comm comm, const std::string& op) {
  SPARTA_TIMED(MPI_Igather(send, count, type, recv, recv_count, type, root, comm, &req));
}

void timed_gatherv(const void* send, int count, MPI_Datatype type, void* recv, const int* counts, const int* displs,
                   int root, MPI_Comm comm, const std::string& op) {
  SPARTA_TIMED(MPI_Igatherv(send, count, type, recv, counts, displs, type, root, comm, &req));
}

void timed_allgather(const void* send, int count, MPI_Datatype type, void* recv, int recv_count, MPI_Comm comm,
                     const std::string& op) {
  SPARTA_TIMED(MPI_Iallgather(send, count, type, recv, recv_count, type, comm, &req));
}

void timed_allgatherv(const void* send, int count, MPI_Datatype type, void* recv, const int* counts,
                      const int* displs, MPI_Comm comm, const std::string& op) {
  SPARTA_TIMED(MPI_Iallgatherv(send, count, type, recv, counts, displs, type, comm, &req));
}

void timed_alltoall(const void* send, int count, MPI_Datatype type, void* recv, int recv_count, MPI_Comm comm,
                    const std::string& op) {
  SPARTA_TIMED(MPI_Ialltoall(send, count, type, recv, recv_count, type, comm, &req));
}

void timed_alltoallv(const void* send, const int* send_counts, const int* send_displs, MPI_Datatype type, void* recv,
                     const int* recv_counts, const int* recv_displs, MPI_Comm comm, const std::string& op) {
  SPARTA_TIMED(
      MPI_Ialltoallv(send, send_counts, send_displs, type, recv, recv_counts, recv_displs, type, comm, &req));
}

void timed_send(const void* buf, int bytes, int dest, int tag, MPI_Comm comm, const std::string& op) {
  SPARTA_TIMED(MPI_Isend(buf, bytes, MPI_BYTE, dest, tag, comm, &req));
}

void timed_recv(void* buf, int bytes, int source, int tag, MPI_Comm comm, const std::string& op) {
  SPARTA_TIMED(MPI_Irecv(buf, bytes, MPI_BYTE, source, tag, comm, &req));
}

#undef SPARTA_TIMED

}  // namespace sparta
