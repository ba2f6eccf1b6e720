// A parsed Jinja template and its renderer, with the settings transformers' apply_chat_template
// uses: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with loop controls,
// transformers' `tojson` (json.dumps with ensure_ascii=False), raise_exception and
// strftime_now. Output is meant to be byte-identical to Jinja2's.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja/value.h"

namespace regolith::jinja {

struct Stmt;

class Template {
 public:
  // Throws Error("chat template line N: ...") on a syntax error or an unsupported tag.
  static Template parse(std::string_view source);

  // The context's top-level keys become template variables. Use ordered_json so dicts keep
  // the key order Python would (tojson output depends on it).
  std::string render(const nlohmann::ordered_json& context) const;
  std::string render(const std::vector<std::pair<std::string, Value>>& variables) const;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body_;
};

}  // namespace regolith::jinja
