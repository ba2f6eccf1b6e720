// The server's promises, checked on live servers with the tiny random model: concurrent greedy
// streams equal the same requests alone; a second turn restores the first turn's state and
// prefills only its new tokens, with the output of a cold run; a client that disconnects frees its
// slot at once; SIGTERM lets requests in flight finish; the prefix cache survives a restart and
// ignores damaged or foreign files.
#include <algorithm>
#include <filesystem>
#include <mutex>

#include "server/cache_store.h"
#include "server/json_constraint.h"
#include "server/json_schema.h"
#include "server_test_util.h"

namespace regolith::test {
namespace {

std::vector<int32_t> tokenize(int port, const std::string& text) {
  HttpResult r = post(port, "/tokenize", {{"content", text}});
  return r.json()["tokens"].get<std::vector<int32_t>>();
}

std::string prompt_text(int i) {
  std::string s = "Request " + std::to_string(i) + ":";
  for (int k = 0; k < 3 + 3 * i; ++k) s += " word" + std::to_string(k * 7 % 13);
  return s;
}

struct ChatRun {
  std::string content;
  std::vector<std::string> tokens;  // each token's bytes (from logprobs)
  int status = 0;
};

ChatRun run_chat(int port, const std::string& user, int max_tokens, bool stream) {
  Json body = chat_body(user, max_tokens, stream);
  body["logprobs"] = true;
  body["cache_prompt"] = false;  // batching alone is under test
  HttpResult r = post(port, "/v1/chat/completions", body);
  ChatRun out;
  out.status = r.status;
  auto bytes_of = [](const Json& entry) {
    std::string b;
    for (const Json& v : entry["bytes"]) b += static_cast<char>(v.get<int>());
    return b;
  };
  if (stream) {
    out.content = streamed_content(r.body);
    for (const Json& e : sse_events(r.body))
      for (const Json& c : e["choices"])
        if (c["logprobs"].is_object())
          for (const Json& entry : c["logprobs"]["content"]) out.tokens.push_back(bytes_of(entry));
  } else {
    Json j = r.json();
    out.content = j["choices"][0]["message"]["content"].get<std::string>();
    for (const Json& entry : j["choices"][0]["logprobs"]["content"]) out.tokens.push_back(bytes_of(entry));
  }
  return out;
}

TEST(Batching, SixteenConcurrentGreedyStreamsEqualTheSameRequestsAlone) {
  ServerProcess s({"--parallel", "16", "-c", "1024", "--chunk", "32"});
  const int n = 16, max_tokens = 24;
  std::vector<ChatRun> alone(n), together(n);
  for (int i = 0; i < n; ++i) {
    alone[i] = run_chat(s.port(), prompt_text(i), max_tokens, false);
    ASSERT_EQ(alone[i].status, 200);
    ASSERT_EQ(alone[i].tokens.size(), static_cast<size_t>(max_tokens));
  }
  double steps_before = metric(s.port(), "regolith_scheduler_steps_total");
  double batched_before = metric(s.port(), "regolith_batched_decode_tokens_total");
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] { together[i] = run_chat(s.port(), prompt_text(i), max_tokens, true); });
  for (auto& t : threads) t.join();
  double steps = metric(s.port(), "regolith_scheduler_steps_total") - steps_before;
  double batched = metric(s.port(), "regolith_batched_decode_tokens_total") - batched_before;
  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(together[i].status, 200);
    EXPECT_EQ(together[i].tokens, alone[i].tokens);
    EXPECT_EQ(together[i].content, alone[i].content);
  }
  // Shared steps, most tokens decoded in forward passes of several streams: far fewer steps than
  // tokens of every stream.
  std::printf("[batching] 16 streams x %d tokens in %.0f scheduler steps, %.0f tokens in batched passes\n", max_tokens,
              steps, batched);
  EXPECT_LT(steps, n * max_tokens / 2);
  EXPECT_GT(batched, n * max_tokens / 2);
  EXPECT_EQ(s.stop(), 0);
}

