// Helpers of the live server tests: start `regolith serve` on a free loopback port (it prints the
// port it bound), talk HTTP/1.1 to it over raw sockets (so tests can also send what no client
// library would: garbage, half requests, slow drips), parse SSE streams.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace regolith::test {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

inline std::string test_dir() { return REGOLITH_SERVER_TEST_DIR; }
inline std::string tiny_model() { return test_dir() + "/tiny.gguf"; }
inline std::string qwen35_template() { return REGOLITH_QWEN35_TEMPLATE; }

// One `regolith serve` process for the duration of a test.
class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> args, std::string model = tiny_model()) {
    static int counter = 0;
    log_path_ = test_dir() + "/serve-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".log";
    int out[2];
    if (::pipe(out) != 0) throw std::runtime_error("pipe");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      int err = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(err, 2);
      ::close(out[0]);
      std::vector<std::string> all = {REGOLITH_BIN, "serve", "-m", model, "--port", "0"};
      all.insert(all.end(), args.begin(), args.end());
      if (const char* backend = std::getenv("REGOLITH_TEST_SERVER_BACKEND")) all.insert(all.end(), {"--backend", backend});
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    std::string seen;
    auto deadline = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < deadline) {
      pollfd p{out[0], POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[512];
      ssize_t n = ::read(out[0], buf, sizeof buf);
      if (n <= 0) break;
      seen.append(buf, static_cast<size_t>(n));
      size_t at = seen.find("listening on http://");
      if (at != std::string::npos && seen.find('\n', at) != std::string::npos) {
        port_ = std::stoi(seen.substr(seen.rfind(':', seen.find('\n', at)) + 1));
        break;
      }
    }
    stdout_fd_ = out[0];
    if (port_ == 0) {
      stop(SIGKILL);
      throw std::runtime_error("the server did not start: " + seen + log());
    }
  }
  ~ServerProcess() {
    if (pid_ > 0) stop(SIGKILL);
    if (stdout_fd_ >= 0) ::close(stdout_fd_);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  void signal(int sig) const { ::kill(pid_, sig); }
  // Signals the server and waits for it; returns its exit status (-signal when killed).
  int stop(int sig = SIGTERM) {
    if (pid_ <= 0) return exit_status_;
    ::kill(pid_, sig);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    return exit_status_;
  }
  std::string log() const {
    std::ifstream in(log_path_);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0, stdout_fd_ = -1, exit_status_ = 0;
  std::string log_path_;
};

struct HttpResult {
  int status = 0;  // 0: no response (connection failed, closed or timed out)
  std::map<std::string, std::string> headers;  // names lower-case
  std::string body;
  Json json() const { return Json::parse(body, nullptr, false); }
};

// One client connection.
class Connection {
 public:
  explicit Connection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
    int one = 1;
    if (fd_ >= 0) ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~Connection() { close(); }
  bool ok() const { return fd_ >= 0; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool send_raw(std::string_view data) {
    while (!data.empty()) {
      ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }
  bool send_request(const std::string& method, const std::string& path, const std::string& body,
                    const std::vector<std::string>& headers = {}) {
    std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    for (const auto& h : headers) r += h + "\r\n";
    if (!body.empty() || method == "POST") r += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    r += "\r\n" + body;
    return send_raw(r);
  }

  // Reads one response. on_data sees body bytes as they arrive (chunk payloads); returning false
  // from it stops reading (the caller may then close the connection).
  HttpResult read_response(int timeout_ms = 60000, const std::function<bool(std::string_view)>& on_data = {}) {
    HttpResult r;
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    size_t head_end;
    while ((head_end = buf_.find("\r\n\r\n")) == std::string::npos)
      if (!fill(deadline)) return r;
    std::string head = buf_.substr(0, head_end);
    buf_.erase(0, head_end + 4);
    std::istringstream lines(head);
    std::string line;
    std::getline(lines, line);
    if (line.size() < 12) return r;
    int status = std::stoi(line.substr(9, 3));
    while (std::getline(lines, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      size_t c = line.find(':');
      if (c == std::string::npos) continue;
      std::string name = line.substr(0, c);
      for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      size_t v = line.find_first_not_of(' ', c + 1);
      r.headers[name] = v == std::string::npos ? "" : line.substr(v);
    }
    if (status == 100) return read_response(timeout_ms, on_data);
    if (r.headers["transfer-encoding"] == "chunked") {
      while (true) {
        size_t eol;
        while ((eol = buf_.find("\r\n")) == std::string::npos)
          if (!fill(deadline)) return r;
        size_t size = std::stoul(buf_.substr(0, eol), nullptr, 16);
        while (buf_.size() < eol + 2 + size + 2)
          if (!fill(deadline)) return r;
        std::string data = buf_.substr(eol + 2, size);
        buf_.erase(0, eol + 2 + size + 2);
        if (size == 0) break;
        r.body += data;
        if (on_data && !on_data(data)) {
          r.status = status;
          return r;
        }
      }
    } else if (r.headers.count("content-length")) {
      size_t n = std::stoul(r.headers["content-length"]);
      while (buf_.size() < n)
        if (!fill(deadline)) return r;
      r.body = buf_.substr(0, n);
      buf_.erase(0, n);
    }
    r.status = status;
    return r;
  }

  // True when the server closed the connection within timeout_ms.
  bool closed_by_peer(int timeout_ms) {
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char c[4096];
      ssize_t n = ::recv(fd_, c, sizeof c, 0);
      if (n <= 0) return true;
      buf_.append(c, static_cast<size_t>(n));
    }
    return false;
  }

 private:
  bool fill(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 || fd_ < 0) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    char c[16384];
    ssize_t n = ::recv(fd_, c, sizeof c, 0);
    if (n <= 0) return false;
    buf_.append(c, static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  std::string buf_;
};

inline HttpResult http(int port, const std::string& method, const std::string& path, const std::string& body = "",
                       const std::vector<std::string>& headers = {}, int timeout_ms = 60000) {
  Connection c(port);
  if (!c.ok() || !c.send_request(method, path, body, headers)) return {};
  return c.read_response(timeout_ms);
}

inline HttpResult post(int port, const std::string& path, const Json& body, const std::vector<std::string>& headers = {}) {
  return http(port, "POST", path, body.dump(), headers);
}

// The JSON payloads of an SSE body, up to `data: [DONE]` (which sets *done).
inline std::vector<Json> sse_events(const std::string& body, bool* done = nullptr) {
  std::vector<Json> out;
  if (done) *done = false;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    std::string event = body.substr(pos, end - pos);
    pos = end + 2;
    if (!event.starts_with("data: ")) continue;
    std::string data = event.substr(6);
    if (data == "[DONE]") {
      if (done) *done = true;
      break;
    }
    out.push_back(Json::parse(data));
  }
  return out;
}

// A Prometheus sample by exact series name; -1 when absent.
inline double metric(int port, const std::string& series) {
  HttpResult r = http(port, "GET", "/metrics");
  std::istringstream lines(r.body);
  std::string line;
  while (std::getline(lines, line))
    if (line.starts_with(series + " ")) return std::stod(line.substr(series.size() + 1));
  return -1;
}

// Waits up to timeout_ms for a gauge to reach `want` (a finished reply's last token is fed to its
// session for the prefix cache just after the client has the answer); returns the last value.
inline double wait_metric(int port, const std::string& series, double want, int timeout_ms = 2000) {
  double v = metric(port, series);
  for (auto until = Clock::now() + std::chrono::milliseconds(timeout_ms); v != want && Clock::now() < until;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    v = metric(port, series);
  }
  return v;
}

inline Json chat_body(const std::string& user, int max_tokens, bool stream = false) {
  return {{"model", "tiny"},
          {"messages", Json::array({{{"role", "user"}, {"content", user}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"stream", stream}};
}

// The assistant text of a streamed chat response.
inline std::string streamed_content(const std::string& body) {
  std::string text;
  for (const Json& e : sse_events(body))
    for (const Json& c : e["choices"])
      if (c["delta"].contains("content") && c["delta"]["content"].is_string()) text += c["delta"]["content"].get<std::string>();
  return text;
}

}  // namespace regolith::test
