// io/synthetic: option resolution and its errors, samples as a pure function of (seed, index), key
// distributions (range, hotness, power law), the AUC functions, the planted teacher's AUC, and the
// sparta-datagen program under mpiexec (same file for 1 and 2 ranks; bad options end the job).
#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "src/base/check.h"
#include "io/dataset.h"
#include "io/h5.h"
#include "io/synthetic.h"
#include "tests/testing.h"

using namespace sparta;

namespace {

std::string error_of(const SyntheticOptions& o) {
  try {
    make_synthetic_config(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

void check_has(const std::string& m, const std::vector<std::string>& needles) {
  for (auto& n : needles) BOOST_CHECK_MESSAGE(m.find(n) != std::string::npos, "'" << n << "' missing in: " << m);
}

using Outcome = testing::CommandResult;

// sparta-datagen under mpiexec with a 120 s limit.
Outcome run(const std::string& args, int ranks) {
  return testing::run_command(testing::tool_command("../bin/sparta-datagen", ranks, args, 120));
}

}  // namespace

BOOST_AUTO_TEST_CASE(options_resolve_presets_and_reject_bad_values) {
  SyntheticOptions o;
  o.preset = "mlperf";
  o.samples = 10;
  SyntheticConfig c = make_synthetic_config(o);
  BOOST_CHECK_EQUAL(c.num_slots(), 26);
  BOOST_CHECK_EQUAL(c.num_dense, 13);
  BOOST_CHECK_EQUAL(c.cardinality[0], 39884406);
  BOOST_CHECK_EQUAL(c.cardinality[25], 36);
  o.max_rows = 1000;
  o.slots = 30;
  o.hotness = "2-5";
  o.alpha = "0.9";
  c = make_synthetic_config(o);
  BOOST_CHECK_EQUAL(c.num_slots(), 30);
  BOOST_CHECK_EQUAL(c.cardinality[0], 1000);
  BOOST_CHECK_EQUAL(c.cardinality[5], 3);
  BOOST_CHECK_EQUAL(c.cardinality[26], 1000);  // the list repeats
  BOOST_CHECK_EQUAL(c.hotness_min[7], 2);
  BOOST_CHECK_EQUAL(c.hotness_max[7], 5);
  BOOST_CHECK_EQUAL(synthetic_schema(c).hotness[7], 5);
  BOOST_CHECK_EQUAL(c.alpha[29], 0.9);
  o = SyntheticOptions();
  o.slots = 3;
  o.hotness = "1,2-3,4";
  o.alpha = "0,1,1.3";
  c = make_synthetic_config(o);
  BOOST_CHECK(c.hotness_min == (std::vector<int64_t>{1, 2, 4}));
  BOOST_CHECK(c.hotness_max == (std::vector<int64_t>{1, 3, 4}));
  BOOST_CHECK(c.alpha == (std::vector<double>{0, 1, 1.3}));
  BOOST_CHECK(c.describe().find("hotness=1,2-3,4") != std::string::npos);

  SyntheticOptions bad = o;
  bad.preset = "huge";
  check_has(error_of(bad), {"--preset", "'huge'"});
  bad = o;
  bad.hotness = "1,2";
  check_has(error_of(bad), {"--hotness", "3 (one per slot)", "found 2"});
  bad = o;
  bad.hotness = "x";
  check_has(error_of(bad), {"--hotness", "expected an integer", "'x'"});
  bad = o;
  bad.hotness = "4-2";
  check_has(error_of(bad), {"--hotness", "'4-2'"});
  bad = o;
  bad.alpha = "-1";
  check_has(error_of(bad), {"--alpha", "found -1"});
  bad = o;
  bad.num_dense = 0;
  check_has(error_of(bad), {"--num-dense", "found 0"});
  bad = o;
  bad.samples = -5;
  check_has(error_of(bad), {"--samples"});
}

BOOST_AUTO_TEST_CASE(samples_are_a_function_of_seed_and_index) {
  SyntheticOptions o;
  o.samples = 1000;
  o.hotness = "0-3";
  o.seed = testing::seed();
  SyntheticConfig c = make_synthetic_config(o);
  Teacher t(c);
  SampleBlock whole, parts;
  std::vector<float> pw, pp;
  generate_samples(c, t, 0, 1000, whole, &pw);
  int64_t cut = testing::random_ints(1, 1, 999)[0];
  generate_samples(c, t, 0, cut, parts, &pp);
  generate_samples(c, t, cut, 1000 - cut, parts, &pp);
  BOOST_CHECK(whole.labels == parts.labels);
  BOOST_CHECK(whole.dense == parts.dense);
  BOOST_CHECK(whole.offsets == parts.offsets);
  BOOST_CHECK(whole.keys == parts.keys);
  BOOST_CHECK(pw == pp);
  // A second teacher of the same config agrees; another seed gives other data.
  Teacher t2(c);
  SampleBlock again;
  generate_samples(c, t2, 0, 1000, again);
  BOOST_CHECK(again.labels == whole.labels && again.keys == whole.keys);
  c.seed += 1;
  Teacher t3(c);
  SampleBlock other;
  generate_samples(c, t3, 0, 1000, other);
  BOOST_CHECK(other.dense != whole.dense);
  BOOST_CHECK(other.keys != whole.keys);
}

BOOST_AUTO_TEST_CASE(keys_follow_cardinality_hotness_and_power_law) {
  SyntheticOptions o;
  o.samples = 20000;
  o.slots = 3;
  o.hotness = "1,2-4,1";
  o.alpha = "1.1,0.9,0";
  o.max_rows = 5000;
  o.seed = testing::seed();
  SyntheticConfig c = make_synthetic_config(o);
  Teacher t(c);
  SampleBlock b;
  generate_samples(c, t, 0, c.num_samples, b);
  DatasetSchema s = synthetic_schema(c);
  check_offsets(s, "generated", 0, b.size(), b.offsets.data(), static_cast<int64_t>(b.keys.size()));
  check_values(s, "generated", 0, view_of(b));
  std::vector<std::map<int64_t, int64_t>> freq(3);
  std::map<int64_t, int64_t> counts;
  for (int64_t i = 0; i < b.size(); ++i)
    for (int64_t slot = 0; slot < 3; ++slot) {
      int64_t lo = b.offsets[i * 3 + slot], hi = b.offsets[i * 3 + slot + 1];
      if (slot == 1) counts[hi - lo]++;
      for (int64_t k = lo; k < hi; ++k) freq[slot][b.keys[k]]++;
    }
  BOOST_CHECK_EQUAL(counts.size(), 3u);  // 2, 3 and 4 keys all occur, nothing else
  BOOST_CHECK(counts.count(2) && counts.count(3) && counts.count(4));
  // Power law: the most frequent keys are the smallest, and the head holds much of the mass.
  for (int slot : {0, 1}) {
    int64_t total = 0, head = 0;
    for (auto& kv : freq[slot]) total += kv.second, head += kv.first < 50 ? kv.second : 0;
    BOOST_CHECK_GT(freq[slot][0], freq[slot][10]);
    BOOST_CHECK_GT(freq[slot][10], freq[slot][1000]);
    BOOST_CHECK_MESSAGE(head > total / 3, "slot " << slot << ": keys < 50 hold " << head << " of " << total);
  }
  // alpha 0: uniform over 200 keys (preset small, slot 2 has cardinality 50000 capped to 5000).
  int64_t head = 0;
  for (auto& kv : freq[2]) head += kv.first < 50 ? kv.second : 0;
  BOOST_CHECK_LT(head, 20000 / 50);  // expected 20000 * 50/5000 = 200
  BOOST_CHECK_GT(static_cast<int64_t>(freq[2].size()), 3000);
}

BOOST_AUTO_TEST_CASE(auc_functions) {
  BOOST_CHECK_EQUAL(exact_auc({0.1f, 0.2f, 0.8f, 0.9f}, {0, 0, 1, 1}), 1.0);
  BOOST_CHECK_EQUAL(exact_auc({0.9f, 0.8f, 0.2f, 0.1f}, {0, 0, 1, 1}), 0.0);
  BOOST_CHECK_EQUAL(exact_auc({0.5f, 0.5f, 0.5f, 0.5f}, {0, 1, 0, 1}), 0.5);
  BOOST_CHECK_CLOSE(exact_auc({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}), 0.75, 1e-9);
  std::vector<float> scores = testing::random_floats(5000, 0, 1), labels;
  for (float s : testing::random_floats(5000, 0, 1)) labels.push_back(s < 0.3f ? 1.f : 0.f);
  AucHistogram h;
  for (size_t i = 0; i < scores.size(); ++i) h.add(scores[i], labels[i]);
  BOOST_CHECK_CLOSE(h.auc(), exact_auc(scores, labels), 0.05);
}

BOOST_AUTO_TEST_CASE(teacher_auc_is_well_above_chance) {
  SyntheticOptions o;
  o.samples = 20000;
  o.hotness = "1-3";
  o.seed = testing::seed();
  SyntheticConfig c = make_synthetic_config(o);
  Teacher t(c);
  SampleBlock b;
  std::vector<float> probs;
  generate_samples(c, t, 0, c.num_samples, b, &probs);
  double auc = exact_auc(probs, b.labels);
  BOOST_TEST_MESSAGE("teacher AUC " << auc);
  BOOST_CHECK_GT(auc, 0.75);
  AucHistogram h;
  for (size_t i = 0; i < probs.size(); ++i) h.add(probs[i], b.labels[i]);
  BOOST_CHECK_CLOSE(h.auc(), auc, 0.05);
  // The sparse features carry signal: the teacher's probability with the keys of another sample scores worse.
  std::vector<float> swapped;
  for (int64_t i = 0; i < b.size(); ++i) {
    int64_t j = (i + 1) % b.size();
    std::vector<int64_t> off(c.num_slots() + 1);
    for (int64_t s = 0; s <= c.num_slots(); ++s) off[s] = b.offsets[j * c.num_slots() + s] - b.offsets[j * c.num_slots()];
    double z = t.logit(b.dense.data() + i * c.num_dense, off.data(), b.keys.data() + b.offsets[j * c.num_slots()]);
    swapped.push_back(static_cast<float>(1 / (1 + std::exp(-z))));
  }
  BOOST_CHECK_LT(exact_auc(swapped, b.labels), auc - 0.1);
  double rate = 0;
  for (float l : b.labels) rate += l;
  rate /= b.size();
  BOOST_CHECK(rate > 0.1 && rate < 0.6);
}

BOOST_AUTO_TEST_CASE(sparta_datagen_same_file_for_1_and_2_ranks) {
  testing::ScopedPath file1("synthetic", "1.h5"), file2("synthetic", "2.h5");
  std::string args = "--samples 3000 --chunk 256 --hotness 1-2 --slots 5 --gzip 1 --fletcher32 --seed " +
                     std::to_string(testing::seed() % 1000000);
  Outcome a = run(args + " --out " + file1.path, 1);
  Outcome b = run(args + " --out " + file2.path, 2);
  BOOST_TEST_MESSAGE(a.output << b.output);
  BOOST_CHECK_EQUAL(a.status, 0);
  BOOST_CHECK_EQUAL(b.status, 0);
  if (a.status == 0 && b.status == 0) {
    h5::File fa = h5::open_file(file1.path), fb = h5::open_file(file2.path);
    DatasetSchema sa = read_schema(fa), sb = read_schema(fb);
    BOOST_CHECK_EQUAL(sa.num_samples, 3000);
    BOOST_CHECK_EQUAL(sa.teacher_auc, sb.teacher_auc);
    BOOST_CHECK_GT(sa.teacher_auc, 0.7);
    BOOST_CHECK_EQUAL(sa.generator, sb.generator);
    BOOST_CHECK(h5::read_all<float>(fa, "/label") == h5::read_all<float>(fb, "/label"));
    BOOST_CHECK(h5::read_all<float>(fa, "/dense") == h5::read_all<float>(fb, "/dense"));
    BOOST_CHECK(h5::read_all<int64_t>(fa, "/sparse/offsets") == h5::read_all<int64_t>(fb, "/sparse/offsets"));
    BOOST_CHECK(h5::read_all<int64_t>(fa, "/sparse/keys") == h5::read_all<int64_t>(fb, "/sparse/keys"));
  }
}

BOOST_AUTO_TEST_CASE(sparta_datagen_bad_input_ends_the_job) {
  Outcome o = run("--samples 100 --hotness 3-1 --out /tmp/never.h5", 2);
  BOOST_CHECK_NE(o.status, 0);
  BOOST_CHECK_MESSAGE(o.status != 124 && o.status != 137, "sparta-datagen hung");
  check_has(o.output, {"--hotness", "'3-1'"});
  o = run("--samples 100 --out /nonexistent_dir_sparta/x.h5", 2);
  BOOST_CHECK_NE(o.status, 0);
  BOOST_CHECK_MESSAGE(o.status != 124 && o.status != 137, "sparta-datagen hung");
  check_has(o.output, {"/nonexistent_dir_sparta/x.h5", "cannot create"});
  o = run("--samples 100 --out /tmp/never.h5 --bogus", 2);
  BOOST_CHECK_NE(o.status, 0);
  check_has(o.output, {"bogus"});
}
