// Jinja interpreter details that the Jinja2 comparison cannot show: error messages (which
// must name the line and the feature), Python number formatting, and robustness.

#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "tokenizer/jinja/template.h"
#include "tokenizer/jinja/value.h"

namespace regolith::jinja {
namespace {

std::string render(const std::string& source, const nlohmann::ordered_json& context = nlohmann::ordered_json::object()) {
  return Template::parse(source).render(context);
}

std::string error_of(const std::string& source) {
  try {
    render(source);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Jinja, PythonFloatRepr) {
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1234567890123456.0), "1234567890123456.0");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(0.00001), "1e-05");
  EXPECT_EQ(python_float_repr(-2.5e-300), "-2.5e-300");
  EXPECT_EQ(python_float_repr(-0.0), "-0.0");
  EXPECT_EQ(python_float_repr(1.0 / 3), "0.3333333333333333");
}

TEST(Jinja, ErrorsNameTheLineAndTheFeature) {
  EXPECT_NE(error_of("a\nb\n{% include 'x' %}").find("line 3: the 'include' tag is not supported"), std::string::npos);
  EXPECT_NE(error_of("{% frobnicate %}").find("unknown tag 'frobnicate'"), std::string::npos);
  EXPECT_NE(error_of("{{ x | frobnicate }}").find("filter 'frobnicate' is not supported"), std::string::npos);
  EXPECT_NE(error_of("{{ x is frobnicate }}").find("test 'frobnicate' is not supported"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a'.format(1) }}").find("str method 'format' is not supported"), std::string::npos);
  EXPECT_NE(error_of("\n\n{{ missing.attr }}").find("line 3: 'missing' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{% set l = [] %}{{ l.append(1) }}").find("unsafe"), std::string::npos);
  EXPECT_NE(error_of("{{ raise_exception('boom') }}").find("boom"), std::string::npos);
  EXPECT_NE(error_of("{% for x in y %}").find("expected '{% endfor %}'"), std::string::npos);
  EXPECT_NE(error_of("{{ 'unterminated }}").find("unterminated string"), std::string::npos);
  EXPECT_NE(error_of("{% for x in [1] recursive %}{% endfor %}").find("recursive"), std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("integer overflow"), std::string::npos);
}

TEST(Jinja, NamespaceOnlyAssignment) {
  EXPECT_NE(error_of("{% set d = {} %}{% set d.x = 1 %}").find("non-namespace"), std::string::npos);
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% set ns.a = ns.a + 1 %}{{ ns.a }}"), "2");
}

TEST(Jinja, ContextKeepsKeyOrderForTojson) {
  auto context = nlohmann::ordered_json::parse(R"({"tool": {"z": 1, "a": {"y": [1, 2.0], "b": null}}})");
  EXPECT_EQ(render("{{ tool | tojson }}", context), R"({"z": 1, "a": {"y": [1, 2.0], "b": null}})");
}

TEST(Jinja, RandomTemplatesNeverCrash) {
  // Fragments glued at random: every result must be a render or a regolith::Error.
  const char* pieces[] = {"{{", "}}", "{%", "%}", "{#", "#}", "-", "+", " if ", " for ", " x ", " in ", "[", "]", "(",
                          ")", "'s'", "1", "|", "length", " endif ", " endfor ", "\n", "set", "=", ".", "loop", ":"};
  std::mt19937 rng(7);
  for (int i = 0; i < 3000; ++i) {
    std::string source;
    int n = 1 + rng() % 12;
    for (int k = 0; k < n; ++k) source += pieces[rng() % (sizeof pieces / sizeof *pieces)];
    try {
      render(source, nlohmann::ordered_json::parse(R"({"x": [1, 2], "s": "t"})"));
    } catch (const Error&) {
    }
  }
  SUCCEED();
}

}  // namespace
}  // namespace regolith::jinja
