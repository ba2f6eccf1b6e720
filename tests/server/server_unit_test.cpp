// Unit tests of the server's parts that need no running server: the chat output parser (reasoning,
// XML and JSON tool calls, split at every byte), stop strings, the forced opening, the prefix
// cache's lookup and LRU budget, the cache file format, and request validation.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "core/error.h"
#include "gguf/gguf.h"
#include "runtime/session.h"
#include "server/api_error.h"
#include "server/cache_store.h"
#include "server/chat_output.h"
#include "server/choice_sampler.h"
#include "server/openai_request.h"
#include "server/prefix_cache.h"
#include "server/text_stream.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace regolith::server {
namespace {

std::string tiny_path() { return std::string(REGOLITH_SERVER_TEST_DIR) + "/tiny.gguf"; }

const Tokenizer& tiny_tokenizer() {
  static GgufFile file = GgufFile::open(tiny_path());
  static Tokenizer tok = Tokenizer::from_gguf(file);
  return tok;
}

// Feeds `text` in pieces of `step` bytes and collects everything.
ChatDelta parse_in_pieces(const std::string& text, size_t step, bool reasoning, std::vector<ToolSpec> tools) {
  ChatOutputParser p(reasoning, std::move(tools));
  ChatDelta all;
  for (size_t i = 0; i < text.size(); i += step) all.append(p.push(text.substr(i, step)));
  all.append(p.finish());
  return all;
}

const std::vector<ToolSpec> kTools = {
    {"get_weather", Json::parse(R"({"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}})")},
    {"noop", Json()}};

TEST(ChatOutput, ReasoningContentAndXmlToolCallsAtEverySplit) {
  const std::string text =
      "I should look it up.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n"
      "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=noop>\n"
      "</function>\n</tool_call>";
  for (size_t step = 1; step <= text.size(); ++step) {
    SCOPED_TRACE(step);
    ChatDelta d = parse_in_pieces(text, step, /*reasoning=*/true, kTools);
    EXPECT_EQ(d.reasoning, "I should look it up.\n");
    EXPECT_EQ(d.content, "Let me check.\n\n");
    ASSERT_EQ(d.tool_calls.size(), 2u);
    EXPECT_EQ(d.tool_calls[0].name, "get_weather");
    EXPECT_EQ(Json::parse(d.tool_calls[0].arguments), Json::parse(R"({"city":"Zürich","days":3})"));
    EXPECT_EQ(d.tool_calls[1].name, "noop");
    EXPECT_EQ(d.tool_calls[1].arguments, "{}");
    EXPECT_TRUE(d.tool_calls[0].id.starts_with("call_"));
  }
}

TEST(ChatOutput, JsonToolCallsAndThinkOpenedByTheModel) {
  const std::string text =
      "<think>\nhmm\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  for (size_t step : {1, 2, 5, 100}) {
    ChatDelta d = parse_in_pieces(text, step, false, kTools);
    EXPECT_EQ(d.reasoning, "hmm\n");
    EXPECT_EQ(d.content, "");
    ASSERT_EQ(d.tool_calls.size(), 1u);
    EXPECT_EQ(d.tool_calls[0].name, "get_weather");
    EXPECT_EQ(Json::parse(d.tool_calls[0].arguments), Json::parse(R"({"city":"Paris"})"));
  }
}

TEST(ChatOutput, WithoutToolsTagsAreText) {
  ChatDelta d = parse_in_pieces("a <tool_call> b </tool_call> <think> c", 3, false, {});
  EXPECT_EQ(d.content, "a <tool_call> b </tool_call> <think> c");
  EXPECT_TRUE(d.tool_calls.empty());
  EXPECT_TRUE(d.reasoning.empty());
}

TEST(ChatOutput, CutOffToolCallKeepsItsNameAndCompleteParameters) {
  ChatDelta d = parse_in_pieces("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<parameter=days>\n2",
                                4, false, kTools);
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(Json::parse(d.tool_calls[0].arguments), Json::parse(R"({"city":"Rome"})"));
  ChatDelta nameless = parse_in_pieces("text <tool_call>\n<func", 4, false, kTools);
  EXPECT_TRUE(nameless.tool_calls.empty());
  EXPECT_EQ(nameless.content, "text <tool_call>\n<func");
}

