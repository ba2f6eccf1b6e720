#include "server/stream.h"

#include <algorithm>

#include "server/api_error.h"
#include "tokenizer/tokenizer.h"

namespace regolith::server {
namespace {

const char* finish_name(FinishReason reason, bool tool_calls) {
  if (reason == FinishReason::length) return "length";
  return tool_calls ? "tool_calls" : "stop";
}

Json bytes_json(std::string_view s) {
  Json out = Json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

}  // namespace

std::string json_text(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string sse_data(const Json& j) { return "data: " + json_text(j) + "\n\n"; }

Json error_json(int status, const std::string& message, const std::string& param, const std::string& code) {
  ApiError e(status, message, param, code);
  return {{"error",
           {{"message", message},
            {"type", e.type()},
            {"param", param.empty() ? Json(nullptr) : Json(param)},
            {"code", code.empty() ? Json(nullptr) : Json(code)}}}};
}

// ---- ResponseWriter ----

Json ResponseWriter::chunk_base(const char* object) const {
  return {{"id", meta_.id}, {"object", object}, {"created", meta_.created}, {"model", meta_.model},
          {"system_fingerprint", "regolith"}};
}

void ResponseWriter::send_chunk(const Json& chunk) { out_.write(sse_data(chunk)); }

std::string ResponseWriter::token_text(int32_t id) const { return std::string(tokenizer_.token_bytes(id)); }

Json ResponseWriter::usage_json() const {
  return {{"prompt_tokens", usage_.prompt_tokens},
          {"completion_tokens", usage_.completion_tokens},
          {"total_tokens", usage_.prompt_tokens + usage_.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage_.cached_tokens}}}};
}

Json ResponseWriter::timings_json() const {
  auto per_second = [](int64_t n, double ms) { return ms > 0 ? n * 1000.0 / ms : 0.0; };
  return {{"queue_ms", usage_.queue_ms},
          {"cache_n", usage_.cached_tokens},
          {"prompt_n", usage_.prefilled_tokens},
          {"prompt_ms", usage_.prefill_ms},
          {"prompt_per_second", per_second(usage_.prefilled_tokens, usage_.prefill_ms)},
          {"predicted_n", usage_.completion_tokens},
          {"predicted_ms", usage_.decode_ms},
          {"predicted_per_second", per_second(usage_.completion_tokens, usage_.decode_ms)}};
}

void ResponseWriter::begin() {
  if (!meta_.stream) return;
  out_.begin_stream(200, "text/event-stream");
  for (int c = 0; c < meta_.n_choices; ++c) open_choice(c);
}

bool ResponseWriter::feed(const ResultEvent& e) {
  switch (e.kind) {
    case ResultEvent::Kind::token: on_token(e.choice, e.token); return true;
    case ResultEvent::Kind::finished: on_finished(e.choice, e.text, e.finish); return true;
    case ResultEvent::Kind::done:
      usage_.prompt_tokens += e.usage.prompt_tokens;
      usage_.cached_tokens += e.usage.cached_tokens;
      usage_.prefilled_tokens += e.usage.prefilled_tokens;
      usage_.completion_tokens += e.usage.completion_tokens;
      usage_.queue_ms = std::max(usage_.queue_ms, e.usage.queue_ms);
      usage_.prefill_ms = std::max(usage_.prefill_ms, e.usage.prefill_ms);
      usage_.decode_ms = std::max(usage_.decode_ms, e.usage.decode_ms);
      if (++tasks_done_ < meta_.n_tasks) return true;
      if (meta_.stream) {
        if (meta_.include_usage) {
          Json chunk = chunk_base(meta_.id.starts_with("chatcmpl") ? "chat.completion.chunk" : "text_completion");
          chunk["choices"] = Json::array();
          chunk["usage"] = usage_json();
          chunk["timings"] = timings_json();
          send_chunk(chunk);
        }
        out_.write("data: [DONE]\n\n");
        out_.end_stream();
      } else {
        Json body = final_body();
        body["usage"] = usage_json();
        body["timings"] = timings_json();
        out_.send(200, "application/json", json_text(body));
      }
      return false;
    case ResultEvent::Kind::error: {
      int status = status_ = e.error.find("shutting down") != std::string::npos ? 503 : 500;
      if (meta_.stream) {
        out_.write(sse_data(error_json(status, e.error)));
        out_.write("data: [DONE]\n\n");
        out_.end_stream();
      } else {
        out_.send(status, "application/json", json_text(error_json(status, e.error)));
      }
      return false;
    }
  }
  return false;
}

// ---- chat ----

ChatResponseWriter::ChatResponseWriter(ResponseMeta meta, const Tokenizer& tokenizer, HttpResponder& out,
                                       const ChatRequest& request)
    : ResponseWriter(std::move(meta), tokenizer, out), logprobs_(request.logprobs) {
  choices_.resize(static_cast<size_t>(meta_.n_choices));
  for (Choice& c : choices_) c.parser = std::make_unique<ChatOutputParser>(request.reasoning_open, request.tools);
}

Json ChatResponseWriter::logprob_entry(const GeneratedToken& token) const {
  Json top = Json::array();
  for (const TokenLogprob& t : token.top) {
    std::string s = token_text(t.token);
    top.push_back({{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_json(s)}});
  }
  std::string s = token_text(token.token);
  return {{"token", s}, {"logprob", token.logprob}, {"bytes", bytes_json(s)}, {"top_logprobs", std::move(top)}};
}

void ChatResponseWriter::send_delta(int choice, ChatDelta delta, Json logprobs, const char* finish) {
  Choice& c = choices_[static_cast<size_t>(choice)];
  Json d = Json::object();
  if (!delta.reasoning.empty()) d["reasoning_content"] = delta.reasoning;
  if (!delta.content.empty()) d["content"] = delta.content;
  if (!delta.tool_calls.empty()) {
    Json calls = Json::array();
    for (const ParsedToolCall& call : delta.tool_calls)
      calls.push_back({{"index", c.calls_sent++},
                       {"id", call.id},
                       {"type", "function"},
                       {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
    d["tool_calls"] = std::move(calls);
  }
  Json chunk = chunk_base("chat.completion.chunk");
  chunk["choices"] = Json::array({{{"index", choice},
                                   {"delta", std::move(d)},
                                   {"logprobs", std::move(logprobs)},
                                   {"finish_reason", finish ? Json(finish) : Json(nullptr)}}});
  if (meta_.include_usage) chunk["usage"] = nullptr;
  send_chunk(chunk);
}

void ChatResponseWriter::open_choice(int choice) {
  Json chunk = chunk_base("chat.completion.chunk");
  chunk["choices"] = Json::array({{{"index", choice},
                                   {"delta", {{"role", "assistant"}, {"content", ""}}},
                                   {"logprobs", nullptr},
                                   {"finish_reason", nullptr}}});
  if (meta_.include_usage) chunk["usage"] = nullptr;
  send_chunk(chunk);
}

void ChatResponseWriter::on_token(int choice, const GeneratedToken& token) {
  Choice& c = choices_[static_cast<size_t>(choice)];
  ChatDelta delta = c.parser->push(token.text);
  if (meta_.stream) {
    if (delta.empty() && !logprobs_) return;
    send_delta(choice, std::move(delta), logprobs_ ? Json::object({{"content", Json::array({logprob_entry(token)})}}) : Json(nullptr),
               nullptr);
  } else {
    c.message.append(std::move(delta));
    if (logprobs_) c.logprobs.push_back(logprob_entry(token));
  }
}

void ChatResponseWriter::on_finished(int choice, const std::string& text, FinishReason reason) {
  Choice& c = choices_[static_cast<size_t>(choice)];
  ChatDelta delta = c.parser->push(text);
  delta.append(c.parser->finish());
  c.finish = finish_name(reason, c.parser->n_tool_calls() > 0);
  if (meta_.stream) {
    if (!delta.empty()) send_delta(choice, std::move(delta), nullptr, nullptr);
    send_delta(choice, {}, nullptr, c.finish);
  } else {
    c.message.append(std::move(delta));
  }
}

Json ChatResponseWriter::final_body() {
  Json body = chunk_base("chat.completion");
  Json choices = Json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    const ChatDelta& m = c.message;
    Json message = {{"role", "assistant"}};
    message["content"] = m.content.empty() && !m.tool_calls.empty() ? Json(nullptr) : Json(m.content);
    if (!m.reasoning.empty()) message["reasoning_content"] = m.reasoning;
    if (!m.tool_calls.empty()) {
      Json calls = Json::array();
      for (const ParsedToolCall& call : m.tool_calls)
        calls.push_back({{"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
      message["tool_calls"] = std::move(calls);
    }
    choices.push_back({{"index", i},
                       {"message", std::move(message)},
                       {"logprobs", logprobs_ ? Json::object({{"content", c.logprobs}}) : Json(nullptr)},
                       {"finish_reason", c.finish ? c.finish : "stop"}});
  }
  body["choices"] = std::move(choices);
  return body;
}

// ---- completions ----

CompletionResponseWriter::CompletionResponseWriter(ResponseMeta meta, const Tokenizer& tokenizer, HttpResponder& out,
                                                   const CompletionRequest& request)
    : ResponseWriter(std::move(meta), tokenizer, out),
      logprobs_(request.logprobs),
      echo_(request.echo),
      return_tokens_(request.return_tokens),
      prompt_texts_(request.prompt_texts),
      n_per_prompt_(request.tasks.empty() ? 1 : request.tasks.front().n_choices) {
  choices_.resize(static_cast<size_t>(meta_.n_choices));
  if (echo_)
    for (size_t i = 0; i < choices_.size(); ++i) choices_[i].text = prompt_texts_[i / static_cast<size_t>(n_per_prompt_)];
}

Json CompletionResponseWriter::logprobs_json(const Choice& c) const {
  return {{"tokens", c.tokens}, {"token_logprobs", c.token_logprobs}, {"top_logprobs", c.top_logprobs}, {"text_offset", c.offsets}};
}

void CompletionResponseWriter::open_choice(int choice) {
  if (!echo_) return;
  Json chunk = chunk_base("text_completion");
  chunk["choices"] = Json::array({{{"index", choice},
                                   {"text", choices_[static_cast<size_t>(choice)].text},
                                   {"logprobs", nullptr},
                                   {"finish_reason", nullptr}}});
  send_chunk(chunk);
}

void CompletionResponseWriter::on_token(int choice, const GeneratedToken& token) {
  Choice& c = choices_[static_cast<size_t>(choice)];
  Choice step;  // this token's logprobs alone, for a streamed chunk
  Choice& lp = meta_.stream ? step : c;
  if (logprobs_ >= 0) {
    Json top = Json::object();
    for (const TokenLogprob& t : token.top) top[token_text(t.token)] = t.logprob;
    lp.tokens.push_back(token_text(token.token));
    lp.token_logprobs.push_back(token.logprob);
    lp.top_logprobs.push_back(std::move(top));
    lp.offsets.push_back(c.text.size());
  }
  c.text += token.text;
  c.ids.push_back(token.token);
  if (!meta_.stream || (token.text.empty() && logprobs_ < 0 && !return_tokens_)) return;
  Json chunk = chunk_base("text_completion");
  chunk["choices"] = Json::array({{{"index", choice},
                                   {"text", token.text},
                                   {"logprobs", logprobs_ >= 0 ? logprobs_json(step) : Json(nullptr)},
                                   {"finish_reason", nullptr}}});
  if (return_tokens_) chunk["choices"][0]["tokens"] = Json::array({token.token});
  if (meta_.include_usage) chunk["usage"] = nullptr;
  send_chunk(chunk);
}

void CompletionResponseWriter::on_finished(int choice, const std::string& text, FinishReason reason) {
  Choice& c = choices_[static_cast<size_t>(choice)];
  c.text += text;
  c.finish = finish_name(reason, false);
  if (!meta_.stream) return;
  Json chunk = chunk_base("text_completion");
  chunk["choices"] = Json::array({{{"index", choice}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", c.finish}}});
  if (meta_.include_usage) chunk["usage"] = nullptr;
  send_chunk(chunk);
}

Json CompletionResponseWriter::final_body() {
  Json body = chunk_base("text_completion");
  Json choices = Json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    choices.push_back({{"index", i},
                       {"text", c.text},
                       {"logprobs", logprobs_ >= 0 ? logprobs_json(c) : Json(nullptr)},
                       {"finish_reason", c.finish ? c.finish : "stop"}});
    if (return_tokens_) choices.back()["tokens"] = c.ids;
  }
  body["choices"] = std::move(choices);
  return body;
}

}  // namespace regolith::server
