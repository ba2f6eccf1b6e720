#include "server/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "core/error.h"
#include "server/api_error.h"
#include "server/json_schema.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace regolith::server {
namespace {

constexpr size_t kMaxStops = 16, kMaxStopBytes = 1024, kMaxLogitBias = 1024;
constexpr int kMaxTopLogprobs = 20;

const char* article_type(const Json& v) {
  switch (v.type()) {
    case Json::value_t::string: return "a string";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    case Json::value_t::null: return "null";
    default: return v.is_number_integer() || v.is_number_unsigned() ? "an integer" : "a number";
  }
}

ApiError wrong_type(const std::string& param, const char* expected, const Json& got) {
  return ApiError(400, cat("Invalid type for '", param, "': expected ", expected, ", but got ", article_type(got), " instead."),
                  param, "invalid_type");
}

// Typed, range-checked access to the fields of one JSON object; `prefix` names nested objects.
class Fields {
 public:
  Fields(const Json& object, std::string prefix = {}) : j_(object), prefix_(std::move(prefix)) {}

  // The field, or null when absent or JSON null.
  const Json* get(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  std::string name(const char* key) const { return prefix_ + key; }

  std::optional<bool> boolean(const char* key) const {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw wrong_type(name(key), "a boolean", *v);
    return v->get<bool>();
  }
  std::optional<double> number(const char* key, double lo, double hi) const {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) throw wrong_type(name(key), "a number", *v);
    double x = v->get<double>();
    if (!(x >= lo && x <= hi))
      throw invalid_request(cat("Invalid '", name(key), "': expected a value in [", lo, ", ", hi, "], but got ", v->dump(), "."),
                            name(key));
    return x;
  }
  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) const {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) throw wrong_type(name(key), "an integer", *v);
    int64_t x;
    if (v->is_number_integer()) {
      x = v->get<int64_t>();
    } else if (v->is_number_unsigned()) {
      x = std::numeric_limits<int64_t>::max();  // beyond int64: above any range
    } else {
      double d = v->get<double>();
      if (d != std::floor(d)) throw wrong_type(name(key), "an integer", *v);
      x = d >= 9.2e18 ? std::numeric_limits<int64_t>::max() : d <= -9.2e18 ? std::numeric_limits<int64_t>::min()
                                                                          : static_cast<int64_t>(d);
    }
    if (x < lo)
      throw invalid_request(cat("Invalid '", name(key), "': integer below minimum value. Expected a value >= ", lo,
                                ", but got ", v->dump(), " instead."),
                            name(key), "integer_below_min_value");
    if (x > hi)
      throw invalid_request(cat("Invalid '", name(key), "': integer above maximum value. Expected a value <= ", hi,
                                ", but got ", v->dump(), " instead."),
                            name(key), "integer_above_max_value");
    return x;
  }
  std::optional<std::string> string(const char* key) const {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw wrong_type(name(key), "a string", *v);
    return v->get<std::string>();
  }
  const Json* object(const char* key) const {
    const Json* v = get(key);
    if (v && !v->is_object()) throw wrong_type(name(key), "an object", *v);
    return v;
  }
  const Json* array(const char* key) const {
    const Json* v = get(key);
    if (v && !v->is_array()) throw wrong_type(name(key), "an array", *v);
    return v;
  }

 private:
  const Json& j_;
  std::string prefix_;
};

struct CommonFields {
  bool stream = false, include_usage = false;
  std::optional<int64_t> max_tokens;
};

