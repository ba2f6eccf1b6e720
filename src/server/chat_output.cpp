#include "server/chat_output.h"

#include <algorithm>
#include <random>

namespace regolith::server {
namespace {

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Length of the longest suffix of `s` that is a proper prefix of one of the tags.
size_t partial_tag(std::string_view s, std::initializer_list<std::string_view> tags) {
  size_t keep = 0;
  for (std::string_view tag : tags)
    for (size_t n = std::min(tag.size() - 1, s.size()); n > keep; --n)
      if (s.substr(s.size() - n) == tag.substr(0, n)) {
        keep = n;
        break;
      }
  return keep;
}

std::string new_call_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const char* alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += alphabet[rng() % 62];
  return id;
}

// A parameter's value as JSON: the schema's type decides; a string schema keeps the text.
Json parameter_value(const std::string& name, const std::string& text, const ToolSpec* tool) {
  std::string type;
  if (tool && tool->parameters.is_object()) {
    auto props = tool->parameters.find("properties");
    if (props != tool->parameters.end() && props->is_object()) {
      auto p = props->find(name);
      if (p != props->end() && p->is_object() && p->contains("type") && (*p)["type"].is_string())
        type = (*p)["type"].get<std::string>();
    }
  }
  if (type == "string") return text;
  Json parsed = Json::parse(text, nullptr, false);
  return parsed.is_discarded() ? Json(text) : parsed;
}

}  // namespace

void ChatDelta::append(ChatDelta other) {
  reasoning += other.reasoning;
  content += other.content;
  for (auto& c : other.tool_calls) tool_calls.push_back(std::move(c));
}

bool parse_tool_call(std::string_view body, const std::vector<ToolSpec>& tools, ParsedToolCall& out) {
  std::string_view b = trim(body);
  auto find_tool = [&](const std::string& name) -> const ToolSpec* {
    for (const ToolSpec& t : tools)
      if (t.name == name) return &t;
    return nullptr;
  };
  if (b.starts_with("{")) {  // JSON: {"name": ..., "arguments": {...}}
    Json j = Json::parse(b, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string()) {
      // Cut off: the name may still be readable.
      size_t k = b.find("\"name\"");
      if (k == std::string_view::npos) return false;
      size_t q1 = b.find('"', b.find(':', k) + 1);
      size_t q2 = q1 == std::string_view::npos ? q1 : b.find('"', q1 + 1);
      if (q2 == std::string_view::npos) return false;
      out.name = std::string(b.substr(q1 + 1, q2 - q1 - 1));
      out.arguments = "{}";
    } else {
      out.name = j["name"].get<std::string>();
      Json args = j.contains("arguments") ? j["arguments"] : Json::object();
      out.arguments = args.is_string() ? args.get<std::string>() : args.dump();
    }
    out.id = new_call_id();
    return !out.name.empty();
  }
  constexpr std::string_view kFunction = "<function=", kParam = "<parameter=", kParamEnd = "</parameter>";
  size_t f = b.find(kFunction);
  if (f == std::string_view::npos) return false;
  size_t name_end = b.find('>', f);
  if (name_end == std::string_view::npos) return false;
  out.name = std::string(trim(b.substr(f + kFunction.size(), name_end - f - kFunction.size())));
  if (out.name.empty()) return false;
  const ToolSpec* tool = find_tool(out.name);
  Json args = Json::object();
  size_t pos = name_end + 1;
  while (true) {
    size_t p = b.find(kParam, pos);
    if (p == std::string_view::npos) break;
    size_t pname_end = b.find('>', p);
    if (pname_end == std::string_view::npos) break;
    size_t end = b.find(kParamEnd, pname_end);
    if (end == std::string_view::npos) break;  // cut off inside a value: leave it out
    std::string name(trim(b.substr(p + kParam.size(), pname_end - p - kParam.size())));
    std::string_view value = b.substr(pname_end + 1, end - pname_end - 1);
    if (value.starts_with("\n")) value.remove_prefix(1);
    if (value.ends_with("\n")) value.remove_suffix(1);
    args[name] = parameter_value(name, std::string(value), tool);
    pos = end + kParamEnd.size();
  }
  out.arguments = args.dump(-1, ' ', false, Json::error_handler_t::replace);
  out.id = new_call_id();
  return true;
}

