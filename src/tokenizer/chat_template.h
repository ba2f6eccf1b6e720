// Chat formatting: renders a model's Jinja chat template (`tokenizer.chat_template`) the way
// transformers' apply_chat_template does, so prompts match what the model was trained on.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja/template.h"

namespace regolith {

class Tokenizer;

struct ChatOptions {
  bool add_generation_prompt = true;
  // OpenAI-style tool definitions; null renders as `tools = none`, as transformers passes it.
  nlohmann::ordered_json tools = nullptr;
  // Further template variables: enable_thinking, reasoning_effort, preserve_thinking, ...
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // bos/eos texts become the `bos_token` / `eos_token` variables when not empty.
  ChatTemplate(const std::string& source, std::string bos_token = {}, std::string eos_token = {});
  // The GGUF's template and special tokens; throws when the file has no chat template.
  static ChatTemplate from_tokenizer(const Tokenizer& tokenizer);

  // messages: [{"role": ..., "content": ..., "tool_calls": ..., ...}, ...]
  std::string apply(const nlohmann::ordered_json& messages, const ChatOptions& options = {}) const;

 private:
  jinja::Template template_;
  std::string bos_token_, eos_token_;
};

// Whether a rendered prompt ends inside a reasoning block: its last <think> has no </think> after
// it (a thinking template's generation prompt opens one), so the reply starts as reasoning.
bool ends_in_open_reasoning(const std::string& prompt);

}  // namespace regolith
