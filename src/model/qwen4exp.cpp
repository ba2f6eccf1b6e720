// The qwen4exp forward pass (model-spec §4.1), one chunk of one sequence or one token each of
// several (their tokens are the columns of every activation; only the ops that read a sequence's
// state run per sequence, on its columns):
//   embed → R = 4 copies → for each layer [PLE at its layer] → HC read → GDN or QSA → HC write
//   → HC read → MoE → HC write → final HC mixer (no inject, no norm) → LM head.
// Each line is one backend op on named tensors; every intermediate is offered to the trace hook.
#include "model/qwen4exp.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "quant/rows.h"

namespace regolith {
namespace {

constexpr int64_t kInitialCapacity = 256;
// Where a queued step's inputs lie in its mailbox: the token id (I32), then its n-gram rows (F32).
constexpr size_t kQueuedToken = 0, kQueuedPleRows = 16;
size_t mailbox_bytes(const Qwen4ExpHparams& hp) {
  return kQueuedPleRows + (hp.ple_layers.empty() ? 0 : static_cast<size_t>(hp.n_embd) * sizeof(float));
}

void check_token(const Qwen4ExpHparams& hp, int32_t t) {
  if (t < 0 || t >= hp.n_vocab) fail("token id ", t, " is outside the vocabulary (", hp.n_vocab, ")");
}

// Hashed n-gram rows of `tokens` after `context`, the ids before them (model-spec §4.8.2–3): a
// predecessor counts only when no EOS lies between it and the token; before the sequence start
// everything reads as EOS. `context` becomes the last ngram_size − 1 ids.
std::vector<int64_t> ple_rows(const Qwen4ExpHparams& hp, const PleHashConstants& hash, std::vector<int32_t>& context,
                              std::span<const int32_t> tokens) {
  const int64_t n_ctx = hp.ple_ngram_size - 1, nh = hp.ple_n_heads(), T = static_cast<int64_t>(tokens.size());
  const uint64_t eos = static_cast<uint64_t>(hp.ple_eos_token_id);
  std::vector<int64_t> hist(context.begin(), context.end());
  hist.insert(hist.end(), tokens.begin(), tokens.end());
  std::vector<int64_t> rows(nh * T);
  std::vector<uint64_t> ctx(n_ctx + 1), r(nh);
  for (int64_t t = 0; t < T; ++t) {
    int64_t i = n_ctx + t;
    ctx[0] = static_cast<uint64_t>(hist[i]);
    bool cut = false;
    for (int64_t s = 1; s <= n_ctx; ++s) {
      if (s > 1 && static_cast<uint64_t>(hist[i - s + 1]) == eos) cut = true;  // an EOS between cuts
      ctx[s] = cut ? eos : static_cast<uint64_t>(hist[i - s]);
    }
    ple_row_ids(hash, static_cast<uint64_t>(hp.ple_heads_per_ngram), ctx.data(), r.data());
    for (int64_t h = 0; h < nh; ++h) rows[t * nh + h] = static_cast<int64_t>(r[h]);
  }
  context.assign(hist.end() - n_ctx, hist.end());
  return rows;
}

// One sequence's n tokens in a forward pass, at positions st->n_past onwards (st->mtp_n_past for
// the MTP block's cells). Forward places the parts side by side: part p is columns
// first .. first + n − 1 of every activation.
struct SeqPart {
  SeqPart(Qwen4ExpState* st, std::span<const int32_t> tokens, int64_t n) : st(st), tokens(tokens), n(n) {}
  Qwen4ExpState* st;
  std::span<const int32_t> tokens;  // empty for a queued step (its id is in the mailbox)
  int64_t n;
  int64_t first = 0;               // set by Forward
  std::vector<int64_t> positions;  // set by Forward
};

// t ← a tensor of that dtype and shape: t itself when it has them (a buffer reused from call to call).
void reuse_or_alloc(Backend& be, Tensor& t, DType dtype, const std::array<int64_t, 4>& ne) {
  if (t.empty() || t.dtype() != dtype || t.ne() != ne) t = be.alloc(dtype, ne);
}

// dst ← src, reusing dst's storage when it has src's shape.
void copy_into(Backend& be, const Tensor& src, Tensor& dst) {
  if (src.empty()) {
    dst = {};
    return;
  }
  reuse_or_alloc(be, dst, src.dtype(), src.ne());
  be.copy(src, 0, dst, 0, src.n_elements());
}

// Which layers a pass runs: the trunk's, or the MTP block's on its own cells and cache.
enum class Pass { Trunk, Mtp };

class Forward {
 public:
  // inputs set: one part of one token whose id and n-gram rows come from that mailbox (forward_queued).
  // record: filled for keep_verified (one part only).
  Forward(const Qwen4ExpModel& model, const PleHashConstants& ple_hash, Backend& be, std::vector<SeqPart> parts,
          HostMailbox* inputs, const TraceFn& trace, Pass pass = Pass::Trunk, Qwen4ExpVerifyRecord* record = nullptr)
      : hp_(model.hparams()), w_(model.weights()), ple_hash_(ple_hash), be_(be), parts_(std::move(parts)),
        inputs_(inputs), trace_(trace), pass_(pass), record_(record) {
    for (SeqPart& p : parts_) {
      p.first = T_;
      for (int64_t t = 0; t < p.n; ++t) p.positions.push_back(next_position(*p.st) + t);
      T_ += p.n;
    }
  }

