// Turns one request's ResultEvents into its HTTP response, on the worker thread that serves it:
// SSE chunks (`data: {...}` ... `data: [DONE]`) when streaming, one JSON body otherwise, in the
// shapes of OpenAI's chat.completion(.chunk) and text_completion objects, with usage
// (prompt_tokens_details.cached_tokens) and llama.cpp-style timings.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/chat_output.h"
#include "server/http.h"
#include "server/openai_request.h"
#include "server/task.h"

namespace regolith::server {

struct ResponseMeta {
  std::string id;       // chatcmpl-... / cmpl-...
  int64_t created = 0;  // unix seconds
  std::string model;
  bool stream = false, include_usage = false;
  int n_choices = 1;    // over all prompts
  int n_tasks = 1;      // done events to wait for
};

// Drives one response: feed() every event until it returns false.
class ResponseWriter {
 public:
  ResponseWriter(ResponseMeta meta, const Tokenizer& tokenizer, HttpResponder& out)
      : meta_(std::move(meta)), tokenizer_(tokenizer), out_(out) {}
  virtual ~ResponseWriter() = default;

  void begin();                          // stream: status line and the opening chunks
  bool feed(const ResultEvent& event);   // false once the response is complete
  const RequestUsage& usage() const { return usage_; }
  int status() const { return status_; }  // 200, or the status of a failure event

 protected:
  virtual void open_choice(int choice) = 0;
  virtual void on_token(int choice, const GeneratedToken& token) = 0;
  virtual void on_finished(int choice, const std::string& text, FinishReason reason) = 0;
  virtual Json final_body() = 0;  // non-streamed: the whole response

  Json chunk_base(const char* object) const;
  void send_chunk(const Json& chunk);
  Json usage_json() const;
  Json timings_json() const;
  std::string token_text(int32_t id) const;

  ResponseMeta meta_;
  const Tokenizer& tokenizer_;
  HttpResponder& out_;
  RequestUsage usage_;
  int tasks_done_ = 0;
  int status_ = 200;
};

class ChatResponseWriter : public ResponseWriter {
 public:
  ChatResponseWriter(ResponseMeta meta, const Tokenizer& tokenizer, HttpResponder& out, const ChatRequest& request);

 protected:
  void open_choice(int choice) override;
  void on_token(int choice, const GeneratedToken& token) override;
  void on_finished(int choice, const std::string& text, FinishReason reason) override;
  Json final_body() override;

 private:
  struct Choice {
    std::unique_ptr<ChatOutputParser> parser;
    ChatDelta message;
    Json logprobs = Json::array();
    const char* finish = nullptr;
    int calls_sent = 0;
  };
  void send_delta(int choice, ChatDelta delta, Json logprobs, const char* finish);
  Json logprob_entry(const GeneratedToken& token) const;

  bool logprobs_;
  std::vector<Choice> choices_;
};

class CompletionResponseWriter : public ResponseWriter {
 public:
  CompletionResponseWriter(ResponseMeta meta, const Tokenizer& tokenizer, HttpResponder& out,
                           const CompletionRequest& request);

 protected:
  void open_choice(int choice) override;
  void on_token(int choice, const GeneratedToken& token) override;
  void on_finished(int choice, const std::string& text, FinishReason reason) override;
  Json final_body() override;

 private:
  struct Choice {
    std::string text;
    std::vector<int32_t> ids;
    Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array(), offsets = Json::array();
    const char* finish = nullptr;
  };
  Json logprobs_json(const Choice& c) const;

  int logprobs_;
  bool echo_, return_tokens_;
  std::vector<std::string> prompt_texts_;
  int n_per_prompt_;
  std::vector<Choice> choices_;
};

std::string sse_data(const Json& j);
std::string json_text(const Json& j);  // compact; invalid UTF-8 replaced
Json error_json(int status, const std::string& message, const std::string& param = {}, const std::string& code = {});

}  // namespace regolith::server
