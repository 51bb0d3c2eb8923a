// io/checksum (XXH64 against published values, streaming, files) and the checkpoint tools as a user runs them:
// tool_ckpt_writer writes checkpoints under mpiexec, sparta-ckpt lists, verifies and exports them, and a flipped
// byte makes verify fail naming the file. Needs SPARTA_TOOLS and SPARTA_MPIEXEC (tests/run_all.sh sets them).
#include <boost/test/unit_test.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "src/base/check.h"
#include "io/checkpoint.h"
#include "io/checksum.h"
#include "io/h5.h"
#include "tests/testing.h"

using namespace sparta;
namespace fs = std::filesystem;

namespace {

using Outcome = testing::CommandResult;

// tool_ckpt_writer on `ranks` ranks, and the sparta-ckpt program, each with a 120 s limit.
Outcome writer(int ranks, const std::string& args) {
  return testing::run_command(testing::tool_command("tool_ckpt_writer", ranks, args, 120));
}
Outcome ckpt_program(const std::string& args) {
  return testing::run_command(testing::tool_command("../bin/sparta-ckpt", 0, args, 120));
}

std::vector<unsigned char> random_bytes(size_t n) {
  std::vector<unsigned char> b(n);
  for (auto& x : b) x = static_cast<unsigned char>(testing::rng()());
  return b;
}

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

}  // namespace

BOOST_AUTO_TEST_CASE(xxh64_matches_published_values) {
  // Published XXH64 digests (seed 0): the reference implementation's test values.
  BOOST_CHECK_EQUAL(checksum_hex(checksum64("", 0)), "ef46db3751d8e999");
  BOOST_CHECK_EQUAL(checksum_hex(checksum64("a", 1)), "d24ec4f1a98c6e5b");
  BOOST_CHECK_EQUAL(checksum_hex(checksum64("abc", 3)), "44bc2cf5ad770999");
  const std::string s = "Nobody inspects the spammish repetition";  // 39 bytes: stripes, 8-, 4- and 1-byte tails
  BOOST_CHECK_EQUAL(checksum_hex(checksum64(s.data(), s.size())), "fbcea83c8a378bf1");
}

BOOST_AUTO_TEST_CASE(streaming_equals_one_shot_and_catches_changes) {
  for (size_t n : {size_t(0), size_t(1), size_t(31), size_t(32), size_t(33), size_t(257), size_t(1 << 20) + 17}) {
    std::vector<unsigned char> b = random_bytes(n);
    uint64_t whole = checksum64(b.data(), b.size());
    Checksum64 c;
    size_t at = 0;
    while (at < n) {
      size_t piece = std::min<size_t>(n - at, testing::rng()() % 70);
      c.update(b.data() + at, piece);
      at += piece;
    }
    BOOST_CHECK_EQUAL(c.digest(), whole);
    BOOST_CHECK_EQUAL(c.bytes(), n);
    if (n > 0) {
      size_t i = testing::rng()() % n;
      b[i] ^= static_cast<unsigned char>(1u << (testing::rng()() % 8));
      BOOST_CHECK_NE(checksum64(b.data(), b.size()), whole);
      BOOST_CHECK_NE(checksum64(b.data(), b.size() - 1), checksum64(b.data(), b.size()));
    }
  }
  BOOST_CHECK_EQUAL(parse_checksum_hex(checksum_hex(0x0123456789abcdefULL)), 0x0123456789abcdefULL);
  BOOST_CHECK_THROW(parse_checksum_hex("0123"), Error);
  BOOST_CHECK_THROW(parse_checksum_hex("0123456789abcdeZ"), Error);
}

BOOST_AUTO_TEST_CASE(file_checksum_reads_in_blocks) {
  std::string path = testing::temp_path("ckpt", "file.bin");
  std::vector<unsigned char> b = random_bytes((3 << 20) + 5);  // several 1 MiB blocks and a tail
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
  uint64_t bytes = 0;
  BOOST_CHECK_EQUAL(checksum_file(path, &bytes), checksum64(b.data(), b.size()));
  BOOST_CHECK_EQUAL(bytes, b.size());
  fs::remove(path);
  try {
    checksum_file(path);
    BOOST_ERROR("no error for a missing file");
  } catch (const Error& e) {
    BOOST_CHECK(contains(e.what(), path));
  }
}

