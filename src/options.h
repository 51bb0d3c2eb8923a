// options.h: the command-line options every program shares (Boost.Program_options), and their parsing
// with errors that name the option.
#pragma once

#include <boost/program_options.hpp>
#include <string>

#include "src/context.h"

namespace sparta {

namespace po = boost::program_options;

// --device, --ranks-per-node, --log-level, --help
void add_common_options(po::options_description& desc, ContextOptions& ctx, std::string& log_level);

// Parses argv; on --help prints usage on rank 0 and returns false. Bad options throw sparta::Error.
bool parse_options(int argc, char** argv, const po::options_description& desc, po::variables_map& vm,
                   const std::string& usage);

}  // namespace sparta
