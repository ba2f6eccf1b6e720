// PLE hash constants and row ids against the values in model-spec §4.8 (computed there by
// running the transformers algorithm).

#include <gtest/gtest.h>

#include "model/ple_hash.h"

using namespace regolith;

namespace {

PleHashConstants real_model() {
  return ple_hash_constants({.seed = 1234, .ple_layer_index = 0, .vocab_size = 248320, .ngram_size = 3,
                             .heads_per_ngram = 8, .ngram_vocab_size_base = 20000000, .pad_to = 128});
}

}  // namespace

TEST(PleHash, ConstantsOfTheRealModel) {
  PleHashConstants c = real_model();
  EXPECT_EQ(c.multipliers, (std::vector<uint64_t>{23703573157769ull, 20109073645365ull, 8052911324071ull}));
  EXPECT_EQ(c.head_vocab, (std::vector<uint64_t>{20000003, 20000023, 20000033, 20000047, 20000059, 20000063,
                                                 20000069, 20000077, 20000081, 20000093, 20000107, 20000147,
                                                 20000153, 20000159, 20000161, 20000171}));
  EXPECT_EQ(c.head_offsets[1], 20000003u);
  EXPECT_EQ(c.head_offsets[15], 300001275u);
  EXPECT_EQ(c.n_rows, 320001536u);
}

TEST(PleHash, RowIdsMatchSpecVectors) {
  PleHashConstants c = real_model();
  const uint64_t eos = 248044;
  struct Case {
    uint64_t ctx[3];
    std::vector<uint64_t> rows;
  } cases[] = {
      {{100, eos, eos}, {5727835, 21884476, 43702108, 66434789, 84094509, 104112171, 134886528, 157314943, 162363667,
                         189466439, 200618315, 232121522, 258547276, 266199001, 289022207, 305180972}},
      {{3, 2, 1}, {14605717, 24410875, 49313567, 72177428, 86060820, 104022010, 130963819, 146886202, 161523077,
                   195939126, 219424565, 220811782, 248020141, 275228530, 284297999, 309645223}},
      {{248045, eos, eos}, {13981229, 30076798, 49239434, 61315716, 98540601, 111186732, 120378863, 146384625,
                            173637879, 184336749, 217808755, 222173721, 249579227, 277180543, 299757935, 312970430}},
  };
  for (const Case& k : cases) {
    std::vector<uint64_t> rows(16);
    ple_row_ids(c, 8, k.ctx, rows.data());
    EXPECT_EQ(rows, k.rows);
  }
}

TEST(PleHash, SecondPleLayerContinuesThePrimeSequence) {
  PleHashConstants first = real_model();
  PleHashConstants second = ple_hash_constants({.seed = 1234, .ple_layer_index = 1, .vocab_size = 248320,
                                                .ngram_size = 3, .heads_per_ngram = 8,
                                                .ngram_vocab_size_base = 20000000, .pad_to = 128});
  EXPECT_GT(second.head_vocab[0], first.head_vocab[15]);
  EXPECT_NE(second.multipliers, first.multipliers);
}
