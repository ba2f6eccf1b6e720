// Chat template application: the variables transformers passes (messages, tools, documents,
// add_generation_prompt, the special tokens, and the caller's extra kwargs, which override).

#include "tokenizer/chat_template.h"

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace regolith {

ChatTemplate::ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token)
    : template_(jinja::Template::parse(source)), bos_token_(std::move(bos_token)), eos_token_(std::move(eos_token)) {}

ChatTemplate ChatTemplate::from_tokenizer(const Tokenizer& tok) {
  if (tok.chat_template().empty()) fail("the model has no chat template (tokenizer.chat_template)");
  auto text = [&](int32_t id) { return id == kNoToken ? std::string() : tok.token_text(id); };
  return ChatTemplate(tok.chat_template(), text(tok.bos_id()), text(tok.eos_id()));
}

std::string ChatTemplate::apply(const nlohmann::ordered_json& messages, const ChatOptions& options) const {
  if (!messages.is_array()) fail("chat messages must be a JSON array");
  if (!options.extra.is_object()) fail("chat template variables must be a JSON object");
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["messages"] = messages;
  context["tools"] = options.tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = options.add_generation_prompt;
  if (!bos_token_.empty()) context["bos_token"] = bos_token_;
  if (!eos_token_.empty()) context["eos_token"] = eos_token_;
  for (const auto& [key, value] : options.extra.items()) context[key] = value;
  return template_.render(context);
}

bool ends_in_open_reasoning(const std::string& prompt) {
  const size_t open = prompt.rfind("<think>"), close = prompt.rfind("</think>");
  return open != std::string::npos && (close == std::string::npos || close < open);
}

}  // namespace regolith
