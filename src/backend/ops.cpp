// Backend-independent pieces of ops.h: tensor views, argument checks, host reads, products that
// share an input, and the prefill/decode dispatch of the GDN scan.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "backend/ops.h"
#include "core/error.h"

namespace regolith {

Tensor Tensor::reshaped(std::array<int64_t, 4> ne) const {
  if (ne[0] * ne[1] * ne[2] * ne[3] != n_elements())
    fail("cannot view tensor ", shape_string(), " as {", ne[0], ", ", ne[1], ", ", ne[2], ", ", ne[3], "}");
  return Tensor(dtype_, ne, storage_, offset_);
}

Tensor Tensor::slice(int dim, int64_t first, int64_t n) const {
  if (dim < 0 || dim > 3 || first < 0 || n < 0 || first + n > ne_[dim])
    fail("cannot slice ", n, " from ", first, " of dimension ", dim, " of tensor ", shape_string());
  for (int d = dim + 1; d < 4; ++d)
    if (ne_[d] != 1) fail("cannot slice dimension ", dim, " of tensor ", shape_string(), ": not its outermost");
  int64_t stride = 1;
  for (int d = 0; d < dim; ++d) stride *= ne_[d];
  std::array<int64_t, 4> ne = ne_;
  ne[dim] = n;
  return Tensor(dtype_, ne, storage_, offset_ + first * stride);
}

Tensor Tensor::bitcast(DType dtype) const {
  if (dtype_bytes(dtype) != dtype_bytes(dtype_))
    fail("cannot read tensor ", shape_string(), " of ", dtype_name(dtype_), " as ", dtype_name(dtype));
  return Tensor(dtype, ne_, storage_, offset_);
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::I32: return "i32";
    case DType::BF16: return "bf16";
  }
  return "?";
}

std::string Tensor::shape_string() const { return cat("{", ne_[0], ", ", ne_[1], ", ", ne_[2], ", ", ne_[3], "}"); }

void expect_shape(const Tensor& t, std::array<int64_t, 4> ne, const char* op, const char* what) {
  if (t.empty() || t.ne() != ne)
    fail(op, ": ", what, " is ", t.empty() ? std::string("missing") : t.shape_string(), ", expected {", ne[0], ", ",
         ne[1], ", ", ne[2], ", ", ne[3], "}");
}

void expect_elements(const Tensor& t, int64_t n, const char* op, const char* what) {
  if (t.empty() || t.n_elements() != n) fail(op, ": ", what, " has ", t.n_elements(), " values, expected ", n);
}

void check_get_rows(const Weight& table, std::span<const int64_t> ids, const Tensor& out) {
  expect_elements(out, table.ne[0] * static_cast<int64_t>(ids.size()), "get_rows", "out");
  for (int64_t id : ids)
    if (id < 0 || id >= table.n_rows())
      fail("get_rows: row ", id, " is outside ", table.name, " (", table.n_rows(), " rows)");
}

void check_mul_mat(const Weight& w, const Tensor& x, const Tensor& out) {
  int64_t T = x.ne(1);
  if (w.ne[2] != 1 || w.ne[3] != 1) fail("mul_mat: ", w.name, " is not a matrix");
  expect_shape(x, {w.ne[0], T, 1, 1}, "mul_mat", "x");
  expect_shape(out, {w.ne[1], T, 1, 1}, "mul_mat", "out");
}

void check_add(const Tensor& a, const Tensor& b, const Tensor& out) {
  expect_shape(b, a.ne(), "add", "b");
  expect_shape(out, a.ne(), "add", "out");
}

void check_repeat_streams(const Tensor& x, int64_t n_streams, const Tensor& out) {
  expect_shape(out, {x.ne(0) * n_streams, x.ne(1), 1, 1}, "repeat_streams", "out");
}

