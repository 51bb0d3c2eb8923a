// trainer.h: DLRM / DCNv2 training, one rank per device, the embeddings model-parallel (src/embedding_collection.h)
// and the dense model data-parallel (src/model.h).
//
// One step, on the device's compute stream unless said otherwise:
//   1. the reader's batch (this rank's slice of the global batch, read ahead on a thread) → device: copied on a
//      stream of its own into one of two device batches while the step before trains (stage / take below)
//   2. embedding forward (collective): [local_batch, slots * dim] pooled embeddings
//   3. dense forward, BCE over the global batch (each rank's loss is its sum / global batch size, so the sum
//      over ranks is the mean and the summed gradients are the global batch's)
//   4. dense backward; each gradient bucket (top MLP, cross network, bottom MLP) is all-reduced as soon as
//      backward has queued it, on a second stream (cuda), so the all-reduce of the top MLP runs while the
//      interaction and the bottom MLP compute their gradients
//   5. embedding backward (collective): the pooled gradients travel back to the rows' owners, which update the
//      touched rows with the sparse optimizer
//   6. the compute stream waits for the all-reduce; the dense optimizer steps with the scheduled learning rate
// fp16 precision adds dynamic loss scaling (src/loss_scale.h): the loss gradient is scaled before 4; after the
// all-reduce one kernel unscales the dense gradients and the embedding gradient and flags any overflow, the
// host reads the flag (one int, the step's one extra sync) and agrees it over ranks, and an overflowed step
// skips 5 and the optimizer step on every rank (it still counts as a step).
// Losses stay on the device and are all-reduced once per log interval, so a step syncs the host only where
// the embedding exchange needs counts.
//
// Determinism: every rank count, placement and plan gives the same model up to the order of floating-point
// sums (the all-reduce, a row's gradients summed per rank then over ranks); the same rank count and plan give
// the same bits, so a run resumed from a checkpoint continues the uninterrupted run's trajectory exactly.
//
// Checkpoints (io/checkpoint.h) hold the tables' rows and optimizer state, every dense tensor by name (model.h
// parts) and the dense optimizer's state, and the configuration as INI text; the step says where the reader
// resumes (epoch = step / batches per epoch, batch = step % batches per epoch, the shuffle being a function of
// the seed and the epoch). Loading takes another rank count and another plan.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "io/checkpoint.h"
#include "io/reader.h"
#include "src/base/buffer.h"
#include "src/context.h"
#include "src/loss_scale.h"
#include "src/metrics.h"
#include "src/model.h"
#include "src/placement.h"
#include "src/train_config.h"

namespace sparta {

class Communicator;
class EmbeddingCollection;

struct TrainResult {
  int64_t first_step = 0;            // the step this run started from (a resumed checkpoint's, else 0)
  int64_t last_step = 0;             // the step it ended at
  std::vector<double> losses;        // the global batch's mean loss of every step this run made, in order
  std::vector<std::pair<int64_t, EvalMetrics>> evals;  // (step, metrics) of every evaluation
  bool reached_target = false;       // stopped early at train.target_auc
  bool stopped_early = false;        // stopped by train.patience
  int64_t best_step = -1;            // the evaluation with the best train.best_metric (-1: none)
  double best_value = 0;             // its value
  double teacher_auc = -1;           // the eval file's recorded teacher AUC (synthetic data), else -1
  std::string checkpoint;            // the last step directory written ("" when none)
  std::vector<int64_t> skipped_steps;  // fp16: the steps skipped for an overflow, in order
  double loss_scale = 1;             // fp16: the loss scale at the end (1 otherwise)
};

// What the trainer is built for: training (both readers), or predicting on the eval file (the model loaded
// from a checkpoint; no training reader, no optimizer step).
enum class TrainerMode { train, predict };

class Trainer {
 public:
  // Collective over world (MPI_COMM_WORLD in the programs; tests train on sub-communicators of several sizes in
  // one job), whose topology (comm/topology.h) and this rank's device are given. Opens the datasets and checks
  // them against the configuration (slots, dense features, sizes), plans the tables (rank 0 prints the plan and
  // the memory of every rank), builds the collection and the model, and loads `load_from` (a checkpoint root or
  // step directory; "" with cfg.resume: cfg.checkpoint_dir). Any error on any rank throws sparta::Error on every
  // rank, before any work.
  Trainer(MPI_Comm world, const Topology& topo, const Device& dev, const TrainConfig& cfg,
          TrainerMode mode = TrainerMode::train, const std::string& load_from = "");
  // Benchmarks: batches come from memory (timed_step), not from files. schema gives the data's shape and
  // cardinalities, sample one batch of this rank's (its keys plan the tables); batches may hold up to
  // sample.size samples. Collective, errors as above.
  Trainer(MPI_Comm world, const Topology& topo, const Device& dev, const TrainConfig& cfg, const DatasetSchema& schema,
          const Batch& sample, int64_t global_batch);
  // The same over MPI_COMM_WORLD with the context's topology and device.
  Trainer(const Context& ctx, const TrainConfig& cfg, TrainerMode mode = TrainerMode::train,
          const std::string& load_from = "");
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Collective. Trains to train.steps (or the epochs), evaluating, logging and checkpointing as configured.
  TrainResult run();

