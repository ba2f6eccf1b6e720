// OpenAI request bodies -> typed, validated requests. Runs on HTTP worker threads: checks every
// field's type and range (400 naming the field), applies the chat template, tokenizes, and checks
// the prompt and max_tokens against the context. Unknown fields are ignored, as most OpenAI-
// compatible servers do.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/json_constraint.h"
#include "server/task.h"

namespace regolith {
class Tokenizer;
class ChatTemplate;
}  // namespace regolith

namespace regolith::server {

using Json = nlohmann::ordered_json;

struct ModelInfo {
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;  // null: the model has none (chat endpoint answers 400)
  bool xml_tool_calls = true;   // the template's tool-call format: <function=NAME> XML, or JSON in <tool_call>
  std::string id;               // the served model's name
  int64_t n_ctx = 0;
  int64_t n_vocab = 0;
  int max_choices = 64;         // n times the number of prompts
  const JsonVocabulary::Lazy* json_vocabulary = nullptr;  // the tries JSON-mode requests take
};

struct ToolSpec {
  std::string name;
  Json parameters;  // JSON schema of the arguments (may be null)
};

struct ChatRequest {
  GenerationTask task;
  std::string prompt_text;
  bool stream = false, include_usage = false;
  bool logprobs = false;
  std::vector<ToolSpec> tools;  // the tools whose calls are parsed back (empty: tool_choice none)
  bool reasoning_open = false;  // the prompt ends inside <think>: the reply starts as reasoning
};

struct CompletionRequest {
  std::vector<GenerationTask> tasks;  // one per prompt
  std::vector<std::string> prompt_texts;  // for echo
  bool stream = false, include_usage = false, echo = false;
  bool return_tokens = false;  // llama.cpp's extension: each choice's token ids
  int logprobs = -1;
};

ChatRequest parse_chat_request(const Json& body, const ModelInfo& model);
CompletionRequest parse_completion_request(const Json& body, const ModelInfo& model);

// Checks the optional `model` field against the served model (404 model_not_found).
void check_model_name(const Json& body, const ModelInfo& model);

}  // namespace regolith::server
