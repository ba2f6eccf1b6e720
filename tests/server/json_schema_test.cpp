// Structured outputs: schemas compile or are refused by name; the grammar accepts exactly the
// documents a small validator of the supported keywords accepts (with properties in the schema's
// order); the token mask equals a brute-force mask, and sampled replies that end are valid.
#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "core/error.h"
#include "server/json_schema.h"
#include "token_mask_check.h"

namespace regolith::server {
namespace {

using Json = nlohmann::ordered_json;

bool reads_prefix(const JsonGrammar& g, std::string_view text) {
  JsonGrammarState s(g);
  return std::all_of(text.begin(), text.end(), [&](char c) { return s.step(static_cast<uint8_t>(c)); });
}

bool reads_whole(const JsonGrammar& g, std::string_view text) {
  JsonGrammarState s(g);
  for (char c : text)
    if (!s.step(static_cast<uint8_t>(c))) return false;
  return s.complete();
}

// The oracle: the supported keywords' meaning, written directly (annotations ignored). With
// properties, members not among them are refused unless additionalProperties allows them.
bool valid(const Json& v, const Json& schema, const Json& root) {
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("$ref")) {
    const std::string ref = schema["$ref"];
    if (ref == "#") return valid(v, root, root);
    const size_t slash = ref.rfind('/');
    return valid(v, root[ref.substr(2, slash - 2)][ref.substr(slash + 1)], root);
  }
  if (schema.contains("const")) return v == schema["const"];
  if (schema.contains("enum"))
    return std::any_of(schema["enum"].begin(), schema["enum"].end(), [&](const Json& e) { return v == e; });
  for (const char* key : {"anyOf", "oneOf"})
    if (schema.contains(key))
      return std::any_of(schema[key].begin(), schema[key].end(), [&](const Json& s) { return valid(v, s, root); });
  if (schema.contains("type")) {
    std::vector<std::string> types;
    if (schema["type"].is_string()) types.push_back(schema["type"]);
    else for (const Json& t : schema["type"]) types.push_back(t);
    auto is = [&](const std::string& t) {
      if (t == "string") return v.is_string();
      if (t == "integer") return v.is_number_integer();
      if (t == "number") return v.is_number();
      if (t == "boolean") return v.is_boolean();
      if (t == "null") return v.is_null();
      if (t == "object") return v.is_object();
      return t == "array" && v.is_array();
    };
    if (std::none_of(types.begin(), types.end(), is)) return false;
  }
  if (v.is_object() && (schema.contains("properties") || schema.contains("additionalProperties") ||
                        schema.value("type", Json()) == "object")) {
    const Json props = schema.value("properties", Json::object());
    for (const Json& name : schema.value("required", Json::array()))
      if (!v.contains(name.get<std::string>())) return false;
    const Json extra = schema.contains("additionalProperties") ? schema["additionalProperties"] : Json(!schema.contains("properties"));
    for (const auto& [k, member] : v.items()) {
      if (props.contains(k) ? !valid(member, props[k], root) : !valid(member, extra, root)) return false;
    }
  }
  if (v.is_array()) {
    if (schema.contains("minItems") && v.size() < schema["minItems"].get<size_t>()) return false;
    if (schema.contains("maxItems") && v.size() > schema["maxItems"].get<size_t>()) return false;
    if (schema.contains("items"))
      for (const Json& item : v)
        if (!valid(item, schema["items"], root)) return false;
  }
  return true;
}

const Json kPerson = Json::parse(R"({
  "type": "object", "title": "a person",
  "properties": {
    "name": {"type": "string", "description": "full name"},
    "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["a", "b", 3, null]}, "maxItems": 3},
    "pet": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/pet"}]}
  },
  "required": ["name", "age"],
  "$defs": {"pet": {"type": "object", "properties": {"kind": {"const": "cat"}, "legs": {"type": "number"}},
                    "required": ["kind"], "additionalProperties": false}}
})");

const Json kTree = Json::parse(R"({
  "$defs": {"node": {"type": "object", "properties": {"v": {"type": ["integer", "null"]},
                                                      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "minItems": 1, "maxItems": 2}},
                     "required": ["v"]}},
  "$ref": "#/$defs/node"
})");

const Json kLoose = Json::parse(R"({"type": "object", "additionalProperties": {"type": "boolean"}})");
const Json kTwoOrThree = Json::parse(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3})");
const Json kTwoOrMore = Json::parse(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2})");

