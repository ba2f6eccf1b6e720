#include "server/scheduler.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>

#include "core/error.h"
#include "server/choice_sampler.h"
#include "server/text_stream.h"
#include "tokenizer/tokenizer.h"

namespace regolith::server {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

int64_t ns_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

// How many tokens of `prompt` a session's timeline already holds: all of them or nothing (a
// recurrent state cannot be cut back), and never the whole prompt (its logits are not kept).
int64_t reusable_prefix(const std::vector<int32_t>& timeline, const std::vector<int32_t>& prompt) {
  if (timeline.empty() || timeline.size() >= prompt.size()) return 0;
  return std::equal(timeline.begin(), timeline.end(), prompt.begin()) ? static_cast<int64_t>(timeline.size()) : 0;
}

}  // namespace

// One HTTP request: where its events go and whether its client is still there.
struct Scheduler::Request {
  std::shared_ptr<ResultChannel> results;
  std::shared_ptr<std::atomic<bool>> cancelled;
  Clock::time_point submitted;
};

// One prompt of a request with its n choices. Choice 0 prefills; the others fork from its state.
struct Scheduler::TaskRun {
  std::shared_ptr<Request> request;
  GenerationTask task;
  int choices_left = 0;
  int forks_pending = 0;
  bool failed = false, cancel_counted = false;
  RequestUsage usage;
  Clock::time_point admitted, prompt_done;
  std::shared_ptr<const SessionSnapshot> prompt_snapshot;  // for the forks
  std::vector<float> prompt_logits;                        // the prompt's last row, for the forks
};

// Waiting for a slot: a task's first choice, a fork of its prompt state, or a cache warm-up.
struct Scheduler::Pending {
  std::shared_ptr<TaskRun> task;  // null: warm-up of warm_tokens
  int choice = 0;
  std::vector<int32_t> warm_tokens;
};

struct Scheduler::Sequence {
  std::shared_ptr<TaskRun> task;  // null for a warm-up
  int choice = 0;
  int slot = -1;
  enum class Phase { prefill, decode, commit } phase = Phase::prefill;
  std::vector<int32_t> warm_tokens;
  const std::vector<int32_t>* prompt = nullptr;
  int64_t pos = 0;  // prompt tokens the session holds
  std::unique_ptr<ChoiceSampler> sampler;
  std::unique_ptr<TextStream> text;
  int64_t n_generated = 0;
  int32_t last_token = -1;  // the last token chosen
  std::optional<int32_t> unfed;  // a chosen token the session has not been given: the next batched pass's
  bool done = false;
};

struct Scheduler::BatchEntry {
  Sequence* seq = nullptr;
  std::span<const int32_t> tokens;  // a prompt chunk; empty for a running reply
};

Scheduler::Scheduler(std::shared_ptr<Engine> engine, const Tokenizer& tokenizer, SchedulerOptions options,
                     Metrics& metrics)
    : engine_(std::move(engine)), tokenizer_(tokenizer), options_(options), metrics_(metrics),
      cache_(options.cache_bytes) {
  if (options_.n_slots < 1) fail("--parallel must be at least 1");
  if (options_.chunk < 1) fail("--chunk must be at least 1");
  if (options_.draft < 0) fail("--draft must be at least 0");
  if (options_.draft > 0) check_draft_source(engine_->model(), options_.draft_from);
  options_.step_tokens = std::max(options_.step_tokens, options_.chunk);
  slots_.resize(static_cast<size_t>(options_.n_slots));
  metrics_.slots_total = options_.n_slots;
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::start() {
  running_ = true;
  thread_ = std::thread([this] { loop(); });
}

std::vector<std::vector<int32_t>> Scheduler::persistent_cache_keys() {
  std::unique_lock lock(mutex_);
  if (!running_) return cache_.persistent_keys();
  export_requested_ = true;
  wake_.notify_one();
  exported_.wait(lock, [&] { return !export_requested_ || !running_; });
  if (!running_) return cache_.persistent_keys();
  return std::move(exported_keys_);
}

Scheduler::Admission Scheduler::submit(Submission submission) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return Admission::stopping;
    int n = static_cast<int>(submission.tasks.size());
    int idle_slots = options_.n_slots - static_cast<int>(metrics_.slots_busy.load());
    if (n_queued_.load() + n > options_.max_queue + std::max(idle_slots, 0)) return Admission::queue_full;
    n_queued_ += n;
    metrics_.queue_depth = n_queued_.load();
    incoming_.push_back(std::move(submission));
  }
  wake_.notify_one();
  return Admission::accepted;
}