  Tensor run(LogitRows rows, Tensor* wide) {
    int64_t H = hp_.n_embd, S = hp_.hc_count;
    Tensor x = f32(H, T_);
    if (inputs_) {
      // The token id and its n-gram rows in one receive: each receive costs the device a read of
      // host memory, on the chain (about 14 µs for the rows alone at layer 1, H100).
      const auto words = static_cast<int64_t>(mailbox_bytes(hp_) / sizeof(int32_t));
      Tensor received = be_.alloc_output(DType::I32, {words, 1, 1, 1});
      be_.receive(*inputs_, 0, received);
      if (!hp_.ple_layers.empty())
        queued_ple_rows_ = received.slice(0, kQueuedPleRows / sizeof(int32_t), H).bitcast(DType::F32);
      be_.get_rows_by(w_.token_embd, received.slice(0, kQueuedToken / sizeof(int32_t), 1), x);
    } else {
      std::vector<int64_t> ids;
      for (const SeqPart& p : parts_) ids.insert(ids.end(), p.tokens.begin(), p.tokens.end());
      be_.get_rows(w_.token_embd, ids, x);
    }
    trace("embd", -1, x);
    Tensor R = f32(H * S, T_);
    be_.repeat_streams(x, S, R);
    // A sublayer's output is written into R by the next hc_read (hc_write_read), or before
    // anything else reads R.
    PendingWrite pending;
    for (int64_t il = 0; il < hp_.n_layer; ++il) layer(il, w_.layers[il], R, pending);
    if (wide) {
      write_pending(R, pending);
      *wide = R;
    }
    const auto n_parts = static_cast<int64_t>(parts_.size());
    if (rows == LogitRows::Last && T_ > n_parts) {  // each sequence's last token
      write_pending(R, pending);
      Tensor last = f32(H * S, n_parts);
      for (int64_t i = 0; i < n_parts; ++i) {
        const SeqPart& p = parts_[static_cast<size_t>(i)];
        be_.copy(R, (p.first + p.n - 1) * H * S, last, i * H * S, H * S);
      }
      R = last;
    }
    Tensor h = hc_read(w_.output_hc, R, pending, -1, "output_hc").x;
    Tensor logits = mul_mat(w_.output, h);
    trace("logits", -1, logits);
    for (SeqPart& p : parts_) p.st->n_past += p.n;
    return logits;
  }

  // The MTP block on one sequence's cells (model-spec §4.10): each stream of the block's input is
  // proj_embd·enorm(embedding of the next token) + proj_stream·(that stream of hnorm(wide)), the
  // norm of the wide residual taken over all W values (SGLang and vLLM; llama.cpp norms each
  // stream). Then the block's layer, and for the last cell its mixer and the shared LM head.
  // next_id: the one cell's token in the backend's memory (mtp_forward_by); otherwise the part's.
  Tensor run_mtp(const Tensor& wide, bool logits, Tensor* wide_out, const Tensor* next_id = nullptr) {
    const MtpWeights& m = *w_.mtp;
    const int64_t H = hp_.n_embd, S = hp_.hc_count, W = H * S;
    const SeqPart& part = parts_.front();
    Tensor x = f32(H, T_);
    if (next_id)
      be_.get_rows_by(w_.token_embd, *next_id, x);
    else
      be_.get_rows(w_.token_embd, std::vector<int64_t>(part.tokens.begin(), part.tokens.end()), x);
    Tensor embd = mul_mat(m.proj_embd, rms_norm(x, m.enorm, H));
    Tensor streams = mul_mat(m.proj_stream, rms_norm(wide, m.hnorm, W).reshaped({H, S * T_, 1, 1}));
    Tensor embd_streams = f32(W, T_), R = f32(W, T_);
    be_.repeat_streams(embd, S, embd_streams);
    be_.add(streams.reshaped({W, T_, 1, 1}), embd_streams, R);
    trace("mtp.input", hp_.n_layer, R);
    PendingWrite pending;
    layer(hp_.n_layer, m.layer, R, pending);
    write_pending(R, pending);
    part.st->mtp_n_past += T_;
    Tensor last = R;
    if (T_ > 1) {
      last = f32(W, 1);
      be_.copy(R, (T_ - 1) * W, last, 0, W);
    }
    if (wide_out) *wide_out = last;
    if (!logits) return {};
    Tensor h = hc_read(m.head_hc, last, pending, -1, "mtp.head_hc").x;
    Tensor draft = mul_mat(w_.output, h);
    trace("mtp.logits", -1, draft);
    return draft;
  }

