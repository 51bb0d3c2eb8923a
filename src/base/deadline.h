// deadline.h: host-side MPI waits that cannot hang. Every collective or message a rank waits for outside the
// communicator (agreements, broadcasts of strings, the checkpoint's and the synthetic generator's gathers,
// barriers) starts non-blocking and is polled against the job timeout: the one setting `comm.timeout`, which
// the communicator's own waits also use. A wait that makes no progress that long asks every member of the
// communicator where it is (a roll call on reserved tags). When a missing rank does not answer (stopped or
// dead) or waits in another operation, it prints once which operation timed out and which ranks did not arrive,
// and calls MPI_Abort (check.h's abort path); when every missing rank answers that it is working, it says so
// and waits another timeout.
// A peer that died may also make MPI report an error on the wait: that ends the job the same way.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace sparta {

constexpr double kDefaultJobTimeoutSeconds = 300;

// The job timeout in seconds (> 0); set once options are parsed (sparta-train: comm.timeout).
void set_job_timeout(double seconds);
double job_timeout();

// Waits for req (started by this rank over comm) under the job timeout. op names the operation in messages.
void wait_request(MPI_Request* req, MPI_Comm comm, const std::string& op);
// The same for several requests (point-to-point exchanges).
void wait_requests(std::vector<MPI_Request>& reqs, MPI_Comm comm, const std::string& op);

// Rank-local part of the roll call: notes that this rank waits in op now and answers peers that ask. Called by
// every polling wait, the communicator's included, so that a timed-out peer can tell a rank waiting elsewhere
// from a missing one.
void answer_roll_calls(const std::string& op);
// A thread that answers roll calls while the rank works outside any wait ("working for N s"): a timed-out wait
// whose missing ranks all answer so goes on (rank 0 alone converting a large file is not a stall), while a
// stopped or dead rank never answers. MpiSession starts it under MPI_THREAD_MULTIPLE and stops it before
// MPI_Finalize; without it a rank busy outside a wait cannot answer and counts as stopped.
void start_roll_call_responder();
void stop_roll_call_responder();

// Test hook for the fault tests: SPARTA_FAULT="<world rank>|<stop|kill|exit|busy>|<op text>[|<nth>]" makes that
// rank stop itself (SIGSTOP), die (SIGKILL), exit(3) or work on for 2.5 job timeouts (busy) on reaching the nth
// (default 1st) wait whose op contains the text, before it starts the operation. Every timed_* call and every communicator operation is such a point.
// Unset (always, outside tests): one cached check of the environment.
void fault_point(const std::string& op);

// Blocking collectives under the job timeout: the MPI call of the same name, started non-blocking, then waited
// for with wait_request. op says what the caller does ("agree_on_error", "checkpoint save: rows per rank").
void timed_barrier(MPI_Comm comm, const std::string& op);
void timed_bcast(void* buf, int count, MPI_Datatype type, int root, MPI_Comm comm, const std::string& op);
void timed_allreduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op mop, MPI_Comm comm,
                     const std::string& op);
void timed_reduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op mop, int root, MPI_Comm comm,
                  const std::string& op);
void timed_gather(const void* send, int count, MPI_Datatype type, void* recv, int recv_count, int root,
                  MPI_Comm comm, const std::string& op);
void timed_gatherv(const void* send, int count, MPI_Datatype type, void* recv, const int* counts, const int* displs,
                   int root, MPI_Comm comm, const std::string& op);
void timed_allgather(const void* send, int count, MPI_Datatype type, void* recv, int recv_count, MPI_Comm comm,
                     const std::string& op);
void timed_allgatherv(const void* send, int count, MPI_Datatype type, void* recv, const int* counts,
                      const int* displs, MPI_Comm comm, const std::string& op);
void timed_alltoall(const void* send, int count, MPI_Datatype type, void* recv, int recv_count, MPI_Comm comm,
                    const std::string& op);
void timed_alltoallv(const void* send, const int* send_counts, const int* send_displs, MPI_Datatype type, void* recv,
                     const int* recv_counts, const int* recv_displs, MPI_Comm comm, const std::string& op);
// Point to point (bytes).
void timed_send(const void* buf, int bytes, int dest, int tag, MPI_Comm comm, const std::string& op);
void timed_recv(void* buf, int bytes, int source, int tag, MPI_Comm comm, const std::string& op);

}  // namespace sparta