void Scheduler::warm_up(std::vector<std::vector<int32_t>> prefixes) {
  {
    std::lock_guard lock(mutex_);
    for (auto& p : prefixes) warm_incoming_.push_back(std::move(p));
  }
  wake_.notify_one();
}

void Scheduler::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::loop() {
  while (true) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] {
        return stopping_ || export_requested_ || !incoming_.empty() || !warm_incoming_.empty() || !active_.empty() ||
               !pending_.empty() || !warm_pending_.empty();
      });
      if (export_requested_) {
        exported_keys_ = cache_.persistent_keys();
        export_requested_ = false;
        exported_.notify_all();
      }
      if (stopping_) break;
    }
    try {
      take_incoming();
      drop_cancelled();
      admit();
      if (!active_.empty()) step();
    } catch (const std::exception& e) {  // out of memory in a snapshot, say: fail what runs, keep serving
      for (auto& seq : active_)
        if (!seq->done) fail_sequence(*seq, std::string("internal error: ") + e.what());
      std::erase_if(active_, [](const std::unique_ptr<Sequence>& s) { return s->done; });
    }
    update_gauges();
  }
  // Shutting down: whatever is still running or waiting ends with an error event.
  take_incoming();
  for (auto& seq : active_) {
    if (seq->done) continue;
    if (seq->task) fail_sequence(*seq, "the server is shutting down");
    else release(*seq);
  }
  for (auto& p : pending_)
    if (p->task && !p->task->failed) {
      p->task->failed = true;
      p->task->request->results->push({.kind = ResultEvent::Kind::error, .error = "the server is shutting down"});
    }
  active_.clear();
  pending_.clear();
  n_queued_ = 0;
  update_gauges();
  std::lock_guard lock(mutex_);
  running_ = false;
  exported_.notify_all();
}

void Scheduler::take_incoming() {
  std::vector<Submission> incoming;
  {
    std::lock_guard lock(mutex_);
    incoming.swap(incoming_);
    for (auto& w : warm_incoming_) warm_pending_.push_back(std::move(w));
    warm_incoming_.clear();
  }
  for (Submission& s : incoming) {
    auto request = std::make_shared<Request>(Request{s.results, s.cancelled, s.submitted});
    for (GenerationTask& t : s.tasks) {
      auto run = std::make_shared<TaskRun>();
      run->request = request;
      run->task = std::move(t);
      run->choices_left = run->task.n_choices;
      pending_.push_back(std::make_unique<Pending>(Pending{run, 0, {}}));
    }
  }
}

void Scheduler::drop_cancelled() {
  auto gone = [](const std::shared_ptr<TaskRun>& t) { return t && (t->failed || t->request->cancelled->load()); };
  for (auto& seq : active_)
    if (!seq->done && gone(seq->task)) {
      if (seq->phase != Sequence::Phase::commit && !seq->task->failed && !seq->task->cancel_counted) {
        seq->task->cancel_counted = true;
        ++metrics_.requests_cancelled;
      }
      release(*seq);
    }
  std::erase_if(active_, [](const std::unique_ptr<Sequence>& s) { return s->done; });
  std::erase_if(pending_, [&](const std::unique_ptr<Pending>& p) {
    if (!gone(p->task)) return false;
    if (p->choice == 0) --n_queued_;
    return true;
  });
}

int Scheduler::free_slot() const {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (!slots_[i].busy) return static_cast<int>(i);
  return -1;
}

bool Scheduler::waits_for_commit(const Pending& p) const {
  // The next turn of a conversation whose reply is about to be cached waits one step for it.
  const std::vector<int32_t>& prompt = p.task->task.prompt;
  for (const auto& seq : active_) {
    if (seq->done || seq->phase != Sequence::Phase::commit) continue;
    const std::vector<int32_t>& timeline = session_of(*seq).tokens();
    if (timeline.size() <= prompt.size() && std::equal(timeline.begin(), timeline.end(), prompt.begin()))
      return true;
  }
  return false;
}

