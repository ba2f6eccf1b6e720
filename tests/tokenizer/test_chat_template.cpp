// Chat templates against Jinja2: every case in tests/data/tokenizer/chat/cases.json (made by
// tools/tokenizer/make_chat_cases.py with transformers' Jinja2 settings) must render byte for
// byte as Jinja2 did, or fail where Jinja2 failed.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_support.h"
#include "tokenizer/chat_template.h"

namespace regolith::test {
namespace {

using ordered_json = nlohmann::ordered_json;

const ordered_json& cases() {
  static const ordered_json j = ordered_json::parse(read_text_file(data_path("chat/cases.json")));
  return j;
}

std::string first_difference(const std::string& got, const std::string& expected) {
  size_t i = 0;
  while (i < got.size() && i < expected.size() && got[i] == expected[i]) ++i;
  size_t from = i > 40 ? i - 40 : 0;
  return cat("at byte ", i, ":\n  got      ", ordered_json(got.substr(from, 100)).dump(), "\n  expected ",
             ordered_json(expected.substr(from, 100)).dump());
}

TEST(ChatTemplate, ConversationsMatchJinja2) {
  const ordered_json& all = cases();
  std::map<std::string, std::string> sources;
  for (const auto& [key, file] : all["templates"].items()) sources[key] = read_text_file(data_path("chat/" + file.get<std::string>()));
  const std::string bos = all["special_tokens"]["bos_token"], eos = all["special_tokens"]["eos_token"];
  std::map<std::string, int> rendered, per_template;  // successful renders expected per template
  int n_errors = 0;
  for (const ordered_json& c : all["cases"]) {
    const std::string name = c["name"], tmpl = c["template"];
    ChatTemplate chat(sources.at(tmpl), bos, eos);
    ChatOptions options;
    options.add_generation_prompt = c["add_generation_prompt"];
    options.tools = c["tools"];
    options.extra = c["extra"];
    if (!c.contains("error")) ++per_template[tmpl];
    if (c.contains("error")) {
      EXPECT_THROW(chat.apply(c["messages"], options), Error) << name << " (Jinja2: " << c["error"] << ")";
      ++n_errors;
      continue;
    }
    try {
      std::string got = chat.apply(c["messages"], options);
      const std::string expected = c["expected"];
      if (got == expected)
        ++rendered[tmpl];
      else
        ADD_FAILURE() << name << ": differs " << first_difference(got, expected);
    } catch (const Error& e) {
      ADD_FAILURE() << name << ": " << e.what();
    }
  }
  for (const auto& [tmpl, n] : per_template) {
    std::printf("[ chat     ] %s: %d/%d conversations byte-identical to Jinja2\n", tmpl.c_str(), rendered[tmpl],
                n);
    EXPECT_GE(rendered[tmpl], 30) << tmpl;
  }
  EXPECT_GT(n_errors, 0);
}

TEST(ChatTemplate, FeatureSnippetsMatchJinja2) {
  int same = 0, total = 0;
  for (const ordered_json& s : cases()["snippets"]) {
    const std::string name = s["name"];
    ++total;
    if (s.contains("error")) {
      EXPECT_THROW(jinja::Template::parse(s["source"].get<std::string>()).render(s["context"]), Error)
          << name << " (Jinja2: " << s["error"] << ")";
      ++same;
      continue;
    }
    try {
      std::string got = jinja::Template::parse(s["source"].get<std::string>()).render(s["context"]);
      const std::string expected = s["expected"];
      if (got == expected)
        ++same;
      else
        ADD_FAILURE() << name << ": differs " << first_difference(got, expected);
    } catch (const Error& e) {
      ADD_FAILURE() << name << ": " << e.what();
    }
  }
  std::printf("[ jinja    ] %d/%d feature snippets agree with Jinja2\n", same, total);
}

TEST(ChatTemplate, Qwen3TemplateFromGguf) {
  if (qwen3_dir().empty()) GTEST_SKIP() << "Qwen3 tokenizer.json unavailable (npm unreachable)";
  const Tokenizer& tok = qwen3_tokenizer();
  ChatTemplate chat = ChatTemplate::from_tokenizer(tok);
  ordered_json messages = ordered_json::parse(R"([{"role": "user", "content": "Hi"}])");
  ChatOptions options;
  options.extra["enable_thinking"] = false;
  std::string prompt = chat.apply(messages, options);
  EXPECT_EQ(prompt, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  std::vector<int32_t> ids = tok.encode(prompt);
  EXPECT_EQ(ids.front(), 151644);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 151667), 1);  // <think>
}

}  // namespace
}  // namespace regolith::test
