// Speculative decoding. A round drafts tokens after the token just chosen, evaluates that token
// and its drafts in one forward pass (Session::verify), and walks the verified logits with the
// caller's choice of token (a sampler): each position's choice is emitted, and the walk goes on
// while it equals that position's draft; the session keeps what was emitted before the last
// choice and takes the rest back (Session::keep_verified).
//
// Every emitted token is chosen from the logits one-token decoding would give it (up to the
// rounding of a multi-token pass), one choice per token, so the output is plain decoding's:
// greedy exactly, sampling token for token under the same seed. For a draft d, emitting a draw
// t ~ p and going on only when t = d is the speculative-sampling rule for a one-hot draft: d is
// accepted with probability p(d), and otherwise the token is drawn from p without d.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "runtime/session.h"

namespace regolith {

using ChooseToken = std::function<int32_t(std::span<const float> logits)>;
// At most n tokens expected after `next` (chosen, not evaluated yet); fewer, or none, when unsure.
using Drafter = std::function<std::vector<int32_t>(int32_t next, int64_t n)>;

// The model's MTP head (Session::draft_mtp); enables MTP drafting on the session, which must not
// have evaluated a token yet.
Drafter mtp_drafter(Session& session);
// Prompt lookup: the latest earlier occurrence of the timeline's last tokens (`next` included; the
// longest match of at most `ngram` tokens) and the tokens that followed it there. Free to run and
// right wherever text repeats itself (code edits, quoting, extraction, loops).
Drafter lookup_drafter(const Session& session, int64_t ngram = 3);

struct SpeculativeStats {
  int64_t rounds = 0, drafted = 0, accepted = 0;
};

// How many drafts a round asks for. Fixed: always the most. Adaptive: one more after a round
// that kept them all, one more than were kept after a round that kept some, one after a round that
// kept none — and none after kPauseAfter such rounds in a row (plain steps), with one draft tried
// again every kProbeEvery rounds: drafts that are never right cost a verify pass now and then
// instead of every round. The output does not depend on it. MTP drafts adapt (each costs a pass
// of the MTP block); prompt-lookup drafts, free to make and offered only where the text matched,
// are asked for in full (make_speculator).
enum class DraftCount { Fixed, Adaptive };

class Speculator {
 public:
  static constexpr int64_t kPauseAfter = 3, kProbeEvery = 8;
  Speculator(Session& session, Drafter drafter, int64_t max_drafts, DraftCount count = DraftCount::Adaptive);

  // `next` (chosen from the last logits, not evaluated yet) joins the session with the drafts
  // accepted after it. Returns those drafts and then the token chosen where the walk stopped (not
  // evaluated yet): between 1 and max_drafts + 1 tokens, and at most `limit` (>= 1). `go_on`, when
  // given, is asked after each choice and ends the walk there when false (the reply ended at it).
  std::vector<int32_t> round(int32_t next, const ChooseToken& choose, int64_t limit,
                             const std::function<bool()>& go_on = {});
  const SpeculativeStats& stats() const { return stats_; }

 private:
  void adapt(int64_t drafted, int64_t kept);

  Session& session_;
  Drafter drafter_;
  int64_t max_drafts_;
  DraftCount count_;
  int64_t want_;            // drafts the next round asks for
  int64_t misses_ = 0;        // rounds in a row that kept no draft
  int64_t plain_rounds_ = 0;  // rounds without drafts since drafting paused
  SpeculativeStats stats_;
};

// Throws unless `from` (--draft-from) names a source this model can draft from: "mtp" (a file with
// a usable MTP block) or "lookup".
void check_draft_source(const Qwen4ExpModel& model, std::string_view from);
// A speculator on a session that has not evaluated a token yet, drafting from `from`: the MTP head
// with an adaptive count, or prompt lookup with a fixed one.
std::unique_ptr<Speculator> make_speculator(Session& session, std::string_view from, int64_t max_drafts);

}  // namespace regolith