void check_rms_norm(const Tensor& x, const Weight* w, int64_t group, const Tensor& out) {
  int64_t n = x.ne(0);
  if (group <= 0 || n % group != 0) fail("rms_norm: group ", group, " does not divide rows of ", n);
  expect_shape(out, x.ne(), "rms_norm", "out");
  if (w && w->n_elements() != group && w->n_elements() != n)
    fail("rms_norm: weight ", w->name, " has ", w->n_elements(), " values for groups of ", group, " in rows of ", n);
}

void check_rope(const Tensor& x, std::span<const int64_t> positions, int64_t n_rot) {
  if (static_cast<int64_t>(positions.size()) != x.ne(2) || x.ne(3) != 1)
    fail("rope: ", positions.size(), " positions for ", x.shape_string());
  if (n_rot <= 0 || n_rot % 2 || n_rot > x.ne(0)) fail("rope: n_rot ", n_rot, " for heads of ", x.ne(0));
}

void check_swiglu(const Tensor& g, const Tensor& u, const Tensor& out) {
  expect_shape(u, g.ne(), "swiglu", "u");
  expect_shape(out, g.ne(), "swiglu", "out");
}

void check_add_sigmoid_gated(const Tensor& acc, const Tensor& x, const Tensor& s) {
  expect_shape(x, acc.ne(), "add_sigmoid_gated", "x");
  expect_shape(s, {1, acc.ne(1), 1, 1}, "add_sigmoid_gated", "s");
}

std::array<int64_t, 4> states_after_shape(const Tensor& state, int64_t T) {
  const auto& ne = state.ne();
  return {ne[0], ne[1], ne[2], std::max<int64_t>(T - 1, 1)};
}

void check_states_after(const GdnCoreArgs& a) {
  expect_shape(*a.states_after, states_after_shape(*a.state, a.qkv->ne(1)), "gdn_core", "states_after");
  if (a.states_after->dtype() != a.state->dtype()) fail("gdn_core: states_after is not of the state's type");
}

void check_columns(int64_t columns, size_t states, const char* op) {
  if (columns != static_cast<int64_t>(states)) fail(op, ": ", columns, " columns with ", states, " sequence states");
}

void check_causal_conv(const Tensor& x, const Tensor& history, const Weight& w, int64_t dilation, const Tensor& out) {
  int64_t C = x.ne(0);
  if (w.ne[1] != C) fail("causal_conv: ", w.name, " has ", w.ne[1], " channels, input has ", C);
  if (w.ne[0] < 1 || dilation < 1) fail("causal_conv: ", w.ne[0], " taps at dilation ", dilation, " (both must be positive)");
  expect_shape(history, {C, (w.ne[0] - 1) * dilation, 1, 1}, "causal_conv", "history");
  expect_shape(out, x.ne(), "causal_conv", "out");
}

void check_hc_read(const HcReadArgs& a) {
  int64_t S = a.n_streams, W = a.R->ne(0), T = a.R->ne(1), r = a.down->ne[1];
  if (S <= 0 || W % S) fail("hc_read: ", S, " streams do not divide ", W);
  if (a.norm->n_elements() != W || a.down->ne[0] != W || a.up->ne[0] != r || a.up->ne[1] != W)
    fail("hc_read: weights ", a.norm->name, ", ", a.down->name, ", ", a.up->name, " do not fit width ", W);
  expect_shape(*a.x, {W / S, T, 1, 1}, "hc_read", "x");
  if (a.inject) {
    if (a.inject->ne[0] != W || a.inject->ne[1] != S) fail("hc_read: ", a.inject->name, " does not fit");
    expect_shape(*a.inject_w, {S, T, 1, 1}, "hc_read", "inject_w");
  }
}

void check_hc_write(const Tensor& R, const Tensor& y, const Tensor& inject_w) {
  int64_t W = R.ne(0), T = R.ne(1), H = y.ne(0), S = inject_w.ne(0);
  if (H * S != W) fail("hc_write: ", S, " streams of ", H, " do not make ", W);
  expect_shape(y, {H, T, 1, 1}, "hc_write", "y");
  expect_shape(inject_w, {S, T, 1, 1}, "hc_write", "inject_w");
}

