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
#include <span>
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

class Speculator {
 public:
  Speculator(Session& session, Drafter drafter, int64_t max_drafts);

  // `next` (chosen from the last logits, not evaluated yet) joins the session with the drafts
  // accepted after it. Returns those drafts and then the token chosen where the walk stopped (not
  // evaluated yet): between 1 and max_drafts + 1 tokens, and at most `limit` (>= 1). `go_on`, when
  // given, is asked after each choice and ends the walk there when false (the reply ended at it).
  std::vector<int32_t> round(int32_t next, const ChooseToken& choose, int64_t limit,
                             const std::function<bool()>& go_on = {});
  const SpeculativeStats& stats() const { return stats_; }

 private:
  Session& session_;
  Drafter drafter_;
  int64_t max_drafts_;
  SpeculativeStats stats_;
};

}  // namespace regolith
