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

// Collective over comm. error: this rank's failure ("" when it succeeded). When any rank failed, every rank
// throws sparta::Error "rank <r>: <message>" with the lowest failing rank's message (and how many others
// failed); otherwise returns. The Error says every_rank() when comm spans MPI_COMM_WORLD.
void agree_on_error(MPI_Comm comm, const std::string& error);

// The string of root on every rank.
std::string bcast_string(MPI_Comm comm, int root, const std::string& s);

}  // namespace sparta