// The fields chat and completions share: sampling, stops, n, streaming, extensions.
CommonFields parse_common(const Fields& f, const ModelInfo& model, GenerationTask& task) {
  SamplingOptions& s = task.sampling;
  s.temperature = static_cast<float>(f.number("temperature", 0, 2).value_or(1.0));
  s.top_p = static_cast<float>(f.number("top_p", 0, 1).value_or(1.0));
  s.top_k = static_cast<int32_t>(f.integer("top_k", -1, std::numeric_limits<int32_t>::max()).value_or(0));
  s.min_p = static_cast<float>(f.number("min_p", 0, 1).value_or(0.0));
  s.presence_penalty = static_cast<float>(f.number("presence_penalty", -2, 2).value_or(0.0));
  s.frequency_penalty = static_cast<float>(f.number("frequency_penalty", -2, 2).value_or(0.0));
  s.repetition_penalty = static_cast<float>(f.number("repetition_penalty", 1e-3, 100).value_or(1.0));
  if (auto seed = f.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()))
    s.seed = static_cast<uint64_t>(*seed);
  if (const Json* bias = f.object("logit_bias")) {
    if (bias->size() > kMaxLogitBias) throw invalid_request(cat("'logit_bias' has more than ", kMaxLogitBias, " entries"), "logit_bias");
    for (const auto& [key, value] : bias->items()) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
      }
      if (used != key.size() || id < 0 || id >= model.n_vocab)
        throw invalid_request(cat("'logit_bias' key '", key, "' is not a token id of this model (0..", model.n_vocab - 1, ")"),
                              "logit_bias", "invalid_token_id");
      if (!value.is_number()) throw wrong_type("logit_bias." + key, "a number", value);
      double b = value.get<double>();
      if (!(b >= -100 && b <= 100)) throw invalid_request("'logit_bias' values must be in [-100, 100]", "logit_bias");
      s.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
    }
  }
  if (const Json* stop = f.get("stop")) {
    if (stop->is_string()) {
      task.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > kMaxStops) throw invalid_request(cat("'stop' may hold at most ", kMaxStops, " strings"), "stop");
      for (const Json& s1 : *stop) {
        if (!s1.is_string()) throw wrong_type("stop", "a string or an array of strings", *stop);
        task.stop.push_back(s1.get<std::string>());
      }
    } else {
      throw wrong_type("stop", "a string or an array of strings", *stop);
    }
    for (const std::string& s1 : task.stop)
      if (s1.size() > kMaxStopBytes) throw invalid_request(cat("a stop string is longer than ", kMaxStopBytes, " bytes"), "stop");
  }
  task.n_choices = static_cast<int>(f.integer("n", 1, model.max_choices).value_or(1));
  task.ignore_eos = f.boolean("ignore_eos").value_or(false);
  task.use_cache = f.boolean("cache_prompt").value_or(true);

  CommonFields c;
  c.stream = f.boolean("stream").value_or(false);
  if (const Json* so = f.object("stream_options")) {
    if (!c.stream) throw invalid_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
    c.include_usage = Fields(*so, "stream_options.").boolean("include_usage").value_or(false);
  }
  c.max_tokens = f.integer("max_tokens", 1, std::numeric_limits<int64_t>::max());
  if (auto mct = f.integer("max_completion_tokens", 1, std::numeric_limits<int64_t>::max())) c.max_tokens = mct;
  if (const Json* rf = f.object("response_format")) {
    auto type = Fields(*rf, "response_format.").string("type");
    if (!type)
      throw invalid_request("Missing required parameter: 'response_format.type'.", "response_format.type",
                            "missing_required_parameter");
    if (*type == "json_object") {
      task.json_object = true;
    } else if (*type == "json_schema") {
      const Json* spec = Fields(*rf, "response_format.").object("json_schema");
      if (!spec)
        throw invalid_request("Missing required parameter: 'response_format.json_schema'.", "response_format.json_schema",
                              "missing_required_parameter");
      const Json* schema = Fields(*spec, "response_format.json_schema.").get("schema");
      try {
        task.json_schema = JsonGrammar::compile(schema ? *schema : Json::object());
      } catch (const Error& e) {
        throw invalid_request(cat("response_format.json_schema.schema: ", e.what()), "response_format.json_schema.schema");
      }
    } else if (*type != "text") {
      throw invalid_request("response_format '" + *type + "' is not supported (text, json_object and json_schema are)",
                            "response_format");
    }
    if (task.json_object || task.json_schema) {
      if (!model.json_vocabulary) fail("JSON mode: the server has no vocabulary tries");
      task.json_vocabulary = model.json_vocabulary->get();
    }
  }
  return c;
}

