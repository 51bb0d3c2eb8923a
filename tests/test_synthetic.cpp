// io/synthetic: option resolution and its errors, samples as a pure function of (seed, index), key
// distributions (range, hotness, power law), the AUC functions, the planted teacher's AUC, the teacher seed
// (splits of one task share a teacher; a file's recorded settings rebuild it, old files included), and the
// sparta-datagen program under mpiexec (same file for 1 and 2 ranks; bad options end the job; a rank that
// fails while generating ends every rank promptly with its message).
#include <hdf5.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdlib>
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

// The samples of a dataset file, as written.
SampleBlock read_samples(const std::string& path) {
  h5::File f = h5::open_file(path);
  DatasetSchema s = read_schema(f);
  SampleBlock b;
  b.num_dense = s.num_dense;
  b.num_slots = s.num_slots;
  b.labels = h5::read_all<float>(f, "/label");
  b.dense = h5::read_all<float>(f, "/dense");
  b.offsets = h5::read_all<int64_t>(f, "/sparse/offsets");
  b.keys = h5::read_all<int64_t>(f, "/sparse/keys");
  return b;
}

// The exact AUC of teacher t's noise-free probability on the samples of b.
double auc_of_teacher(const Teacher& t, const SampleBlock& b) {
  const int64_t S = b.num_slots;
  std::vector<float> probs;
  std::vector<int64_t> off(S + 1);
  for (int64_t i = 0; i < b.size(); ++i) {
    const int64_t k0 = b.offsets[i * S];
    for (int64_t s = 0; s <= S; ++s) off[s] = b.offsets[i * S + s] - k0;
    const double z = t.logit(b.dense.data() + i * b.num_dense, off.data(), b.keys.data() + k0);
    probs.push_back(static_cast<float>(1 / (1 + std::exp(-z))));
  }
  return exact_auc(probs, b.labels);
}

bool same_samples(const SampleBlock& a, const SampleBlock& b) {
  return a.labels == b.labels && a.dense == b.dense && a.offsets == b.offsets && a.keys == b.keys;
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
  o.teacher_seed = testing::seed() ^ 0x5a5a5a;
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
  // Every rank sees the mistake together, so the job ends with the message and status 1, not MPI_Abort.
  for (const std::string& args : {std::string("--samples 100 --hotness 3-1 --out /tmp/never.h5"),
                                  std::string("--samples 100 --out /nonexistent_dir_sparta/x.h5"),
                                  std::string("--samples 100 --out /tmp/never.h5 --bogus")})
    for (int ranks : {1, 2}) {
      Outcome o = run(args, ranks);
      BOOST_CHECK_MESSAGE(o.status == 1, args << ", " << ranks << " rank(s): exit status " << o.status << ", expected 1");
      BOOST_CHECK_MESSAGE(o.output.find("Abort(") == std::string::npos, args << ": aborted:\n" << o.output);
      check_has(o.output, {"sparta-datagen: "});
      if (args.find("3-1") != std::string::npos) check_has(o.output, {"--hotness", "'3-1'"});
      if (args.find("nonexistent") != std::string::npos) check_has(o.output, {"/nonexistent_dir_sparta/x.h5", "cannot create"});
      if (args.find("bogus") != std::string::npos) check_has(o.output, {"bogus"});
    }
}