int Scheduler::choose_slot(const Pending& p) const {
  // Among free slots, the one whose session already holds the longest prefix of the prompt: a
  // conversation continues in place, without copying a snapshot.
  int best = -1;
  int64_t best_n = -1;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].busy) continue;
    int64_t n = p.task && p.choice == 0 && slots_[i].session ? reusable_prefix(slots_[i].session->tokens(), p.task->task.prompt) : 0;
    if (n > best_n) best = static_cast<int>(i), best_n = n;
  }
  return best;
}

void Scheduler::admit() {
  while (true) {
    if (!pending_.empty()) {
      const Pending& front = *pending_.front();
      if (front.choice == 0 && front.task->task.use_cache && waits_for_commit(front)) break;
      int slot = choose_slot(front);
      if (slot < 0) break;
      std::unique_ptr<Pending> p = std::move(pending_.front());
      pending_.pop_front();
      start_sequence(*p, slot);
      continue;
    }
    int slot = free_slot();
    if (slot >= 0 && !warm_pending_.empty() &&
               std::none_of(active_.begin(), active_.end(), [](const auto& s) { return !s->task; })) {
      Pending p{nullptr, 0, std::move(warm_pending_.front())};
      warm_pending_.pop_front();
      start_sequence(p, slot);
      continue;
    }
    break;
  }
}

void Scheduler::start_sequence(Pending& p, int slot_index) {
  Slot& slot = slots_[static_cast<size_t>(slot_index)];
  if (!slot.session) {
    slot.session = std::make_unique<Session>(engine_);
    if (options_.draft > 0) slot.speculator = make_speculator(*slot.session, options_.draft_from, options_.draft);
  }
  Session& session = *slot.session;
  auto seq = std::make_unique<Sequence>();
  seq->slot = slot_index;
  slot.busy = true;
  ++metrics_.slots_busy;  // at once, not at the end of the step: submit() reads it for the queue limit

  if (!p.task) {  // warm-up: rebuild a persisted prefix's snapshots
    seq->warm_tokens = std::move(p.warm_tokens);
    seq->prompt = &seq->warm_tokens;
    auto hit = cache_.find(seq->warm_tokens, static_cast<int64_t>(seq->warm_tokens.size()));
    if (hit && hit->n_tokens == static_cast<int64_t>(seq->warm_tokens.size())) {
      slot.busy = false;
      --metrics_.slots_busy;
      return;
    }
    if (hit) session.restore(*hit->snapshot), seq->pos = hit->n_tokens;
    else session.reset();
    active_.push_back(std::move(seq));
    return;
  }

  TaskRun& t = *p.task;
  seq->task = p.task;
  seq->choice = p.choice;
  seq->prompt = &t.task.prompt;
  static std::mt19937_64 random_seeds{std::random_device{}()};
  uint64_t seed = t.task.sampling.seed ? *t.task.sampling.seed + static_cast<uint64_t>(p.choice) : random_seeds();
  seq->sampler = std::make_unique<ChoiceSampler>(t.task.sampling, seed, t.task.prompt, t.task.forced_openings,
                                                 t.task.json_vocabulary.get(), t.task.json_schema.get());
  seq->text = std::make_unique<TextStream>(tokenizer_, t.task.stop);
  const int64_t len = static_cast<int64_t>(t.task.prompt.size());

  if (p.choice > 0) {  // a fork: the primary's prompt state and last logits
    session.restore(*t.prompt_snapshot);
    ++metrics_.snapshot_restores;
    seq->pos = len;
    seq->phase = Sequence::Phase::decode;
    std::vector<float> logits = t.prompt_logits;
    if (--t.forks_pending == 0) t.prompt_snapshot.reset(), t.prompt_logits.clear();
    active_.push_back(std::move(seq));
    next_token(*active_.back(), logits);
    return;
  }

  --n_queued_;
  ++metrics_.requests_started;
  t.admitted = Clock::now();
  t.usage.queue_ms = ms_between(t.request->submitted, t.admitted);
  t.forks_pending = t.task.n_choices - 1;
  int64_t cached = 0;
  std::shared_ptr<const std::vector<float>> cached_logits;
  if (t.task.use_cache) {
    // The longest cached prefix (a whole prompt comes with its logits), or else the slot's own
    // timeline when it is a prefix of the prompt: often the previous turn of this conversation.
    int64_t own_n = reusable_prefix(session.tokens(), t.task.prompt);
    auto hit = cache_.enabled() ? cache_.find(t.task.prompt, len) : std::nullopt;
    if (hit && hit->n_tokens > own_n) {
      session.restore(*hit->snapshot);
      ++metrics_.snapshot_restores;
      cached = hit->n_tokens;
      cached_logits = hit->logits;
    } else if (own_n > 0) {
      cached = own_n;
    } else {
      session.reset();
    }
  } else {
    session.reset();
  }
  seq->pos = cached;
  t.usage.prompt_tokens = len;
  t.usage.cached_tokens = cached;
  t.usage.prefilled_tokens = len - cached;
  metrics_.prompt_tokens += len;
  metrics_.cached_tokens += cached;
  active_.push_back(std::move(seq));
  if (cached == len) after_prefill(*active_.back(), *cached_logits);  // nothing to run
}

