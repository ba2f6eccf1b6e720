// A chat reply's text -> OpenAI message parts, incrementally: text inside <think>...</think> becomes
// `reasoning_content`, <tool_call> blocks become `tool_calls` (Qwen's XML format
// <function=NAME><parameter=P>value</parameter></function>, or JSON {"name", "arguments"}), the
// rest is `content`. Text that may be the start of a tag is held back until it is known; a tool
// call is reported whole once its closing tag arrives (or, cut off, at the end if its name is known).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "server/openai_request.h"

namespace regolith::server {

struct ParsedToolCall {
  std::string id, name, arguments;  // arguments: a JSON object as text
};

struct ChatDelta {
  std::string reasoning, content;
  std::vector<ParsedToolCall> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  void append(ChatDelta other);
};

class ChatOutputParser {
 public:
  // starts_in_reasoning: the prompt ended inside <think>. tools: parse tool calls of these tools
  // (empty: tool-call tags are plain content).
  ChatOutputParser(bool starts_in_reasoning, std::vector<ToolSpec> tools);

  ChatDelta push(std::string_view text);
  ChatDelta finish();
  int n_tool_calls() const { return n_tool_calls_; }

 private:
  enum class State { reasoning, content, tool_call };
  void emit_reasoning(std::string_view s, ChatDelta& out);
  void emit_content(std::string_view s, ChatDelta& out);
  bool add_tool_call(std::string_view body, ChatDelta& out);

  State state_;
  std::vector<ToolSpec> tools_;
  std::string buffer_;
  bool trim_reasoning_start_ = true, trim_content_start_ = true;
  bool content_seen_ = false;
  int n_tool_calls_ = 0;
};

// Parses one tool call body (the text between <tool_call> and </tool_call>); false when it names no
// function. Parameter values become JSON by the tool's schema (strings stay strings).
bool parse_tool_call(std::string_view body, const std::vector<ToolSpec>& tools, ParsedToolCall& out);

}  // namespace regolith::server