BOOST_AUTO_TEST_CASE(the_teacher_is_a_function_of_the_teacher_seed_only) {
  SyntheticOptions o;
  o.samples = 3000;
  o.hotness = "1-3";
  o.seed = testing::seed();
  o.teacher_seed = testing::seed() * 31 + 5;
  SyntheticConfig a = make_synthetic_config(o);
  SyntheticConfig b = a;
  b.seed = a.seed + 1;  // another split of the same task
  SyntheticConfig other = a;
  other.teacher_seed = a.teacher_seed + 1;  // another task, same samples stream seed
  SampleBlock sa, sb;
  generate_samples(a, Teacher(a), 0, a.num_samples, sa);
  generate_samples(b, Teacher(b), 0, b.num_samples, sb);
  BOOST_CHECK(sa.dense != sb.dense && sa.keys != sb.keys);  // other samples
  // On every sample, the teachers of two splits give the same logit; another teacher seed gives another.
  Teacher ta(a), tb(b), tother(other);
  std::vector<int64_t> off(a.num_slots() + 1);
  double max_same = 0, corr_xy = 0, xx = 0, yy = 0;
  for (int64_t i = 0; i < sb.size(); ++i) {
    const int64_t k0 = sb.offsets[i * a.num_slots()];
    for (int64_t s = 0; s <= a.num_slots(); ++s) off[s] = sb.offsets[i * a.num_slots() + s] - k0;
    const float* d = sb.dense.data() + i * a.num_dense;
    const double za = ta.logit(d, off.data(), sb.keys.data() + k0), zb = tb.logit(d, off.data(), sb.keys.data() + k0);
    const double zo = tother.logit(d, off.data(), sb.keys.data() + k0);
    max_same = std::max(max_same, std::fabs(za - zb));
    corr_xy += (za - a.teacher_bias) * (zo - a.teacher_bias);
    xx += (za - a.teacher_bias) * (za - a.teacher_bias);
    yy += (zo - a.teacher_bias) * (zo - a.teacher_bias);
  }
  BOOST_CHECK_EQUAL(max_same, 0.0);
  const double corr = corr_xy / std::sqrt(xx * yy);
  BOOST_TEST_MESSAGE("logit correlation of two teacher seeds: " << corr);
  BOOST_CHECK_LT(std::fabs(corr), 0.2);
  // The dense distributions belong to the task: a split's feature means match, another task's do not.
  auto mean_of = [](const SampleBlock& blk, int64_t j) {
    double m = 0;
    for (int64_t i = 0; i < blk.size(); ++i) m += blk.dense[i * blk.num_dense + j];
    return m / blk.size();
  };
  SampleBlock so;
  generate_samples(other, tother, 0, other.num_samples, so);
  int differ = 0;
  for (int64_t j = 0; j < a.num_dense; ++j) {
    BOOST_CHECK_CLOSE(mean_of(sa, j), mean_of(sb, j), 5.0);  // 3000 samples: well within 5 %
    differ += std::fabs(mean_of(sa, j) - mean_of(so, j)) > 0.1 * std::fabs(mean_of(sa, j));
  }
  BOOST_CHECK_GE(differ, a.num_dense / 2);
}

// Train and eval files from sparta-datagen with one teacher seed: the train file's recorded settings rebuild
// a teacher that scores the eval file at the eval file's recorded teacher AUC; a file of another teacher
// seed is not scored better than chance.
BOOST_AUTO_TEST_CASE(a_file_s_teacher_scores_another_split_at_its_recorded_auc) {
  testing::ScopedPath train("synthetic", "train.h5"), eval("synthetic", "eval.h5"), other("synthetic", "other.h5");
  const unsigned long long teacher = testing::seed() % 1000003 + 11, s1 = testing::seed() % 999983 + 1;
  const std::string args = "--samples 6000 --chunk 500 --hotness 1,1-3,1,2,1,1,1,1-2 --alpha 1.05 --max-rows 20000";
  auto gen = [&](const std::string& out, unsigned long long tseed, unsigned long long seed) {
    Outcome r = run(args + " --teacher-seed " + std::to_string(tseed) + " --seed " + std::to_string(seed) +
                        " --out " + out, 2);
    BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  };
  gen(train.path, teacher, s1);
  gen(eval.path, teacher, s1 + 1);
  gen(other.path, teacher + 1, s1 + 1);

  DatasetSchema st = read_schema(train.path), se = read_schema(eval.path), so = read_schema(other.path);
  BOOST_REQUIRE(st.seed && st.teacher_seed && se.seed && se.teacher_seed);
  BOOST_CHECK_EQUAL(*st.seed, s1);
  BOOST_CHECK_EQUAL(*st.teacher_seed, teacher);
  BOOST_CHECK_EQUAL(*se.seed, s1 + 1);
  BOOST_CHECK_EQUAL(*se.teacher_seed, teacher);
  BOOST_CHECK_EQUAL(*so.teacher_seed, teacher + 1);
  check_compatible(st, train.path, se, eval.path);

  SyntheticConfig ct = recorded_config(st, train.path);
  BOOST_CHECK_EQUAL(ct.seed, s1);
  BOOST_CHECK_EQUAL(ct.teacher_seed, teacher);
  Teacher t(ct);
  SampleBlock be = read_samples(eval.path), bt = read_samples(train.path);
  BOOST_CHECK(!same_samples(be, bt));
  // The recorded AUC comes from a histogram of 2^18 bins: within 0.002 of the exact one.
  const double on_eval = auc_of_teacher(t, be);
  BOOST_TEST_MESSAGE("train teacher on eval: " << on_eval << ", eval's recorded " << se.teacher_auc);
  BOOST_CHECK_GT(se.teacher_auc, 0.7);
  BOOST_CHECK_SMALL(on_eval - se.teacher_auc, 0.002);
  BOOST_CHECK_SMALL(auc_of_teacher(t, bt) - st.teacher_auc, 0.002);
  // Another teacher seed is another task: the train teacher is near chance on it.
  const double on_other = auc_of_teacher(t, read_samples(other.path));
  BOOST_TEST_MESSAGE("train teacher on another teacher's file: " << on_other << ", its recorded " << so.teacher_auc);
  BOOST_CHECK_GT(so.teacher_auc, 0.7);
  BOOST_CHECK_LT(on_other, so.teacher_auc - 0.15);
  BOOST_CHECK_SMALL(on_other - 0.5, 0.1);
  // The recorded settings regenerate the file exactly.
  SyntheticConfig ce = recorded_config(se, eval.path);
  SampleBlock again;
  generate_samples(ce, Teacher(ce), 0, ce.num_samples, again);
  BOOST_CHECK(same_samples(again, be));
}

