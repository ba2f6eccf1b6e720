#include "runtime/session.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/error.h"

namespace regolith {

Engine::Engine(std::shared_ptr<const Qwen4ExpModel> model, std::unique_ptr<Backend> backend, DType gdn_state)
    : model_(std::move(model)), backend_(std::move(backend)), gdn_state_(gdn_state) {
  if (gdn_state != DType::F32 && gdn_state != DType::BF16)
    fail("engine: the GDN state is kept in f32 or bf16, not ", dtype_name(gdn_state));
}

std::shared_ptr<Engine> Engine::open(const std::string& model_path, const BackendOptions& backend) {
  auto be = make_backend(backend);
  return std::make_shared<Engine>(Qwen4ExpModel::load(model_path), std::move(be), backend.gdn_state);
}

std::shared_ptr<Engine> Engine::open(const std::string& model_path, std::string_view backend) {
  return open(model_path, BackendOptions{.name = std::string(backend)});
}

Session::Session(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {
  for (auto& inputs : mailboxes_) inputs = engine_->backend().mailbox(engine_->model().queued_inputs_bytes());
  reset();
}

Session::~Session() {
  try {
    drop_queued();
  } catch (const std::exception&) {  // a destructor does not throw; the device error shows elsewhere
  }
}

void Session::reset() {
  drop_queued();
  state_ = engine_->model().new_state(engine_->backend(), engine_->gdn_state());
  tokens_.clear();
  verified_.tokens.clear();
}

void Session::drop_queued() {
  // The device would wait for this token forever.
  if (awaits_token() && queued_.back().inputs) engine_->model().give_queued_token(state_, *queued_.back().inputs, 0);
  queued_.clear();
}

void Session::queue_step() {
  if (awaits_token()) fail("queue_step: the queued step has no token yet");
  if (mtp_) fail("queue_step: a session that drafts with MTP decodes with draft_mtp and verify");
  if (queued_.size() == 2) fail("queue_step: two steps are in flight; take the older one's logits first");
  const Qwen4ExpModel& model = engine_->model();
  Backend& be = engine_->backend();
  QueuedStep step;
  if (HostMailbox* inputs = mailboxes_[steps_queued_ % 2].get()) {
    step.inputs = inputs;
    try {
      step.logits = be.read_later(model.forward_queued(be, state_, *step.inputs, trace_));
    } catch (const std::exception&) {
      model.give_queued_token(state_, *step.inputs, 0);  // what was issued must not wait forever
      throw;
    }
  }
  ++steps_queued_;
  queued_.push_back(std::move(step));
}

void Session::give_token(int32_t token) {
  if (!awaits_token()) fail("give_token: no queued step waits for a token");
  QueuedStep& step = queued_.back();
  const Qwen4ExpModel& model = engine_->model();
  if (step.inputs) {
    model.give_queued_token(state_, *step.inputs, token);
  } else {
    Backend& be = engine_->backend();
    step.logits = be.read_later(model.forward(be, state_, std::span(&token, 1), LogitRows::Last, trace_));
  }
  tokens_.push_back(token);
  step.given = true;
}

std::span<const float> Session::step_logits() {
  if (queued_.empty() || !queued_.front().given) fail("step_logits: no step has its token");
  read_ = std::move(queued_.front().logits);
  queued_.pop_front();
  return read_->wait();
}

std::vector<float> eval_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens) {
  if (sessions.empty()) fail("eval_batch: no sessions");
  Engine& engine = *sessions.front()->engine_;
  std::vector<Qwen4ExpState*> states;
  for (Session* s : sessions) {
    if (s->engine_.get() != &engine) fail("eval_batch: sessions of different engines");
    if (s->awaits_token()) fail("eval_batch: a queued step waits for its token");
    states.push_back(&s->state_);
  }
  Backend& be = engine.backend();
  const bool mtp = std::any_of(sessions.begin(), sessions.end(), [](const Session* s) { return s->mtp_; });
  Tensor wide;
  // Checks the tokens and repeats.
  Tensor logits = engine.model().forward_batch(be, states, tokens, {}, mtp ? &wide : nullptr);
  for (size_t i = 0; i < sessions.size(); ++i) {
    Session& s = *sessions[i];
    s.queued_.clear();  // as eval(): given steps nobody read are followed by this one
    s.verified_.tokens.clear();
    s.tokens_.push_back(tokens[i]);
    if (s.mtp_) s.mtp_wait(wide.slice(1, static_cast<int64_t>(i), 1));
  }
  return be.read_f32(logits);
}

// The largest chunk whose activations fit in a quarter of the memory at hand: the device pool
// rounds large buffers up to a power of two, and other sessions share the memory.
int64_t Session::chunk_for(int64_t n, const EvalOptions& options) const {
  if (options.chunk > 0) return options.chunk;
  if (n <= 1) return 1;  // a decode step asks the backend nothing (a device's free memory costs a driver call)
  std::optional<uint64_t> memory = options.memory_limit
                                       ? std::optional<uint64_t>(options.memory_limit)
                                       : engine_->backend().memory_available();
  if (!memory) return n;
  const uint64_t budget = *memory / 4;
  const LogitRows rows = options.all_logits ? LogitRows::All : LogitRows::Last;
  const Qwen4ExpModel& model = engine_->model();
  int64_t lo = 1, hi = n;  // forward_bytes grows with T: the largest T within budget, at least 1
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (model.forward_bytes(mid, rows) <= budget)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

std::vector<float> Session::eval(std::span<const int32_t> tokens, const EvalOptions& options) {
  if (options.chunk < 0) fail("eval: negative chunk size");
  if (awaits_token()) fail("eval: a queued step waits for its token");
  queued_.clear();  // given steps whose logits nobody read: the forward below follows them
  verified_.tokens.clear();  // verified tokens not taken back are kept
  Backend& be = engine_->backend();
  int64_t V = engine_->n_vocab(), n = static_cast<int64_t>(tokens.size());
  const int64_t chunk = chunk_for(n, options);
  std::vector<float> out;
  LogitRows rows = options.all_logits ? LogitRows::All : LogitRows::Last;
  for (int64_t i = 0; i < n; i += chunk) {
    auto part = tokens.subspan(i, std::min(chunk, n - i));
    auto t0 = std::chrono::steady_clock::now();
    Tensor logits = forward(part, rows);
    if (options.issue_seconds)
      *options.issue_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Without all_logits only the last chunk's row is kept.
    if (options.read_logits && (options.all_logits || i + chunk >= n)) {
      std::vector<float> l = be.read_f32(logits);
      if (out.empty())
        out = std::move(l);  // a decode step's 1 MB row is not copied again
      else
        out.insert(out.end(), l.begin(), l.end());
    }
  }
  const int64_t rows_read = !options.read_logits ? 0 : options.all_logits ? n : std::min<int64_t>(n, 1);
  if (static_cast<int64_t>(out.size()) != rows_read * V)
    fail("eval: got ", out.size(), " logits for ", n, " tokens of a ", V, "-token vocabulary");
  return out;
}

SessionSnapshot Session::snapshot() const {
  if (awaits_token()) fail("snapshot: a queued step waits for its token");
  SessionSnapshot s;
  s.state_ = state_.clone(engine_->backend());
  s.tokens_ = tokens_;
  return s;
}

void Session::restore(const SessionSnapshot& snapshot) {
  drop_queued();
  state_ = snapshot.state_.clone(engine_->backend());
  tokens_ = snapshot.tokens_;
  verified_.tokens.clear();
}

Tensor Session::forward(std::span<const int32_t> tokens, LogitRows rows, Qwen4ExpVerifyRecord* record) {
  Backend& be = engine_->backend();
  Tensor wide;
  Tensor logits = engine_->model().forward(be, state_, tokens, rows, trace_, mtp_ ? &wide : nullptr, record);
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  if (mtp_) mtp_wait(wide);
  return logits;
}

void Session::mtp_wait(const Tensor& wide) {
  Backend& be = engine_->backend();
  Tensor& waiting = state_.mtp_waiting;
  if (waiting.empty()) {
    waiting = wide;
  } else {
    Tensor both = be.alloc_output(DType::F32, {wide.ne(0), waiting.ne(1) + wide.ne(1), 1, 1});
    be.copy(waiting, 0, both, 0, waiting.n_elements());
    be.copy(wide, 0, both, waiting.n_elements(), wide.n_elements());
    waiting = both;
  }
  if (waiting.ne(1) > kMaxMtpWaiting) mtp_cells(nullptr, nullptr);
}

Tensor Session::mtp_cells(const int32_t* next, Tensor* wide_out) {
  Qwen4ExpState& st = state_;
  const int64_t waiting = st.n_past - st.mtp_n_past;
  if (waiting < 0 || waiting != (st.mtp_waiting.empty() ? 0 : st.mtp_waiting.ne(1)))
    fail("MTP: the layer's cache does not follow this session's timeline (", st.mtp_n_past, " cells, ", n_past(),
         " tokens); a session drafts with MTP from its first token on");
  const int64_t cells = next ? waiting : waiting - 1;
  if (cells <= 0) return {};
  const auto first = tokens_.begin() + st.mtp_n_past + 1;  // the token after the first waiting position
  std::vector<int32_t> after(first, first + (next ? cells - 1 : cells));
  if (next) after.push_back(*next);
  const Tensor cells_wide = cells == waiting ? st.mtp_waiting : st.mtp_waiting.slice(1, 0, cells);
  Tensor rest = cells == waiting ? Tensor() : st.mtp_waiting.slice(1, cells, waiting - cells);
  Backend& be = engine_->backend();
  Tensor logits = engine_->model().mtp_forward(be, st, cells_wide, after, next != nullptr, wide_out, trace_);
  st.mtp_waiting = rest;
  return logits;
}

void Session::enable_mtp() {
  const Qwen4ExpModel& model = engine_->model();
  if (const std::string why = model.mtp_problem(); !why.empty()) fail("MTP drafting: ", why);
  if (state_.n_past > 0) fail("MTP drafting is enabled before the first token (the session has ", n_past(), ")");
  mtp_ = true;
}

std::vector<int32_t> Session::draft_mtp(int32_t next, int64_t n) {
  if (!mtp_) fail("draft_mtp: MTP drafting is not enabled on this session");
  if (awaits_token()) fail("draft_mtp: a queued step waits for its token");
  if (!verified_.tokens.empty()) fail("draft_mtp: the verified tokens are neither kept nor taken back yet");
  if (n_past() == 0) fail("draft_mtp: no token evaluated yet");
  if (n < 0) fail("draft_mtp: ", n, " drafts");
  if (n == 0) return {};
  const Qwen4ExpModel& model = engine_->model();
  Backend& be = engine_->backend();
  // Cells up to the last evaluated position are the real ones; the chained cells after it write
  // cache slots that the next real cells overwrite.
  const int64_t real_cells = state_.n_past;
  // Each draft is chosen where its logits are and read by the next cell there: the host reads the
  // n ids once, at the end.
  Tensor ids = be.alloc(DType::I32, {n, 1, 1, 1});
  Tensor wide;
  Tensor logits = mtp_cells(&next, &wide);
  for (int64_t k = 0;; ++k) {
    Tensor id = ids.slice(0, k, 1);
    be.argmax(logits, id);
    if (k + 1 == n) break;
    logits = model.mtp_forward_by(be, state_, wide, id, &wide, trace_);
  }
  state_.mtp_n_past = real_cells;
  return be.read_i32(ids);
}

std::vector<float> Session::verify(std::span<const int32_t> tokens) {
  if (tokens.empty()) fail("verify: no tokens");
  if (awaits_token()) fail("verify: a queued step waits for its token");
  if (!verified_.tokens.empty()) fail("verify: the verified tokens are neither kept nor taken back yet");
  queued_.clear();
  Tensor logits = forward(tokens, LogitRows::All, &verified_);
  return engine_->backend().read_f32(logits);
}

void Session::keep_verified(int64_t m) {
  if (verified_.tokens.empty()) fail("keep_verified: no tokens were verified");
  engine_->model().keep_verified(engine_->backend(), state_, verified_, m);
  tokens_.resize(static_cast<size_t>(state_.n_past));
  verified_.tokens.clear();
}

}  // namespace regolith
