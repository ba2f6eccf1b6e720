// The engine API the CLI and server use: an Engine (an immutable model plus the backend that runs
// it) and Sessions (one sequence each: every piece of per-sequence state, with checkpoints).
// Callers pass token ids and get logits back; they never see a tensor.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/ops.h"
#include "model/qwen4exp.h"

namespace regolith {

class Engine {
 public:
  Engine(std::shared_ptr<const Qwen4ExpModel> model, std::unique_ptr<Backend> backend,
         DType gdn_state = DType::F32);
  static std::shared_ptr<Engine> open(const std::string& model_path, const BackendOptions& backend = {});
  static std::shared_ptr<Engine> open(const std::string& model_path, std::string_view backend);

  const Qwen4ExpModel& model() const { return *model_; }
  Backend& backend() const { return *backend_; }
  DType gdn_state() const { return gdn_state_; }  // F32 or BF16 (BackendOptions::gdn_state)
  int64_t n_vocab() const { return model_->hparams().n_vocab; }

 private:
  std::shared_ptr<const Qwen4ExpModel> model_;
  std::unique_ptr<Backend> backend_;
  DType gdn_state_;
};

struct EvalOptions {
  // Tokens per forward call; 0: as many as the memory allows (Model::forward_bytes against a
  // quarter of the backend's free memory, or of memory_limit; all at once when the backend cannot
  // tell), 1: token by token.
  int64_t chunk = 0;
  uint64_t memory_limit = 0;  // when set, the bytes chunk 0 plans with instead of the backend's free memory
  bool all_logits = true;   // logits of every token, or only of the last one
  // When set, receives the seconds the host spent issuing the forward passes, before it waited for
  // the logits: on an asynchronous backend, how close decode is to being bound by launching work.
  double* issue_seconds = nullptr;
  // False: no logits come back (an empty result), so nothing waits for the forward passes and, on an
  // asynchronous backend, the next eval's work queues behind them (bench's queued decode).
  bool read_logits = true;
};

// A complete copy of a Session's state at one point of its timeline.
class SessionSnapshot {
 private:
  friend class Session;
  Qwen4ExpState state_;
  std::vector<int32_t> tokens_;
};

class Session;

// One decode step of several sessions of one engine in one forward pass: session i takes
// tokens[i]. Returns logits row-major [sessions][n_vocab]. As eval() of that token in each
// session (within the backend's rounding: the products run over all the tokens at once). No session
// may have a step waiting for its token, nor appear twice.
std::vector<float> eval_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens);

class Session {
 public:
  explicit Session(std::shared_ptr<Engine> engine);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Appends tokens to the timeline; returns logits row-major [rows][n_vocab] (every token, or the last).
  std::vector<float> eval(std::span<const int32_t> tokens, const EvalOptions& options = {});

  // Decode with the next step issued ahead: queue_step() issues the forward pass of the next
  // position before its token is known, give_token() supplies the token, step_logits() waits for
  // the logits of the oldest given step. On a backend that queues work (mailbox()) the host issues
  // a step while the device still runs the one before, and the device starts it as soon as its
  // token is given; elsewhere give_token() runs it. At most two steps are in flight, and only the
  // newest may lack its token:
  //   queue_step(); give_token(t0);
  //   loop: queue_step(); logits = step_logits(); give_token(sample(logits));
  // A step left without its token is given token 0 by reset(), restore() and the destructor (its
  // state is dropped); eval() and snapshot() refuse to run past it. eval() drops the logits of
  // given steps not yet read. A backend's mailboxes are made with the session: a session made
  // while another's queued step waits for its token could otherwise wait for the device forever.
  void queue_step();
  void give_token(int32_t token);
  std::span<const float> step_logits();  // [n_vocab], valid until the next step_logits()
  bool awaits_token() const { return !queued_.empty() && !queued_.back().given; }
  bool has_unread_step() const { return !queued_.empty() && queued_.front().given; }

  // ---- speculative decoding (src/spec/speculative.h drives it) ----
  // verify() evaluates a token and the drafts after it, returning the logits of every one, and
  // records what keep_verified(m) needs to keep the first m (at least the token) and take the rest
  // back without evaluating anything again (Qwen4ExpVerifyRecord).
  std::vector<float> verify(std::span<const int32_t> tokens);
  void keep_verified(int64_t m);
  // With the model's MTP head (model-spec §4.10), enabled before the first token: eval(), verify()
  // and eval_batch then keep the trunk's residual of every position whose MTP cell waits, and run
  // the cells whose next token is known in one pass once more than kMaxMtpWaiting wait;
  // draft_mtp(next, n) returns n draft tokens after `next` (the token chosen from the last logits,
  // not yet evaluated): the cells of the positions still waiting, then n − 1 cells each on the one
  // before's output residual and draft. Queued steps refuse such a session (they would leave its
  // MTP cache behind).
  void enable_mtp();
  std::vector<int32_t> draft_mtp(int32_t next, int64_t n);

  int64_t n_past() const { return state_.n_past; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  SessionSnapshot snapshot() const;
  void restore(const SessionSnapshot& snapshot);  // the snapshot stays valid for later restores
  void reset();
  void set_trace(TraceFn trace) { trace_ = std::move(trace); }

 private:
  friend std::vector<float> eval_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens);
  int64_t chunk_for(int64_t n, const EvalOptions& options) const;
  void drop_queued();  // gives a step that lacks its token token 0, then forgets every queued step
  // The trunk forward of `tokens` (with the MTP layer's bookkeeping when enabled) and the timeline.
  Tensor forward(std::span<const int32_t> tokens, LogitRows rows, Qwen4ExpVerifyRecord* record = nullptr);
  // Appends the trunk's residual of the positions just evaluated [W, n] to those whose MTP cells
  // wait; past kMaxMtpWaiting of them, runs the cells whose next token is known in one pass (the
  // residuals of a long prompt or of many steps are not all kept).
  void mtp_wait(const Tensor& wide);
  static constexpr int64_t kMaxMtpWaiting = 32;
  // Runs the MTP cells of the waiting positions whose next token is known (tokens_, then `next`
  // when given): all but the last without `next`. With `next`, returns the last cell's draft
  // logits and puts its output residual in *wide_out.
  Tensor mtp_cells(const int32_t* next, Tensor* wide_out);

  struct QueuedStep {
    std::unique_ptr<PendingRead> logits;
    HostMailbox* inputs = nullptr;  // null: the backend has no mailboxes, the step runs when given
    bool given = false;
  };

  std::shared_ptr<Engine> engine_;
  Qwen4ExpState state_;
  std::vector<int32_t> tokens_;
  TraceFn trace_;
  std::deque<QueuedStep> queued_;  // oldest first
  std::array<std::unique_ptr<HostMailbox>, 2> mailboxes_;  // a step's inputs, used in turn; null: none
  int64_t steps_queued_ = 0;
  std::unique_ptr<PendingRead> read_;  // the last step_logits()'s values
  bool mtp_ = false;
  Qwen4ExpVerifyRecord verified_;  // the last verify(); its tokens until they are kept or taken back
};

}  // namespace regolith