// A file written before teacher seeds (no seed or teacher_seed attribute, no teacher_seed= in its generator
// attribute) had one seed for everything: it reads back with teacher seed = seed and regenerates exactly.
BOOST_AUTO_TEST_CASE(old_files_without_a_teacher_seed_use_the_seed) {
  testing::ScopedPath f("synthetic", "old.h5");
  const unsigned long long seed = testing::seed() % 999331 + 3;
  Outcome r = run("--samples 700 --slots 3 --hotness 1-2 --seed " + std::to_string(seed) + " --teacher-seed " +
                      std::to_string(seed) + " --out " + f.path, 1);
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  const std::string key = " teacher_seed=" + std::to_string(seed);
  {
    h5::File h = h5::open_file(f.path, true);
    std::string gen = h5::read_attr_string(h, "/", "generator");
    BOOST_REQUIRE(gen.find(key) != std::string::npos);
    gen.erase(gen.find(key), key.size());
    h5::write_attr(h, "/", "generator", gen);
    BOOST_REQUIRE(H5Adelete(h.id(), "seed") >= 0 && H5Adelete(h.id(), "teacher_seed") >= 0);
  }
  DatasetSchema s = read_schema(f.path);
  BOOST_CHECK(!s.seed && !s.teacher_seed);
  SyntheticConfig c = recorded_config(s, f.path);
  BOOST_CHECK_EQUAL(c.seed, seed);
  BOOST_CHECK_EQUAL(c.teacher_seed, seed);
  SampleBlock want;
  generate_samples(c, Teacher(c), 0, c.num_samples, want);
  BOOST_CHECK(same_samples(want, read_samples(f.path)));
  // Recorded settings that contradict each other, or a file that is not synthetic, are errors naming it.
  h5::write_attr(h5::open_file(f.path, true), "/", "teacher_seed", static_cast<int64_t>(seed + 1));
  h5::write_attr(h5::open_file(f.path, true), "/", "seed", static_cast<int64_t>(seed + 1));
  std::string m = "no error";
  try {
    recorded_config(read_schema(f.path), f.path);
  } catch (const Error& e) {
    m = e.what();
  }
  check_has(m, {f.path, "attribute 'seed'", std::to_string(seed + 1)});
  DatasetSchema plain = s;
  plain.generator.clear();
  m = "no error";
  try {
    recorded_config(plain, "plain.h5");
  } catch (const Error& e) {
    m = e.what();
  }
  check_has(m, {"plain.h5", "generator", "expected a synthetic file"});
}