void check_gdn_gates(const Tensor& alpha, const Tensor& beta_raw, const Weight& ssm_a, const Weight& dt_bias,
                     const Tensor& g, const Tensor& beta) {
  int64_t nv = alpha.ne(0);
  if (ssm_a.n_elements() != nv || dt_bias.n_elements() != nv)
    fail("gdn_gates: ", ssm_a.name, " / ", dt_bias.name, " do not have ", nv, " heads");
  expect_shape(beta_raw, alpha.ne(), "gdn_gates", "beta_raw");
  expect_shape(g, alpha.ne(), "gdn_gates", "g");
  expect_shape(beta, alpha.ne(), "gdn_gates", "beta");
}

void check_gdn_scan(const GdnScanArgs& a, const char* op) {
  int64_t T = a.qkv->ne(1), nk = a.n_k_heads, nv = a.n_v_heads;
  if (nk <= 0 || nv <= 0 || nv % nk) fail(op, ": ", nv, " v heads over ", nk, " k heads");
  expect_shape(*a.qkv, {2 * nk * a.dk + nv * a.dv, T, 1, 1}, op, "qkv");
  expect_shape(*a.g, {nv, T, 1, 1}, op, "g");
  expect_shape(*a.beta, {nv, T, 1, 1}, op, "beta");
  expect_shape(*a.state, {a.dv, a.dk, nv, 1}, op, "state");
  if (a.state->dtype() != DType::F32 && a.state->dtype() != DType::BF16)
    fail(op, ": the state is ", dtype_name(a.state->dtype()), ", not f32 or bf16");
  expect_shape(*a.out, {a.dv * nv, T, 1, 1}, op, "out");
}

void check_gated_rms_norm(const Tensor& x, const Tensor& z, const Weight& w, const Tensor& out) {
  int64_t dv = w.n_elements();
  if (dv <= 0 || x.ne(0) % dv) fail("gated_rms_norm: ", w.name, " (", dv, ") does not divide ", x.ne(0));
  expect_shape(z, x.ne(), "gated_rms_norm", "z");
  expect_shape(out, x.ne(), "gated_rms_norm", "out");
}

void check_split_q_gate(const Tensor& qg, const Tensor& q, const Tensor& gate) {
  std::array<int64_t, 4> ne{qg.ne(0) / 2, qg.ne(1), qg.ne(2), 1};
  expect_shape(q, ne, "split_q_gate", "q");
  expect_shape(gate, ne, "split_q_gate", "gate");
}

void check_qsa_pool(const QsaPoolArgs& a) {
  int64_t d = a.raw_keys->ne(0);
  if (a.pooled->ne(0) != d || a.k_norm->n_elements() != d) fail("qsa_pool: widths differ from ", d);
  if (a.block_begin < 0 || a.block_end > a.pooled->ne(1) || a.block_end * a.ratio > a.raw_keys->ne(1))
    fail("qsa_pool: blocks [", a.block_begin, ", ", a.block_end, ") exceed the caches");
  if (a.n_rot <= 0 || a.n_rot % 2 || a.n_rot > d) fail("qsa_pool: n_rot ", a.n_rot, " for keys of ", d);
}

void check_qsa_select(const QsaSelectArgs& a) {
  int64_t d = a.iq->ne(0), T = a.iq->ne(2), max_sel = a.sel->ne(0);
  if (static_cast<int64_t>(a.positions.size()) != T) fail("qsa_select: ", a.positions.size(), " positions for ", T, " rows");
  if (a.pooled->ne(0) != d) fail("qsa_select: pooled keys are ", a.pooled->ne(0), " wide, queries ", d);
  expect_shape(*a.sel, {max_sel, T, 1, 1}, "qsa_select", "sel");
  expect_shape(*a.n_sel, {T, 1, 1, 1}, "qsa_select", "n_sel");
  for (int64_t p : a.positions) {
    int64_t nb = (p + 1) / a.ratio;
    if (nb > a.pooled->ne(1)) fail("qsa_select: row at position ", p, " needs ", nb, " pooled blocks");
    // The chosen blocks (as many as qsa_top_blocks returns) and the incomplete tail.
    int64_t n = std::clamp<int64_t>(a.top_blocks, 0, nb) * a.ratio + (p + 1 - nb * a.ratio);
    if (n > max_sel) fail("qsa_select: ", n, " selected positions exceed the ", max_sel, " slots");
  }
}

