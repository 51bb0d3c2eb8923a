// test_slurm_job: experiments/slurm/train.sbatch, the job script README shows, run as Slurm would run it (in the
// submit directory, with SLURM_* set) through an `srun` stand-in that starts its program under this build's
// mpiexec with SLURM_NTASKS ranks: sparta-info and a short training run on a tiny synthetic dataset must
// finish, the script must exit with the trainer's status (0, then 1 for a bad option), and it must refuse a
// missing build. Runs from the repository root (make test).
#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/testing.h"

namespace fs = std::filesystem;

namespace {

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

std::string tools_dir() {
  const char* t = std::getenv("SPARTA_TOOLS");
  return t ? t : "build/tests";
}
std::string bin_dir() { return fs::absolute(tools_dir() + "/../bin").lexically_normal().string(); }
std::string mpiexec() {
  const char* m = std::getenv("SPARTA_MPIEXEC");
  return m ? m : "mpiexec";
}

testing::CommandResult run(const std::string& cmd, int timeout_s = 300) {
  return testing::run_command("timeout -k 5 " + std::to_string(timeout_s) + " " + cmd);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(slurm_job)

BOOST_AUTO_TEST_CASE(train_sbatch_runs_sparta_train_under_srun, *boost::unit_test::timeout(600)) {
  BOOST_REQUIRE_MESSAGE(fs::exists("experiments/slurm/train.sbatch"), "run from the repository root");
  testing::ScopedPath dir("slurm_job", "job");
  fs::create_directories(dir.path + "/fakebin");
  // srun: drop srun's own options, count the tasks from SLURM_NTASKS, start the program under mpiexec.
  {
    std::ofstream f(dir.path + "/fakebin/srun");
    f << "#!/bin/bash\nwhile [ $# -gt 0 ]; do case $1 in --*) shift;; *) break;; esac; done\n"
      << "echo \"srun: $SLURM_NTASKS tasks: $1\"\nexec " << mpiexec() << " -n \"$SLURM_NTASKS\" \"$@\"\n";
  }
  fs::permissions(dir.path + "/fakebin/srun", fs::perms::owner_all);
  const std::string data = dir.path + "/train.h5";
  testing::CommandResult r = run(mpiexec() + " -n 2 " + bin_dir() + "/sparta-datagen --preset small --max-rows 100 "
                                 "--samples 4096 --out " + data, 120);
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  const std::string env = "env PATH=\"" + dir.path + "/fakebin:$PATH\" SLURM_SUBMIT_DIR=\"" + fs::current_path().string() +
                          "\" SLURM_NTASKS=2 SLURM_NNODES=1 SLURM_JOB_ID=42 SPARTA_BIN=" + bin_dir() + " ";
  const std::string train = " --device cpu --data.train " + data + " --data.global_batch 512 --train.steps 4 "
                            "--model.embedding_dim 8 --model.bottom_mlp 16,8 --model.top_mlp 16,1 "
                            "--train.metrics " + dir.path + "/metrics.jsonl";
  r = run(env + "bash experiments/slurm/train.sbatch" + train, 300);
  BOOST_CHECK_MESSAGE(r.status == 0, r.output);
  BOOST_CHECK_MESSAGE(contains(r.output, "srun: 2 tasks") && contains(r.output, "exited with status 0"), r.output);
  BOOST_CHECK_MESSAGE(fs::exists(dir.path + "/metrics.jsonl"), "no metrics written:\n" << r.output);
  // The job's status is the trainer's.
  r = run(env + "bash experiments/slurm/train.sbatch" + train + " --no-such.option 1", 300);
  BOOST_CHECK_MESSAGE(r.status == 1 && contains(r.output, "exited with status 1"), r.output);
  // No build where SPARTA_BIN points: a clear refusal before srun.
  r = run("env PATH=\"" + dir.path + "/fakebin:$PATH\" SLURM_NTASKS=2 SPARTA_BIN=" + dir.path +
          "/nothing bash experiments/slurm/train.sbatch" + train, 60);
  BOOST_CHECK_MESSAGE(r.status == 1 && contains(r.output, "no " + dir.path + "/nothing/sparta-train") &&
                          !contains(r.output, "srun:"),
                      r.output);
}

BOOST_AUTO_TEST_SUITE_END()