// A rank that fails while generating (planted by tests/tool_datagen_fail) ends every rank's
// generate_dataset with the same Error: caught, the ranks stay in step (a barrier after it completes); left
// to the program's top, the job ends promptly with the message printed once (rank 0's, naming the failing rank)
// and exit status 1 (every rank raised it together, so no MPI_Abort). Never by the time limit.
BOOST_AUTO_TEST_CASE(one_failing_rank_ends_every_rank_promptly) {
  testing::ScopedPath f("synthetic", "fail.h5");
  for (int ranks : {2, 3, 4})
    for (int failing : {ranks - 1, 0})
      for (std::string mode : {"catch", "exit"}) {
        const int round = failing == 0 ? 0 : 2;
        Outcome o = testing::run_command(testing::tool_command(
            "tool_datagen_fail", ranks,
            std::to_string(failing) + " " + std::to_string(round) + " " + f.path + " " + mode, 60));
        BOOST_TEST_MESSAGE(o.output);
        const std::string where = std::to_string(ranks) + " ranks, rank " + std::to_string(failing) + " failing, " + mode;
        BOOST_CHECK_MESSAGE(o.status != 124 && o.status != 137, where << ": the job hung");
        BOOST_CHECK_MESSAGE(o.status == 1, where << ": exit status " << o.status << ", expected 1");
        BOOST_CHECK_MESSAGE(o.output.find("Abort(") == std::string::npos, where << ": aborted");
        const std::string msg = (mode == "catch" ? "caught: rank " : "tool_datagen_fail: rank ") +
                                std::to_string(failing) + ": planted failure while generating round " +
                                std::to_string(round) + " on rank " + std::to_string(failing);
        if (mode == "catch") {  // the tool prints what every rank caught
          for (int r = 0; r < ranks; ++r)
            BOOST_CHECK_MESSAGE(o.output.find(":" + std::to_string(r) + "] " + msg) != std::string::npos,
                                where << ": rank " << r << " did not report '" << msg << "' in:\n" << o.output);
        } else {  // at the program's top, an error every rank raised together is printed once, naming the rank
          size_t n = 0;
          for (size_t at = o.output.find(msg); at != std::string::npos; at = o.output.find(msg, at + 1)) ++n;
          BOOST_CHECK_MESSAGE(n == 1, where << ": '" << msg << "' printed " << n << " times, expected once:\n" << o.output);
        }
      }
}

// make demo's data (experiments/demo.sh, run from the repository root as the test runner does): train and
// eval are two splits of one task, so the train file's teacher scores eval at eval's recorded AUC.
BOOST_AUTO_TEST_CASE(the_demo_s_train_and_eval_share_a_teacher) {
  const char* tools = std::getenv("SPARTA_TOOLS");
  const char* mpiexec = std::getenv("SPARTA_MPIEXEC");
  const std::string build = std::string(tools ? tools : "build/tests") + "/..";
  BOOST_REQUIRE_MESSAGE(std::system("test -f experiments/demo.sh") == 0, "run from the repository root");
  testing::ScopedPath data("synthetic", "demo");
  Outcome r = testing::run_command("DEMO_DATA=" + data.path + " timeout -k 5 300 bash experiments/demo.sh " + build +
                                   " '" + (mpiexec ? mpiexec : "mpiexec") + "' 2");
  BOOST_TEST_MESSAGE(r.output);
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  const std::string train = data.path + "/train.h5", eval = data.path + "/eval.h5";
  DatasetSchema st = read_schema(train), se = read_schema(eval);
  BOOST_REQUIRE(st.seed && se.seed && st.teacher_seed && se.teacher_seed);
  BOOST_CHECK_EQUAL(*st.teacher_seed, *se.teacher_seed);
  BOOST_CHECK_NE(*st.seed, *se.seed);
  check_compatible(st, train, se, eval);
  const double on_eval = auc_of_teacher(Teacher(recorded_config(st, train)), read_samples(eval));
  BOOST_TEST_MESSAGE("demo: train teacher on eval " << on_eval << ", eval's recorded " << se.teacher_auc);
  BOOST_CHECK_SMALL(on_eval - se.teacher_auc, 0.002);
}
