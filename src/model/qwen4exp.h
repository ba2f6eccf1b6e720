// The qwen4exp text model (model-spec §4): the forward pass written once against backend ops,
// and the per-sequence state it reads and advances. Prefill and decode are the same code: the ops
// choose their algorithm by token count (GDN chunked scan vs recurrent step, per-row QSA selection).
// A decode step of several sequences is one pass too (forward_batch). The MTP draft head
// (mtp_forward) is the same layer code on the file's trailing block. Not here: vision inputs.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/ops.h"
#include "gguf/gguf.h"
#include "model/ple_hash.h"
#include "model/qwen4exp_hparams.h"
#include "model/weights.h"

namespace regolith {

// Per-layer state of one sequence. GDN layers use conv/ssm, QSA layers the caches.
struct Qwen4ExpLayerState {
  Tensor conv;        // GDN [C, K−1]: the last K−1 pre-conv qkv rows, oldest first
  Tensor ssm;         // GDN [dv, dk, nv] FP32 recurrent state
  Tensor k, v;        // QSA [hd, nh_kv, capacity]: normed + rotated keys, values
  Tensor index_keys;  // QSA [d_idx, capacity]: raw indexer keys (no norm, no rope)
  Tensor pooled;      // QSA [d_idx, capacity/ratio]: pooled block keys, cached once a block completes
  int64_t n_pooled = 0;
};

struct Qwen4ExpMark;

struct Qwen4ExpState {
  int64_t n_past = 0;    // tokens consumed; the next token's position
  int64_t capacity = 0;  // token slots in the QSA caches (the MTP layer's too)
  std::vector<Qwen4ExpLayerState> layers;
  std::vector<int32_t> ple_context;  // the last ngram_size−1 token ids (EOS before the first token)
  Tensor ple_conv;                   // [W, (K−1)·ngram_size]: the last PLE conv inputs, oldest first
  // The MTP layer's caches (dense attention: no pooled keys), its cells done (positions
  // 0 .. mtp_n_past − 1), and the trunk's wide residual at the positions mtp_n_past .. n_past − 1,
  // whose cells wait for the token after them [W, n_past − mtp_n_past]. Kept only by sessions that
  // draft with MTP (Session::enable_mtp).
  Qwen4ExpLayerState mtp;
  int64_t mtp_n_past = 0;
  Tensor mtp_waiting;

  Qwen4ExpState clone(Backend& be) const;  // a deep copy (checkpoint)
  // Saves into `m` the histories a forward pass moves on, reusing its buffers.
  void mark(Backend& be, Qwen4ExpMark& m) const;
};

// A state's convolution histories and n-gram context at one point (Qwen4ExpState::mark): with the
// inputs recorded after it, the histories after any of those inputs. The caches indexed by
// position need no copy: positions past n_past are free slots.
struct Qwen4ExpMark {
  int64_t n_past = -1;
  std::vector<int32_t> ple_context;
  Tensor ple_conv;
  std::vector<Tensor> conv;  // per layer (empty on QSA layers)
};

// What a forward pass of verified tokens records so that only its first tokens can be kept
// without evaluating them again (Qwen4ExpModel::keep_verified): the histories before it, each GDN
// layer's conv inputs and recurrent state after every token but the last, the PLE conv inputs.
struct Qwen4ExpVerifyRecord {
  Qwen4ExpMark start;
  std::vector<int32_t> tokens;
  std::vector<Tensor> conv_inputs;          // per layer: GDN [C, T]
  std::vector<Tensor> states;               // per layer: GDN [dv, dk, nv, T − 1], after tokens 0 .. T − 2
  Tensor ple_inputs;                        // [W, T]
};

// Receives named intermediates: name, layer (−1 outside layers), tensor [n, T]. Off when empty.
using TraceFn = std::function<void(std::string_view name, int64_t layer, const Tensor& t)>;

enum class LogitRows { All, Last };

class Qwen4ExpModel {
 public:
  // Opens and validates a GGUF (hyperparameters, every tensor, the PLE hash constants).
  static std::shared_ptr<const Qwen4ExpModel> load(const std::string& path);
  static std::shared_ptr<const Qwen4ExpModel> from_file(GgufFile file);

