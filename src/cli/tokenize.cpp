// `regolith tokenize` and `regolith detokenize`: the model's tokenizer (and chat template) from
// the command line, for checking prompts and ids against other tools.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include "cli/commands.h"
#include "cli/token_list.h"
#include "core/error.h"
#include "core/text_file.h"
#include "gguf/gguf.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace regolith::cli {
namespace {

struct TokenizeArgs {
  std::string model, prompt, file, system;
  bool ids_only = false, no_parse_special = false, no_add_special = false, chat = false, no_think = false;
  bool show_prompt = false, stats = false;
};

std::string read_all(const std::string& path) {
  if (path == "-") return std::string(std::istreambuf_iterator<char>(std::cin), {});
  return read_text_file(path);
}

// A token's text for display: characters as they are, control characters and bytes that are
// only part of a character (tokens often split CJK and emoji) as escapes.
std::string printable(std::string_view bytes) {
  std::string out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    auto c = static_cast<unsigned char>(bytes[pos]);
    size_t n = utf8::sequence_length(bytes.substr(pos));
    char buf[8];
    if (n > 1) {
      out.append(bytes.substr(pos, n));
      pos += n;
      continue;
    }
    ++pos;
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c == '\'') out += "\\'";
    else if (c < 0x20 || c >= 0x7F) std::snprintf(buf, sizeof buf, "\\x%02x", c), out += buf;
    else out += static_cast<char>(c);
  }
  return out;
}

void run_tokenize(const TokenizeArgs& a) {
  if (a.prompt.empty() == a.file.empty()) fail("give the text with exactly one of -p TEXT or -f FILE");
  GgufFile gguf = GgufFile::open(a.model);
  Tokenizer tok = Tokenizer::from_gguf(gguf);
  std::string text = a.file.empty() ? a.prompt : read_all(a.file);
  if (a.chat) {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
    messages.push_back({{"role", "user"}, {"content", text}});
    ChatOptions options;
    if (a.no_think) options.extra["enable_thinking"] = false;
    text = ChatTemplate::from_tokenizer(tok).apply(messages, options);
  } else if (!a.system.empty()) {
    fail("--system needs --chat");
  }
  if (a.show_prompt) std::fprintf(stderr, "%s\n", text.c_str());
  auto t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> ids = tok.encode(text, {.add_special = !a.no_add_special, .parse_special = !a.no_parse_special});
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.ids_only) {
    std::printf("[");
    for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? ", %d" : "%d", ids[i]);
    std::printf("]\n");
  } else {
    for (int32_t id : ids) std::printf("%7d -> '%s'\n", id, printable(tok.token_bytes(id)).c_str());
  }
  if (a.stats)
    std::fprintf(stderr, "%zu bytes -> %zu tokens in %.3f ms (%.1f MB/s)\n", text.size(), ids.size(), seconds * 1e3,
                 text.size() / std::max(seconds, 1e-9) / 1e6);
}

void run_detokenize(const std::string& model, const std::vector<std::string>& id_args, bool skip_special, bool stream) {
  std::string joined;
  for (const std::string& s : id_args) joined += s + " ";
  if (id_args.empty()) joined = read_all("-");
  for (char& c : joined)
    if (c == '[' || c == ']' || c == '\n' || c == '\t' || c == '\r') c = ' ';
  std::vector<int32_t> ids = parse_token_list(joined);
  GgufFile gguf = GgufFile::open(model);
  Tokenizer tok = Tokenizer::from_gguf(gguf);
  if (stream) {  // as generation would print it: each piece as soon as it is complete UTF-8
    StreamingDetokenizer detok(tok, skip_special);
    for (int32_t id : ids) std::fputs(detok.push(id).c_str(), stdout);
    std::fputs(detok.finish().c_str(), stdout);
  } else {
    std::string bytes = tok.decode(ids, skip_special);
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
  }
  std::fputc('\n', stdout);
}

}  // namespace

void add_tokenize(CLI::App& app) {
  static TokenizeArgs a;
  auto* cmd = app.add_subcommand("tokenize", "Turn text into token ids with a model's tokenizer");
  cmd->add_option("-m,--model", a.model, "GGUF file (only its tokenizer metadata is read)")->required();
  cmd->add_option("-p,--prompt", a.prompt, "Text to tokenize");
  cmd->add_option("-f,--file", a.file, "Read the text from a file ('-': standard input)");
  cmd->add_flag("--ids", a.ids_only, "Print only the ids, as a list");
  cmd->add_flag("--no-parse-special", a.no_parse_special, "Treat control tokens in the text (<|im_start|>) as text");
  cmd->add_flag("--no-add-special", a.no_add_special, "Do not add BOS/EOS even where the model asks for them");
  cmd->add_flag("--chat", a.chat, "Wrap the text as a user message with the model's chat template");
  cmd->add_option("--system", a.system, "System prompt for --chat");
  cmd->add_flag("--no-think", a.no_think, "With --chat: enable_thinking=false");
  cmd->add_flag("--show-prompt", a.show_prompt, "Print the text that is tokenized (after the template) to stderr");
  cmd->add_flag("--stats", a.stats, "Print the token count and speed to stderr");
  cmd->callback([] { run_tokenize(a); });

  static std::string model;
  static std::vector<std::string> ids;
  static bool skip_special = false, stream = false;
  auto* det = app.add_subcommand("detokenize", "Turn token ids back into text");
  det->add_option("-m,--model", model, "GGUF file")->required();
  det->add_option("ids", ids, "Token ids (\"1,2,3\", \"[1, 2, 3]\" or separate arguments; standard input if none)");
  det->add_flag("--skip-special", skip_special, "Leave out control tokens");
  det->add_flag("--stream", stream, "Decode token by token as generation does (invalid UTF-8 becomes U+FFFD)");
  det->callback([] { run_detokenize(model, ids, skip_special, stream); });
}

}  // namespace regolith::cli