 private:
  struct Hc {
    Tensor x, inject_w;
  };

  void trace(std::string_view name, int64_t il, const Tensor& t) const {
    if (trace_) trace_(name, il, t);
  }
  int64_t next_position(const Qwen4ExpState& st) const { return pass_ == Pass::Mtp ? st.mtp_n_past : st.n_past; }
  Qwen4ExpLayerState& layer_state(const SeqPart& p, int64_t il) const {
    return il < hp_.n_layer ? p.st->layers[il] : p.st->mtp;
  }

  // One token of each of several sequences (a batched decode step): the per-sequence convolutions
  // and scans go to the backend's columns ops, one call for all sequences.
  bool one_token_each() const {
    return parts_.size() > 1 && std::all_of(parts_.begin(), parts_.end(), [](const SeqPart& p) { return p.n == 1; });
  }
  // Each part's tensor `member` of its state, in part (column) order.
  template <typename Member>
  std::vector<Tensor*> each_state(Member member) const {
    std::vector<Tensor*> v;
    for (const SeqPart& p : parts_) v.push_back(member(*p.st));
    return v;
  }
  // Part p's columns of an activation whose tokens are its outermost dimension.
  Tensor of(const Tensor& t, const SeqPart& p) const {
    if (parts_.size() == 1) return t;
    int dim = 3;
    while (dim > 0 && t.ne(dim) == 1) --dim;
    if (t.ne(dim) != T_) fail("forward: tensor ", t.shape_string(), " is not one column a token");
    return t.slice(dim, p.first, p.n);
  }
  // Every tensor made here is the output of the op it is made for.
  Tensor f32(int64_t a, int64_t b = 1, int64_t c = 1) { return be_.output_f32(a, b, c); }
  Tensor mul_mat(const Weight& w, const Tensor& x) {
    Tensor out = f32(w.ne[1], x.ne(1));
    be_.mul_mat(w, x, out);
    return out;
  }
  // The products of several weights with one input, in the order given.
  template <size_t N>
  std::array<Tensor, N> mul_mats(const std::array<const Weight*, N>& ws, const Tensor& x) {
    std::array<Tensor, N> outs;
    std::array<Tensor*, N> out_ptrs;
    for (size_t i = 0; i < N; ++i) {
      outs[i] = f32(ws[i]->ne[1], x.ne(1));
      out_ptrs[i] = &outs[i];
    }
    be_.mul_mat_shared_input(ws, x, out_ptrs);
    return outs;
  }
  Tensor rms_norm(const Tensor& x, const Weight& w, int64_t group) {
    Tensor out = f32(x.ne(0), x.ne(1), x.ne(2));
    be_.rms_norm(x, &w, group, static_cast<float>(hp_.rms_eps), out);
    return out;
  }

  // R += inject_w ⊙ y of a sublayer, traced as `name` of layer il once written.
  struct PendingWrite {
    Tensor y, inject_w;
    std::string_view name;
    int64_t il = -1;
  };
  void write_pending(Tensor& R, PendingWrite& p) {
    if (p.y.empty()) return;
    be_.hc_write(R, p.y, p.inject_w);
    trace(p.name, p.il, R);
    p = {};
  }

  // One decoder layer: [PLE] → HC read → GDN or QSA → HC write → HC read → MoE → HC write (the last
  // write left pending for the next read).
  void layer(int64_t il, const LayerWeights& L, Tensor& R, PendingWrite& pending) {
    if (L.has_ple) ple(il, L.ple, R, pending);
    Hc attn = hc_read(L.hc_attn, R, pending, il, "hc_attn");
    Tensor y = L.recurrent ? gdn(il, L.gdn, attn.x) : qsa(il, L.qsa, attn.x);
    pending = {y, attn.inject_w, "resid_attn", il};
    Hc ffn = hc_read(L.hc_ffn, R, pending, il, "hc_ffn");
    y = moe(il, L.moe, ffn.x);
    pending = {y, ffn.inject_w, "resid_ffn", il};
  }

  // The read of R, with the pending write (if any) applied first.
  Hc hc_read(const HcWeights& w, Tensor& R, PendingWrite& pending, int64_t il, const std::string& name) {
    Hc out{f32(hp_.n_embd, R.ne(1)), w.inject.present() ? f32(hp_.hc_count, R.ne(1)) : Tensor()};
    const HcReadArgs args{.R = &R, .norm = &w.norm, .down = &w.down, .up = &w.up,
                          .inject = w.inject.present() ? &w.inject : nullptr, .n_streams = hp_.hc_count,
                          .eps = static_cast<float>(hp_.rms_eps), .x = &out.x, .inject_w = &out.inject_w};
    if (pending.y.empty()) {
      be_.hc_read(args);
    } else {
      be_.hc_write_read(R, pending.y, pending.inject_w, args);
      trace(pending.name, pending.il, R);
      pending = {};
    }
    trace(name + ".x", il, out.x);
    if (!out.inject_w.empty()) trace(name + ".inject", il, out.inject_w);
    return out;
  }