// The reply's text and finish reason, streamed or not.
std::pair<std::string, std::string> content_and_finish(const HttpResult& r, bool streamed) {
  if (!streamed) {
    const Json j = r.json();
    return {j["choices"][0]["message"]["content"].get<std::string>(), j["choices"][0]["finish_reason"].get<std::string>()};
  }
  std::string finish;
  for (const Json& e : sse_events(r.body))
    for (const Json& choice : e["choices"])
      if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) finish = choice["finish_reason"];
  return {streamed_content(r.body), finish};
}

// JSON mode on the tiny random model: a reply that ends is one JSON object; one cut off by
// max_tokens is the start of one. Streamed and not, greedy and sampled.
TEST(JsonMode, RepliesAreJsonObjects) {
  ServerProcess s({"--parallel", "2"});
  int ended = 0;
  for (int i = 0; i < 8; ++i) {
    Json body = chat_body("reply in JSON " + std::to_string(i), 160, i % 2 == 1);
    body["response_format"] = {{"type", "json_object"}};
    body["temperature"] = i < 4 ? 0.0 : 1.0;
    body["seed"] = i;
    HttpResult r = post(s.port(), "/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    const auto [content, finish] = content_and_finish(r, i % 2 == 1);
    SCOPED_TRACE("reply " + std::to_string(i) + " (" + finish + "): " + content);
    if (finish == "stop") {
      ++ended;
      EXPECT_TRUE(Json::parse(content).is_object());
    } else {
      ASSERT_EQ(finish, "length");
      server::JsonRecognizer prefix;
      for (char c : content) ASSERT_TRUE(prefix.step(static_cast<uint8_t>(c)));
    }
  }
  std::printf("[json] %d of 8 replies ended within 160 tokens\n", ended);
  EXPECT_EQ(s.stop(), 0);
}

// Structured outputs on the tiny random model: replies that end have the schema's required members
// with their types; a reply cut off is the start of a valid one.
TEST(JsonMode, SchemaRepliesFollowTheSchema) {
  ServerProcess s({"--parallel", "2"});
  const Json schema = Json::parse(R"({"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer"},
      "tags":{"type":"array","items":{"enum":["x","y"]},"maxItems":2}},"required":["name","n"]})");
  auto grammar = server::JsonGrammar::compile(schema);
  int ended = 0;
  for (int i = 0; i < 6; ++i) {
    Json body = chat_body("a record " + std::to_string(i), 120, i % 2 == 1);
    body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "record"}, {"schema", schema}}}};
    body["temperature"] = 1.0;
    body["seed"] = i;
    HttpResult r = post(s.port(), "/v1/chat/completions", body);
    ASSERT_EQ(r.status, 200) << r.body;
    const auto [content, finish] = content_and_finish(r, i % 2 == 1);
    SCOPED_TRACE("reply " + std::to_string(i) + " (" + finish + "): " + content);
    server::JsonGrammarState state(*grammar);
    for (char c : content) ASSERT_TRUE(state.step(static_cast<uint8_t>(c)));
    if (finish == "stop") {
      ++ended;
      const Json v = Json::parse(content);
      EXPECT_TRUE(v["name"].is_string());
      EXPECT_TRUE(v["n"].is_number_integer());
      if (v.contains("tags")) {
        EXPECT_LE(v["tags"].size(), 2u);
      }
    } else {
      EXPECT_EQ(finish, "length");
    }
  }
  std::printf("[json schema] %d of 6 replies ended within 120 tokens\n", ended);
  EXPECT_EQ(s.stop(), 0);
}