BOOST_AUTO_TEST_CASE(sparta_ckpt_lists_verifies_and_exports) {
  std::string root = testing::temp_path("ckpt", "program");
  Outcome w = writer(2, "write " + root + " --steps 2 --rows 500");
  BOOST_REQUIRE_MESSAGE(w.status == 0, w.output);

  Outcome l = ckpt_program("list " + root);
  BOOST_CHECK_MESSAGE(l.status == 0, l.output);
  BOOST_CHECK_MESSAGE(contains(l.output, "step-1\n") && contains(l.output, "step-2   (latest)") &&
                          contains(l.output, "latest: step-2"), l.output);

  Outcome v = ckpt_program("verify " + root);
  BOOST_CHECK_MESSAGE(v.status == 0, v.output);
  for (const char* needle : {"step 2, written by 2 rank(s)", "table user", "rows         1000", "ok   shard-1-of-2.h5",
                             "ok   dense.h5", "verify: ok"})
    BOOST_CHECK_MESSAGE(contains(v.output, needle), "'" << needle << "' missing in:\n" << v.output);

  std::string out = root + "/user.h5";
  Outcome e = ckpt_program("export " + root + "/step-1 --table user --out " + out);
  BOOST_CHECK_MESSAGE(e.status == 0, e.output);
  {
    Manifest m = read_manifest(root + "/step-1");
    TableRows want = read_table(m, "user");
    h5::File f = h5::open_file(out);
    BOOST_CHECK_EQUAL(h5::read_attr_int(f, "/", "step"), 1);
    BOOST_CHECK(h5::read_all<int64_t>(f, "/keys") == want.keys);
    BOOST_CHECK(h5::read_all<float>(f, "/values") == want.values);
    BOOST_CHECK(h5::read_all<float>(f, "/state") == want.state);
    BOOST_CHECK(h5::shape(f, "/state") == (std::vector<hsize_t>{1000, 64}));
  }
  Outcome bad_table = ckpt_program("export " + root + " --table nope --out " + root + "/nope.h5");
  BOOST_CHECK_EQUAL(bad_table.status, 1);
  BOOST_CHECK_MESSAGE(contains(bad_table.output, "table 'nope'") && contains(bad_table.output, "user, item"),
                      bad_table.output);
  BOOST_CHECK(!fs::exists(root + "/nope.h5"));
  BOOST_CHECK_EQUAL(ckpt_program("frobnicate " + root).status, 2);

  // One flipped byte in a shard: verify and export fail, naming the file.
  {
    std::fstream f(root + "/step-2/shard-1-of-2.h5", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100000);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(100000);
    f.write(&c, 1);
  }
  Outcome bad = ckpt_program("verify " + root);
  BOOST_CHECK_EQUAL(bad.status, 1);
  BOOST_CHECK_MESSAGE(contains(bad.output, "BAD  shard-1-of-2.h5") && contains(bad.output, "checksum mismatch") &&
                          contains(bad.output, "verify: 1 problem(s)"), bad.output);
  Outcome bad_export = ckpt_program("export " + root + " --table item --out " + root + "/item.h5");
  BOOST_CHECK_EQUAL(bad_export.status, 1);
  BOOST_CHECK_MESSAGE(contains(bad_export.output, "shard-1-of-2.h5: checksum mismatch"), bad_export.output);
  // The intact step still loads with its exact content, onto one rank.
  Outcome c = writer(1, "check " + root + "/step-1 --rows 500");
  BOOST_CHECK_MESSAGE(c.status == 0 && contains(c.output, "check: ok"), c.output);
  testing::remove_tree(root);
}