ChatOutputParser::ChatOutputParser(bool starts_in_reasoning, std::vector<ToolSpec> tools)
    : state_(starts_in_reasoning ? State::reasoning : State::content), tools_(std::move(tools)) {}

void ChatOutputParser::emit_reasoning(std::string_view s, ChatDelta& out) {
  if (trim_reasoning_start_) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    if (s.empty()) return;
    trim_reasoning_start_ = false;
  }
  out.reasoning += s;
}

void ChatOutputParser::emit_content(std::string_view s, ChatDelta& out) {
  if (trim_content_start_) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    if (s.empty()) return;
    trim_content_start_ = false;
  }
  content_seen_ = true;
  out.content += s;
}

bool ChatOutputParser::add_tool_call(std::string_view body, ChatDelta& out) {
  ParsedToolCall call;
  if (!parse_tool_call(body, tools_, call)) return false;
  out.tool_calls.push_back(std::move(call));
  ++n_tool_calls_;
  return true;
}

ChatDelta ChatOutputParser::push(std::string_view text) {
  ChatDelta out;
  buffer_ += text;
  while (true) {
    if (state_ == State::reasoning) {
      size_t p = buffer_.find(kThinkClose);
      if (p == std::string::npos) {
        size_t keep = partial_tag(buffer_, {kThinkClose});
        emit_reasoning(std::string_view(buffer_).substr(0, buffer_.size() - keep), out);
        buffer_.erase(0, buffer_.size() - keep);
        return out;
      }
      emit_reasoning(std::string_view(buffer_).substr(0, p), out);
      buffer_.erase(0, p + kThinkClose.size());
      state_ = State::content;
      trim_content_start_ = true;
    } else if (state_ == State::content) {
      // <think> opens reasoning only before any content; <tool_call> only when tools were given.
      bool think_allowed = !content_seen_, calls_allowed = !tools_.empty();
      size_t think = think_allowed ? buffer_.find(kThinkOpen) : std::string::npos;
      if (think != std::string::npos && !trim(std::string_view(buffer_).substr(0, think)).empty()) think = std::string::npos;
      size_t call = calls_allowed ? buffer_.find(kCallOpen) : std::string::npos;
      if (think == std::string::npos && call == std::string::npos) {
        size_t keep = 0;
        if (think_allowed && calls_allowed) keep = partial_tag(buffer_, {kThinkOpen, kCallOpen});
        else if (think_allowed) keep = partial_tag(buffer_, {kThinkOpen});
        else if (calls_allowed) keep = partial_tag(buffer_, {kCallOpen});
        emit_content(std::string_view(buffer_).substr(0, buffer_.size() - keep), out);
        buffer_.erase(0, buffer_.size() - keep);
        return out;
      }
      if (think != std::string::npos && (call == std::string::npos || think < call)) {
        buffer_.erase(0, think + kThinkOpen.size());
        state_ = State::reasoning;
        trim_reasoning_start_ = true;
      } else {
        emit_content(std::string_view(buffer_).substr(0, call), out);
        buffer_.erase(0, call + kCallOpen.size());
        state_ = State::tool_call;
      }
    } else {
      size_t p = buffer_.find(kCallClose);
      if (p == std::string::npos) return out;  // a tool call is reported whole
      std::string body = buffer_.substr(0, p);
      buffer_.erase(0, p + kCallClose.size());
      if (!add_tool_call(body, out)) emit_content(std::string(kCallOpen) + body + std::string(kCallClose), out);
      state_ = State::content;
      trim_content_start_ = true;
    }
  }
}

ChatDelta ChatOutputParser::finish() {
  ChatDelta out;
  std::string rest = std::move(buffer_);
  buffer_.clear();
  switch (state_) {
    case State::reasoning: emit_reasoning(rest, out); break;
    case State::content: emit_content(rest, out); break;
    case State::tool_call:
      if (!add_tool_call(rest, out)) emit_content(std::string(kCallOpen) + rest, out);
      break;
  }
  state_ = State::content;
  return out;
}

}  // namespace regolith::server
