// mkmodel output against the qwen4exp tensor table and the hyperparameter reader's checks.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "convert/random_model.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "model/qwen4exp_hparams.h"
#include "model/qwen4exp_tensors.h"
#include "quant/rows.h"
#include "test_files.h"

using namespace regolith;

TEST(ModelLayout, TinyRandomModelHasEveryTensorOfTheTable) {
  TempDir dir;
  RandomModelOptions o;
  o.hparams = preset_hparams("tiny", 0);
  o.hparams.n_layer_nextn = 1;
  o.default_type = GgmlType::Q8_0;
  std::string path = dir.path("tiny.gguf");
  write_random_model(path, o);
  GgufFile f = GgufFile::open(path);
  Qwen4ExpHparams hp = read_hparams(f);
  EXPECT_EQ(hp.n_layer, 4);
  EXPECT_EQ(hp.n_layer_nextn, 1);
  EXPECT_EQ(hp.is_recurrent, (std::vector<bool>{true, true, true, false}));
  const int64_t rows = f.tensor("per_layer_token_embd.weight").ne[1];
  std::vector<TensorSpec> specs = qwen4exp_tensor_specs(hp, rows);
  EXPECT_EQ(specs.size(), f.tensors().size());
  for (const TensorSpec& s : specs) {
    const GgufTensor& t = f.tensor(s.name);
    EXPECT_EQ(t.ne, s.ne) << s.name;
    EXPECT_EQ(t.type, storage_type(s, GgmlType::Q8_0)) << s.name;
  }
  EXPECT_TRUE(f.find_tensor("blk.4.nextn.eh_proj.weight"));
  EXPECT_EQ(f.tensor("blk.0.ssm_conv1d.weight").type, GgmlType::F32);
  EXPECT_EQ(f.tensor("blk.0.ffn_gate_inp.weight").type, GgmlType::F32);  // router stays F32
}

TEST(ModelLayout, RandomWeightsAreDeterministicAndSane) {
  TempDir dir;
  RandomModelOptions o;
  o.hparams = preset_hparams("tiny", 4);
  write_random_model(dir.path("a.gguf"), o);
  write_random_model(dir.path("b.gguf"), o);
  o.seed = 7;
  write_random_model(dir.path("c.gguf"), o);
  GgufFile a = GgufFile::open(dir.path("a.gguf")), b = GgufFile::open(dir.path("b.gguf")),
           c = GgufFile::open(dir.path("c.gguf"));
  const GgufTensor& ta = a.tensor("blk.0.attn_qkv.weight");
  EXPECT_EQ(std::memcmp(ta.data, b.tensor("blk.0.attn_qkv.weight").data, ta.n_bytes), 0);
  EXPECT_NE(std::memcmp(ta.data, c.tensor("blk.0.attn_qkv.weight").data, ta.n_bytes), 0);
  std::vector<float> w(static_cast<size_t>(ta.n_elements()));
  dequantize_row(GgmlType::F32, ta.data, ta.n_elements(), w.data());
  double sum2 = 0;
  for (float v : w) sum2 += double(v) * v;
  double rms = std::sqrt(sum2 / w.size());
  EXPECT_NEAR(rms, 1.0 / std::sqrt(128.0), 0.01);  // N(0, 1/fan_in)
  const GgufTensor& decay = a.tensor("blk.0.ssm_a");
  for (int64_t i = 0; i < decay.n_elements(); ++i) {
    float v;
    std::memcpy(&v, decay.data + 4 * i, 4);
    EXPECT_LT(v, 0.0f);
  }
}

// --repeat-experts: every expert's bytes are the first expert's, the other tensors as without it.
TEST(ModelLayout, RepeatedExpertsCopyTheFirstExpert) {
  TempDir dir;
  RandomModelOptions o;
  o.hparams = preset_hparams("tiny", 4);
  o.default_type = GgmlType::Q8_0;
  write_random_model(dir.path("plain.gguf"), o);
  o.repeat_experts = true;
  write_random_model(dir.path("repeat.gguf"), o);
  GgufFile plain = GgufFile::open(dir.path("plain.gguf")), rep = GgufFile::open(dir.path("repeat.gguf"));
  for (const char* name : {"blk.0.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight", "blk.3.ffn_down_exps.weight"}) {
    const GgufTensor& t = rep.tensor(name);
    const GgufTensor& p = plain.tensor(name);
    const uint64_t expert_bytes = t.n_bytes / static_cast<uint64_t>(t.ne[2]);
    EXPECT_EQ(std::memcmp(t.data, p.data, expert_bytes), 0) << name << ": expert 0 as without repetition";
    for (int64_t e = 1; e < t.ne[2]; ++e)
      EXPECT_EQ(std::memcmp(t.data + e * expert_bytes, t.data, expert_bytes), 0) << name << " expert " << e;
    EXPECT_NE(std::memcmp(p.data + expert_bytes, p.data, expert_bytes), 0) << name << ": plain experts differ";
  }
  const GgufTensor& q = rep.tensor("blk.0.attn_qkv.weight");
  EXPECT_EQ(std::memcmp(q.data, plain.tensor("blk.0.attn_qkv.weight").data, q.n_bytes), 0);
}

TEST(ModelLayout, MissingOrBadMetadataNamesTheKey) {
  TempDir dir;
  auto write_without = [&](const std::string& drop, const GgufValue* replacement) {
    RandomModelOptions o;
    o.hparams = preset_hparams("tiny", 0);
    std::string src = dir.path("src.gguf");
    write_random_model(src, o);
    GgufFile f = GgufFile::open(src);
    GgufWriter w(dir.path("edited.gguf"));
    for (const auto& [k, v] : f.metadata()) {
      if (k != drop)
        w.set(k, v);
      else if (replacement)
        w.set(k, *replacement);
    }
    for (const GgufTensor& t : f.tensors()) w.add_tensor(t.name, t.type, t.ne);
    w.write_header();
    for (const GgufTensor& t : f.tensors()) w.write_data(t.bytes());
    w.finish();
    return GgufFile::open(dir.path("edited.gguf"));
  };
  auto expect_message = [](const GgufFile& f, const std::string& needle) {
    try {
      read_hparams(f);
      FAIL() << "expected an error naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_message(write_without("qwen4exp.ssm.group_count", nullptr), "qwen4exp.ssm.group_count");
  expect_message(write_without("qwen4exp.hyper_connection.low_rank", nullptr), "qwen4exp.hyper_connection.low_rank");
  GgufValue odd_heads = uint32_t{3};
  expect_message(write_without("qwen4exp.attention.head_count_kv", &odd_heads), "qwen4exp.attention.head_count_kv");
  GgufValue wrong_type = std::string("x");
  expect_message(write_without("qwen4exp.expert_count", &wrong_type), "qwen4exp.expert_count");
  GgufValue short_ratios = GgufValue::array(GgufType::INT32, std::vector<int32_t>{0, 0});
  expect_message(write_without("qwen4exp.attention.compress_ratios", &short_ratios), "compress_ratios");
}