// Puts the prompt and max_tokens against the context: 400 when they do not fit.
void fit_context(GenerationTask& task, std::optional<int64_t> max_tokens, const ModelInfo& model, const char* what) {
  const int64_t n = static_cast<int64_t>(task.prompt.size());
  if (n == 0) throw invalid_request(cat("the ", what, " is empty (no tokens)"), what);
  if (n >= model.n_ctx)
    throw invalid_request(cat("This model's maximum context length is ", model.n_ctx, " tokens. However, your ", what,
                              " resulted in ", n, " tokens."),
                          what, "context_length_exceeded");
  const int64_t room = model.n_ctx - n;
  if (max_tokens && *max_tokens > room)
    throw invalid_request(cat("max_tokens is too large: ", *max_tokens, ". The ", what, " has ", n,
                              " tokens and the context ", model.n_ctx, ", so at most ", room, " tokens can be generated."),
                          "max_tokens", "context_length_exceeded");
  task.max_tokens = max_tokens.value_or(room);
}

std::string text_of_content(const Json& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw wrong_type(param, "a string or an array of content parts", content);
  std::string text;
  for (const Json& part : content) {
    if (!part.is_object()) throw wrong_type(param + "[]", "an object", part);
    Fields pf(part, param + "[].");
    std::string type = pf.string("type").value_or("");
    if (type != "text") throw invalid_request(cat("content part type '", type, "' is not supported (text only)"), param);
    auto t = pf.string("text");
    if (!t) throw invalid_request("a text content part has no 'text'", param);
    if (!text.empty()) text += "\n";
    text += *t;
  }
  return text;
}

