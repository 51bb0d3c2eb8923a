// options.h: the command-line options every program shares (Boost.Program_options), and their parsing
// with errors that name the option.
#pragma once

#include <boost/program_options.hpp>
#include <string>

#include "src/base/check.h"
#include "src/context.h"

namespace sparta {

namespace po = boost::program_options;

// --device, --ranks-per-node, --log-level, --help
void add_common_options(po::options_description& desc, ContextOptions& ctx, std::string& log_level);

// The top of every program's main: returns body()'s exit status; a sparta::Error escaping body ends the
// program through end_with_error (src/base/check.h): its message, then status 1 when no rank can be left
// waiting (one rank, or an error every rank raised together), else MPI_Abort. Call it inside the MpiSession's
// scope, so that MPI finalizes after it returns.
template <class F>
int run_program(const std::string& program, F&& body) {
  try {
    return body();
  } catch (const Error& e) {
    return end_with_error(program, e);
  }
}

// Parses argv (with positional arguments when pos is given); on --help prints usage on rank 0 and returns
// false. Bad options throw sparta::Error. Sets the log level when desc has --log-level.
bool parse_options(int argc, char** argv, const po::options_description& desc, po::variables_map& vm,
                   const std::string& usage, const po::positional_options_description* pos = nullptr);

}  // namespace sparta
