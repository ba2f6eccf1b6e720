// Fuzzing of what the server builds from untrusted text: random schemas (supported keywords mixed
// with unsupported ones, wrong types, references that lead nowhere or to themselves) must compile
// or give regolith::Error, and random bytes read through the grammars and the JSON object
// recognizer must never crash (this suite also runs under AddressSanitizer and UBSan in CI).
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "core/error.h"
#include "server/json_constraint.h"
#include "server/json_schema.h"

using namespace regolith;
using namespace regolith::server;
using Json = nlohmann::ordered_json;

namespace {

Json random_value(std::mt19937& rng, int depth);

Json random_schema(std::mt19937& rng, int depth) {
  static const char* kTypes[] = {"string", "integer", "number", "boolean", "null", "object", "array", "widget"};
  static const char* kKeys[] = {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
                                "enum", "const", "anyOf", "oneOf", "$ref", "title", "$defs", "pattern"};
  if (rng() % 10 == 0) return rng() % 2 == 0;  // true / false
  Json s = Json::object();
  const int n = static_cast<int>(rng() % 4);
  for (int i = 0; i < n; ++i) {
    const std::string key = kKeys[rng() % std::size(kKeys)];
    if (key == "type") s[key] = rng() % 4 ? Json(kTypes[rng() % std::size(kTypes)]) : Json::array({kTypes[rng() % 7], "null"});
    else if (key == "properties" || key == "$defs") {
      Json p = Json::object();
      for (int k = 0; k < static_cast<int>(rng() % 4); ++k) p[std::string(1, static_cast<char>('a' + rng() % 4))] = depth > 0 ? random_schema(rng, depth - 1) : Json::object();
      s[key] = p;
    } else if (key == "required") s[key] = Json::array({std::string(1, static_cast<char>('a' + rng() % 5))});
    else if (key == "additionalProperties" || key == "items") s[key] = depth > 0 ? random_schema(rng, depth - 1) : Json(rng() % 2 == 0);
    else if (key == "minItems" || key == "maxItems") s[key] = static_cast<int>(rng() % 70) - 3;
    else if (key == "enum") s[key] = Json::array({random_value(rng, 2), random_value(rng, 2)});
    else if (key == "const") s[key] = random_value(rng, 2);
    else if (key == "anyOf" || key == "oneOf") {
      Json a = Json::array();
      for (int k = 0; k < static_cast<int>(rng() % 3); ++k) a.push_back(depth > 0 ? random_schema(rng, depth - 1) : Json::object());
      s[key] = a;
    } else if (key == "$ref") {
      static const char* kRefs[] = {"#", "#/$defs/a", "#/$defs/b", "#/definitions/a", "#/nowhere", "a"};
      s[key] = kRefs[rng() % std::size(kRefs)];
    } else s[key] = random_value(rng, 1);
  }
  return s;
}

Json random_value(std::mt19937& rng, int depth) {
  switch (rng() % 6) {
    case 0: return static_cast<int>(rng() % 100) - 50;
    case 1: return std::string(1, static_cast<char>('s' + rng() % 4));
    case 2: return rng() % 2 == 0;
    case 3: return nullptr;
    case 4: return depth > 0 ? Json::array({random_value(rng, depth - 1)}) : Json(1.5);
    default: return depth > 0 ? Json{{"k", random_value(rng, depth - 1)}} : Json::object();
  }
}

// Random bytes, mostly JSON's own, through a reader: it may refuse any of them, never crash.
template <class State>
void read_random_bytes(State state, std::mt19937& rng) {
  static const std::string alphabet = "{}[],:\"\\ \n0123456789-+.eEtrufalsens\x01\xc3\xa9\xed\xa0\xf4";
  for (int i = 0; i < 300; ++i) {
    const char c = rng() % 8 ? alphabet[rng() % alphabet.size()] : static_cast<char>(rng());
    state.step(static_cast<uint8_t>(c));
    state.complete();
    state.in_plain_string();
  }
}

}  // namespace

TEST(JsonFuzz, RandomSchemasCompileOrRefuseAndTheirGrammarsReadAnyBytes) {
  std::mt19937 rng(2024);
  int compiled = 0;
  for (int i = 0; i < 3000; ++i) {
    Json schema = random_schema(rng, 3);
    if (schema.is_object() && rng() % 3 == 0) schema["$defs"] = {{"a", random_schema(rng, 2)}, {"b", {{"$ref", "#/$defs/a"}}}};
    try {
      auto grammar = JsonGrammar::compile(schema);
      ++compiled;
      read_random_bytes(JsonGrammarState(*grammar), rng);
    } catch (const Error&) {
      // a clear refusal
    }
  }
  std::printf("[json fuzz] %d of 3000 random schemas compiled\n", compiled);
  EXPECT_GT(compiled, 300);
}

TEST(JsonFuzz, TheObjectRecognizerReadsAnyBytes) {
  std::mt19937 rng(7);
  for (int i = 0; i < 3000; ++i) read_random_bytes(JsonRecognizer(), rng);
}
