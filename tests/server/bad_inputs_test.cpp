// Bad requests against a live server: each gets a 4xx with an OpenAI-shaped error object, and the
// server keeps serving (health, a normal request, no busy slot) after all of them.
#include "server_test_util.h"

namespace regolith::test {
namespace {

class BadInputs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"-c", "256", "--max-body", "65536", "--timeout", "2", "--parallel", "2"});
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->stop(SIGTERM), 0) << server_->log();
    delete server_;
  }
  void TearDown() override {
    // Whatever the request was, the server still answers and holds no slot.
    EXPECT_EQ(http(port(), "GET", "/health").status, 200);
  }
  static int port() { return server_->port(); }

  // Expects `status` and an OpenAI error object (message, type; param when given).
  static void expect_error(const HttpResult& r, int status, const std::string& param = {}) {
    EXPECT_EQ(r.status, status) << r.body;
    Json j = r.json();
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string() && !j["error"]["message"].get<std::string>().empty()) << r.body;
    EXPECT_TRUE(j["error"]["type"].is_string()) << r.body;
    if (!param.empty()) {
      EXPECT_EQ(j["error"]["param"], param) << r.body;
    }
  }
  static HttpResult chat(Json body) { return post(port(), "/v1/chat/completions", body); }
  static HttpResult complete(Json body) { return post(port(), "/v1/completions", body); }

  static ServerProcess* server_;
};
ServerProcess* BadInputs::server_ = nullptr;

TEST_F(BadInputs, InvalidJson) {
  expect_error(http(port(), "POST", "/v1/chat/completions", "{\"messages\": [", {}), 400, "body");
  expect_error(http(port(), "POST", "/v1/chat/completions", "not json at all"), 400, "body");
  expect_error(http(port(), "POST", "/v1/completions", "{\"prompt\": \"a\"} trailing"), 400, "body");
  expect_error(http(port(), "POST", "/v1/chat/completions", ""), 400, "body");
  expect_error(http(port(), "POST", "/v1/chat/completions", "[1, 2, 3]"), 400);
  expect_error(http(port(), "POST", "/v1/completions", "{\"prompt\": \"\xff\xfe\"}"), 400, "body");  // not UTF-8
  expect_error(http(port(), "POST", "/v1/chat/completions", std::string(10000, '[')), 400, "body");  // too deep
}

TEST_F(BadInputs, WrongFieldTypes) {
  Json base = chat_body("hi", 4);
  for (auto [field, value] : std::vector<std::pair<std::string, Json>>{{"temperature", "hot"},
                                                                       {"max_tokens", "5"},
                                                                       {"max_tokens", 2.5},
                                                                       {"n", true},
                                                                       {"stream", "yes"},
                                                                       {"stop", 5},
                                                                       {"stop", Json::array({1, 2})},
                                                                       {"seed", "x"},
                                                                       {"top_p", Json::array()},
                                                                       {"logprobs", 1},
                                                                       {"messages", "hello"},
                                                                       {"tools", Json::object()},
                                                                       {"logit_bias", Json::array()},
                                                                       {"model", 7}}) {
    Json body = base;
    body[field] = value;
    SCOPED_TRACE(field + " = " + value.dump());
    expect_error(chat(body), 400, field);
  }
  Json bad_message = base;
  bad_message["messages"] = Json::array({{{"role", 3}, {"content", "x"}}});
  expect_error(chat(bad_message), 400, "messages[0].role");
  bad_message["messages"] = Json::array({{{"role", "user"}, {"content", 42}}});
  expect_error(chat(bad_message), 400, "messages[0].content");
  bad_message["messages"] = Json::array({{{"role", "wizard"}, {"content", "x"}}});
  expect_error(chat(bad_message), 400, "messages[0].role");
  bad_message["messages"] = Json::array({{{"role", "user"}}});
  expect_error(chat(bad_message), 400, "messages[0].content");
  bad_message["messages"] = Json::array({{{"role", "user"}, {"content", Json::array({{{"type", "image_url"}}})}}});
  expect_error(chat(bad_message), 400, "messages[0].content");
  expect_error(complete({{"prompt", Json::object()}, {"max_tokens", 2}}), 400, "prompt");
  expect_error(complete({{"prompt", Json::array({"a", 1})}, {"max_tokens", 2}}), 400, "prompt[1]");
  expect_error(complete({{"prompt", Json::array({1, "a"})}, {"max_tokens", 2}}), 400, "prompt[1]");
}