TEST(PrefixCache, SecondTurnPrefillsOnlyNewTokensAndEqualsColdRun) {
  ServerProcess s({"-c", "2048", "--chunk", "64"});
  std::string story;
  for (int i = 0; i < 12; ++i) story += "Once upon a time there was a tiny model number " + std::to_string(i) + ". ";
  std::vector<int32_t> p1 = tokenize(s.port(), story);
  Json first = post(s.port(), "/v1/completions",
                    {{"prompt", p1}, {"max_tokens", 20}, {"temperature", 0}, {"return_tokens", true}}).json();
  std::vector<int32_t> r1 = first["choices"][0]["tokens"].get<std::vector<int32_t>>();
  ASSERT_EQ(r1.size(), 20u);
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

  std::vector<int32_t> added = tokenize(s.port(), " And then what happened?");
  std::vector<int32_t> p2 = p1;
  p2.insert(p2.end(), r1.begin(), r1.end());
  p2.insert(p2.end(), added.begin(), added.end());
  double prefilled_before = metric(s.port(), "regolith_prompt_tokens_prefilled_total");
  Json second = post(s.port(), "/v1/completions",
                     {{"prompt", p2}, {"max_tokens", 20}, {"temperature", 0}, {"return_tokens", true}}).json();
  double prefilled = metric(s.port(), "regolith_prompt_tokens_prefilled_total") - prefilled_before;
  Json cold = post(s.port(), "/v1/completions",
                   {{"prompt", p2}, {"max_tokens", 20}, {"temperature", 0}, {"return_tokens", true}, {"cache_prompt", false}})
                  .json();

  const int64_t cached = second["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  std::printf("[second turn] prompt %zu tokens: cached %lld (turn 1: %zu prompt + %zu reply), prefilled %lld (new: %zu)\n",
              p2.size(), static_cast<long long>(cached), p1.size(), r1.size(),
              static_cast<long long>(second["timings"]["prompt_n"].get<int64_t>()), added.size());
  EXPECT_EQ(cached, static_cast<int64_t>(p1.size() + r1.size()));
  EXPECT_EQ(second["timings"]["prompt_n"], added.size());
  EXPECT_EQ(prefilled, static_cast<double>(added.size()));
  EXPECT_EQ(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(cold["timings"]["prompt_n"], p2.size());
  EXPECT_EQ(second["choices"][0]["tokens"], cold["choices"][0]["tokens"]);
  EXPECT_EQ(second["choices"][0]["text"], cold["choices"][0]["text"]);

  // The same prompt again is cached whole, logits included: nothing to prefill.
  Json again = post(s.port(), "/v1/completions",
                    {{"prompt", p2}, {"max_tokens", 20}, {"temperature", 0}, {"return_tokens", true}}).json();
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], p2.size());
  EXPECT_EQ(again["timings"]["prompt_n"], 0);
  EXPECT_EQ(again["choices"][0]["tokens"], cold["choices"][0]["tokens"]);
  EXPECT_EQ(s.stop(), 0);
}

// A logit bias that leaves the model only digits, ASCII punctuation and spaces: tokens the
// tokenizer never merges, so the reply's text tokenizes back to exactly the generated tokens (a
// random model's raw output, split bytes and unmerged letter pairs, does not).
Json canonical_reply_bias(int port) {
  Json bias = Json::object();
  for (int id = 0; id < 512; ++id) {
    std::string text = http(port, "POST", "/detokenize", Json{{"tokens", {id}}}.dump()).json()["content"].get<std::string>();
    bool plain = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
      return c == ' ' || (c >= '!' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~');
    });
    if (!plain) bias[std::to_string(id)] = -100;
  }
  return bias;
}