void check_qsa_attend(const QsaAttendArgs& a) {
  int64_t hd = a.q->ne(0), nh = a.q->ne(1), T = a.q->ne(2), nkv = a.k_cache->ne(1), cap = a.k_cache->ne(2);
  if (nkv <= 0 || nh % nkv) fail("qsa_attend: ", nkv, " kv heads for ", nh, " heads");
  expect_shape(*a.gate, a.q->ne(), "qsa_attend", "gate");
  expect_shape(*a.k_cache, {hd, nkv, cap, 1}, "qsa_attend", "k_cache");
  expect_shape(*a.v_cache, {hd, nkv, cap, 1}, "qsa_attend", "v_cache");
  expect_shape(*a.out, {hd * nh, T, 1, 1}, "qsa_attend", "out");
  if (a.dense_rows < 0 || a.dense_rows > T || a.dense_n0 < 0)
    fail("qsa_attend: ", a.dense_rows, " dense rows from position ", a.dense_n0, " for ", T, " rows");
  if (!a.sel != !a.n_sel) fail("qsa_attend: sel and n_sel come together");
  if (!a.sel && a.dense_rows != T) fail("qsa_attend: no selection for ", T - a.dense_rows, " rows that are not dense");
  if (a.sel) {
    expect_shape(*a.sel, {a.sel->ne(0), T, 1, 1}, "qsa_attend", "sel");
    expect_shape(*a.n_sel, {T, 1, 1, 1}, "qsa_attend", "n_sel");
  }
  const int64_t slots = a.sel ? a.sel->ne(0) : a.dense_n0 + T;
  if (a.dense_rows > 0 && (a.dense_n0 + a.dense_rows > cap || a.dense_n0 + a.dense_rows > slots))
    fail("qsa_attend: dense rows up to position ", a.dense_n0 + a.dense_rows - 1, " for ", cap, " cached positions and ",
         slots, " slots");
}

QsaRows::QsaRows(const QsaAttendArgs& a) : n0_(a.dense_n0) {
  if (a.sel) {
    sel_ = a.sel->i32(), n_sel_ = a.n_sel->i32(), slots_ = a.sel->ne(0);
    return;
  }
  slots_ = a.dense_n0 + a.q->ne(2);
  dense_.resize(static_cast<size_t>(slots_));
  std::iota(dense_.begin(), dense_.end(), 0);
}

void check_moe_route(const Tensor& logits, int64_t k, const Tensor& ids, const Tensor& weights) {
  int64_t E = logits.ne(0), T = logits.ne(1);
  if (k <= 0 || k > E) fail("moe_route: top ", k, " of ", E, " experts");
  expect_shape(ids, {k, T, 1, 1}, "moe_route", "ids");
  expect_shape(weights, {k, T, 1, 1}, "moe_route", "weights");
}

void check_moe_experts(const MoeExpertsArgs& a) {
  const Weight &wg = *a.gate_exps, &wu = *a.up_exps, &wd = *a.down_exps;
  int64_t H = wg.ne[0], F = wg.ne[1], E = wg.ne[2], T = a.x->ne(1), k = a.ids->ne(0);
  if (wu.ne != wg.ne || wd.ne[0] != F || wd.ne[1] != H || wd.ne[2] != E)
    fail("moe_experts: ", wg.name, ", ", wu.name, ", ", wd.name, " do not fit together");
  expect_shape(*a.x, {H, T, 1, 1}, "moe_experts", "x");
  expect_shape(*a.ids, {k, T, 1, 1}, "moe_experts", "ids");
  expect_shape(*a.weights, {k, T, 1, 1}, "moe_experts", "weights");
  expect_shape(*a.out, {H, T, 1, 1}, "moe_experts", "out");
}