  // The PLE injection at layer il, with the write still pending from the layer before (traced
  // apart first when tracing: its trace point holds R before the PLE).
  void ple(int64_t il, const PleWeights& w, Tensor& R, PendingWrite& pending) {
    int64_t H = hp_.n_embd, S = hp_.hc_count;
    Tensor E;
    if (inputs_) {
      E = queued_ple_rows_;
    } else {
      E = f32(H, T_);
      std::vector<int64_t> rows;
      for (const SeqPart& p : parts_) {
        std::vector<int64_t> r = ple_rows(hp_, ple_hash_, p.st->ple_context, p.tokens);
        rows.insert(rows.end(), r.begin(), r.end());
      }
      be_.get_rows(w_.ple_table, rows, E);
    }
    trace("ple.embd", il, E);
    if (trace_) write_pending(R, pending);  // before the products: ple_inject reads R before its wait
    auto [key_proj, val] = mul_mats<2>({&w.key, &w.value}, E);
    Tensor N = record_ ? f32(H * S, T_) : Tensor();
    for (const SeqPart& p : parts_) {  // each sequence's own conv history
      Tensor Rp = of(R, p), Np = N.empty() ? N : of(N, p);
      const Tensor yp = pending.y.empty() ? Tensor() : of(pending.y, p);
      const Tensor wp = pending.y.empty() ? Tensor() : of(pending.inject_w, p);
      const Tensor kp = of(key_proj, p), vp = of(val, p);
      be_.ple_inject({.R = &Rp, .y = yp.empty() ? nullptr : &yp, .inject_w = wp.empty() ? nullptr : &wp,
                      .key_proj = &kp, .val = &vp, .norm_key = &w.norm_key, .norm_query = &w.norm_query,
                      .norm_conv = &w.norm_conv, .conv = &w.conv, .history = &p.st->ple_conv, .n_streams = S,
                      .dilation = hp_.ple_ngram_size, .eps = static_cast<float>(hp_.rms_eps),
                      .conv_inputs = Np.empty() ? nullptr : &Np});
    }
    pending = {};
    if (record_) record_->ple_inputs = N;
    trace("resid_ple", il, R);
  }

  Tensor gdn(int64_t il, const GdnWeights& w, const Tensor& a) {
    int64_t nv = hp_.ssm_n_v_heads;
    auto [qkv, z, alpha, beta_raw] = mul_mats<4>({&w.qkv, &w.gate, &w.alpha, &w.beta}, a);
    Tensor u = f32(hp_.ssm_conv_dim(), T_);
    Tensor g = f32(nv, T_), beta = f32(nv, T_), o = f32(hp_.ssm_value_dim(), T_), on = f32(hp_.ssm_value_dim(), T_);
    // Gates, the delta-rule scan and the gated output norm, on the conv's output.
    const auto core_args = [&](const Tensor& u_, const Tensor& alpha_, const Tensor& beta_raw_, const Tensor& z_,
                               Tensor* state, Tensor& g_, Tensor& beta_, Tensor& o_, Tensor& on_) {
      return GdnCoreArgs{.qkv = &u_, .alpha = &alpha_, .beta_raw = &beta_raw_, .ssm_a = &w.ssm_a, .dt_bias = &w.dt_bias,
                         .z = &z_, .norm = &w.norm, .eps = static_cast<float>(hp_.rms_eps), .state = state,
                         .n_k_heads = hp_.ssm_n_k_heads, .n_v_heads = nv, .dk = hp_.ssm_k_head_dim,
                         .dv = hp_.ssm_v_head_dim, .g = &g_, .beta = &beta_, .core = &o_, .out = &on_};
    };
    if (one_token_each()) {
      be_.causal_conv_columns(qkv, each_state([il](Qwen4ExpState& st) { return &st.layers[il].conv; }), w.conv, 1, u);
      be_.gdn_core_columns(core_args(u, alpha, beta_raw, z, nullptr, g, beta, o, on),
                           each_state([il](Qwen4ExpState& st) { return &st.layers[il].ssm; }));
    } else {
      for (const SeqPart& p : parts_) {
        Qwen4ExpLayerState& ls = p.st->layers[il];
        Tensor u_p = of(u, p), alpha_p = of(alpha, p), beta_raw_p = of(beta_raw, p), z_p = of(z, p);
        Tensor g_p = of(g, p), beta_p = of(beta, p), o_p = of(o, p), on_p = of(on, p);
        be_.causal_conv(of(qkv, p), ls.conv, w.conv, 1, u_p);
        GdnCoreArgs args = core_args(u_p, alpha_p, beta_raw_p, z_p, &ls.ssm, g_p, beta_p, o_p, on_p);
        if (record_) {  // verified tokens step one at a time; keep_verified takes the state after any
          record_->conv_inputs[il] = qkv;
          Tensor& after = record_->states[il];
          reuse_or_alloc(be_, after, ls.ssm.dtype(), states_after_shape(ls.ssm, p.n));
          args.states_after = &after;
        }
        be_.gdn_core(args);
      }
    }
    trace("gdn.conv", il, u);
    trace("gdn.g", il, g);
    trace("gdn.beta", il, beta);
    trace("gdn.core", il, o);
    trace("gdn.normed", il, on);
    Tensor y = mul_mat(w.out, on);
    trace("gdn.out", il, y);
    return y;
  }

