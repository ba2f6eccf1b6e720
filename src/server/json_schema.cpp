#include "server/json_schema.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <type_traits>

#include "core/error.h"

namespace regolith::server {
namespace {

using Json = nlohmann::ordered_json;
using Element = JsonGrammar::Element;
using Kind = Element::Kind;

// Paths deeper than kMaxStack are dropped (a schema that recurses through $ref), and so are paths
// beyond kMaxStacks alive at once: every token's mask steps each live path through the vocabulary's
// tries, so the live paths bound the host's time per token (32 object alternatives that start
// alike: a 14 ms mask inside their first string on 150K tokens, against 0.5 ms for one, on a
// 2-core machine). Only nested anyOf lists whose alternatives start alike reach the
// bound (enum values share one path through their trie); what is dropped then is some
// alternatives, never validity: every path left can still end.
constexpr size_t kMaxStack = 256;
constexpr size_t kMaxStacks = 256;
constexpr size_t kMaxAlternatives = 32;  // anyOf, oneOf, type lists
constexpr int kMaxExpansion = 256;
constexpr int kMaxUnrolled = 64;  // minItems / maxItems
constexpr int kMaxIndent = 32;    // whitespace after a newline
constexpr size_t kMaxRules = 20000;  // a request's schema stays cheap to compile and to read

}  // namespace

// ---- the state of a reply ----------------------------------------------------------------------

JsonGrammarState::JsonGrammarState(const JsonGrammar& grammar) : grammar_(&grammar) {
  expand(Stack{{grammar.start(), {}}}, stacks_);
}

// The top element matched: on to the next one of its sequence (a finished sequence is popped).
void JsonGrammarState::advance(Stack& s) {
  const Element* next = s.back().at + 1;
  if (next->kind == Kind::end) s.pop_back();
  else s.back() = {next, {}};
}

void JsonGrammarState::add(Stack s, std::vector<Stack>& out) const {
  if (out.size() < kMaxStacks && std::find(out.begin(), out.end(), s) == out.end()) out.push_back(std::move(s));
}

// Replaces rules at the top by their alternatives until every top reads bytes. `depth` bounds the
// rules entered without reading a byte (a schema that refers to itself before any text).
void JsonGrammarState::expand(Stack s, std::vector<Stack>& out, int depth) const {
  while (!s.empty() && s.back().at->kind == Kind::end) s.pop_back();  // an empty alternative
  if (s.empty() || s.back().at->kind != Kind::rule) return add(std::move(s), out);
  const uint32_t rule = s.back().at->rule;
  advance(s);  // the rule's continuation stays below its alternatives
  if (s.size() >= kMaxStack || depth >= kMaxExpansion) return;
  for (const JsonGrammar::Sequence& alternative : grammar_->rules()[rule]) {
    Stack t = s;
    t.push_back({alternative.data(), {}});
    expand(std::move(t), out, depth + 1);
  }
}

bool JsonGrammarState::step(uint8_t byte) {
  std::vector<Stack> next;
  for (const Stack& s : stacks_) {
    if (s.empty()) continue;
    const Entry& top = s.back();
    if (top.at->kind == Kind::bytes) {
      if (!top.at->bytes.test(byte)) continue;
      Stack t = s;
      advance(t);
      expand(std::move(t), next);
    } else {  // a string body
      JsonStringReader reader = top.string;
      const JsonStringReader::Step r = reader.step(byte);
      if (r == JsonStringReader::Step::refused) continue;
      Stack t = s;
      if (r == JsonStringReader::Step::closed) {
        advance(t);
        expand(std::move(t), next);
      } else {
        t.back().string = reader;
        add(std::move(t), next);
      }
    }
  }
  if (next.empty()) return false;
  stacks_ = std::move(next);
  return true;
}

bool JsonGrammarState::complete() const {
  return std::any_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return s.empty(); });
}

bool JsonGrammarState::in_plain_string() const {
  return !stacks_.empty() && std::all_of(stacks_.begin(), stacks_.end(), [](const Stack& s) {
    return !s.empty() && s.back().at->kind == Kind::string_body && s.back().string.plain();
  });
}