void check_moe_ffn(const MoeFfnArgs& a) {
  const Weight &wg = *a.gate_exps, &sg = *a.shared_gate, &su = *a.shared_up, &sd = *a.shared_down;
  int64_t H = wg.ne[0], E = wg.ne[2], T = a.x->ne(1), Fs = sg.ne[1];
  if (a.router->ne[0] != H || a.router->ne[1] != E)
    fail("moe_ffn: ", a.router->name, " does not map ", H, " values to ", E, " experts");
  if (sg.ne[0] != H || su.ne != sg.ne || sd.ne[0] != Fs || sd.ne[1] != H || a.shared_gate_inp->ne[0] != H ||
      a.shared_gate_inp->ne[1] != 1)
    fail("moe_ffn: ", sg.name, ", ", su.name, ", ", sd.name, ", ", a.shared_gate_inp->name, " do not fit together");
  if (a.k <= 0 || a.k > E) fail("moe_ffn: top ", a.k, " of ", E, " experts");
  expect_shape(*a.x, {H, T, 1, 1}, "moe_ffn", "x");
  expect_shape(*a.logits, {E, T, 1, 1}, "moe_ffn", "logits");
  expect_shape(*a.out, {H, T, 1, 1}, "moe_ffn", "out");
}

void check_ple_gate(const Tensor& key, const Tensor& qry, const Tensor& val, int64_t n_streams, const Tensor& out) {
  int64_t W = key.ne(0), T = key.ne(1), H = val.ne(0);
  if (H * n_streams != W) fail("ple_gate: ", n_streams, " streams of ", H, " do not make ", W);
  expect_shape(qry, key.ne(), "ple_gate", "qry");
  expect_shape(val, {H, T, 1, 1}, "ple_gate", "val");
  expect_shape(out, key.ne(), "ple_gate", "out");
}

void check_ple_inject(const PleInjectArgs& a) {
  const int64_t S = a.n_streams, W = a.R->ne(0), T = a.R->ne(1);
  if (a.R->dtype() != DType::F32) fail("ple_inject: R is not F32");
  if (S <= 0 || W % S) fail("ple_inject: ", S, " streams do not divide ", W);
  const int64_t H = W / S, K = a.conv->ne[0];
  expect_shape(*a.R, {W, T, 1, 1}, "ple_inject", "R");
  if (!a.y != !a.inject_w) fail("ple_inject: a pending write needs both y and inject_w");
  if (a.y) check_hc_write(*a.R, *a.y, *a.inject_w);
  expect_shape(*a.key_proj, {W, T, 1, 1}, "ple_inject", "key_proj");
  expect_shape(*a.val, {H, T, 1, 1}, "ple_inject", "val");
  for (const Weight* w : {a.norm_key, a.norm_query, a.norm_conv})
    if (w->n_elements() != W) fail("ple_inject: ", w->name, " does not have ", W, " values");
  if (K < 1 || a.conv->ne[1] != W || a.dilation < 1) fail("ple_inject: ", a.conv->name, " is not a conv over ", W, " channels");
  expect_shape(*a.history, {W, (K - 1) * a.dilation, 1, 1}, "ple_inject", "history");
  if (a.conv_inputs) expect_shape(*a.conv_inputs, {W, T, 1, 1}, "ple_inject", "conv_inputs");
}

void Backend::ple_inject(const PleInjectArgs& a) {
  check_ple_inject(a);
  Tensor& R = *a.R;
  const int64_t W = R.ne(0), T = R.ne(1), H = W / a.n_streams;
  if (a.y) hc_write(R, *a.y, *a.inject_w);
  const auto wide = [&] { return alloc_output(DType::F32, {W, T, 1, 1}); };
  Tensor key = wide(), qry = wide(), G = wide(), C = wide();
  Tensor N = a.conv_inputs ? *a.conv_inputs : wide();
  rms_norm(*a.key_proj, a.norm_key, H, a.eps, key);
  rms_norm(R, a.norm_query, H, a.eps, qry);
  ple_gate(key, qry, *a.val, a.n_streams, G);
  rms_norm(G, a.norm_conv, H, a.eps, N);
  causal_conv(N, *a.history, *a.conv, a.dilation, C);
  add(R, G, R);
  add(R, C, R);
}