TEST(ChatOutput, UnfinishedReasoningStaysReasoning) {
  ChatDelta d = parse_in_pieces("\nstill thinking </thi", 2, true, {});
  EXPECT_EQ(d.reasoning, "still thinking </thi");
  EXPECT_EQ(d.content, "");
}

std::vector<int32_t> ids_of(const std::string& text) { return tiny_tokenizer().encode(text, {.add_special = false}); }

std::string stream_text(const std::string& text, std::vector<std::string> stops, bool* stopped = nullptr) {
  TextStream s(tiny_tokenizer(), std::move(stops));
  std::string out;
  for (int32_t id : ids_of(text)) out += s.push(id);
  out += s.finish();
  if (stopped) *stopped = s.stopped();
  return out;
}

TEST(TextStreamTest, StopStringsAcrossTokens) {
  bool stopped = false;
  EXPECT_EQ(stream_text("hello world, stop here please", {"stop here"}, &stopped), "hello world, ");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(stream_text("abc", {"abcd"}, &stopped), "abc");  // a prefix of a stop is released at the end
  EXPECT_FALSE(stopped);
  EXPECT_EQ(stream_text("xx END yy", {"zz", "END"}), "xx ");
  EXPECT_EQ(stream_text("no stops", {}), "no stops");
  EXPECT_EQ(stream_text("Zürich °C", {"°"}), "Zürich ");
}

TEST(TextStreamTest, HoldsBackOnlyWhatCouldStartAStop) {
  TextStream s(tiny_tokenizer(), {"XYZ"});
  std::string out;
  for (int32_t id : ids_of("abX")) out += s.push(id);
  EXPECT_EQ(out, "ab");  // "X" may start the stop string
  for (int32_t id : ids_of("Q")) out += s.push(id);
  EXPECT_EQ(out, "abXQ");
}

TEST(ForcedOpening, MasksEveryTokenThatLeavesTheOpenings) {
  const Tokenizer& tok = tiny_tokenizer();
  OpeningConstraint c({"<tool_call>\n<function=ab>\n", "<tool_call>\n<function=cd>\n"});
  std::string produced;
  std::vector<float> logits(static_cast<size_t>(tok.n_vocab()));
  int steps = 0;
  while (c.active() && steps++ < 100) {
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>((i * 37) % 101);  // arbitrary preferences
    c.mask(logits, tok);
    int32_t best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    produced += tok.token_bytes(best);
    c.accept(tok.token_bytes(best));
  }
  EXPECT_TRUE(produced == "<tool_call>\n<function=ab>\n" || produced == "<tool_call>\n<function=cd>\n") << produced;
}

TEST(PrefixCacheTest, LongestPrefixLruBudgetAndLogits) {
  auto engine = Engine::open(tiny_path());
  Session session(engine);
  auto snap = std::make_shared<const SessionSnapshot>(session.snapshot());
  PrefixCache cache(1000);
  cache.insert({1, 2, 3}, snap, {0.5f}, 100, SnapshotPoint::prompt_end);
  cache.insert({1, 2, 3, 4, 5}, snap, {1.5f}, 100, SnapshotPoint::reply_end);
  cache.insert({1, 9}, snap, {}, 100, SnapshotPoint::chunk);
  std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6};
  auto hit = cache.find(prompt, 6);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->n_tokens, 5);
  EXPECT_EQ((*hit->logits)[0], 1.5f);
  hit = cache.find(prompt, 4);  // limited: the 3-token entry
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->n_tokens, 3);
  EXPECT_FALSE(cache.find(std::vector<int32_t>{2, 3}, 2));
  EXPECT_FALSE(cache.find(std::vector<int32_t>{1, 2}, 2));  // {1, 2} itself was never stored

  // Over budget: the least recently used entries go first ({1, 9} was never used).
  cache.insert({7, 7, 7}, snap, {}, 800, SnapshotPoint::chunk);
  EXPECT_FALSE(cache.find(std::vector<int32_t>{1, 9, 0}, 3));
  EXPECT_TRUE(cache.find(prompt, 6));
  EXPECT_LE(cache.stats().bytes.load(), 1000);
  EXPECT_GE(cache.stats().evictions.load(), 1);
  auto keys = cache.persistent_keys();  // prompt and reply ends only
  for (const auto& k : keys) EXPECT_NE(k, (std::vector<int32_t>{7, 7, 7}));

  PrefixCache off(0);
  off.insert({1}, snap, {}, 1, SnapshotPoint::chunk);
  EXPECT_FALSE(off.find(std::vector<int32_t>{1, 2}, 2));
}

