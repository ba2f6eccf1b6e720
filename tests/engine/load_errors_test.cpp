// Bad model files give an Error naming the tensor or key at fault: a missing tensor, a wrong
// shape, a type the engine cannot read, PLE hash arrays that do not match their recomputation.
// The bad files are the tiny random model rewritten with one change.
#include <cstring>
#include <functional>
#include <optional>

#include "core/error.h"
#include "engine_test_util.h"
#include "gguf/gguf.h"
#include "model/qwen4exp.h"
#include "quant/rows.h"
#include "test_files.h"

namespace regolith::test {
namespace {

struct TensorEdit {
  std::string name = {};
  bool drop = false;
  std::optional<GgmlType> type = {};            // re-encode (values become zero)
  std::optional<std::vector<int64_t>> ne = {};  // reshape (values become zero)
};

// Copies the tiny model to `out` with one tensor edited and/or metadata changed.
void rewrite(const std::string& out, const TensorEdit& edit,
             const std::function<void(GgufWriter&)>& meta = nullptr) {
  GgufFile src = GgufFile::open(engine_model("tiny.gguf"));
  GgufWriter w(out);
  for (const auto& [key, value] : src.metadata())
    if (key != "general.alignment") w.set(key, value);
  if (meta) meta(w);
  std::vector<std::pair<const GgufTensor*, std::vector<uint8_t>>> data;
  for (const GgufTensor& t : src.tensors()) {
    if (t.name == edit.name && edit.drop) continue;
    if (t.name == edit.name) {
      GgmlType type = edit.type.value_or(t.type);
      std::vector<int64_t> ne = edit.ne.value_or(t.ne);
      int64_t rows = 1;
      for (size_t i = 1; i < ne.size(); ++i) rows *= ne[i];
      w.add_tensor(t.name, type, ne);
      data.emplace_back(&t, std::vector<uint8_t>(row_bytes(type, ne[0]) * rows, 0));
    } else {
      w.add_tensor(t.name, t.type, t.ne);
      data.emplace_back(&t, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    }
  }
  w.write_header();
  for (auto& [t, bytes] : data) w.write_data(bytes);
  w.finish();
}

std::string load_error(const std::string& path) {
  try {
    Qwen4ExpModel::load(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_error_mentions(const std::string& error, const std::vector<std::string>& parts) {
  ASSERT_FALSE(error.empty()) << "the model loaded";
  for (const std::string& p : parts) EXPECT_NE(error.find(p), std::string::npos) << "'" << p << "' not in: " << error;
}

TEST(LoadErrors, UnchangedCopyLoads) {
  TempDir dir;
  rewrite(dir.path("same.gguf"), {});
  EXPECT_EQ(load_error(dir.path("same.gguf")), "");
}

TEST(LoadErrors, MissingTensorIsNamed) {
  TempDir dir;
  rewrite(dir.path("m.gguf"), {.name = "blk.2.ssm_out.weight", .drop = true});
  expect_error_mentions(load_error(dir.path("m.gguf")), {"missing tensor", "blk.2.ssm_out.weight"});
}

TEST(LoadErrors, WrongShapeIsNamed) {
  TempDir dir;
  rewrite(dir.path("s.gguf"), {.name = "blk.3.attn_k.weight", .ne = std::vector<int64_t>{128, 32}});
  expect_error_mentions(load_error(dir.path("s.gguf")), {"blk.3.attn_k.weight", "{128, 32}", "expected"});
}

TEST(LoadErrors, UnreadableTypeIsNamed) {
  TempDir dir;
  // An integer type: a valid GGUF tensor type that no weight decoder reads.
  rewrite(dir.path("t.gguf"), {.name = "blk.0.ffn_up_exps.weight", .type = GgmlType::I32});
  expect_error_mentions(load_error(dir.path("t.gguf")), {"blk.0.ffn_up_exps.weight", "i32", "cannot read"});
}

TEST(LoadErrors, MissingOutputFallsBackToTiedEmbedding) {
  TempDir dir;
  rewrite(dir.path("tied.gguf"), {.name = "output.weight", .drop = true});
  auto model = Qwen4ExpModel::load(dir.path("tied.gguf"));
  EXPECT_TRUE(model->weights().tied_output);
  EXPECT_EQ(model->weights().output.data, model->weights().token_embd.data);
}

TEST(LoadErrors, PleHashArraysAreChecked) {
  TempDir dir;
  rewrite(dir.path("h.gguf"), {}, [](GgufWriter& w) {
    w.set("qwen4exp.ple.head_offsets", GgufValue::array(GgufType::UINT64, std::vector<uint64_t>{0, 101, 205, 311}));
  });
  expect_error_mentions(load_error(dir.path("h.gguf")), {"qwen4exp.ple.head_offsets"});
  rewrite(dir.path("v.gguf"), {}, [](GgufWriter& w) {
    w.set("qwen4exp.ple.head_vocab_sizes", GgufValue::array(GgufType::UINT64, std::vector<uint64_t>{101, 103, 109, 113}));
  });
  expect_error_mentions(load_error(dir.path("v.gguf")), {"qwen4exp.ple.head_vocab_sizes"});
  rewrite(dir.path("m.gguf"), {}, [](GgufWriter& w) {
    w.set("qwen4exp.ple.layer_multipliers", GgufValue::array(GgufType::UINT64, std::vector<uint64_t>{3, 4, 5}));
  });
  expect_error_mentions(load_error(dir.path("m.gguf")), {"qwen4exp.ple.layer_multipliers", "4"});
}

}  // namespace
}  // namespace regolith::test