  Tensor qsa(int64_t il, const QsaWeights& w, const Tensor& a) {
    int64_t hd = hp_.head_dim, nh = hp_.n_head, nkv = hp_.n_head_kv, di = hp_.indexer_head_dim;
    // Main attention q (with its output gate), k, v; k and v join the cache.
    // The indexer's queries are normed and rotated too, and its raw keys cached.
    auto [q_proj, k_proj, v, iq_proj, ik] = mul_mats<5>({&w.q, &w.k, &w.v, &w.index_q, &w.index_k}, a);
    Tensor q = f32(hd, nh, T_), gate = f32(hd, nh, T_), k = f32(hd, nkv, T_), o = f32(hd * nh, T_);
    const float theta = static_cast<float>(hp_.rope_theta), eps = static_cast<float>(hp_.rms_eps);
    // Ratio 0 (the MTP block): no blocks, every row attends to its whole causal prefix.
    const int64_t ratio = hp_.compress_ratios[il], top_blocks = ratio ? hp_.indexer_top_k / ratio : 0;
    for (const SeqPart& p : parts_) {
      const Tensor qg = of(q_proj, p).reshaped({2 * hd, nh, p.n, 1});
      const Tensor k_proj_p = of(k_proj, p), v_p = of(v, p), iq_proj_p = of(iq_proj, p), ik_p = of(ik, p);
      Tensor q_p = of(q, p), gate_p = of(gate, p), k_p = of(k, p), o_p = of(o, p);
      Tensor iq = f32(di, hp_.indexer_n_head, p.n);
      Qwen4ExpLayerState& ls = layer_state(p, il);
      const int64_t n0 = p.positions.front(), n_end = n0 + p.n;
      be_.qsa_prepare({.qg = &qg, .k = &k_proj_p, .v = &v_p, .iq = &iq_proj_p, .ik = &ik_p,
                       .q_norm = &w.q_norm, .k_norm = &w.k_norm, .iq_norm = &w.index_q_norm, .positions = p.positions,
                       .n_rot = hp_.n_rot, .theta = theta, .eps = eps, .q_out = &q_p, .gate_out = &gate_p, .k_out = &k_p,
                       .iq_out = &iq, .k_cache = &ls.k, .v_cache = &ls.v, .ik_cache = &ls.index_keys, .n0 = n0});
      // Blocks completed by this chunk are pooled.
      int64_t nb = ratio ? n_end / ratio : 0;
      if (nb > ls.n_pooled) {
        be_.qsa_pool({.raw_keys = &ls.index_keys, .pooled = &ls.pooled, .k_norm = &w.index_k_norm,
                      .block_begin = ls.n_pooled, .block_end = nb, .ratio = ratio, .n_rot = hp_.n_rot,
                      .theta = theta, .eps = eps});
        ls.n_pooled = nb;
      }
      // A row whose complete blocks are at most top_blocks ((p + 1) / ratio <= top_blocks) keeps all
      // of them and its tail: its selection is its whole causal prefix. Rows are in position order.
      // While every row is such a row (a cache of up to (top_blocks + 1)·ratio − 1 positions) the
      // indexer has nothing to choose: no selection is made, and attention is causal.
      const int64_t dense_rows = ratio ? std::clamp<int64_t>((top_blocks + 1) * ratio - 1 - n0, 0, p.n) : p.n;
      Tensor sel, n_sel;
      if (dense_rows < p.n) {
        int64_t max_sel = std::min(top_blocks * ratio + ratio - 1, n_end);
        sel = be_.alloc_output(DType::I32, {max_sel, p.n, 1, 1}), n_sel = be_.alloc_output(DType::I32, {p.n, 1, 1, 1});
        be_.qsa_select({.iq = &iq, .pooled = &ls.pooled, .positions = p.positions, .ratio = ratio,
                        .top_blocks = top_blocks, .sel = &sel, .n_sel = &n_sel});
        trace("qsa.sel", il, sel);
        trace("qsa.n_sel", il, n_sel);
      }
      be_.qsa_attend({.q = &q_p, .gate = &gate_p, .k_cache = &ls.k, .v_cache = &ls.v,
                      .sel = sel.empty() ? nullptr : &sel, .n_sel = n_sel.empty() ? nullptr : &n_sel,
                      .scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd))), .out = &o_p,
                      .dense_n0 = n0, .dense_rows = dense_rows, .next = &w.out});
    }
    trace("qsa.q", il, q);
    trace("qsa.k", il, k);
    trace("qsa.attn", il, o);
    Tensor y = mul_mat(w.out, o);
    trace("qsa.out", il, y);
    return y;
  }

  Tensor moe(int64_t il, const MoeWeights& w, const Tensor& m) {
    Tensor router = f32(hp_.n_expert, T_), y = f32(hp_.n_embd, T_);
    be_.moe_ffn({.x = &m, .router = &w.router, .gate_exps = &w.gate_exps, .up_exps = &w.up_exps,
                 .down_exps = &w.down_exps, .shared_gate = &w.shared_gate, .shared_up = &w.shared_up,
                 .shared_down = &w.shared_down, .shared_gate_inp = &w.shared_gate_inp, .k = hp_.n_expert_used,
                 .logits = &router, .out = &y});
    trace("moe.router", il, router);
    trace("moe.out", il, y);
    return y;
  }

  const Qwen4ExpHparams& hp_;
  const Qwen4ExpWeights& w_;
  const PleHashConstants& ple_hash_;
  Backend& be_;
  std::vector<SeqPart> parts_;
  HostMailbox* inputs_;
  Tensor queued_ple_rows_;  // with inputs_: the token's n-gram rows [H], received with its id
  const TraceFn& trace_;
  Pass pass_;
  Qwen4ExpVerifyRecord* record_;
  int64_t T_ = 0;
};

