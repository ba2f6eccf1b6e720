#include "spec/speculative.h"

#include <algorithm>

#include "core/error.h"

namespace regolith {

Drafter mtp_drafter(Session& session) {
  session.enable_mtp();
  return [&session](int32_t next, int64_t n) { return session.draft_mtp(next, n); };
}

Drafter lookup_drafter(const Session& session, int64_t ngram) {
  if (ngram < 1) fail("prompt lookup: n-grams of ", ngram, " tokens");
  return [&session, ngram](int32_t next, int64_t n) {
    std::vector<int32_t> h = session.tokens();
    h.push_back(next);
    const auto len = static_cast<int64_t>(h.size());
    for (int64_t k = std::min(ngram, len - 1); k >= 1; --k) {
      // The latest end e < len − 1 of an earlier copy of the last k tokens.
      for (int64_t e = len - 2; e >= k - 1; --e) {
        if (!std::equal(h.end() - k, h.end(), h.begin() + (e - k + 1))) continue;
        const int64_t take = std::min(n, len - 1 - e);
        return std::vector<int32_t>(h.begin() + e + 1, h.begin() + e + 1 + take);
      }
    }
    return std::vector<int32_t>();
  };
}

Speculator::Speculator(Session& session, Drafter drafter, int64_t max_drafts, DraftCount count)
    : session_(session), drafter_(std::move(drafter)), max_drafts_(max_drafts), count_(count), want_(max_drafts) {
  if (max_drafts < 1) fail("speculative decoding: ", max_drafts, " drafts a round (at least 1)");
}

void Speculator::adapt(int64_t drafted, int64_t kept) {
  if (count_ == DraftCount::Fixed) return;
  if (drafted == 0) {  // paused (or a drafter with nothing to offer): try one again now and then
    if (want_ == 0 && ++plain_rounds_ >= kProbeEvery) want_ = 1, plain_rounds_ = 0;
    return;
  }
  misses_ = kept > 0 ? 0 : misses_ + 1;
  if (kept == drafted)
    want_ = std::min(max_drafts_, want_ + 1);
  else if (kept > 0)
    want_ = kept + 1;
  else
    want_ = misses_ >= kPauseAfter ? 0 : 1;
}

std::vector<int32_t> Speculator::round(int32_t next, const ChooseToken& choose, int64_t limit,
                                       const std::function<bool()>& go_on) {
  if (limit < 1) fail("speculative round: a limit of ", limit, " tokens");
  const int64_t most = std::min(want_, limit - 1);
  std::vector<int32_t> drafts = most > 0 ? drafter_(next, most) : std::vector<int32_t>();
  if (static_cast<int64_t>(drafts.size()) > most) drafts.resize(static_cast<size_t>(most));
  ++stats_.rounds;
  if (drafts.empty()) {  // a plain step: nothing to take back, so nothing to record
    const std::vector<float> logits = session_.eval(std::span(&next, 1));
    adapt(0, 0);
    return {choose(logits)};
  }
  std::vector<int32_t> tokens{next};
  tokens.insert(tokens.end(), drafts.begin(), drafts.end());
  const std::vector<float> logits = session_.verify(tokens);
  const auto n = static_cast<int64_t>(drafts.size());
  const auto V = static_cast<int64_t>(logits.size()) / (n + 1);
  std::vector<int32_t> out;
  for (int64_t j = 0; j <= n; ++j) {
    out.push_back(choose(std::span(logits).subspan(static_cast<size_t>(j * V), static_cast<size_t>(V))));
    if (j == n || out.back() != drafts[static_cast<size_t>(j)] || (go_on && !go_on())) break;
  }
  // `next` and the drafts before the last choice stay; the last choice is the next round's `next`.
  session_.keep_verified(static_cast<int64_t>(out.size()));
  stats_.drafted += n;
  stats_.accepted += static_cast<int64_t>(out.size()) - 1;
  adapt(n, static_cast<int64_t>(out.size()) - 1);
  return out;
}

namespace {
bool is_mtp_source(std::string_view from) {
  if (from != "mtp" && from != "lookup") fail("--draft-from ", from, ": mtp or lookup");
  return from == "mtp";
}
}  // namespace

void check_draft_source(const Qwen4ExpModel& model, std::string_view from) {
  if (!is_mtp_source(from)) return;
  if (const std::string why = model.mtp_problem(); !why.empty()) fail("--draft-from mtp: ", why);
}

std::unique_ptr<Speculator> make_speculator(Session& session, std::string_view from, int64_t max_drafts) {
  if (is_mtp_source(from)) return std::make_unique<Speculator>(session, mtp_drafter(session), max_drafts, DraftCount::Adaptive);
  return std::make_unique<Speculator>(session, lookup_drafter(session), max_drafts, DraftCount::Fixed);
}

}  // namespace regolith