// ---- the compiler ------------------------------------------------------------------------------

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const Json& root) : root_(root) {}

  std::shared_ptr<const JsonGrammar> run() {
    ws_ = whitespace();
    const uint32_t top = value(root_, "#");
    if (!keep_finite_alternatives()[top]) fail("#: the schema allows no value of finite length");
    g_.start_ = {rule_element(top), Element{}};
    return std::make_shared<const JsonGrammar>(std::move(g_));
  }

 private:
  using Sequence = JsonGrammar::Sequence;

  // Drops every alternative that cannot end (a required member whose schema requires itself, a
  // $ref loop), so that any prefix the grammar accepts can be completed; returns which rules can.
  std::vector<bool> keep_finite_alternatives() {
    auto& rules = g_.rules_;
    std::vector<bool> finite(rules.size(), false);
    auto ends = [&](const Sequence& s) {
      return std::all_of(s.begin(), s.end(), [&](const Element& e) { return e.kind != Kind::rule || finite[e.rule]; });
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < rules.size(); ++r)
        if (!finite[r] && std::any_of(rules[r].begin(), rules[r].end(), ends)) finite[r] = changed = true;
    }
    for (auto& alternatives : rules) std::erase_if(alternatives, [&](const Sequence& s) { return !ends(s); });
    return finite;
  }

  static Element byte_set(std::string_view chars) {
    Element e{.kind = Kind::bytes, .rule = 0, .bytes = {}};
    for (char c : chars) e.bytes.set(static_cast<uint8_t>(c));
    return e;
  }
  static Element byte_range(uint8_t lo, uint8_t hi) {
    Element e{.kind = Kind::bytes, .rule = 0, .bytes = {}};
    for (int b = lo; b <= hi; ++b) e.bytes.set(static_cast<size_t>(b));
    return e;
  }
  static Element rule_element(uint32_t rule) { return Element{.kind = Kind::rule, .rule = rule, .bytes = {}}; }
  static void literal(Sequence& s, std::string_view text) {
    for (char c : text) s.push_back(byte_set(std::string_view(&c, 1)));
  }

  uint32_t new_rule() {
    if (g_.rules_.size() >= kMaxRules) fail("the schema is too large (more than ", kMaxRules, " grammar rules)");
    g_.rules_.emplace_back();
    return static_cast<uint32_t>(g_.rules_.size() - 1);
  }
  void alternative(uint32_t rule, Sequence s) {
    s.push_back(Element{});
    g_.rules_[rule].push_back(std::move(s));
  }
  uint32_t rule_of(std::vector<Sequence> alternatives) {
    const uint32_t r = new_rule();
    for (Sequence& s : alternatives) alternative(r, std::move(s));
    return r;
  }

  // Nothing, a space, or a newline and up to kMaxIndent spaces or tabs: room for the usual
  // layouts, none for a reply that pads itself without end.
  uint32_t whitespace() {
    uint32_t indent = rule_of({{}});
    for (int i = 0; i < kMaxIndent; ++i) indent = rule_of({{}, {byte_set(" \t"), rule_element(indent)}});
    return rule_of({{}, {byte_set(" ")}, {byte_set("\n"), rule_element(indent)}});
  }
  Element ws() const { return rule_element(ws_); }

  uint32_t string_rule() {
    if (!string_) string_ = rule_of({{byte_set("\""), Element{.kind = Kind::string_body, .rule = 0, .bytes = {}}}});
    return *string_;
  }
  // Zero or more digits.
  uint32_t digits() {
    if (!digits_) {
      digits_ = new_rule();
      alternative(*digits_, {});
      alternative(*digits_, {byte_range('0', '9'), rule_element(*digits_)});
    }
    return *digits_;
  }
  uint32_t number_rule(bool integer) {
    std::optional<uint32_t>& cached = integer ? integer_ : number_;
    if (cached) return *cached;
    const uint32_t sign = rule_of({{}, {byte_set("-")}});
    const uint32_t whole = rule_of({{byte_set("0")}, {byte_range('1', '9'), rule_element(digits())}});
    Sequence s{rule_element(sign), rule_element(whole)};
    if (!integer) {
      const uint32_t fraction = rule_of({{}, {byte_set("."), byte_range('0', '9'), rule_element(digits())}});
      const uint32_t exponent =
          rule_of({{}, {byte_set("eE"), rule_element(rule_of({{}, {byte_set("+-")}})), byte_range('0', '9'), rule_element(digits())}});
      s.push_back(rule_element(fraction));
      s.push_back(rule_element(exponent));
    }
    cached = rule_of({s});
    return *cached;
  }

  // Any JSON value (the empty schema).
  uint32_t any_value() {
    if (any_) return *any_;
    any_ = new_rule();
    const uint32_t object = generic_object(*any_);
    const uint32_t array = array_of(*any_, 0, -1);
    for (uint32_t r : {object, array, string_rule(), number_rule(false)}) alternative(*any_, {rule_element(r)});
    for (std::string_view word : {"true", "false", "null"}) {
      Sequence s;
      literal(s, word);
      alternative(*any_, std::move(s));
    }
    return *any_;
  }

  // "{" members "}" where every member's value is `value_rule`, keys any strings.
  uint32_t generic_object(uint32_t value_rule) {
    const uint32_t member = rule_of({{rule_element(string_rule()), ws(), byte_set(":"), ws(), rule_element(value_rule), ws()}});
    const uint32_t more = new_rule();
    alternative(more, {});
    alternative(more, {byte_set(","), ws(), rule_element(member), rule_element(more)});
    return rule_of({{byte_set("{"), ws(), byte_set("}")},
                    {byte_set("{"), ws(), rule_element(member), rule_element(more), byte_set("}")}});
  }

  // "[" items "]" with at least min_items and at most max_items (-1: no limit).
  uint32_t array_of(uint32_t item, int min_items, int max_items) {
    const Sequence one{rule_element(item), ws()};
    const Sequence next{byte_set(","), ws(), rule_element(item), ws()};
    // tail(k): items after the first k, so that the count ends between the bounds.
    uint32_t tail;
    if (max_items < 0) {
      tail = new_rule();
      alternative(tail, {});
      Sequence s = next;
      s.push_back(rule_element(tail));
      alternative(tail, std::move(s));
      for (int k = std::max(min_items, 1) - 1; k >= 1; --k) {  // the last items before the minimum
        Sequence s2 = next;
        s2.push_back(rule_element(tail));
        tail = rule_of({s2});
      }
    } else {
      tail = rule_of({{}});
      for (int k = max_items - 1; k >= 1; --k) {
        Sequence s = next;
        s.push_back(rule_element(tail));
        tail = k >= min_items ? rule_of({{}, s}) : rule_of({s});
      }
    }
    std::vector<Sequence> alternatives;
    if (min_items == 0) alternatives.push_back({byte_set("["), ws(), byte_set("]")});
    if (max_items != 0) {
      Sequence s{byte_set("["), ws()};
      s.insert(s.end(), one.begin(), one.end());
      s.push_back(rule_element(tail));
      s.push_back(byte_set("]"));
      alternatives.push_back(std::move(s));
    }
    return rule_of(std::move(alternatives));
  }

  // The object of `properties` in their order (the required ones always), then members of
  // `extra` (a value rule) when additional properties are allowed.
  uint32_t object_of(const Json& schema, const std::string& path) {
    const Json& properties = schema.at("properties");
    if (!properties.is_object()) fail(path, ".properties: not an object");
    std::set<std::string> required;
    if (const auto it = schema.find("required"); it != schema.end()) {
      if (!it->is_array()) fail(path, ".required: not an array");
      for (const Json& name : *it) {
        if (!name.is_string() || !properties.contains(name.get<std::string>()))
          fail(path, ".required: ", name.dump(), " is not one of the properties");
        required.insert(name.get<std::string>());
      }
    }
    std::optional<uint32_t> extra = additional(schema, path);
    const size_t n = properties.size();
    std::vector<uint32_t> members;
    std::vector<bool> needed;
    for (const auto& [name, sub] : properties.items()) {
      Sequence s;
      literal(s, Json(name).dump());
      s.insert(s.end(), {ws(), byte_set(":"), ws(), rule_element(value(sub, path + ".properties." + name)), ws()});
      members.push_back(rule_of({s}));
      needed.push_back(required.contains(name));
    }
    // first[i]: members from i on, none written yet; rest[i]: members from i on after a comma.
    uint32_t first_end, rest_end;
    if (extra) {
      const uint32_t member = rule_of({{rule_element(string_rule()), ws(), byte_set(":"), ws(), rule_element(*extra), ws()}});
      rest_end = new_rule();
      alternative(rest_end, {});
      alternative(rest_end, {byte_set(","), ws(), rule_element(member), rule_element(rest_end)});
      first_end = rule_of({{}, {rule_element(member), rule_element(rest_end)}});
    } else {
      first_end = rest_end = rule_of({{}});
    }
    uint32_t first = first_end, rest = rest_end;
    for (size_t i = n; i-- > 0;) {
      std::vector<Sequence> f{{rule_element(members[i]), rule_element(rest)}};
      std::vector<Sequence> r{{byte_set(","), ws(), rule_element(members[i]), rule_element(rest)}};
      if (!needed[i]) f.push_back({rule_element(first)}), r.push_back({rule_element(rest)});
      first = rule_of(std::move(f));
      rest = rule_of(std::move(r));
    }
    return rule_of({{byte_set("{"), ws(), rule_element(first), byte_set("}")}});
  }

  // additionalProperties: false / absent with properties: none; true, absent without
  // properties or a schema: members of that schema.
  std::optional<uint32_t> additional(const Json& schema, const std::string& path) {
    const auto it = schema.find("additionalProperties");
    if (it == schema.end()) return schema.contains("properties") ? std::nullopt : std::optional(any_value());
    if (it->is_boolean()) return it->get<bool>() ? std::optional(any_value()) : std::nullopt;
    return value(*it, path + ".additionalProperties");
  }

  uint32_t typed(const Json& schema, const std::string& type, const std::string& path) {
    if (type == "string") return string_rule();
    if (type == "integer") return number_rule(true);
    if (type == "number") return number_rule(false);
    if (type == "boolean" || type == "null") {
      std::vector<Sequence> words;
      for (std::string_view w : type == "null" ? std::vector<std::string_view>{"null"} : std::vector<std::string_view>{"true", "false"}) {
        Sequence s;
        literal(s, w);
        words.push_back(std::move(s));
      }
      return rule_of(std::move(words));
    }
    if (type == "object") {
      if (schema.contains("properties")) return object_of(schema, path);
      const std::optional<uint32_t> extra = additional(schema, path);
      return extra ? generic_object(*extra) : rule_of({{byte_set("{"), ws(), byte_set("}")}});
    }
    if (type == "array") {
      const auto it = schema.find("items");
      const uint32_t item = it == schema.end() ? any_value() : value(*it, path + ".items");
      const int lo = bound(schema, "minItems", 0, path), hi = bound(schema, "maxItems", -1, path);
      if (hi >= 0 && hi < lo) fail(path, ": maxItems is below minItems");
      return array_of(item, lo, hi);
    }
    fail(path, ".type: unknown type '", type, "'");
  }

  static int bound(const Json& schema, const char* key, int absent, const std::string& path) {
    const auto it = schema.find(key);
    if (it == schema.end()) return absent;
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > kMaxUnrolled)
      fail(path, ".", key, ": an integer from 0 to ", kMaxUnrolled, " is supported");
    return static_cast<int>(it->get<int64_t>());
  }

  uint32_t reference(const std::string& ref, const std::string& path) {
    if (const auto it = refs_.find(ref); it != refs_.end()) return it->second;
    const Json* target = nullptr;
    if (ref == "#") {
      target = &root_;
    } else {
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        if (!ref.starts_with(prefix)) continue;
        const std::string section = std::string(prefix).substr(2, std::string(prefix).size() - 3);
        const std::string name = ref.substr(std::string(prefix).size());
        if (root_.contains(section) && root_[section].contains(name)) target = &root_[section][name];
      }
    }
    if (!target) fail(path, ".$ref: '", ref, "' is not # or a name under #/$defs or #/definitions");
    const uint32_t r = new_rule();  // before the body: a schema may refer to itself
    refs_[ref] = r;
    alternative(r, {rule_element(value(*target, ref))});
    return r;
  }

  uint32_t value(const Json& schema, const std::string& path) {
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) fail(path, ": the schema false allows no value");
      return any_value();
    }
    if (!schema.is_object()) fail(path, ": a schema is an object");
    static const std::set<std::string> annotations = {"title", "description", "default", "examples", "$schema",
                                                      "$id", "$comment", "$defs", "definitions", "deprecated",
                                                      "readOnly", "writeOnly"};
    static const std::set<std::string> supported = {"type", "properties", "required", "additionalProperties", "items",
                                                    "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "$ref"};
    for (const auto& [key, v] : schema.items())
      if (!annotations.contains(key) && !supported.contains(key))
        fail(path, ": the keyword '", key, "' is not supported");
    if (const auto it = schema.find("$ref"); it != schema.end()) {
      if (!it->is_string()) fail(path, ".$ref: not a string");
      return reference(it->get<std::string>(), path);
    }
    if (const auto it = schema.find("const"); it != schema.end()) return literal_values(schema, Json::array({*it}), path);
    if (const auto it = schema.find("enum"); it != schema.end()) {
      if (!it->is_array() || it->empty()) fail(path, ".enum: not a non-empty array");
      return literal_values(schema, *it, path);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      const auto it = schema.find(key);
      if (it == schema.end()) continue;
      if (!it->is_array() || it->empty()) fail(path, ".", key, ": not a non-empty array");
      if (it->size() > kMaxAlternatives) fail(path, ".", key, ": more than ", kMaxAlternatives, " alternatives");
      std::vector<Sequence> alternatives;
      for (size_t i = 0; i < it->size(); ++i)
        alternatives.push_back({rule_element(value((*it)[i], path + "." + key + "[" + std::to_string(i) + "]"))});
      return rule_of(std::move(alternatives));
    }
    const auto type = schema.find("type");
    if (type == schema.end()) {
      if (schema.contains("properties")) return object_of(schema, path);
      if (schema.contains("items")) return typed(schema, "array", path);
      return any_value();
    }
    if (type->is_string()) return typed(schema, type->get<std::string>(), path);
    if (!type->is_array() || type->empty()) fail(path, ".type: a type name or a non-empty array of them");
    std::vector<Sequence> alternatives;
    for (const Json& t : *type) {
      if (!t.is_string()) fail(path, ".type: ", t.dump(), " is not a type name");
      alternatives.push_back({rule_element(typed(schema, t.get<std::string>(), path))});
    }
    return rule_of(std::move(alternatives));
  }

  // The values (of the schema's type, when it names one) written compactly, as JSON text, as a
  // trie of rules: one path is alive however many values share a prefix.
  uint32_t literal_values(const Json& schema, const Json& values, const std::string& path) {
    std::vector<std::string> texts;
    for (const Json& v : values)
      if (has_type(schema, v)) texts.push_back(v.dump());
    if (texts.empty()) fail(path, ": no value of enum / const has the schema's type");
    std::sort(texts.begin(), texts.end());
    texts.erase(std::unique(texts.begin(), texts.end()), texts.end());
    return text_trie(texts, 0, texts.size(), 0);
  }

  // The rule for texts[begin, end) (sorted, sharing their first `at` bytes) from byte `at` on.
  uint32_t text_trie(const std::vector<std::string>& texts, size_t begin, size_t end, size_t at) {
    std::vector<Sequence> alternatives;
    size_t i = begin;
    if (texts[i].size() == at) alternatives.push_back({}), ++i;  // one value ends here (sorted first)
    while (i < end) {
      size_t j = i + 1;
      while (j < end && texts[j][at] == texts[i][at]) ++j;
      alternatives.push_back({byte_set(std::string_view(&texts[i][at], 1)), rule_element(text_trie(texts, i, j, at + 1))});
      i = j;
    }
    return rule_of(std::move(alternatives));
  }

  static bool has_type(const Json& schema, const Json& v) {
    const auto type = schema.find("type");
    if (type == schema.end()) return true;
    auto is = [&](const Json& t) {
      const std::string name = t.is_string() ? t.get<std::string>() : "";
      return (name == "string" && v.is_string()) || (name == "integer" && v.is_number_integer()) ||
             (name == "number" && v.is_number()) || (name == "boolean" && v.is_boolean()) ||
             (name == "null" && v.is_null()) || (name == "object" && v.is_object()) || (name == "array" && v.is_array());
    };
    return type->is_array() ? std::any_of(type->begin(), type->end(), is) : is(*type);
  }

  const Json& root_;
  JsonGrammar g_;
  uint32_t ws_ = 0;
  std::optional<uint32_t> string_, digits_, integer_, number_, any_;
  std::map<std::string, uint32_t> refs_;
};

std::shared_ptr<const JsonGrammar> JsonGrammar::compile(const nlohmann::ordered_json& schema) {
  return SchemaCompiler(schema).run();
}

JsonReplyConstraint::JsonReplyConstraint(const JsonVocabulary& vocabulary, const JsonGrammar* schema) {
  if (schema) constraint_.emplace<TokenConstraint<JsonGrammarState>>(vocabulary, JsonGrammarState(*schema));
  else constraint_.emplace<JsonConstraint>(vocabulary, JsonRecognizer());
}

void JsonReplyConstraint::mask(std::span<float> logits) const {
  std::visit([&](const auto& c) {
    if constexpr (!std::is_same_v<std::decay_t<decltype(c)>, std::monostate>) c.mask(logits);
  }, constraint_);
}

void JsonReplyConstraint::accept(int32_t token, std::string_view bytes) {
  std::visit([&](auto& c) {
    if constexpr (!std::is_same_v<std::decay_t<decltype(c)>, std::monostate>) c.accept(token, bytes);
  }, constraint_);
}

}  // namespace regolith::server