std::vector<float> Backend::read_f32(const Tensor& t) {
  if (t.dtype() != DType::F32) fail("read_f32 on a non-F32 tensor");
  std::vector<float> out(t.n_elements());
  read(t, out.data(), out.size() * sizeof(float));
  return out;
}

std::vector<int32_t> Backend::read_i32(const Tensor& t) {
  if (t.dtype() != DType::I32) fail("read_i32 on a non-I32 tensor");
  std::vector<int32_t> out(t.n_elements());
  read(t, out.data(), out.size() * sizeof(int32_t));
  return out;
}

namespace {

class ReadNow final : public PendingRead {
 public:
  explicit ReadNow(std::vector<float> values) : values_(std::move(values)) {}
  std::span<const float> wait() override { return values_; }

 private:
  std::vector<float> values_;
};

}  // namespace

std::unique_ptr<PendingRead> Backend::read_later(const Tensor& src) { return std::make_unique<ReadNow>(read_f32(src)); }

std::unique_ptr<HostMailbox> Backend::mailbox(size_t) { return nullptr; }

void check_receive(HostMailbox& from, size_t offset, const Tensor& dst) {
  const size_t size = from.bytes().size();
  if (offset > size || dst.n_bytes() > size - offset)
    fail("receive: ", dst.n_bytes(), " bytes at ", offset, " of a ", size, "-byte mailbox");
}

void Backend::receive(HostMailbox& from, size_t offset, Tensor& dst) {
  check_receive(from, offset, dst);
  write(dst, from.bytes().data() + offset, dst.n_bytes());
}

void check_argmax(const Tensor& x, const Tensor& ids) {
  if (x.dtype() != DType::F32 || x.ne(2) != 1 || x.ne(3) != 1 || x.ne(0) == 0) fail("argmax: x is not F32 [N, T]: ", x.shape_string());
  if (ids.dtype() != DType::I32 || ids.n_elements() != x.ne(1))
    fail("argmax: ids ", ids.shape_string(), " are not I32 [", x.ne(1), "]");
}

void Backend::argmax(const Tensor& x, Tensor& ids) {
  check_argmax(x, ids);
  const std::vector<float> v = read_f32(x);
  const int64_t N = x.ne(0);
  std::vector<int32_t> out(static_cast<size_t>(x.ne(1)));
  for (size_t t = 0; t < out.size(); ++t) {
    const auto column = v.begin() + static_cast<std::ptrdiff_t>(t * N);
    out[t] = static_cast<int32_t>(std::max_element(column, column + N) - column);
  }
  write(ids, out.data(), out.size() * sizeof(int32_t));
}

void Backend::get_rows_by(const Weight& table, const Tensor& ids, Tensor& out) {
  std::vector<int32_t> ids32 = read_i32(ids);
  get_rows(table, std::vector<int64_t>(ids32.begin(), ids32.end()), out);
}

void Backend::mul_mat_shared_input(std::span<const Weight* const> ws, const Tensor& x, std::span<Tensor* const> outs) {
  if (ws.size() != outs.size()) fail("mul_mat_shared_input: ", ws.size(), " weights for ", outs.size(), " outputs");
  for (size_t i = 0; i < ws.size(); ++i) mul_mat(*ws[i], x, *outs[i]);
}