void Scheduler::step() {
  batched_ = active_.size() >= 2;
  std::vector<BatchEntry> batch;
  int64_t budget = options_.step_tokens;
  for (auto& seq : active_)
    if (seq->phase != Sequence::Phase::prefill) {
      batch.push_back({.seq = seq.get(), .tokens = {}});
      --budget;
    }
  bool any_prefill = false;
  for (auto& seq : active_) {
    if (seq->phase != Sequence::Phase::prefill) continue;
    const int64_t len = static_cast<int64_t>(seq->prompt->size());
    const int64_t end = std::min(len, (seq->pos / options_.chunk + 1) * options_.chunk);
    const int64_t n = end - seq->pos;
    if (any_prefill && n > budget) continue;  // waits for the next step; streams keep flowing
    batch.push_back({.seq = seq.get(), .tokens = std::span<const int32_t>(*seq->prompt).subspan(seq->pos, n)});
    budget -= n;
    any_prefill = true;
  }
  run_batch(batch);
  ++metrics_.steps;
  std::erase_if(active_, [](const std::unique_ptr<Sequence>& s) { return s->done; });
}

// One engine step over all entries: prompt chunks one by one, the replies whose tokens wait
// (unfed) in one forward pass. A reply decoding alone had its step issued (and given its token)
// when the token was chosen; here the next one is issued before its logits are read. Each sequence
// gives the step it issued its token before the loop moves on, so no other session's work is ever
// queued behind a step that waits.
void Scheduler::run_batch(std::vector<BatchEntry>& batch) {
  std::vector<Sequence*> together;
  for (BatchEntry& e : batch) {
    Sequence& seq = *e.seq;
    if (seq.unfed && !batched_ && speculator_of(seq)) {
      speculate(seq);
      continue;
    }
    if (seq.unfed) {
      together.push_back(&seq);
      continue;
    }
    Session& session = session_of(seq);
    auto t0 = Clock::now();
    try {
      switch (seq.phase) {
        case Sequence::Phase::prefill: {
          std::vector<float> logits = session.eval(e.tokens, {.chunk = 0, .all_logits = false});
          metrics_.prefill_ns += ns_since(t0);
          metrics_.prefilled_tokens += static_cast<int64_t>(e.tokens.size());
          seq.pos += static_cast<int64_t>(e.tokens.size());
          after_prefill(seq, logits);
          break;
        }
        case Sequence::Phase::decode: {
          // Not when the next token ends the reply and nothing would feed it, nor when the next
          // token waits for a batched pass.
          if (!batched_ && (seq.n_generated + 1 < seq.task->task.max_tokens || commits(seq))) session.queue_step();
          next_token(seq, session.step_logits());
          metrics_.decode_ns += ns_since(t0);
          break;
        }
        case Sequence::Phase::commit: {
          std::span<const float> logits = session.step_logits();
          snapshot_into_cache(seq, SnapshotPoint::reply_end, std::vector<float>(logits.begin(), logits.end()));
          release(seq);
          break;
        }
      }
    } catch (const std::exception& ex) {
      if (!seq.done) fail_sequence(seq, ex.what());
    }
  }
  if (!together.empty()) step_together(together);
}