// Grows the token-indexed caches (QSA K/V, raw and pooled indexer keys; the MTP layer's when
// `mtp`) to hold n tokens.
void reserve(Backend& be, const Qwen4ExpHparams& hp, Qwen4ExpState& st, int64_t n, bool mtp) {
  if (n <= st.capacity) return;
  int64_t cap = std::max({n, 2 * st.capacity, kInitialCapacity});
  auto grow_layer = [&](Qwen4ExpLayerState& ls, int64_t ratio, int64_t used) {
    auto grow = [&](Tensor& t, std::array<int64_t, 4> ne, int64_t used_values) {
      Tensor bigger = be.alloc(DType::F32, ne);
      if (!t.empty() && used_values > 0) be.copy(t, 0, bigger, 0, used_values);
      t = bigger;
    };
    int64_t hd = hp.head_dim, nkv = hp.n_head_kv, di = hp.indexer_head_dim;
    grow(ls.k, {hd, nkv, cap, 1}, used * hd * nkv);
    grow(ls.v, {hd, nkv, cap, 1}, used * hd * nkv);
    grow(ls.index_keys, {di, cap, 1, 1}, used * di);
    if (ratio) grow(ls.pooled, {di, cap / ratio + 1, 1, 1}, ls.n_pooled * di);
  };
  for (int64_t il = 0; il < hp.n_layer; ++il)
    if (!hp.is_recurrent[il]) grow_layer(st.layers[il], hp.compress_ratios[il], st.n_past);
  if (mtp) grow_layer(st.mtp, 0, st.mtp_n_past);
  st.capacity = cap;
}

Tensor clone_tensor(Backend& be, const Tensor& t) {
  Tensor out;
  copy_into(be, t, out);
  return out;
}

}  // namespace

Qwen4ExpState Qwen4ExpState::clone(Backend& be) const {
  Qwen4ExpState out;
  out.n_past = n_past;
  out.capacity = capacity;
  out.ple_context = ple_context;
  out.ple_conv = clone_tensor(be, ple_conv);
  for (const Qwen4ExpLayerState& ls : layers)
    out.layers.push_back({clone_tensor(be, ls.conv), clone_tensor(be, ls.ssm), clone_tensor(be, ls.k),
                          clone_tensor(be, ls.v), clone_tensor(be, ls.index_keys), clone_tensor(be, ls.pooled),
                          ls.n_pooled});
  const Qwen4ExpLayerState& m = mtp;
  out.mtp = {{}, {}, clone_tensor(be, m.k), clone_tensor(be, m.v), clone_tensor(be, m.index_keys), {}, 0};
  out.mtp_n_past = mtp_n_past;
  out.mtp_waiting = clone_tensor(be, mtp_waiting);
  return out;
}

void Qwen4ExpState::mark(Backend& be, Qwen4ExpMark& m) const {
  m.n_past = n_past;
  m.ple_context = ple_context;
  copy_into(be, ple_conv, m.ple_conv);
  m.conv.resize(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) copy_into(be, layers[i].conv, m.conv[i]);
}

std::shared_ptr<const Qwen4ExpModel> Qwen4ExpModel::load(const std::string& path) {
  return from_file(GgufFile::open(path));
}

