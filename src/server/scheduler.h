// The scheduler: one thread that owns every Session and runs the engine. HTTP workers submit typed
// requests (token ids, sampling settings) and read ResultEvents back; nothing else crosses.
//
// Continuous batching: each step advances every active sequence, a new prompt by one chunk of at
// most `chunk` tokens (chunks end at multiples of `chunk`, so every run of a prompt splits it the
// same way and snapshots land on shared boundaries), a running reply by one token, so streams keep
// flowing while long prompts are read. While several sequences are active, the running replies'
// tokens go through one forward pass together (eval_batch: every weight read once for all of
// them); a reply running alone has its next step issued before its logits are read
// (Session::queue_step) and given its token as soon as the token is chosen — or, with drafts
// (`draft`), decodes by speculative rounds (spec/speculative.h): several tokens a forward pass when
// the drafts are right, the same tokens as without them.
//
// Prefix cache: snapshots at chunk boundaries, at the end of each prompt and at the end of each
// reply (after feeding the reply's last token, once the client has its answer) go into a PrefixCache;
// a new request restores the longest cached prefix of its prompt and prefills only the rest.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <string>

#include "runtime/session.h"
#include "server/metrics.h"
#include "server/prefix_cache.h"
#include "server/queue.h"
#include "spec/speculative.h"

namespace regolith {
class Tokenizer;
}

namespace regolith::server {

struct SchedulerOptions {
  int n_slots = 4;             // sessions decoded together (--parallel)
  int64_t n_ctx = 4096;        // tokens per sequence, prompt and reply together
  int64_t chunk = 256;         // prompt tokens per forward call and between cache snapshots
  int64_t step_tokens = 512;   // tokens one step may process over all sequences (at least one chunk)
  int max_queue = 64;          // requests that may wait for a slot
  size_t cache_bytes = 0;      // prefix cache budget; 0 disables it
  int64_t draft = 0;           // drafts a speculative round for a reply running alone; 0: none
  std::string draft_from = "mtp";  // mtp (the model's MTP head) or lookup (earlier text)
};

class Scheduler {
 public:
  Scheduler(std::shared_ptr<Engine> engine, const Tokenizer& tokenizer, SchedulerOptions options, Metrics& metrics);
  ~Scheduler();

  void start();
  enum class Admission { accepted, queue_full, stopping };
  Admission submit(Submission submission);
  // Replays persisted prefixes into the cache while no request waits (see cache_store.h).
  void warm_up(std::vector<std::vector<int32_t>> prefixes);
  // Ends the thread: requests still running get an error event. Idempotent.
  void stop();

  // Cache keys worth persisting (prompt and reply ends). Any thread: the scheduler thread copies
  // them between steps while it runs.
  std::vector<std::vector<int32_t>> persistent_cache_keys();
  const PrefixCacheStats& cache_stats() const { return cache_.stats(); }
  size_t cache_budget() const { return cache_.budget(); }
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Request;
  struct TaskRun;
  struct Sequence;
  struct Pending;
  struct BatchEntry;

  void loop();
  void take_incoming();
  void drop_cancelled();
  void admit();
  void start_sequence(Pending& p, int slot);
  void step();
  void run_batch(std::vector<BatchEntry>& batch);
  void step_together(const std::vector<Sequence*>& seqs);  // their chosen tokens in one forward pass
  void after_prefill(Sequence& seq, const std::vector<float>& logits);
  void next_token(Sequence& seq, std::span<const float> logits);  // chooses the token and feeds it
  void feed(Sequence& seq, int32_t token);  // to the step issued ahead, a new one, or the next pass
  void speculate(Sequence& seq);  // a speculative round from its unfed token (a reply running alone)
  void finish(Sequence& seq, FinishReason reason, bool feed_last_token);
  bool commits(const Sequence& seq) const;  // the reply's end goes into the prefix cache
  Session& session_of(const Sequence& seq) const;
  Speculator* speculator_of(const Sequence& seq) const;  // null without drafts
  void finish_task_choice(TaskRun& task);
  void release(Sequence& seq);
  void fail_sequence(Sequence& seq, const std::string& message);
  void snapshot_into_cache(Sequence& seq, SnapshotPoint point, const std::vector<float>& logits);
  int free_slot() const;
  int choose_slot(const Pending& p) const;
  bool waits_for_commit(const Pending& p) const;
  void update_gauges();

  std::shared_ptr<Engine> engine_;
  const Tokenizer& tokenizer_;
  SchedulerOptions options_;
  Metrics& metrics_;
  PrefixCache cache_;

  std::mutex mutex_;  // guards incoming_, warm_incoming_, stopping_
  std::condition_variable wake_, exported_;
  std::vector<Submission> incoming_;
  std::vector<std::vector<int32_t>> warm_incoming_;
  bool stopping_ = false;
  bool running_ = false, export_requested_ = false;
  std::vector<std::vector<int32_t>> exported_keys_;
  std::atomic<int> n_queued_{0};  // tasks submitted but not yet started
  std::thread thread_;

  // Scheduler-thread state.
  struct Slot {
    std::unique_ptr<Session> session;
    std::unique_ptr<Speculator> speculator;  // with drafts
    bool busy = false;
  };
  std::vector<Slot> slots_;
  std::deque<std::unique_ptr<Pending>> pending_;
  std::deque<std::vector<int32_t>> warm_pending_;
  std::vector<std::unique_ptr<Sequence>> active_;
  bool batched_ = false;  // several sequences active: chosen tokens wait for one pass together
};

}  // namespace regolith::server
