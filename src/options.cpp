// options.cpp: see options.h.
#include "src/options.h"

#include <iostream>
#include <sstream>

#include "src/base/check.h"
#include "src/base/log.h"

namespace sparta {

void add_common_options(po::options_description& desc, ContextOptions& ctx, std::string& log_level) {
  desc.add_options()("help,h", "print this help")(
      "device", po::value<std::string>(&ctx.device)->default_value("auto"),
      "cpu | cuda | auto: a GPU per rank, the one it sees (a per-rank binding: srun --gpus-per-task=1) or, seeing "
      "several, its host-local rank's; auto falls back to cpu when there are too few, and says why")(
      "ranks-per-node", po::value<int>(&ctx.ranks_per_node)->default_value(0),
      "0: one node per host; k: cut each host into emulated nodes of k ranks")(
      "log-level", po::value<std::string>(&log_level)->default_value("info"), "debug | info | warn | error");
}

bool parse_options(int argc, char** argv, const po::options_description& desc, po::variables_map& vm,
                   const std::string& usage, const po::positional_options_description* pos) {
  try {
    po::command_line_parser parser(argc, argv);
    parser.options(desc);
    if (pos) parser.positional(*pos);
    po::store(parser.run(), vm);
    if (vm.count("help")) {
      if (identity_rank() <= 0) std::cout << usage << "\n\n" << desc << std::endl;
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw Error(std::string("options: ") + e.what());
  }
  if (vm.count("log-level")) set_log_level(parse_log_level(vm["log-level"].as<std::string>()));
  return true;
}

}  // namespace sparta