void Scheduler::step_together(const std::vector<Sequence*>& seqs) {
  std::vector<Session*> sessions;
  std::vector<int32_t> tokens;
  for (Sequence* seq : seqs) {
    sessions.push_back(&session_of(*seq));
    tokens.push_back(*seq->unfed);
    seq->unfed.reset();
  }
  auto t0 = Clock::now();
  std::vector<float> logits;
  try {
    logits = eval_batch(sessions, tokens);
  } catch (const std::exception& ex) {
    for (Sequence* seq : seqs)
      if (!seq->done) fail_sequence(*seq, ex.what());
    return;
  }
  metrics_.decode_ns += ns_since(t0);
  if (seqs.size() > 1) ++metrics_.batched_steps, metrics_.batched_tokens += static_cast<int64_t>(seqs.size());
  const auto V = static_cast<size_t>(engine_->n_vocab());
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence& seq = *seqs[i];
    std::span<const float> row(logits.data() + i * V, V);
    try {
      if (seq.phase == Sequence::Phase::commit) {
        snapshot_into_cache(seq, SnapshotPoint::reply_end, std::vector<float>(row.begin(), row.end()));
        release(seq);
      } else {
        next_token(seq, row);
      }
    } catch (const std::exception& ex) {
      if (!seq.done) fail_sequence(seq, ex.what());
    }
  }
}

// Every token the round emits goes through next_token (events, stop strings, limits), which leaves
// it unfed: after the round the last one is the next round's first. The walk ends where the reply
// does; a reply that ends with its last token to commit evaluates it here on the next step.
void Scheduler::speculate(Sequence& seq) {
  Session& session = session_of(seq);
  const int32_t next = *seq.unfed;
  seq.unfed.reset();
  auto t0 = Clock::now();
  try {
    if (seq.phase == Sequence::Phase::commit) {
      const std::vector<float> logits = session.eval(std::span(&next, 1));
      snapshot_into_cache(seq, SnapshotPoint::reply_end, logits);
      release(seq);
      return;
    }
    const ChooseToken choose = [&](std::span<const float> logits) {
      next_token(seq, logits);
      return seq.last_token;
    };
    const int64_t limit = seq.task->task.max_tokens - seq.n_generated;
    Speculator& speculator = *speculator_of(seq);
    const SpeculativeStats before = speculator.stats();
    speculator.round(next, choose, limit, [&] { return seq.phase == Sequence::Phase::decode; });
    metrics_.decode_ns += ns_since(t0);
    ++metrics_.draft_rounds;
    metrics_.drafted_tokens += speculator.stats().drafted - before.drafted;
    metrics_.accepted_drafts += speculator.stats().accepted - before.accepted;
  } catch (const std::exception& ex) {
    if (!seq.done) fail_sequence(seq, ex.what());
  }
}

void Scheduler::after_prefill(Sequence& seq, const std::vector<float>& logits) {
  const int64_t len = static_cast<int64_t>(seq.prompt->size());
  if (seq.pos < len) {
    if (seq.pos % options_.chunk == 0) snapshot_into_cache(seq, SnapshotPoint::chunk, logits);
    return;
  }
  if (!seq.task) {  // a warm-up is complete
    snapshot_into_cache(seq, SnapshotPoint::restored_from_disk, logits);
    release(seq);
    return;
  }
  TaskRun& t = *seq.task;
  snapshot_into_cache(seq, SnapshotPoint::prompt_end, logits);
  t.prompt_done = Clock::now();
  t.usage.prefill_ms = ms_between(t.admitted, t.prompt_done);
  if (t.forks_pending > 0) {
    t.prompt_snapshot = std::make_shared<const SessionSnapshot>(session_of(seq).snapshot());
    ++metrics_.snapshots_taken;
    t.prompt_logits = logits;
    for (int c = t.task.n_choices - 1; c >= 1; --c) pending_.push_front(std::make_unique<Pending>(Pending{seq.task, c, {}}));
  }
  seq.phase = Sequence::Phase::decode;
  next_token(seq, logits);
}