TEST(PrefixCache, SecondChatTurnRestoresTheWholeFirstTurn) {
  ServerProcess s({"-c", "2048"});
  Json turn1 = chat_body("Tell me about the sea, the wind and the long road home.", 16);
  turn1["logit_bias"] = canonical_reply_bias(s.port());
  Json r1 = post(s.port(), "/v1/chat/completions", turn1).json();
  std::string reply = r1["choices"][0]["message"]["content"].get<std::string>();
  int64_t p1 = r1["usage"]["prompt_tokens"].get<int64_t>();
  ASSERT_EQ(r1["usage"]["completion_tokens"], 16);

  Json turn2 = turn1;
  turn2["messages"].push_back({{"role", "assistant"}, {"content", reply}});
  turn2["messages"].push_back({{"role", "user"}, {"content", "And after that?"}});
  Json r2 = post(s.port(), "/v1/chat/completions", turn2).json();
  turn2["cache_prompt"] = false;
  Json cold = post(s.port(), "/v1/chat/completions", turn2).json();

  int64_t prompt = r2["usage"]["prompt_tokens"].get<int64_t>();
  int64_t cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  int64_t prefilled = r2["timings"]["prompt_n"].get<int64_t>();
  std::printf("[chat second turn] prompt %lld tokens: cached %lld (turn 1: %lld prompt + 16 reply), prefilled %lld\n",
              static_cast<long long>(prompt), static_cast<long long>(cached), static_cast<long long>(p1),
              static_cast<long long>(prefilled));
  EXPECT_EQ(cached, p1 + 16);
  EXPECT_EQ(prefilled, prompt - cached);
  EXPECT_EQ(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(cold["timings"]["prompt_n"], prompt);
  EXPECT_EQ(r2["choices"][0]["message"]["content"], cold["choices"][0]["message"]["content"]);
  EXPECT_EQ(s.stop(), 0);
}

TEST(PrefixCache, FreeTextSecondTurnReusesAtLeastThePrompt) {
  // Unconstrained random text rarely tokenizes back to the generated tokens, so here only the
  // first turn's prompt is certain to be reused; the reply is still identical to a cold run.
  ServerProcess s({"-c", "2048"});
  Json turn1 = chat_body("Tell me about the sea.", 16);
  Json r1 = post(s.port(), "/v1/chat/completions", turn1).json();
  Json turn2 = turn1;
  turn2["messages"].push_back({{"role", "assistant"}, {"content", r1["choices"][0]["message"]["content"]}});
  turn2["messages"].push_back({{"role", "user"}, {"content", "More."}});
  Json r2 = post(s.port(), "/v1/chat/completions", turn2).json();
  turn2["cache_prompt"] = false;
  Json cold = post(s.port(), "/v1/chat/completions", turn2).json();
  EXPECT_GE(r2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), r1["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(r2["choices"][0]["message"]["content"], cold["choices"][0]["message"]["content"]);
  EXPECT_EQ(s.stop(), 0);
}

TEST(Disconnect, FreesTheSlotAtOnce) {
  ServerProcess s({"--parallel", "1", "-c", "8192"});
  for (bool stream : {true, false}) {
    SCOPED_TRACE(stream ? "streamed" : "not streamed");
    {
      Connection c(s.port());
      ASSERT_TRUE(c.send_request("POST", "/v1/completions",
                                 Json{{"prompt", "a long one"}, {"max_tokens", 8000}, {"stream", stream}, {"ignore_eos", true}}
                                     .dump()));
      if (stream) c.read_response(10000, [](std::string_view) { return false; });  // the first chunk
      else std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }  // closed: 8000 tokens would take the only slot for seconds
    auto t0 = Clock::now();
    HttpResult r = post(s.port(), "/v1/completions", {{"prompt", "next"}, {"max_tokens", 4}});
    double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_EQ(r.status, 200);
    EXPECT_LT(waited, 3.0) << "the abandoned request kept the slot";
  }
  EXPECT_GE(metric(s.port(), "regolith_client_disconnects_total"), 2);
  EXPECT_GE(metric(s.port(), "regolith_requests_cancelled_total"), 2);
  EXPECT_EQ(wait_metric(s.port(), "regolith_slots_busy", 0), 0);
  EXPECT_EQ(s.stop(), 0);
}

TEST(Shutdown, SigtermLetsRequestsInFlightFinish) {
  ServerProcess s({"--parallel", "2", "-c", "2048"});
  // SIGTERM once the stream has begun: the request is certainly in flight.
  Connection c(s.port());
  ASSERT_TRUE(c.send_request("POST", "/v1/completions",
                             Json{{"prompt", "x"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true},
                                  {"stream_options", {{"include_usage", true}}}}.dump()));
  bool signalled = false;
  HttpResult r = c.read_response(60000, [&](std::string_view) {
    if (!signalled) s.signal(SIGTERM), signalled = true;
    return true;
  });
  EXPECT_TRUE(signalled);
  EXPECT_EQ(r.status, 200);
  bool done = false;
  std::vector<Json> events = sse_events(r.body, &done);
  EXPECT_TRUE(done);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 400);
  int port = s.port();
  EXPECT_EQ(s.stop(), 0);
  EXPECT_FALSE(Connection(port).ok()) << "still accepting after shutdown";
}

TEST(Shutdown, SigintStopsAnIdleServer) {
  ServerProcess s({});
  EXPECT_EQ(http(s.port(), "GET", "/health").status, 200);
  EXPECT_EQ(s.stop(SIGINT), 0);
}

TEST(PrefixCacheDisk, SurvivesRestartAndIgnoresDamagedOrForeignFiles) {
  namespace fs = std::filesystem;
  fs::path dir = test_dir() + "/cache-dir-" + std::to_string(::getpid());
  fs::remove_all(dir);
  std::vector<int32_t> prompt;
  Json first;
  {
    ServerProcess s({"--cache-dir", dir.string(), "-c", "1024"});
    std::string text;
    for (int i = 0; i < 10; ++i) text += "The cache keeps conversation " + std::to_string(i) + " warm. ";
    prompt = tokenize(s.port(), text);
    first = post(s.port(), "/v1/completions", {{"prompt", prompt}, {"max_tokens", 10}, {"temperature", 0}}).json();
    EXPECT_EQ(s.stop(), 0);
    EXPECT_NE(s.log().find("prefixes saved"), std::string::npos) << s.log();
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().extension(), ".rpc") << "left behind: " << e.path();
    files.push_back(e.path());
  }
  ASSERT_FALSE(files.empty());
  auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto write = [](const fs::path& p, const std::string& b) { std::ofstream(p, std::ios::binary) << b; };
  std::string good = read(files.front());
  std::string flipped = good;
  flipped[flipped.size() - 3] ^= 0x20;
  write(dir / "flipped.rpc", flipped);
  write(dir / "short.rpc", good.substr(0, good.size() / 2));
  write(dir / "garbage.rpc", "this is not a cache file at all, just some words");
  write(dir / "foreign.rpc", server::CacheStore::encode(0x1234567890abcdefull, prompt));

  ServerProcess s({"--cache-dir", dir.string(), "-c", "1024"});
  std::string log = s.log();
  for (const char* name : {"flipped.rpc", "short.rpc", "garbage.rpc", "foreign.rpc"})
    EXPECT_NE(log.find(std::string(name) + ": ignored"), std::string::npos) << name << "\n" << log;
  EXPECT_NE(log.find("made for another model"), std::string::npos) << log;
  EXPECT_NE(log.find("checksum mismatch"), std::string::npos) << log;
  // Wait for the replay of the good files, then the same request is served from the cache.
  for (int i = 0; i < 100 && metric(s.port(), "regolith_prefix_cache_entries") < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Json again = post(s.port(), "/v1/completions", {{"prompt", prompt}, {"max_tokens", 10}, {"temperature", 0}}).json();
  std::printf("[cache dir] after restart: cached %lld of %zu prompt tokens\n",
              static_cast<long long>(again["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>()), prompt.size());
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], prompt.size());
  EXPECT_EQ(again["choices"][0]["text"], first["choices"][0]["text"]);
  EXPECT_EQ(s.stop(), 0);
  fs::remove_all(dir);
}

TEST(PrefixCacheDisk, WrittenWhileServingSoAKilledServerLosesLittle) {
  namespace fs = std::filesystem;
  fs::path dir = test_dir() + "/cache-crash-" + std::to_string(::getpid());
  fs::remove_all(dir);
  std::vector<int32_t> prompt;
  {
    ServerProcess s({"--cache-dir", dir.string(), "--cache-save-every", "1", "-c", "1024"});
    prompt = tokenize(s.port(), "A prompt that should outlive a crash of the server, one two three four.");
    EXPECT_EQ(post(s.port(), "/v1/completions", {{"prompt", prompt}, {"max_tokens", 5}}).status, 200);
    auto files = [&] {
      size_t n = 0;
      if (fs::exists(dir))
        for (const auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ".rpc";
      return n;
    };
    for (int i = 0; i < 100 && files() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_GE(files(), 2u) << "prompt and reply ends written while serving";
    EXPECT_EQ(s.stop(SIGKILL), -SIGKILL);
  }
  ServerProcess s({"--cache-dir", dir.string(), "-c", "1024"});
  for (int i = 0; i < 100 && metric(s.port(), "regolith_prefix_cache_entries") < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Json again = post(s.port(), "/v1/completions", {{"prompt", prompt}, {"max_tokens", 5}}).json();
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], prompt.size());
  EXPECT_EQ(s.stop(), 0);
  fs::remove_all(dir);
}

// Speculative decoding (--draft): the replies of a server without drafts, greedy and sampled under a
// seed, free text and JSON-schema replies (whose repeated whitespace lookup drafts get right), one
// request at a time and four at once (batched passes between speculative rounds), with MTP and
// with prompt-lookup drafts.
TEST(Speculative, RepliesEqualThoseWithoutDrafts) {
  const std::string model = test_dir() + "/tiny-mtp.gguf";
  const int n = 4, max_tokens = 40;
  const Json schema = Json::parse(R"({"type":"object","properties":{"a":{"enum":["x","y"]},"b":{"type":"boolean"}},
      "required":["a","b"]})");
  auto body = [&](int i, bool sampled) {
    Json b = chat_body(prompt_text(i), max_tokens);
    b["model"] = "tiny-mtp";
    b["logprobs"] = true;
    if (sampled) b["temperature"] = 1.0, b["seed"] = 11 + i;
    if (i % 2 == 1)
      b["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "ab"}, {"schema", schema}}}};
    return b;
  };
  // The reply's text and its tokens' bytes.
  auto reply_tokens = [](const HttpResult& r) {
    std::vector<std::string> tokens;
    for (const Json& entry : r.json()["choices"][0]["logprobs"]["content"]) {
      std::string b;
      for (const Json& v : entry["bytes"]) b += static_cast<char>(v.get<int>());
      tokens.push_back(b);
    }
    return std::make_pair(r.json()["choices"][0]["message"]["content"].get<std::string>(), tokens);
  };
  std::vector<std::pair<std::string, std::vector<std::string>>> want;
  {
    ServerProcess plain({"--parallel", "4", "-c", "1024"}, model);
    for (bool sampled : {false, true})
      for (int i = 0; i < n; ++i) want.push_back(reply_tokens(post(plain.port(), "/v1/chat/completions", body(i, sampled))));
    EXPECT_EQ(plain.stop(), 0);
  }
  for (const char* from : {"mtp", "lookup"}) {
    SCOPED_TRACE(from);
    ServerProcess s({"--parallel", "4", "-c", "1024", "--draft", "3", "--draft-from", from}, model);
    for (bool sampled : {false, true}) {
      for (int i = 0; i < n; ++i) {
        SCOPED_TRACE("alone " + std::to_string(i) + (sampled ? " sampled" : " greedy"));
        EXPECT_EQ(reply_tokens(post(s.port(), "/v1/chat/completions", body(i, sampled))), want[(sampled ? n : 0) + i]);
      }
      std::vector<std::pair<std::string, std::vector<std::string>>> together(n);
      std::vector<std::thread> threads;
      for (int i = 0; i < n; ++i)
        threads.emplace_back([&, i] { together[i] = reply_tokens(post(s.port(), "/v1/chat/completions", body(i, sampled))); });
      for (auto& t : threads) t.join();
      for (int i = 0; i < n; ++i) EXPECT_EQ(together[i], want[(sampled ? n : 0) + i]) << "together " << i;
    }
    EXPECT_GT(metric(s.port(), "regolith_speculative_rounds_total"), 0);
    EXPECT_GT(metric(s.port(), "regolith_speculative_drafted_tokens_total"), 0);
    if (std::string(from) == "lookup") EXPECT_GT(metric(s.port(), "regolith_speculative_accepted_tokens_total"), 0);
    EXPECT_EQ(s.stop(), 0);
  }
}

// MTP drafts from a model without an MTP block are refused at startup, with the reason.
TEST(Speculative, MtpDraftsNeedAnMtpBlock) {
  try {
    ServerProcess s({"--draft", "2"}, tiny_model());
    ADD_FAILURE() << "the server started";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("--draft-from mtp: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("has no MTP block"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace regolith::test