// OpenAI messages -> the template's messages: text content, tool-call arguments as objects.
Json template_messages(const Json& messages) {
  Json out = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    std::string at = cat("messages[", i, "]");
    if (!m.is_object()) throw wrong_type(at, "an object", m);
    Fields f(m, at + ".");
    auto role = f.string("role");
    if (!role) throw invalid_request(cat("Missing required parameter: '", at, ".role'."), at + ".role", "missing_required_parameter");
    if (*role == "developer") role = "system";
    if (*role != "system" && *role != "user" && *role != "assistant" && *role != "tool")
      throw invalid_request(cat("Invalid value: '", *role, "'. Supported values are: 'system', 'developer', 'user', 'assistant' and 'tool'."),
                            at + ".role");
    Json r = {{"role", *role}};
    const Json* content = f.get("content");
    const Json* tool_calls = *role == "assistant" ? f.array("tool_calls") : nullptr;
    if (!content && !tool_calls)
      throw invalid_request(cat("Missing required parameter: '", at, ".content'."), at + ".content", "missing_required_parameter");
    r["content"] = content ? text_of_content(*content, at + ".content") : std::string();
    if (auto rc = f.string("reasoning_content")) r["reasoning_content"] = *rc;
    if (auto name = f.string("name")) r["name"] = *name;
    if (auto id = f.string("tool_call_id")) r["tool_call_id"] = *id;
    if (tool_calls) {
      Json calls = Json::array();
      for (const Json& c : *tool_calls) {
        if (!c.is_object()) throw wrong_type(at + ".tool_calls[]", "an object", c);
        const Json* fn = Fields(c, at + ".tool_calls[].").object("function");
        if (!fn) throw invalid_request("a tool call has no 'function'", at + ".tool_calls");
        Fields ff(*fn, at + ".tool_calls[].function.");
        auto name = ff.string("name");
        if (!name) throw invalid_request("a tool call has no function name", at + ".tool_calls");
        Json args = Json::object();
        if (auto a = ff.string("arguments")) {
          args = Json::parse(*a, nullptr, false);
          if (args.is_discarded()) args = *a;  // not JSON: the template gets the text
        }
        Json call = {{"type", "function"}, {"function", {{"name", *name}, {"arguments", args}}}};
        if (auto id = Fields(c).string("id")) call["id"] = *id;
        calls.push_back(std::move(call));
      }
      r["tool_calls"] = std::move(calls);
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<ToolSpec> parse_tools(const Json& tools) {
  std::vector<ToolSpec> out;
  for (size_t i = 0; i < tools.size(); ++i) {
    std::string at = cat("tools[", i, "]");
    if (!tools[i].is_object()) throw wrong_type(at, "an object", tools[i]);
    Fields f(tools[i], at + ".");
    if (f.string("type").value_or("function") != "function") throw invalid_request("only function tools are supported", at + ".type");
    const Json* fn = f.object("function");
    if (!fn) throw invalid_request(cat("Missing required parameter: '", at, ".function'."), at + ".function", "missing_required_parameter");
    Fields ff(*fn, at + ".function.");
    auto name = ff.string("name");
    if (!name || name->empty()) throw invalid_request("a function tool needs a name", at + ".function.name");
    const Json* params = ff.object("parameters");
    out.push_back({*name, params ? *params : Json()});
  }
  return out;
}

}  // namespace

void check_model_name(const Json& body, const ModelInfo& model) {
  auto name = Fields(body).string("model");
  if (name && !name->empty() && *name != model.id)
    throw ApiError(404, cat("The model '", *name, "' does not exist (this server serves '", model.id, "')."), "model",
                   "model_not_found");
}

ChatRequest parse_chat_request(const Json& body, const ModelInfo& model) {
  if (!body.is_object()) throw wrong_type("body", "an object", body);
  check_model_name(body, model);
  if (!model.chat_template) throw invalid_request("the model has no chat template; use /v1/completions", "messages");
  Fields f(body);
  ChatRequest r;
  const Json* messages = f.array("messages");
  if (!messages) throw invalid_request("Missing required parameter: 'messages'.", "messages", "missing_required_parameter");
  if (messages->empty()) throw invalid_request("'messages' must hold at least one message", "messages", "empty_array");
  CommonFields c = parse_common(f, model, r.task);
  r.stream = c.stream;
  r.include_usage = c.include_usage;
  r.logprobs = f.boolean("logprobs").value_or(false);
  if (auto top = f.integer("top_logprobs", 0, kMaxTopLogprobs)) {
    if (!r.logprobs) throw invalid_request("'top_logprobs' needs 'logprobs' set to true", "top_logprobs");
    r.task.top_logprobs = static_cast<int>(*top);
  } else if (r.logprobs) {
    r.task.top_logprobs = 0;
  }

  ChatOptions options;
  if (const Json* kwargs = f.object("chat_template_kwargs"))
    for (const auto& [k, v] : kwargs->items()) options.extra[k] = v;
  if (auto effort = f.string("reasoning_effort")) options.extra["reasoning_effort"] = *effort;
  std::vector<ToolSpec> tools;
  if (const Json* t = f.array("tools")) tools = parse_tools(*t);
  std::string choice = "auto", forced_name;
  if (const Json* tc = f.get("tool_choice")) {
    if (tc->is_string()) {
      choice = tc->get<std::string>();
      if (choice != "none" && choice != "auto" && choice != "required")
        throw invalid_request("'tool_choice' must be 'none', 'auto', 'required' or a function", "tool_choice");
    } else if (tc->is_object()) {
      const Json* fn = Fields(*tc, "tool_choice.").object("function");
      auto name = fn ? Fields(*fn, "tool_choice.function.").string("name") : std::nullopt;
      if (!name) throw invalid_request("'tool_choice' names no function", "tool_choice");
      choice = "function", forced_name = *name;
    } else {
      throw wrong_type("tool_choice", "a string or an object", *tc);
    }
  }
  if ((choice == "required" || choice == "function") && tools.empty())
    throw invalid_request("'tool_choice' asks for a tool call but no 'tools' were given", "tool_choice");
  if (choice == "function" &&
      std::none_of(tools.begin(), tools.end(), [&](const ToolSpec& t) { return t.name == forced_name; }))
    throw invalid_request("'tool_choice' names the function '" + forced_name + "', which is not in 'tools'", "tool_choice");
  if (choice != "none" && !tools.empty()) {
    options.tools = Json::array();
    for (const Json& t : *f.array("tools")) options.tools.push_back(t);
    r.tools = tools;
  }

  Json rendered_messages = template_messages(*messages);
  try {
    r.prompt_text = model.chat_template->apply(rendered_messages, options);
  } catch (const Error& e) {
    throw invalid_request(std::string("the chat template rejected the messages: ") + e.what(), "messages");
  }
  r.reasoning_open = ends_in_open_reasoning(r.prompt_text);
  if (r.task.json_object || r.task.json_schema) {
    if (choice == "required" || choice == "function")
      throw invalid_request("a JSON 'response_format' and a forced tool call ('tool_choice') exclude each other",
                            "response_format");
    // The reply is the JSON value alone: a reasoning block the template opened is closed empty,
    // as templates do when thinking is off.
    if (r.reasoning_open) r.prompt_text += "</think>\n\n", r.reasoning_open = false;
  }

  if (choice == "required" || choice == "function") {
    for (const ToolSpec& t : tools) {
      if (choice == "function" && t.name != forced_name) continue;
      std::string opening = model.xml_tool_calls ? "<tool_call>\n<function=" + t.name + ">\n"
                                                 : "<tool_call>\n{\"name\": \"" + t.name + "\", \"arguments\": ";
      r.task.forced_openings.push_back((r.reasoning_open ? "</think>\n\n" : "") + opening);
    }
  }
  r.task.prompt = model.tokenizer->encode(r.prompt_text);
  fit_context(r.task, c.max_tokens, model, "messages");
  return r;
}

CompletionRequest parse_completion_request(const Json& body, const ModelInfo& model) {
  if (!body.is_object()) throw wrong_type("body", "an object", body);
  check_model_name(body, model);
  Fields f(body);
  CompletionRequest r;
  GenerationTask base;
  CommonFields c = parse_common(f, model, base);
  r.stream = c.stream;
  r.include_usage = c.include_usage;
  r.echo = f.boolean("echo").value_or(false);
  r.return_tokens = f.boolean("return_tokens").value_or(false);
  if (auto lp = f.integer("logprobs", 0, kMaxTopLogprobs)) r.logprobs = static_cast<int>(*lp), base.top_logprobs = r.logprobs;
  if (auto best_of = f.integer("best_of", 1, model.max_choices); best_of && *best_of != base.n_choices)
    throw invalid_request("'best_of' other than 'n' is not supported", "best_of");
  if (auto suffix = f.string("suffix"); suffix && !suffix->empty())
    throw invalid_request("'suffix' (fill-in-the-middle) is not supported", "suffix");

  const Json* prompt = f.get("prompt");
  if (!prompt) throw invalid_request("Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter");
  auto tokens_of = [&](const Json& ids, const std::string& at) {
    std::vector<int32_t> out;
    for (size_t i = 0; i < ids.size(); ++i) {
      const Json& v = ids[i];
      if (!v.is_number_integer() && !v.is_number_unsigned()) throw wrong_type(cat(at, "[", i, "]"), "a token id (integer)", v);
      int64_t id = v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX ? INT64_MAX : v.get<int64_t>();
      if (id < 0 || id >= model.n_vocab)
        throw invalid_request(cat("token id ", v.dump(), " at ", at, "[", i, "] is not in this model's vocabulary (0..",
                                  model.n_vocab - 1, ")"),
                              "prompt", "invalid_token_id");
      out.push_back(static_cast<int32_t>(id));
    }
    return out;
  };
  std::vector<std::vector<int32_t>> prompts;
  if (prompt->is_string()) {
    r.prompt_texts.push_back(prompt->get<std::string>());
  } else if (prompt->is_array()) {
    if (prompt->empty()) throw invalid_request("'prompt' is an empty array", "prompt", "empty_array");
    const Json& first = prompt->front();
    if (first.is_number()) {
      prompts.push_back(tokens_of(*prompt, "prompt"));
    } else {
      for (size_t i = 0; i < prompt->size(); ++i) {
        const Json& p = (*prompt)[i];
        if (p.is_string() && first.is_string()) r.prompt_texts.push_back(p.get<std::string>());
        else if (p.is_array() && first.is_array()) prompts.push_back(tokens_of(p, cat("prompt[", i, "]")));
        else throw wrong_type(cat("prompt[", i, "]"), first.is_string() ? "a string" : "an array of token ids", p);
      }
    }
  } else {
    throw wrong_type("prompt", "a string, an array of strings, or token ids", *prompt);
  }
  for (const std::string& text : r.prompt_texts) prompts.push_back(model.tokenizer->encode(text));
  if (r.prompt_texts.empty())
    for (const auto& p : prompts) r.prompt_texts.push_back(model.tokenizer->decode(p, /*skip_special=*/false));
  if (static_cast<int64_t>(prompts.size()) * base.n_choices > model.max_choices)
    throw invalid_request(cat("prompts times 'n' must be at most ", model.max_choices), "n");
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationTask t = base;
    t.prompt = std::move(prompts[i]);
    t.first_choice = static_cast<int>(i) * base.n_choices;
    fit_context(t, c.max_tokens, model, "prompt");
    r.tasks.push_back(std::move(t));
  }
  return r;
}

}  // namespace regolith::server