BOOST_AUTO_TEST_CASE(a_disk_that_fills_at_the_end_of_a_save_leaves_latest_whole) {
  // As reported on a 4 MiB tmpfs: step 1 of 2000 rows, then step 2 of about 2760 rows on 2 ranks, the disk full
  // near the end of the save (the last data bytes, the manifest, `latest`). The writer must fail cleanly (exit 2,
  // no crash at exit), `latest` must still name step 1, and no step-2 may be left.
  std::string dir = testing::temp_path("ckpt", "full_disk"), root = dir + "/ckpt", scratch = dir + "/scratch";
  for (const std::string& r : {root, scratch}) {
    Outcome w = writer(2, "write " + r + " --steps 1 --rows 2000");
    BOOST_REQUIRE_MESSAGE(w.status == 0, w.output);
  }
  Outcome m = writer(2, "write " + scratch + " --first-step 2 --steps 1 --rows 2760 --count-bytes");
  BOOST_REQUIRE_MESSAGE(m.status == 0, m.output);
  size_t at = m.output.find("rank 0 wrote ");
  BOOST_REQUIRE_MESSAGE(at != std::string::npos, m.output);
  const long long total = std::stoll(m.output.substr(at + 13));
  BOOST_TEST_MESSAGE("rank 0 writes " << total << " bytes in a save of step 2");
  // Short by: part of `latest` ("step-2\n" is 7 bytes), all of it, part of the manifest, more of it, and the
  // end of the dense file; then one budget that is enough.
  for (long long short_by : {1LL, 3LL, 7LL, 8LL, 200LL, 3000LL, 12000LL, 0LL}) {
    BOOST_TEST_CONTEXT("rank 0's disk full " << short_by << " bytes before the end of the save") {
      Outcome w = writer(2, "write " + root + " --first-step 2 --steps 1 --rows 2760 --write-budget " +
                                std::to_string(total - short_by));
      CheckpointList list = list_checkpoints(root);
      if (short_by == 0) {
        BOOST_CHECK_MESSAGE(w.status == 0, w.output);
        BOOST_CHECK_EQUAL(list.latest, 2);
      } else {
        BOOST_CHECK_MESSAGE(w.status == 2 && contains(w.output, "No space left on device"), "status " << w.status
                                                                                                   << ":\n" << w.output);
        BOOST_CHECK_EQUAL(list.latest, 1);
        BOOST_CHECK(list.steps == std::vector<int64_t>{1});
        BOOST_CHECK(list.incomplete.empty());
      }
      Outcome v = ckpt_program("verify " + root);
      BOOST_CHECK_MESSAGE(v.status == 0 && contains(v.output, "verify: ok"), v.output);
    }
  }
  Outcome c = writer(1, "check " + root + " --rows 2760");
  BOOST_CHECK_MESSAGE(c.status == 0 && contains(c.output, "check: ok"), c.output);
  testing::remove_tree(dir);
}

// Every byte of every file of a step is covered: one bit flipped at any of 200 sampled positions of each file (every
// position of a smaller file, the first and the last byte always) makes verify refuse the step naming that file, and
// a few of them make a load refuse it too. The step verifies again once the byte is put back.
BOOST_AUTO_TEST_CASE(a_flipped_bit_anywhere_in_a_step_is_refused) {
  std::string root = testing::temp_path("ckpt", "sweep"), step = root + "/step-1";
  Outcome w = writer(2, "write " + root + " --steps 1 --rows 200");
  BOOST_REQUIRE_MESSAGE(w.status == 0, w.output);
  BOOST_REQUIRE(verify_checkpoint(step).ok());
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(step)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  BOOST_CHECK((files == std::vector<std::string>{"dense.h5", "manifest.h5", "manifest.xxh64", "shard-0-of-2.h5",
                                                 "shard-1-of-2.h5"}));
  for (const std::string& name : files) {
    const std::string path = step + "/" + name;
    const uint64_t size = fs::file_size(path);
    std::set<uint64_t> positions{0, size - 1};
    if (size <= 200) {
      for (uint64_t p = 0; p < size; ++p) positions.insert(p);
    } else {
      while (positions.size() < 202) positions.insert(testing::rng()() % size);
    }
    size_t accepted = 0, loads = 0;
    for (uint64_t p : positions) {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(std::streamoff(p));
      const char was = static_cast<char>(f.get());
      f.seekp(std::streamoff(p));
      f.put(static_cast<char>(was ^ (1 << (testing::rng()() % 8))));
      f.flush();
      std::string why;
      try {
        VerifyReport r = verify_checkpoint(step);
        if (!r.ok()) why = r.problems.front();
      } catch (const Error& e) {
        why = e.what();
      }
      if (why.empty() || !contains(why, name)) {
        ++accepted;
        BOOST_ERROR(name << " byte " << p << " flipped: " << (why.empty() ? "accepted" : "refused without naming it: " + why));
      }
      if (loads < 2 && p > 0) {  // a load (what resume and predict do) refuses it as well
        ++loads;
        Outcome c = writer(1, "check " + step + " --rows 200");
        BOOST_CHECK_MESSAGE(c.status != 0 && contains(c.output, name), name << " byte " << p << ":\n" << c.output);
      }
      f.seekp(std::streamoff(p));
      f.put(was);
    }
    BOOST_TEST_MESSAGE(name << ": " << positions.size() << " positions flipped, " << accepted << " accepted");
  }
  BOOST_CHECK(verify_checkpoint(step).ok());
  testing::remove_tree(root);
}