void Backend::moe_ffn(const MoeFfnArgs& a) {
  check_moe_ffn(a);
  const int64_t T = a.x->ne(1), Fs = a.shared_gate->ne[1];
  Tensor sg = output_f32(Fs, T), su = output_f32(Fs, T), s = output_f32(1, T);
  const std::array<const Weight*, 4> ws{a.router, a.shared_gate, a.shared_up, a.shared_gate_inp};
  const std::array<Tensor*, 4> outs{a.logits, &sg, &su, &s};
  mul_mat_shared_input(ws, *a.x, outs);
  Tensor ids = alloc_output(DType::I32, {a.k, T, 1, 1}), weights = output_f32(a.k, T);
  moe_route(*a.logits, a.k, ids, weights);
  moe_experts({.x = a.x, .gate_exps = a.gate_exps, .up_exps = a.up_exps, .down_exps = a.down_exps, .ids = &ids,
               .weights = &weights, .out = a.out});
  Tensor h = output_f32(Fs, T), shared = output_f32(a.out->ne(0), T);
  swiglu(sg, su, h);
  mul_mat(*a.shared_down, h, shared);
  add_sigmoid_gated(*a.out, shared, s);
}

void check_hc_write_read(const Tensor& R, const Tensor& y, const Tensor& inject_w, const HcReadArgs& a) {
  if (a.R != &R) fail("hc_write_read: the read is not of the written residual");
  check_hc_write(R, y, inject_w);
  check_hc_read(a);
}

void Backend::hc_write_read(Tensor& R, const Tensor& y, const Tensor& inject_w, const HcReadArgs& a) {
  check_hc_write_read(R, y, inject_w, a);
  hc_write(R, y, inject_w);
  hc_read(a);
}

void check_qsa_prepare(const QsaPrepareArgs& a) {
  const int64_t hd = a.q_out->ne(0), nh = a.q_out->ne(1), T = a.q_out->ne(2), di = a.iq_out->ne(0);
  const int64_t nkv = a.k_out->ne(1), n_idx = a.iq_out->ne(1);
  expect_shape(*a.qg, {2 * hd, nh, T, 1}, "qsa_prepare", "qg");
  expect_shape(*a.gate_out, {hd, nh, T, 1}, "qsa_prepare", "gate");
  expect_shape(*a.k_out, {hd, nkv, T, 1}, "qsa_prepare", "k_out");
  expect_shape(*a.iq_out, {di, n_idx, T, 1}, "qsa_prepare", "iq_out");
  expect_shape(*a.k, {hd * nkv, T, 1, 1}, "qsa_prepare", "k");
  expect_shape(*a.v, {hd * nkv, T, 1, 1}, "qsa_prepare", "v");
  expect_shape(*a.iq, {di * n_idx, T, 1, 1}, "qsa_prepare", "iq");
  expect_shape(*a.ik, {di, T, 1, 1}, "qsa_prepare", "ik");
  if (static_cast<int64_t>(a.positions.size()) != T) fail("qsa_prepare: ", a.positions.size(), " positions for ", T, " tokens");
  if (a.n_rot <= 0 || a.n_rot % 2 || a.n_rot > hd || a.n_rot > di) fail("qsa_prepare: cannot rotate ", a.n_rot, " dims");
  if (a.q_norm->n_elements() != hd || a.k_norm->n_elements() != hd || a.iq_norm->n_elements() != di)
    fail("qsa_prepare: norm weights do not fit the heads");
  const int64_t end = a.n0 + T;
  if (a.n0 < 0 || a.k_cache->n_elements() < end * hd * nkv || a.v_cache->n_elements() < end * hd * nkv ||
      a.ik_cache->n_elements() < end * di)
    fail("qsa_prepare: the caches do not hold ", end, " tokens");
}