std::shared_ptr<const Qwen4ExpModel> Qwen4ExpModel::from_file(GgufFile file) {
  std::shared_ptr<Qwen4ExpModel> m(new Qwen4ExpModel());
  m->file_ = std::move(file);
  m->hp_ = read_hparams(m->file_);
  m->w_ = bind_weights(m->file_, m->hp_);
  if (!m->hp_.ple_layers.empty()) m->ple_hash_ = check_ple_hash(m->hp_, m->w_.ple_table.ne[1], m->file_.source());
  return m;
}

Qwen4ExpState Qwen4ExpModel::new_state(Backend& be, DType gdn_state) const {
  Qwen4ExpState st;
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    Qwen4ExpLayerState ls;
    if (hp_.is_recurrent[il]) {
      ls.conv = be.alloc(DType::F32, {hp_.ssm_conv_dim(), hp_.ssm_conv_kernel - 1, 1, 1});
      ls.ssm = be.alloc(gdn_state, {hp_.ssm_v_head_dim, hp_.ssm_k_head_dim, hp_.ssm_n_v_heads, 1});
    }
    st.layers.push_back(std::move(ls));
  }
  if (!hp_.ple_layers.empty()) {
    st.ple_context.assign(hp_.ple_ngram_size - 1, static_cast<int32_t>(hp_.ple_eos_token_id));
    st.ple_conv = be.alloc(DType::F32, {hp_.hc_dim(), (hp_.ple_conv_kernel - 1) * hp_.ple_ngram_size, 1, 1});
  }
  reserve(be, hp_, st, kInitialCapacity, has_mtp());
  return st;
}

Tensor Qwen4ExpModel::forward(Backend& be, Qwen4ExpState& state, std::span<const int32_t> tokens, LogitRows rows,
                              const TraceFn& trace, Tensor* wide, Qwen4ExpVerifyRecord* record) const {
  if (tokens.empty()) fail("forward: no tokens");
  for (int32_t t : tokens) check_token(hp_, t);
  reserve(be, hp_, state, state.n_past + static_cast<int64_t>(tokens.size()), has_mtp());
  const auto n = static_cast<int64_t>(tokens.size());
  if (record) {
    state.mark(be, record->start);
    record->tokens.assign(tokens.begin(), tokens.end());
    record->conv_inputs.assign(static_cast<size_t>(hp_.n_layer), Tensor());
    record->states.resize(static_cast<size_t>(hp_.n_layer));
  }
  return Forward(*this, ple_hash_, be, {SeqPart(&state, tokens, n)}, nullptr, trace, Pass::Trunk, record).run(rows, wide);
}

namespace {
// out [R, L] ← the last L columns of [old | the first m columns of inputs] (old [R, L], inputs
// [R, ≥ m]): a convolution's history after m of the inputs.
void history_after(Backend& be, const Tensor& old, const Tensor& inputs, int64_t m, Tensor& out) {
  const int64_t R = old.ne(0), L = old.ne(1), from_old = std::max<int64_t>(0, L - m);
  if (from_old) be.copy(old, m * R, out, 0, from_old * R);
  if (L > from_old) be.copy(inputs, (m - (L - from_old)) * R, out, from_old * R, (L - from_old) * R);
}
}  // namespace

void Qwen4ExpModel::keep_verified(Backend& be, Qwen4ExpState& state, const Qwen4ExpVerifyRecord& record,
                                  int64_t m) const {
  const auto T = static_cast<int64_t>(record.tokens.size());
  if (m < 1 || m > T) fail("keep_verified: ", m, " of ", T, " verified tokens (the first is always kept)");
  if (state.n_past != record.start.n_past + T) fail("keep_verified: the state moved on since the verified tokens");
  if (m == T) return;
  state.n_past = record.start.n_past + m;
  for (int64_t il = 0; il < hp_.n_layer; ++il) {
    Qwen4ExpLayerState& ls = state.layers[static_cast<size_t>(il)];
    const auto i = static_cast<size_t>(il);
    if (hp_.is_recurrent[il]) {
      const int64_t n_state = ls.ssm.n_elements();
      be.copy(record.states[i], (m - 1) * n_state, ls.ssm, 0, n_state);
      history_after(be, record.start.conv[i], record.conv_inputs[i], m, ls.conv);
    } else {  // blocks that a taken-back position completed are pooled again when completed again
      ls.n_pooled = std::min(ls.n_pooled, state.n_past / hp_.compress_ratios[il]);
    }
  }
  if (!hp_.ple_layers.empty()) {
    history_after(be, record.start.ple_conv, record.ple_inputs, m, state.ple_conv);
    std::vector<int32_t> context = record.start.ple_context;
    context.insert(context.end(), record.tokens.begin(), record.tokens.begin() + m);
    state.ple_context.assign(context.end() - static_cast<std::ptrdiff_t>(record.start.ple_context.size()), context.end());
  }
  const int64_t waiting = state.n_past - state.mtp_n_past;  // MTP cells still waiting for their next token
  if (!state.mtp_waiting.empty())
    state.mtp_waiting = waiting > 0 ? state.mtp_waiting.slice(1, 0, waiting) : Tensor();
}