TEST_F(BadInputs, OutOfRangeValues) {
  Json base = chat_body("hi", 4);
  for (auto [field, value] : std::vector<std::pair<std::string, Json>>{{"temperature", 3},
                                                                       {"temperature", -1},
                                                                       {"top_p", 1.5},
                                                                       {"n", 0},
                                                                       {"n", 100000},
                                                                       {"presence_penalty", 9},
                                                                       {"top_logprobs", 50}}) {
    Json body = base;
    body[field] = value;
    if (field == "top_logprobs") body["logprobs"] = true;
    SCOPED_TRACE(field + " = " + value.dump());
    expect_error(chat(body), 400, field);
  }
  Json body = base;
  body["stop"] = Json::array();
  for (int i = 0; i < 40; ++i) body["stop"].push_back(std::to_string(i) + "s");
  expect_error(chat(body), 400, "stop");
  body = base;
  body["stream_options"] = {{"include_usage", true}};  // without stream
  expect_error(chat(body), 400, "stream_options");
  body = base;
  body["tool_choice"] = "required";  // without tools
  expect_error(chat(body), 400, "tool_choice");
  body = base;
  body["logit_bias"] = {{"99999", 5}};
  expect_error(chat(body), 400, "logit_bias");
  body = base;
  body["response_format"] = {{"type", "xml"}};
  expect_error(chat(body), 400, "response_format");
  body["response_format"] = {{"type", "json_schema"}};
  expect_error(chat(body), 400, "response_format.json_schema");
  body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "string"}, {"pattern", "a"}}}}}};
  expect_error(chat(body), 400, "response_format.json_schema.schema");
}

TEST_F(BadInputs, UnknownModel) {
  Json body = chat_body("hi", 4);
  body["model"] = "gpt-17";
  HttpResult r = chat(body);
  expect_error(r, 404, "model");
  EXPECT_EQ(r.json()["error"]["code"], "model_not_found");
  expect_error(complete({{"model", "nope"}, {"prompt", "x"}}), 404, "model");
}

TEST_F(BadInputs, EmptyOrMissingMessages) {
  Json body = chat_body("hi", 4);
  body["messages"] = Json::array();
  expect_error(chat(body), 400, "messages");
  body.erase("messages");
  expect_error(chat(body), 400, "messages");
  expect_error(complete({{"max_tokens", 3}}), 400, "prompt");
  expect_error(complete({{"prompt", Json::array()}}), 400, "prompt");
  expect_error(complete({{"prompt", ""}}), 400, "prompt");
}

TEST_F(BadInputs, PromptLongerThanContext) {
  std::string long_text(2000, 'x');  // far more than 256 tokens with this vocabulary
  HttpResult r = chat(chat_body(long_text, 4));
  expect_error(r, 400, "messages");
  EXPECT_EQ(r.json()["error"]["code"], "context_length_exceeded");
  std::vector<int> ids(300, 65);
  expect_error(complete({{"prompt", ids}, {"max_tokens", 1}}), 400, "prompt");
}

TEST_F(BadInputs, NegativeOrHugeMaxTokens) {
  for (Json v : {Json(-5), Json(0), Json(1000000000000LL), Json(300), Json(1e30)}) {
    SCOPED_TRACE(v.dump());
    Json body = chat_body("hi", 1);
    body["max_tokens"] = v;
    expect_error(chat(body), 400, "max_tokens");
  }
  expect_error(complete({{"prompt", "abc"}, {"max_completion_tokens", -1}}), 400, "max_completion_tokens");
}

TEST_F(BadInputs, UnknownTokenIds) {
  for (Json ids : {Json::array({1, 2, 99999}), Json::array({-1}), Json::array({1, 512}),
                   Json::array({Json::array({1, 2}), Json::array({7, 100000})}), Json::array({1.5})}) {
    SCOPED_TRACE(ids.dump());
    expect_error(complete({{"prompt", ids}, {"max_tokens", 2}}), 400);
  }
  expect_error(post(port(), "/detokenize", {{"tokens", {1, 5000}}}), 400, "tokens");
}

TEST_F(BadInputs, OversizedBody) {
  std::string big = "{\"prompt\": \"" + std::string(70000, 'a') + "\"}";
  HttpResult r = http(port(), "POST", "/v1/completions", big);
  expect_error(r, 413);
  // Refused from the header alone: the body is never read.
  Connection c(port());
  ASSERT_TRUE(c.send_raw("POST /v1/completions HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n"));
  expect_error(c.read_response(5000), 413);
  // A 100-continue client is told before it sends the body.
  Connection e(port());
  ASSERT_TRUE(e.send_raw("POST /v1/completions HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n"));
  expect_error(e.read_response(5000), 413);
  // Headers too large.
  Connection h(port());
  ASSERT_TRUE(h.send_raw("GET /health HTTP/1.1\r\nX-Big: " + std::string(40000, 'h') + "\r\n\r\n"));
  expect_error(h.read_response(5000), 431);
}