TEST(JsonSchema, AcceptsTheSchemasValuesInOrderAndNothingElse) {
  // ok: the grammar reads the text; value_ok: the value is valid (a value may be valid in a layout
  // the grammar does not write: members out of the schema's order, more than one space).
  struct Case {
    const Json& schema;
    const char* text;
    bool ok, value_ok;
  };
  for (const Case& c : std::initializer_list<Case>{
           {kPerson, R"({"name":"Al","age":3})", true, true},
           {kPerson, "{\n  \"name\": \"Al\",\n  \"age\": -3,\n  \"tags\": [\"a\", 3, null],\n  \"pet\": null\n}", true, true},
           {kPerson, R"({"name":"Al","age":3,"pet":{"kind":"cat","legs":4.5e1}})", true, true},
           {kPerson, R"({"age":3,"name":"Al"})", false, true},
           {kPerson, R"({"name":"Al","age":3}  )", false, true},
           {kPerson, R"({"name":"Al"})", false, false},  // age is required
           {kPerson, R"({"name":"Al","age":3.5})", false, false},
           {kPerson, R"({"name":"Al","age":3,"tags":["a","a","a","a"]})", false, false},
           {kPerson, R"({"name":"Al","age":3,"tags":["c"]})", false, false},
           {kPerson, R"({"name":"Al","age":3,"pet":{"kind":"dog"}})", false, false},
           {kPerson, R"({"name":"Al","age":3,"x":1})", false, false},
           {kTree, R"({"v":1,"kids":[{"v":null},{"v":2,"kids":[{"v":3}]}]})", true, true},
           {kTree, R"({"v":1,"kids":[]})", false, false},
           {kTree, R"({"v":1,"kids":[{"v":1},{"v":2},{"v":3}]})", false, false},
           {kLoose, R"({"a":true,"b":false})", true, true},
           {kLoose, R"({})", true, true},
           {kLoose, R"({"a":1})", false, false},
           {kTwoOrThree, "[1]", false, false},
           {kTwoOrThree, "[1,2]", true, true},
           {kTwoOrThree, "[1, 2, 3]", true, true},
           {kTwoOrThree, "[1,2,3,4]", false, false},
           {kTwoOrMore, "[1]", false, false},
           {kTwoOrMore, "[]", false, false},
           {kTwoOrMore, "[1,2,3,4,5]", true, true},
       }) {
    auto g = JsonGrammar::compile(c.schema);
    EXPECT_EQ(reads_whole(*g, c.text), c.ok) << c.text;
    EXPECT_EQ(valid(Json::parse(c.text), c.schema, c.schema), c.value_ok) << "oracle on " << c.text;
  }
  auto typed_enum = JsonGrammar::compile(Json::parse(R"({"type":"integer","enum":[1,"a",2.5,3]})"));
  for (const char* text : {"1", "3"}) EXPECT_TRUE(reads_whole(*typed_enum, text)) << text;
  for (const char* text : {"\"a\"", "2.5"}) EXPECT_FALSE(reads_whole(*typed_enum, text)) << text;
  Json huge = {{"type", "object"}, {"properties", Json::object()}};
  for (int i = 0; i < 20000; ++i) huge["properties"][std::to_string(i)] = {{"type", "string"}};
  EXPECT_THROW(JsonGrammar::compile(huge), Error);
  Json many = {{"enum", Json::array()}};  // more values than paths a state keeps alive
  for (int i = 0; i < 1500; ++i) many["enum"].push_back(std::to_string(i) + "x");
  auto big_enum = JsonGrammar::compile(many);
  for (const Json& value : many["enum"]) EXPECT_TRUE(reads_whole(*big_enum, value.dump())) << value;
  EXPECT_FALSE(reads_whole(*big_enum, "\"1500x\""));
  EXPECT_FALSE(reads_whole(*big_enum, "\"12\""));
  // A member that may recurse but need not: the alternative that cannot end is dropped, so every
  // prefix read can still be completed.
  auto optional_loop = JsonGrammar::compile(Json::parse(
      R"({"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#"},{"$ref":"#/$defs/never"}]}},
          "required":["v"],"$defs":{"never":{"type":"object","properties":{"x":{"$ref":"#/$defs/never"}},"required":["x"]}}})"));
  EXPECT_TRUE(reads_whole(*optional_loop, R"({"v":1,"next":{"v":2}})"));
  EXPECT_TRUE(reads_prefix(*optional_loop, R"({"v":1,"next":{"v")"));
  EXPECT_FALSE(reads_prefix(*optional_loop, R"({"v":1,"next":{"x")"));
  auto any = JsonGrammar::compile(Json::object());
  for (const char* text : {"1", "\"s\"", "[1,{\"a\":[null]}]", "true"}) EXPECT_TRUE(reads_whole(*any, text)) << text;
}

TEST(JsonSchema, RefusesWhatItCannotEnforceByName) {
  for (const char* schema : {R"({"type":"string","pattern":"a+"})", R"({"type":"string","minLength":2})",
                             R"({"allOf":[{"type":"string"}]})", R"({"type":"integer","maximum":3})",
                             R"({"type":"string","format":"date"})", R"({"$ref":"#/elsewhere"})",
                             R"({"type":"array","maxItems":1000})", R"({"type":"widget"})",
                             R"({"type":"object","properties":{"a":{}},"required":["b"]})", "false",
                             R"({"type":"integer","enum":["a","b"]})",
                             R"({"anyOf":[{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}]})",
                             R"({"type":"object","properties":{"me":{"$ref":"#"}},"required":["me"]})",
                             R"({"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})"}) {
    try {
      JsonGrammar::compile(Json::parse(schema));
      ADD_FAILURE() << "compiled: " << schema;
    } catch (const Error& e) {
      SCOPED_TRACE(e.what());
      EXPECT_FALSE(std::string(e.what()).empty());
    }
  }
  try {
    JsonGrammar::compile(Json::parse(R"({"type":"object","properties":{"a":{"type":"string","pattern":"x"}}})"));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("#.properties.a: the keyword 'pattern'"), std::string::npos) << e.what();
  }
}

// At every step of replies sampled from random logits: the tries' mask equals stepping the state
// through each token's bytes, some token remains, and a reply that ends is a valid value.
TEST(JsonSchema, MaskEqualsTheTokenByTokenCheckAndRepliesAreValid) {
  const Tokenizer& tok = tiny_json_tokenizer();
  JsonVocabulary vocab(tok);
  std::mt19937 rng(5);
  int ended = 0;
  for (const Json* schema : {&kPerson, &kTree, &kLoose, &kTwoOrMore}) {
    auto g = JsonGrammar::compile(*schema);
    ended += sample_masked_replies(tok, vocab, JsonGrammarState(*g), 8, 200, rng, [&](const std::string& text) {
      EXPECT_TRUE(valid(Json::parse(text), *schema, *schema)) << text;
    });
  }
  std::printf("[json schema] %d of 32 sampled replies ended\n", ended);
  EXPECT_GT(ended, 0);
}

}  // namespace
}  // namespace regolith::server