  const Qwen4ExpHparams& hparams() const { return hp_; }
  const Qwen4ExpWeights& weights() const { return w_; }
  const GgufFile& file() const { return file_; }

  Qwen4ExpState new_state(Backend& be, DType gdn_state = DType::F32) const;  // gdn_state: F32 or BF16

  // Consumes `tokens` at positions state.n_past.. and returns logits [n_vocab, rows] (all tokens,
  // or the last one only). One call is one chunk: the caller splits long prompts.
  // `wide`, when given, receives the wide residual after the last layer (before the final mixer)
  // of every token [W, T]: the MTP head's input. `record`, when given, is filled for
  // keep_verified (the GDN layers then step through the tokens one by one, as decode does).
  Tensor forward(Backend& be, Qwen4ExpState& state, std::span<const int32_t> tokens, LogitRows rows,
                 const TraceFn& trace = {}, Tensor* wide = nullptr, Qwen4ExpVerifyRecord* record = nullptr) const;
  // After a forward() that filled `record`: keeps its first m tokens (m >= 1: the first verified
  // token is the one chosen from known logits) and takes the rest back, as if they had never been
  // evaluated (the MTP cells' waiting residuals are trimmed to match).
  void keep_verified(Backend& be, Qwen4ExpState& state, const Qwen4ExpVerifyRecord& record, int64_t m) const;
  // The MTP draft head (model-spec §4.10): cell i reads the trunk's wide residual at position i and
  // the token at i + 1, rotates at position i and writes the MTP layer's cache there. Runs cells
  // state.mtp_n_past .. + n − 1 on the columns of `wide` [W, n] and `next` (n ids) in one pass.
  // Returns the last cell's draft logits [n_vocab, 1] (nothing unless `logits`) and puts its output
  // residual [W, 1] in *wide_out when given: the input of a following draft cell.
  bool has_mtp() const { return w_.mtp.has_value(); }
  // Why this file cannot draft with MTP, naming it ("" when it can): no MTP block, or one whose
  // projection cannot be split.
  std::string mtp_problem() const;
  Tensor mtp_forward(Backend& be, Qwen4ExpState& state, const Tensor& wide, std::span<const int32_t> next,
                     bool logits, Tensor* wide_out = nullptr, const TraceFn& trace = {}) const;
  // One draft cell whose token `next_id` (I32 [1]) is in the backend's memory, as Backend::argmax
  // leaves the draft before it: chained drafts need no read back between them. Returns its logits.
  Tensor mtp_forward_by(Backend& be, Qwen4ExpState& state, const Tensor& wide, const Tensor& next_id,
                        Tensor* wide_out = nullptr, const TraceFn& trace = {}) const;
  // One token for each of several sequences (distinct states), at each one's position: the products
  // read every weight once for all of them. Returns logits [n_vocab, states.size()]; `wide` as in
  // forward(), a column a sequence.
  Tensor forward_batch(Backend& be, std::span<Qwen4ExpState* const> states, std::span<const int32_t> tokens,
                       const TraceFn& trace = {}, Tensor* wide = nullptr) const;
  // One token at position state.n_past, issued before the token is known: its id and n-gram rows
  // are read from `inputs` (a mailbox of queued_inputs_bytes()) when the device reaches them, once
  // give_queued_token() has written and released them, so a backend that queues work can issue
  // the next decode step while the device still runs this one. Returns logits [n_vocab, 1].
  Tensor forward_queued(Backend& be, Qwen4ExpState& state, HostMailbox& inputs, const TraceFn& trace = {}) const;
  void give_queued_token(Qwen4ExpState& state, HostMailbox& inputs, int32_t token) const;
  size_t queued_inputs_bytes() const;
  // An upper estimate of the bytes of activations forward() allocates for T tokens
  // (qwen4exp_memory.cpp); the weights and the state are not included.
  uint64_t forward_bytes(int64_t T, LogitRows rows) const;

 private:
  Qwen4ExpModel() = default;
  // What every MTP pass of n cells checks (an MTP block, wide's shape), then room for the cells.
  void check_mtp_cells(Backend& be, Qwen4ExpState& state, const Tensor& wide, int64_t n) const;
  GgufFile file_;
  Qwen4ExpHparams hp_;
  Qwen4ExpWeights w_;
  PleHashConstants ple_hash_;
};

}  // namespace regolith