TEST_F(BadInputs, SlowSendingClient) {
  // Headers, then only part of the body: 408 once the 2 s request deadline passes.
  auto t0 = Clock::now();
  Connection c(port());
  ASSERT_TRUE(c.send_raw("POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"prompt\":"));
  HttpResult r = c.read_response(10000);
  double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  expect_error(r, 408);
  EXPECT_GT(waited, 1.5);
  EXPECT_LT(waited, 6.0);
  // A client that drips a byte every 300 ms never finishes its headers: the deadline counts from
  // the first byte, not the last.
  Connection d(port());
  std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
  t0 = Clock::now();
  bool cut = false;
  for (char ch : head) {
    if (!d.send_raw(std::string(1, ch))) {
      cut = true;
      break;
    }
    if (d.closed_by_peer(300)) {
      cut = true;
      break;
    }
  }
  waited = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_TRUE(cut) << "the dripping client was never cut off";
  EXPECT_LT(waited, 6.0);
  // Meanwhile other clients were served.
  EXPECT_EQ(post(port(), "/v1/completions", {{"prompt", "ab"}, {"max_tokens", 2}}).status, 200);
}

TEST_F(BadInputs, MalformedHttp) {
  for (std::string raw : {"GARBAGE\r\n\r\n", "GET /health HTTP/9.9\r\n\r\n",
                          "POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
                          "POST /v1/completions HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n{}",
                          "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
                          "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"}) {
    SCOPED_TRACE(raw);
    Connection c(port());
    ASSERT_TRUE(c.send_raw(raw));
    HttpResult r = c.read_response(5000);
    EXPECT_GE(r.status, 400);
    EXPECT_LT(r.status, 500);
  }
  // A chunked body is fine.
  Connection c(port());
  std::string body = "{\"prompt\": \"abc\", \"max_tokens\": 2}";
  char size[16];
  std::snprintf(size, sizeof size, "%zx", body.size());
  ASSERT_TRUE(c.send_raw(std::string("POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n") + size +
                         "\r\n" + body + "\r\n0\r\n\r\n"));
  EXPECT_EQ(c.read_response(5000).status, 200);
}

TEST_F(BadInputs, UnknownRoutesAndMethods) {
  expect_error(http(port(), "GET", "/v1/chat/completions"), 405);
  expect_error(http(port(), "POST", "/v1/nothing", "{}"), 404);
  expect_error(http(port(), "GET", "/v1/models/other-model"), 404);
}

TEST_F(BadInputs, TemplateRejection) {
  // The tiny model's ChatML template accepts any order; a tool message without tools is fine too.
  Json body = chat_body("hi", 2);
  body["messages"].push_back({{"role", "tool"}, {"content", "42"}, {"tool_call_id", "x"}});
  EXPECT_EQ(chat(body).status, 200);
}

TEST_F(BadInputs, ServerStillServesAfterAll) {
  HttpResult r = chat(chat_body("hello", 4));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["usage"]["completion_tokens"], 4);
  EXPECT_EQ(wait_metric(port(), "regolith_slots_busy", 0), 0);
  EXPECT_EQ(metric(port(), "regolith_queue_depth"), 0);
  EXPECT_EQ(metric(port(), "regolith_http_responses_total{endpoint=\"chat_completions\",code=\"5xx\"}"), 0);
}

// Authentication and the queue limit need servers of their own.
TEST(ServerLimits, ApiKey) {
  ServerProcess s({"--api-key", "sekrit", "-c", "256"});
  EXPECT_EQ(post(s.port(), "/v1/completions", {{"prompt", "a"}, {"max_tokens", 1}}).status, 401);
  EXPECT_EQ(post(s.port(), "/v1/completions", {{"prompt", "a"}, {"max_tokens", 1}}, {"Authorization: Bearer wrong"}).status, 401);
  EXPECT_EQ(http(s.port(), "GET", "/v1/models").status, 401);
  EXPECT_EQ(http(s.port(), "GET", "/metrics").status, 401);
  EXPECT_EQ(post(s.port(), "/v1/completions", {{"prompt", "a"}, {"max_tokens", 1}}, {"Authorization: Bearer sekrit"}).status, 200);
  EXPECT_EQ(http(s.port(), "GET", "/health").status, 200);
  HttpResult r = post(s.port(), "/v1/completions", {{"prompt", "a"}}, {"Authorization: Bearer sekri"});
  EXPECT_EQ(r.json()["error"]["code"], "invalid_api_key");
  EXPECT_EQ(s.stop(), 0);
}

TEST(ServerLimits, QueueFull) {
  ServerProcess s({"--parallel", "1", "--queue", "0", "-c", "2048"});
  // A long request holds the only slot; with no queue, the next request is refused at once.
  Connection busy(s.port());
  ASSERT_TRUE(busy.send_request("POST", "/v1/completions", Json{{"prompt", "a"}, {"max_tokens", 1500}, {"stream", true}, {"ignore_eos", true}}.dump()));
  std::string first;
  busy.read_response(10000, [&](std::string_view d) { return (first = d).empty(); });  // until the first chunk
  HttpResult r = post(s.port(), "/v1/completions", {{"prompt", "b"}, {"max_tokens", 1}});
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.json()["error"]["code"], "queue_full");
  EXPECT_EQ(r.headers["retry-after"], "1");
  EXPECT_GE(metric(s.port(), "regolith_requests_rejected_queue_full_total"), 1);
  busy.close();
  EXPECT_EQ(s.stop(), 0);
}

}  // namespace
}  // namespace regolith::test