  // Collective. Predicts every sample of the eval file (or its first data.eval_samples); rank 0 gets them in
  // file order with their labels, the others an empty set.
  Predictions predict();

  // Benchmarks: one training step on b (this rank's slice of a global batch of global_batch samples) with the host
  // waiting after every phase, so each can be timed: data (host → device), embedding (the collection's forward
  // and backward), dense (the model's forward, loss, backward and the optimizer), comm (the dense gradients'
  // all-reduce, as one bucket). Slower than a training step, whose phases overlap. Milliseconds.
  struct StepTimes {
    double data_ms = 0, embedding_ms = 0, dense_ms = 0, comm_ms = 0;
    double total_ms() const { return data_ms + embedding_ms + dense_ms + comm_ms; }
  };
  StepTimes timed_step(const Batch& b, int64_t global_batch);
  // Benchmarks: n training steps exactly as run() takes them (phases overlapping, the dense gradients all-reduced
  // in buckets behind the backward), step i on batches[i % batches.size()], the host waiting only at the end.
  // Milliseconds per step.
  double plain_steps(const std::vector<const Batch*>& batches, int64_t global_batch, int64_t n);

  // The configuration with the dataset's shapes filled in (what checkpoints record).
  const TrainConfig& config() const { return cfg_; }
  int64_t step() const { return step_; }
  const Plan& plan() const { return plan_; }
  // Pieces of the dense model replayed as CUDA graphs so far (train.cuda_graphs; src/base/graph.h).
  int64_t graph_replays() const;
  double teacher_auc() const { return teacher_auc_; }
  // The dense parameters on the host (synchronizes).
  std::vector<float> dense_params();
  // Collective: every rank's held embedding rows of table t (tests).
  TableRows held_rows(int table);
  // The step's timeline, for diagnostics (bench_train --trace): the embedding collection's points
  // (EmbeddingCollection::trace) and the dense stream's, on one clock; read_trace waits for them.
  void trace(bool on);
  std::vector<StreamClock::Point> read_trace();

 private:
  void agree(const std::string& error, const char* what = nullptr) const;  // agree_on_error over world
  void open_datasets(TrainerMode mode);
  void set_shapes(const std::string& option, const std::string& path);  // the model's shape from schema_
  void standardize_dense();  // data.normalize: the training file's statistics into the readers
  void set_dense_transform(const std::vector<float>& mean, const std::vector<float>& scale);
  void build_collection(const Batch& sample, int64_t global_batch);
  void build_rest(const std::string& load_from);  // comm, collection, model, buffers, then load_from
  void report_memory() const;
  void load(const std::string& path);
  std::string save();
  // Batches on the device, two, so that the next batch is copied in while the current one trains (cuda: on
  // copy_stream_, from the reader's pinned memory). stage(b) queues b's copies into a device batch that no
  // staged batch waits in, after the work that last read it; the host keeps b's memory unchanged until
  // copies_done(). take(b) gives the device batch holding b to work about to be queued (the one staged for b,
  // else b staged now): both compute streams wait for its copies, its labels and dense features are copied into
  // labels_ and dense_ (the model reads them from there: fixed pointers, so its CUDA graphs replay), and the
  // embeddings' stream waits for the compute stream's work so far (the step before, which reads the same
  // activations: after a training step, only its part that reads the embeddings, emb_done_at_). release(d), once
  // the work reading d is queued: d may be refilled after it.
  struct DeviceBatch {
    Buffer<float> labels, dense;     // [B], [B, num_dense]
    Buffer<int64_t> offsets, keys;   // [B*slots + 1], [most keys of a local batch]
    StreamEvent copied;              // copy_stream_: the end of the copies into it
    StreamEvent read;                // compute stream: the end of the last work that read it
  };
  void stage(const Batch& b);
  DeviceBatch& take(const Batch& b);
  void release(DeviceBatch& d);
  void copies_done();                // the host waits for every queued copy
  void forget_staged();              // a staged batch that no step will take (and its route ahead)
  // One training step on b, a slice of a global batch of global_batch samples; its loss goes to loss_slot.
  // next (optional), called once b is taken: gives the next step's batch staged (stage()), or null; the
  // collection routes it while this step's dense layers run (route_next). b's memory
  // may change once next is called (the reader's next()).
  // look_ahead: the next batch's lookups may be queued at the end of this step (EmbeddingCollection::
  // look_up_ahead), i.e. no evaluation or checkpoint comes before its step.
  using NextBatch = std::function<const Batch*()>;
  void train_step(const Batch& b, int64_t step, int64_t global_batch, float* loss_slot, const NextBatch& next = {},
                  bool look_ahead = false);
  // EmbeddingCollection::route_ahead of the staged batch nb, on the embeddings' stream after its copies.
  void route_next(const Batch& nb);
  void reduce_bucket(size_t offset, size_t count);
  void join_grad_stream();  // cuda, several ranks: the compute stream waits for the gradient all-reduce
  // fp16, after backward: unscales grads_ and demb_ (batch rows), agrees over ranks whether any overflowed and
  // updates the scaler. Returns whether the step's updates are applied. Synchronizes the host.
  bool unscale_gradients(int64_t batch);
  EvalMetrics evaluate_now();
  Predictions predict_local();
  std::vector<DenseTensor> dense_tensors();
  ModelSpec model_spec() const;
  std::vector<double> flush_losses(int64_t n);  // all-reduces and downloads the interval's losses
  // run()'s parts (src/trainer.cpp "the loop"): Run is what they share.
  struct Run;
  Run start_run();
  const Batch* fetch(Run& run);
  std::string checkpoint_once(Run& run);
  void log_interval(Run& run);
  bool evaluate_and_select(Run& run);
  TrainResult finish_run(Run& run, bool stopped);
  void write_metrics(const std::string& line);

