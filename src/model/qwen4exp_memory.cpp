// An upper estimate of the activation memory one forward call allocates, so that callers can cut
// a long prompt into chunks that fit (runtime/session.cpp). It adds up every per-token tensor of
// the largest layer kind as if all were alive at once, which the forward pass never needs, plus
// the prefill scratch whose size does not grow with the chunk (the GDN chunked scan's rounds).
#include "model/qwen4exp.h"

#include <algorithm>

namespace regolith {

namespace {

constexpr int64_t kGdnRoundChunks = 32, kGdnChunk = 64;  // as the CUDA and CPU chunked scans
constexpr int64_t kAttendSplitRows = 2048;  // CUDA QSA attention: (token, kv head, split) partials

}  // namespace

uint64_t Qwen4ExpModel::forward_bytes(int64_t T, LogitRows rows) const {
  const Qwen4ExpHparams& hp = hp_;
  const int64_t H = hp.n_embd, W = hp.hc_dim(), r = hp.hc_low_rank, k = hp.n_expert_used;
  const int64_t C = hp.ssm_conv_dim(), nv = hp.ssm_n_v_heads, vd = hp.ssm_value_dim();
  const int64_t qd = hp.n_head * hp.head_dim, kvd = hp.n_head_kv * hp.head_dim;
  const int64_t idx = (hp.indexer_n_head + 1) * hp.indexer_head_dim;
  const int64_t max_sel = hp.indexer_top_k + 64;  // the selection, with its incomplete tail block
  // Floats per token.
  const int64_t resid = 2 * W;                     // R, and the last row's copy
  const int64_t hc = 2 * W + H + r + hp.hc_count;  // normed row, mixer products, x, inject weights
  const int64_t gdn = 2 * C + 4 * vd + 4 * nv + H;
  const int64_t qsa = 6 * qd + 2 * kvd + 2 * idx + max_sel + 2 * hp.n_head + H;
  const int64_t moe = hp.n_expert + 3 * hp.n_ff_shexp + 2 * k + 2 * H + 3 * k * hp.n_ff_exp + k * H + 2 * k;
  const int64_t ple = 4 * W + 3 * H;
  const int64_t per_token = resid + hc + std::max({gdn, qsa, moe, ple});
  const int64_t logits = hp.n_vocab * (rows == LogitRows::All ? T : 1);
  const int64_t gdn_rounds = kGdnRoundChunks * nv * (kGdnChunk * (3 * hp.ssm_k_head_dim + hp.ssm_v_head_dim) +
                                                      kGdnChunk * kGdnChunk + 1);
  const int64_t attend_splits = kAttendSplitRows * (hp.n_head / std::max<int64_t>(hp.n_head_kv, 1)) * (hp.head_dim + 2);
  return 4 * static_cast<uint64_t>(per_token * T + logits + attend_splits + (T > 1 ? gdn_rounds : 0));
}

}  // namespace regolith