void Scheduler::next_token(Sequence& seq, std::span<const float> logits) {
  TaskRun& t = *seq.task;
  const GenerationTask& task = t.task;
  int32_t token = seq.sampler->choose(logits, tokenizer_);
  seq.sampler->accept(token, tokenizer_);
  seq.last_token = token;
  if (!task.ignore_eos && tokenizer_.is_end_of_generation(token)) {
    finish(seq, FinishReason::stop, /*feed_last_token=*/true);
    return;
  }
  ResultEvent e{.kind = ResultEvent::Kind::token, .choice = task.first_choice + seq.choice};
  e.token.token = token;
  if (task.top_logprobs >= 0) fill_logprobs(logits, token, task.top_logprobs, e.token);
  e.token.text = seq.text->push(token);
  ++seq.n_generated;
  ++metrics_.generated_tokens;
  t.request->results->push(std::move(e));
  if (seq.text->stopped()) {
    finish(seq, FinishReason::stop, false);
  } else if (seq.n_generated >= task.max_tokens) {
    finish(seq, FinishReason::length, true);
  } else {
    feed(seq, token);
    seq.phase = Sequence::Phase::decode;
  }
}

void Scheduler::feed(Sequence& seq, int32_t token) {
  Session& session = session_of(seq);
  if (session.awaits_token()) {
    session.give_token(token);
  } else if (batched_ || speculator_of(seq)) {
    seq.unfed = token;
  } else {
    session.queue_step();
    session.give_token(token);
  }
}

void Scheduler::finish(Sequence& seq, FinishReason reason, bool feed_last_token) {
  TaskRun& t = *seq.task;
  ResultEvent e{.kind = ResultEvent::Kind::finished, .choice = t.task.first_choice + seq.choice};
  e.text = seq.text->finish();
  e.finish = reason;
  t.request->results->push(std::move(e));
  t.usage.completion_tokens += seq.n_generated;
  finish_task_choice(t);
  seq.phase = Sequence::Phase::commit;  // answered: a failure from here on sends no error
  // The reply's last token (often the end-of-turn token the next turn's prompt repeats) is fed
  // after the client has its answer, so the cached state covers the whole reply. A step issued
  // ahead gets it in any case: it waits for a token.
  const bool commit = feed_last_token && commits(seq);
  if (commit || session_of(seq).awaits_token()) feed(seq, seq.last_token);
  if (!commit) release(seq);
}

bool Scheduler::commits(const Sequence& seq) const { return cache_.enabled() && seq.task->task.use_cache; }

Session& Scheduler::session_of(const Sequence& seq) const { return *slots_[static_cast<size_t>(seq.slot)].session; }

Speculator* Scheduler::speculator_of(const Sequence& seq) const {
  return slots_[static_cast<size_t>(seq.slot)].speculator.get();
}

void Scheduler::finish_task_choice(TaskRun& t) {
  if (--t.choices_left > 0) return;
  t.usage.decode_ms = ms_between(t.prompt_done, Clock::now());
  t.request->results->push({.kind = ResultEvent::Kind::done, .usage = t.usage});
  ++metrics_.requests_finished;
}

void Scheduler::release(Sequence& seq) {
  slots_[static_cast<size_t>(seq.slot)].busy = false;
  --metrics_.slots_busy;
  seq.done = true;
}

void Scheduler::fail_sequence(Sequence& seq, const std::string& message) {
  session_of(seq).reset();  // the state may be half-updated
  release(seq);
  if (!seq.task || seq.task->failed || seq.phase == Sequence::Phase::commit) return;  // commit: already answered
  seq.task->failed = true;
  seq.task->request->results->push({.kind = ResultEvent::Kind::error, .error = message});
}

void Scheduler::snapshot_into_cache(Sequence& seq, SnapshotPoint point, const std::vector<float>& logits) {
  if (!cache_.enabled() || (seq.task && !seq.task->task.use_cache)) return;
  const Session& session = session_of(seq);
  const std::vector<int32_t>& tokens = session.tokens();
  if (cache_.refresh(tokens, point)) return;
  size_t bytes = estimate_snapshot_bytes(engine_->model().hparams(), static_cast<int64_t>(tokens.size()), engine_->gdn_state());
  if (bytes > cache_.budget()) return;
  cache_.insert(tokens, std::make_shared<const SessionSnapshot>(session.snapshot()), logits, bytes, point);
  ++metrics_.snapshots_taken;
}

void Scheduler::update_gauges() {
  metrics_.active_sequences = static_cast<int64_t>(active_.size());
  metrics_.queue_depth = n_queued_.load();
}

}  // namespace regolith::server
