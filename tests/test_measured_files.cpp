// test_measured_files: the measured results keep one naming rule and one revision. Every file under
// experiments/measured/ (the current visit) and experiments/measured/archive/ (superseded visits, cited by the
// NOTES) is named <machine>_<revision>_<what>.<jsonl|txt>; every record of a current JSON-lines file was made at
// the revision its name carries; the current files come from one revision, and experiments/RESULTS.md names that
// revision and cites only files that exist. Runs from the repository root (make test).
#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "tests/testing.h"

namespace fs = std::filesystem;

namespace {

const std::regex kName(R"(^(h100|h200)(x[0-9]+)?_([0-9a-f]{7})_([a-z0-9_.]+)\.(jsonl|txt)$)");

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string revision_of(const std::string& name) {
  std::smatch m;
  return std::regex_match(name, m, kName) ? m[3].str() : "";
}

// The "git" fields of a JSON-lines text, one per record that has one.
std::vector<std::string> git_fields(const std::string& text) {
  std::vector<std::string> out;
  const std::regex git(R"re("git"\s*:\s*"([^"]*)")re");
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, git)) out.push_back(m[1].str());
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(measured_files)

BOOST_AUTO_TEST_CASE(the_rule_itself_tells_good_names_from_bad) {
  BOOST_CHECK_EQUAL(revision_of("h200x2_1a6f596_train.jsonl"), "1a6f596");
  BOOST_CHECK_EQUAL(revision_of("h200_1a6f596_every_suite.txt"), "1a6f596");
  for (const char* bad : {"h200_train.jsonl", "h200_1a6f59_train.jsonl", "gpu_1a6f596_train.jsonl",
                          "h200_1a6f596_Train.jsonl", "h200_1a6f596_train.csv", "h200_grouped_peers.jsonl"})
    BOOST_CHECK_MESSAGE(revision_of(bad).empty(), bad << " passed the rule");
  BOOST_CHECK_EQUAL(git_fields("{\"a\":1,\"git\": \"abc\"}\n{\"b\":2}\n{\"git\":\"def-dirty\"}\n").size(), 2u);
}

BOOST_AUTO_TEST_CASE(every_file_is_named_by_the_rule) {
  BOOST_REQUIRE_MESSAGE(fs::is_directory("experiments/measured"), "run from the repository root");
  size_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator("experiments/measured")) {
    if (e.is_directory()) {
      BOOST_CHECK_MESSAGE(e.path() == fs::path("experiments/measured/archive"),
                          e.path() << ": experiments/measured holds files and archive/ only");
      continue;
    }
    ++n;
    BOOST_CHECK_MESSAGE(!revision_of(e.path().filename().string()).empty(),
                        e.path() << " is not named <machine>_<revision>_<what>.<jsonl|txt>");
  }
  BOOST_CHECK_GT(n, 0u);
}

BOOST_AUTO_TEST_CASE(current_files_come_from_one_revision_that_results_md_names) {
  std::set<std::string> revisions;
  for (const auto& e : fs::directory_iterator("experiments/measured")) {
    if (!e.is_regular_file()) continue;
    const std::string name = e.path().filename().string(), rev = revision_of(name);
    if (rev.empty()) continue;  // reported by every_file_is_named_by_the_rule
    revisions.insert(rev);
    if (e.path().extension() != ".jsonl") continue;
    for (const std::string& g : git_fields(read_file(e.path().string())))
      BOOST_CHECK_MESSAGE(g.rfind(rev, 0) == 0, name << " holds a record made at " << g);
  }
  BOOST_CHECK_MESSAGE(revisions.size() <= 1, "experiments/measured holds " << revisions.size()
                                                 << " revisions: superseded files belong in archive/");
  const std::string results = read_file("experiments/RESULTS.md");
  BOOST_REQUIRE_MESSAGE(!results.empty(), "experiments/RESULTS.md is missing");
  for (const std::string& rev : revisions)
    BOOST_CHECK_MESSAGE(results.find(rev) != std::string::npos, "RESULTS.md does not name revision " << rev);
  const std::regex cited(R"(experiments/measured/([A-Za-z0-9_./-]+\.(jsonl|txt)))");
  for (auto it = std::sregex_iterator(results.begin(), results.end(), cited); it != std::sregex_iterator(); ++it) {
    const std::string path = "experiments/measured/" + (*it)[1].str();
    BOOST_CHECK_MESSAGE(fs::is_regular_file(path), "RESULTS.md cites " << path << ", which does not exist");
    BOOST_CHECK_MESSAGE((*it)[1].str().rfind("archive/", 0) != 0, "RESULTS.md cites an archived file: " << path);
  }
}

// experiments/make_results.py, which writes these files and RESULTS.md, on a visit with hand-computed figures.
BOOST_AUTO_TEST_CASE(make_results_names_archives_and_computes_the_ratios, *boost::unit_test::timeout(300)) {
  testing::CommandResult r = testing::run_command(testing::python() + " tests/py_test_make_results.py");
  BOOST_CHECK_MESSAGE(r.status == 0 && r.output.find("\nOK") != std::string::npos, r.output);
}

BOOST_AUTO_TEST_SUITE_END()
