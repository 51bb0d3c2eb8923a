// agree.h: ranks agree on an error before the next collective, so that no rank is left waiting for one that
// failed. Every multi-rank step that can fail on some ranks only (a file, bad input) runs guarded, then calls
// agree_on_error: when any rank failed, every rank throws the same sparta::Error.
#pragma once

#include <mpi.h>

#include <exception>
#include <string>

#include "src/base/check.h"

namespace sparta {

// Runs f; returns "" when it succeeded, else the message of the exception it threw.
template <class F>
std::string guarded(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    std::string what = e.what();
    return what.empty() ? "unknown error" : what;
  }
  return "";
}

// Collective over comm, under the job timeout (deadline.h). error: this rank's failure ("" when it succeeded).
// When any rank failed, every rank throws sparta::Error "rank <r>: <message>" (or "ranks <r1>,<r2>: <message>"
// when several failed with the same message) with the lowest failing rank's message; ranks that failed with
// another message are named too and print their own. Otherwise returns. The Error says every_rank() when comm
// spans MPI_COMM_WORLD: then rank 0 alone prints it (end_with_error). what: the step it guards, for messages
// ("agree_on_error (reading a batch)") when the wait times out.
void agree_on_error(MPI_Comm comm, const std::string& error, const char* what = nullptr);

// The string of root on every rank (under the job timeout).
std::string bcast_string(MPI_Comm comm, int root, const std::string& s);

}  // namespace sparta