void Backend::qsa_prepare(const QsaPrepareArgs& a) {
  check_qsa_prepare(a);
  const int64_t hd = a.q_out->ne(0), nh = a.q_out->ne(1), T = a.q_out->ne(2), di = a.iq_out->ne(0);
  const int64_t nkv = a.k_out->ne(1);
  Tensor q = output_f32(hd, nh, T);
  split_q_gate(*a.qg, q, *a.gate_out);
  rms_norm(q, a.q_norm, hd, a.eps, *a.q_out);
  rope(*a.q_out, a.positions, a.n_rot, a.theta);
  rms_norm(a.k->reshaped({hd, nkv, T, 1}), a.k_norm, hd, a.eps, *a.k_out);
  rope(*a.k_out, a.positions, a.n_rot, a.theta);
  rms_norm(a.iq->reshaped({di, a.iq_out->ne(1), T, 1}), a.iq_norm, di, a.eps, *a.iq_out);
  rope(*a.iq_out, a.positions, a.n_rot, a.theta);
  copy(*a.k_out, 0, *a.k_cache, a.n0 * hd * nkv, T * hd * nkv);
  copy(*a.v, 0, *a.v_cache, a.n0 * hd * nkv, T * hd * nkv);
  copy(*a.ik, 0, *a.ik_cache, a.n0 * di, T * di);
}

void Backend::gdn_core(const GdnCoreArgs& a) {
  if (a.states_after) return gdn_core_each_token(a);
  gdn_gates(*a.alpha, *a.beta_raw, *a.ssm_a, *a.dt_bias, *a.g, *a.beta);
  gdn_scan({.qkv = a.qkv, .g = a.g, .beta = a.beta, .state = a.state, .out = a.core, .n_k_heads = a.n_k_heads,
            .n_v_heads = a.n_v_heads, .dk = a.dk, .dv = a.dv});
  gated_rms_norm(*a.core, *a.z, *a.norm, a.eps, *a.out);
}

namespace {

// Column t of a GdnCoreArgs' tensors, as the args of a one-token gdn_core.
struct GdnCoreColumn {
  Tensor qkv, alpha, beta_raw, z, g, beta, core, out;
  GdnCoreArgs args;
  GdnCoreColumn(const GdnCoreArgs& a, int64_t t)
      : qkv(a.qkv->slice(1, t, 1)), alpha(a.alpha->slice(1, t, 1)), beta_raw(a.beta_raw->slice(1, t, 1)),
        z(a.z->slice(1, t, 1)), g(a.g->slice(1, t, 1)), beta(a.beta->slice(1, t, 1)), core(a.core->slice(1, t, 1)),
        out(a.out->slice(1, t, 1)), args(a) {
    args.qkv = &qkv, args.alpha = &alpha, args.beta_raw = &beta_raw, args.z = &z;
    args.g = &g, args.beta = &beta, args.core = &core, args.out = &out, args.states_after = nullptr;
  }
  GdnCoreColumn(const GdnCoreColumn&) = delete;
  GdnCoreColumn& operator=(const GdnCoreColumn&) = delete;
};

}  // namespace

void Backend::gdn_core_each_token(const GdnCoreArgs& a) {
  check_states_after(a);
  const int64_t T = a.qkv->ne(1), n_state = a.state->n_elements();
  for (int64_t t = 0; t < T; ++t) {
    gdn_core(GdnCoreColumn(a, t).args);
    if (t + 1 < T) copy(*a.state, 0, *a.states_after, t * n_state, n_state);
  }
}

void Backend::gdn_core_columns(const GdnCoreArgs& a, std::span<Tensor* const> states) {
  check_columns(a.qkv->ne(1), states.size(), "gdn_core_columns");
  for (int64_t t = 0; t < a.qkv->ne(1); ++t) {
    GdnCoreColumn column(a, t);
    column.args.state = states[static_cast<size_t>(t)];
    gdn_core(column.args);
  }
}

void Backend::causal_conv_columns(const Tensor& x, std::span<Tensor* const> histories, const Weight& w,
                                  int64_t dilation, Tensor& out) {
  check_columns(x.ne(1), histories.size(), "causal_conv_columns");
  for (int64_t t = 0; t < x.ne(1); ++t) {
    Tensor o = out.slice(1, t, 1);
    causal_conv(x.slice(1, t, 1), *histories[t], w, dilation, o);
  }
}

void Backend::gdn_scan(const GdnScanArgs& a) {
  if (a.qkv->ne(1) == 1)
    gdn_recurrent(a);
  else
    gdn_chunked(a);
}

}  // namespace regolith
