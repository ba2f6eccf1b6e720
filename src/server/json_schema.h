// Structured outputs (`response_format: {"type": "json_schema", ...}`): a JSON Schema compiled to
// a grammar over bytes, and the state of a reply read through it. The grammar is a set of rules,
// each a list of alternative sequences of elements (a byte set, a rule, or a whole JSON string
// body read by JsonStringReader); a state is the set of stacks of positions still alive, as in a
// pushdown automaton read breadth first, so alternatives (anyOf, optional properties) need no
// look-ahead.
//
// Supported: type (one or a list), properties (in the schema's order; names not in required may
// be left out), required, additionalProperties (false, true or a schema), items, minItems and
// maxItems (up to 64), enum, const, anyOf and oneOf (as anyOf; up to 32 alternatives), $ref to
// #, #/$defs/… and #/definitions/…, and the empty schema (any value). Annotations (title, description, default,
// examples, $schema, $id, $comment) are ignored. Any other keyword is refused with its name, not
// ignored: a reply the schema's author did not mean is worse than an error.
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/json_constraint.h"

namespace regolith::server {

class JsonGrammar {
 public:
  // Throws regolith::Error naming what is not supported or malformed.
  static std::shared_ptr<const JsonGrammar> compile(const nlohmann::ordered_json& schema);

  struct Element {
    enum class Kind : uint8_t { bytes, rule, string_body, end } kind = Kind::end;
    uint32_t rule = 0;
    std::bitset<256> bytes;
  };
  using Sequence = std::vector<Element>;  // ends with an `end` element
  const std::vector<std::vector<Sequence>>& rules() const { return rules_; }
  const Element* start() const { return start_.data(); }

 private:
  friend class SchemaCompiler;
  std::vector<std::vector<Sequence>> rules_;
  Sequence start_;  // the root rule, then end
};

class JsonGrammarState {
 public:
  explicit JsonGrammarState(const JsonGrammar& grammar);  // the grammar outlives the state
  // Reads one more byte; false (and the state unchanged) when no text the grammar allows goes on so.
  bool step(uint8_t byte);
  bool complete() const;  // the text so far is a whole value of the schema
  // Every path is inside a free string with nothing pending (JsonStringReader::plain).
  bool in_plain_string() const;

 private:
  struct Entry {
    const JsonGrammar::Element* at;
    JsonStringReader string;  // progress through a string body at the top
    bool operator==(const Entry&) const = default;
  };
  using Stack = std::vector<Entry>;
  static void advance(Stack& s);
  void expand(Stack s, std::vector<Stack>& out, int depth = 0) const;
  void add(Stack s, std::vector<Stack>& out) const;

  const JsonGrammar* grammar_;
  std::vector<Stack> stacks_;  // each top is a byte set or a string body; an empty stack: complete
};

// A reply's JSON mode: off, one JSON object (json_object) or a value of a schema (json_schema).
class JsonReplyConstraint {
 public:
  JsonReplyConstraint() = default;  // off
  // schema null: any JSON object. Both must outlive the constraint.
  JsonReplyConstraint(const JsonVocabulary& vocabulary, const JsonGrammar* schema);
  bool active() const { return !std::holds_alternative<std::monostate>(constraint_); }
  void mask(std::span<float> logits) const;
  void accept(int32_t token, std::string_view bytes);

 private:
  std::variant<std::monostate, JsonConstraint, TokenConstraint<JsonGrammarState>> constraint_;
};

}  // namespace regolith::server