TEST(CacheStoreTest, RoundTripAndEveryKindOfDamage) {
  CacheStore store("unused", 42, 512, 4096);
  std::vector<int32_t> tokens = {1, 2, 3, 500, 7};
  std::string bytes = CacheStore::encode(42, tokens);
  EXPECT_EQ(bytes.size(), kCacheHeaderBytes + 4 * tokens.size());
  EXPECT_EQ(store.decode(bytes), tokens);
  auto rejects = [&](const std::string& b, const std::string& why) {
    try {
      store.decode(b);
      ADD_FAILURE() << "accepted: " << why;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  rejects(bytes.substr(0, 20), "truncated");
  rejects(bytes.substr(0, bytes.size() - 1), "size");
  rejects(CacheStore::encode(43, tokens), "another model");
  for (size_t i = 0; i < bytes.size(); ++i) {  // any single flipped bit is caught
    std::string b = bytes;
    b[i] ^= 0x01;
    EXPECT_THROW(store.decode(b), Error) << "byte " << i;
  }
  rejects(CacheStore::encode(42, {1, 2, 9999}), "outside the vocabulary");
  rejects(CacheStore::encode(42, std::vector<int32_t>(5000, 1)), "bad sizes");
}

TEST(CacheStoreTest, SaveIsAtomicAndLoadSkipsBadFiles) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(REGOLITH_SERVER_TEST_DIR) / ("store-unit-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  CacheStore store(dir.string(), 7, 512, 4096);
  store.save({{1, 2, 3}, {4, 5}});
  std::ofstream(dir / "junk.rpc") << "junk";
  std::ofstream(dir / "unrelated.txt") << "left alone";
  std::vector<std::string> warnings;
  auto loaded = store.load(warnings);
  EXPECT_EQ(loaded.size(), 2u);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("junk.rpc"), std::string::npos);
  store.save({{9}});  // replaces our files, keeps others
  warnings.clear();
  loaded = store.load(warnings);
  EXPECT_EQ(loaded, (std::vector<std::vector<int32_t>>{{9}}));
  EXPECT_TRUE(fs::exists(dir / "unrelated.txt"));
  fs::remove_all(dir);
}

class RequestParsing : public ::testing::Test {
 protected:
  void SetUp() override {
    tmpl_ = std::make_unique<ChatTemplate>(ChatTemplate::from_tokenizer(tiny_tokenizer()));
    model_.tokenizer = &tiny_tokenizer();
    model_.chat_template = tmpl_.get();
    model_.id = "tiny";
    model_.n_ctx = 128;
    model_.n_vocab = 512;
    model_.json_vocabulary = &json_vocabulary_;
  }
  int status_of(const std::string& body, bool chat = true) {
    try {
      Json j = Json::parse(body);
      if (chat) parse_chat_request(j, model_);
      else parse_completion_request(j, model_);
      return 200;
    } catch (const ApiError& e) {
      return e.status;
    }
  }
  std::unique_ptr<ChatTemplate> tmpl_;
  JsonVocabulary::Lazy json_vocabulary_{tiny_tokenizer()};
  ModelInfo model_;
};

TEST_F(RequestParsing, ValidRequestsBecomeTasks) {
  ChatRequest c = parse_chat_request(Json::parse(R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":5,
      "temperature":0,"stop":["x"],"n":2,"seed":-3,"logprobs":true,"top_logprobs":2})"), model_);
  EXPECT_EQ(c.task.max_tokens, 5);
  EXPECT_EQ(c.task.n_choices, 2);
  EXPECT_EQ(c.task.top_logprobs, 2);
  EXPECT_EQ(c.task.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(*c.task.sampling.seed, static_cast<uint64_t>(-3));
  EXPECT_EQ(c.prompt_text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(c.task.prompt, tiny_tokenizer().encode(c.prompt_text));
  ChatRequest d = parse_chat_request(Json::parse(R"({"messages":[{"role":"user","content":"hi"}]})"), model_);
  EXPECT_EQ(d.task.max_tokens, 128 - static_cast<int64_t>(d.task.prompt.size()));  // until the context is full
  CompletionRequest r = parse_completion_request(Json::parse(R"({"prompt":[[1,2],[3]],"n":3,"max_tokens":4})"), model_);
  ASSERT_EQ(r.tasks.size(), 2u);
  EXPECT_EQ(r.tasks[1].first_choice, 3);
  EXPECT_EQ(r.tasks[1].prompt, std::vector<int32_t>{3});
}

TEST_F(RequestParsing, BadValuesAreClientErrors) {
  EXPECT_EQ(status_of(R"({"messages":[]})"), 400);
  EXPECT_EQ(status_of(R"({"messages":[{"role":"user","content":"hi"}],"model":"other"})"), 404);
  EXPECT_EQ(status_of(R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":200})"), 400);
  EXPECT_EQ(status_of(R"({"messages":[{"role":"user","content":"hi"}],"tool_choice":{"type":"function","function":{"name":"f"}},
      "tools":[{"type":"function","function":{"name":"g"}}]})"), 400);
  EXPECT_EQ(status_of(R"({"prompt":[1,2,512]})", false), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","best_of":3})", false), 400);
  EXPECT_EQ(status_of(R"({"prompt":"a","suffix":"b"})", false), 400);
}

// response_format json_object: a task flag; a reasoning block the template opens is closed empty
// (the reply is the object alone); other formats and a forced tool call beside it are refused.
TEST_F(RequestParsing, JsonModeIsATaskFlagAndClosesOpenReasoning) {
  const char* json_chat = R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}})";
  ChatRequest c = parse_chat_request(Json::parse(json_chat), model_);
  EXPECT_TRUE(c.task.json_object);
  EXPECT_TRUE(c.task.json_vocabulary);
  EXPECT_FALSE(parse_chat_request(Json::parse(R"({"messages":[{"role":"user","content":"hi"}]})"), model_).task.json_object);
  EXPECT_TRUE(parse_completion_request(Json::parse(R"({"prompt":"a","response_format":{"type":"json_object"}})"), model_)
                  .tasks[0].json_object);
  ChatTemplate thinking(
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "<|im_start|>assistant\n<think>\n");
  model_.chat_template = &thinking;
  ChatRequest t = parse_chat_request(Json::parse(json_chat), model_);
  EXPECT_FALSE(t.reasoning_open);
  EXPECT_TRUE(t.prompt_text.ends_with("<think></think>\n\n")) << t.prompt_text;
  EXPECT_TRUE(parse_chat_request(Json::parse(R"({"messages":[{"role":"user","content":"hi"}]})"), model_).reasoning_open);
  model_.chat_template = tmpl_.get();
  EXPECT_EQ(status_of(R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema"}})"), 400);
  ChatRequest s = parse_chat_request(Json::parse(R"({"messages":[{"role":"user","content":"hi"}],"response_format":
      {"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"a":{"type":"string"}}}}}})"), model_);
  EXPECT_TRUE(s.task.json_schema);
  EXPECT_FALSE(s.task.json_object);
  EXPECT_EQ(status_of(R"({"messages":[{"role":"user","content":"hi"}],"response_format":
      {"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","pattern":"a"}}}})"), 400);
  EXPECT_EQ(status_of(R"({"messages":[{"role":"user","content":"hi"}],"response_format":{}})"), 400);
  EXPECT_EQ(status_of(R"({"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"},
      "tool_choice":"required","tools":[{"type":"function","function":{"name":"g"}}]})"), 400);
}

TEST_F(RequestParsing, ForcedToolChoiceOpensTheCall) {
  ChatRequest c = parse_chat_request(Json::parse(R"({"messages":[{"role":"user","content":"weather?"}],
      "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],
      "tool_choice":{"type":"function","function":{"name":"get_weather"}}})"), model_);
  ASSERT_EQ(c.task.forced_openings.size(), 1u);
  EXPECT_EQ(c.task.forced_openings[0], "<tool_call>\n<function=get_weather>\n");
  ASSERT_EQ(c.tools.size(), 1u);
}

}  // namespace
}  // namespace regolith::server