  MPI_Comm world_comm_;
  const Topology& topo_;
  TrainConfig cfg_;
  Device dev_;
  int rank_ = 0, world_ = 1;
  bool predicting_ = false;  // TrainerMode::predict: messages name sparta-predict's options
  std::vector<float> dense_mean_, dense_scale_;  // data.normalize: x -> (x - mean) * scale
  std::unique_ptr<DatasetReader> train_, eval_;
  DatasetSchema schema_;
  double teacher_auc_ = -1;
  std::unique_ptr<Communicator> comm_;
  CollectionConfig collection_cfg_;
  Plan plan_;
  std::unique_ptr<EmbeddingCollection> collection_;
  std::unique_ptr<DenseModel> model_;
  int64_t max_batch_ = 0;
  Buffer<float> params_, grads_, state_;          // [P], [P], [dense optimizer state]
  Buffer<float> labels_, dense_, emb_, demb_;     // [B], [B, num_dense], [B, slots*dim] x2 (in_x0: no emb_)
  // DCNv2 in 16 bits: the collection writes the embeddings into the model's x0_half() (src/model.h), not emb_.
  bool in_x0() const;
  void* emb_out();             // where the collection's forward writes
  const float* model_forward(int64_t batch, int64_t train_step);  // the model's forward of the embeddings there
  DeviceBatch batches_[2];
  int fill_ = 0;                                  // the device batch stage() fills next (unless staged_ waits there)
  const Batch* staged_ = nullptr;                 // the host batch staged into batches_[staged_at_], not yet taken
  int staged_at_ = 0;
  int ahead_at_ = -1;                             // the device batch the collection routed ahead (-1: none)
  // cuda: the end of the compute stream's last read of the embeddings' output in the last training step (the
  // model's inputs_read); take() orders the next forward after it instead of after all the step's work, when
  // emb_done_.
  StreamEvent emb_done_at_;
  bool emb_done_ = false;
  SideStream copy_stream_;                        // cuda: the batches' copies
  Buffer<float> losses_, probs_;                  // [log_every], [B]
  int64_t step_ = 0;
  std::set<int64_t> verified_steps_;  // checkpoint steps known to verify (train.keep_last counts them)
  SideStream grad_stream_;                        // cuda: where the gradient all-reduce runs
  // cuda: the embedding collection runs on its own stream, so that its backward (and the host waits inside it)
  // overlaps the dense model's weight gradients; emb_dev_ is dev_ with that stream (cpu: dev_ itself).
  Device emb_dev_;
  SideStream emb_stream_;
  void wait_for_embeddings();  // dev_.stream waits for the work queued on emb_stream_ so far
  void embeddings_wait();      // emb_stream_ waits for the work queued on dev_.stream so far
  void synchronize_all();      // both streams (fault-aware)
  std::ofstream metrics_;
  std::unique_ptr<LossScaler> scaler_;            // fp16 only
  Buffer<int> nonfinite_;                         // fp16: [1], the overflow flag
  std::vector<int64_t> skipped_;                  // fp16: the steps skipped
};

}  // namespace sparta