std::string Qwen4ExpModel::mtp_problem() const {
  if (!w_.mtp_unusable.empty()) return w_.mtp_unusable;
  return has_mtp() ? std::string() : cat(file_.source(), " has no MTP block (nextn_predict_layers)");
}

void Qwen4ExpModel::check_mtp_cells(Backend& be, Qwen4ExpState& state, const Tensor& wide, int64_t n) const {
  if (!has_mtp()) fail("mtp_forward: ", file_.source(), " has no MTP block");
  if (n == 0) fail("mtp_forward: no cells");
  if (wide.ne(0) != hp_.hc_dim() || wide.ne(1) != n || wide.ne(2) != 1)
    fail("mtp_forward: the wide residual is ", wide.shape_string(), " for ", n, " cells of ", hp_.hc_dim());
  reserve(be, hp_, state, state.mtp_n_past + n, true);
}

Tensor Qwen4ExpModel::mtp_forward(Backend& be, Qwen4ExpState& state, const Tensor& wide, std::span<const int32_t> next,
                                  bool logits, Tensor* wide_out, const TraceFn& trace) const {
  const auto n = static_cast<int64_t>(next.size());
  for (int32_t t : next) check_token(hp_, t);
  check_mtp_cells(be, state, wide, n);
  return Forward(*this, ple_hash_, be, {SeqPart(&state, next, n)}, nullptr, trace, Pass::Mtp)
      .run_mtp(wide, logits, wide_out);
}

Tensor Qwen4ExpModel::mtp_forward_by(Backend& be, Qwen4ExpState& state, const Tensor& wide, const Tensor& next_id,
                                     Tensor* wide_out, const TraceFn& trace) const {
  if (next_id.dtype() != DType::I32 || next_id.n_elements() != 1)
    fail("mtp_forward_by: the token is ", next_id.shape_string(), ", not one I32 id");
  check_mtp_cells(be, state, wide, 1);
  return Forward(*this, ple_hash_, be, {SeqPart(&state, {}, 1)}, nullptr, trace, Pass::Mtp)
      .run_mtp(wide, true, wide_out, &next_id);
}

Tensor Qwen4ExpModel::forward_batch(Backend& be, std::span<Qwen4ExpState* const> states,
                                    std::span<const int32_t> tokens, const TraceFn& trace, Tensor* wide) const {
  if (states.empty() || states.size() != tokens.size())
    fail("forward_batch: ", states.size(), " sequences for ", tokens.size(), " tokens");
  std::vector<SeqPart> parts;
  for (size_t i = 0; i < states.size(); ++i) {
    if (std::find(states.begin(), states.begin() + static_cast<std::ptrdiff_t>(i), states[i]) !=
        states.begin() + static_cast<std::ptrdiff_t>(i))
      fail("forward_batch: a sequence appears twice");
    check_token(hp_, tokens[i]);
    reserve(be, hp_, *states[i], states[i]->n_past + 1, has_mtp());
    parts.emplace_back(states[i], tokens.subspan(i, 1), 1);
  }
  return Forward(*this, ple_hash_, be, std::move(parts), nullptr, trace).run(LogitRows::All, wide);
}

size_t Qwen4ExpModel::queued_inputs_bytes() const { return mailbox_bytes(hp_); }

Tensor Qwen4ExpModel::forward_queued(Backend& be, Qwen4ExpState& state, HostMailbox& inputs,
                                     const TraceFn& trace) const {
  if (inputs.bytes().size() < queued_inputs_bytes()) fail("forward_queued: a mailbox of ", inputs.bytes().size(), " bytes");
  reserve(be, hp_, state, state.n_past + 1, has_mtp());
  return Forward(*this, ple_hash_, be, {SeqPart(&state, {}, 1)}, &inputs, trace).run(LogitRows::Last, nullptr);
}

void Qwen4ExpModel::give_queued_token(Qwen4ExpState& state, HostMailbox& inputs, int32_t token) const {
  check_token(hp_, token);
  uint8_t* at = inputs.bytes().data();
  std::memcpy(at + kQueuedToken, &token, sizeof token);
  if (!hp_.ple_layers.empty()) {
    // The rows a forward() of this token would gather (its backend gathers them on the host too).
    const Weight& table = w_.ple_table;
    auto* rows = reinterpret_cast<float*>(at + kQueuedPleRows);
    const std::vector<int64_t> ids = ple_rows(hp_, ple_hash_, state.ple_context, std::span(&token, 1));
    for (size_t i = 0; i < ids.size(); ++i)
      dequantize_row(table.type, table.data + static_cast<uint64_t>(ids[i]) * table.row_bytes, table.ne[0],
                     rows + i * table.ne[0]);
  }
  inputs.release();
}

}  // namespace regolith
