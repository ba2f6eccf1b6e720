// The HTTP/1.1 transport of `regolith serve`: one thread per connection (bounded), keep-alive,
// Content-Length and chunked request bodies, chunked responses for SSE. Every limit an untrusted
// client could exhaust is enforced here: header and body size (431/413), a total deadline to
// receive a request (408, so a client that drips bytes cannot hold a thread), the number of
// connections (503). Handlers can ask whether the peer has gone away while they wait, so a
// disconnect cancels work at once. It knows nothing of JSON or the model.
//
// Written on POSIX sockets rather than cpp-httplib: Debian 12's cpp-httplib (0.11.4) gives handlers
// no view of the connection (no disconnect check while a non-streamed request waits) and has no
// total deadline on reading a request.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace regolith::server {

struct HttpLimits {
  size_t max_header_bytes = 16 * 1024;
  size_t max_body_bytes = 8 * 1024 * 1024;
  int max_connections = 128;
  std::chrono::milliseconds request_deadline{30000};  // from a request's first byte to its last
  std::chrono::milliseconds keep_alive_idle{30000};   // an idle keep-alive connection is closed after this
  std::chrono::milliseconds write_timeout{30000};     // a client that stops reading is dropped
};

struct CaseInsensitiveLess {
  bool operator()(const std::string& a, const std::string& b) const;
};

struct HttpRequest {
  std::string method, target, path, query, version;
  std::map<std::string, std::string, CaseInsensitiveLess> headers;
  std::string body;
  std::string header(const std::string& name) const;  // empty when absent
};

// One response on one connection. Either send() once, or begin_stream() then write() pieces.
class HttpResponder {
 public:
  // Writes block for at most the socket's SO_SNDTIMEO (HttpLimits::write_timeout).
  HttpResponder(int fd, bool keep_alive) : fd_(fd), keep_alive_(keep_alive) {}

  void add_header(std::string name, std::string value) { extra_.emplace_back(std::move(name), std::move(value)); }
  void send(int status, std::string_view content_type, std::string_view body);
  bool begin_stream(int status, std::string_view content_type);
  bool write(std::string_view data);  // one chunk; false once the client is gone
  void end_stream();

  // True when the client closed its side or the connection broke (checked without blocking).
  bool peer_closed() const;
  bool responded() const { return responded_; }
  bool broken() const { return broken_; }
  bool keep_alive() const { return keep_alive_ && !broken_; }
  void set_keep_alive(bool on) { keep_alive_ = keep_alive_ && on; }

 private:
  std::string head(int status, std::string_view content_type, const std::string& length_header) const;
  bool send_all(std::string_view data);

  int fd_;
  bool keep_alive_;
  std::vector<std::pair<std::string, std::string>> extra_;
  bool responded_ = false, streaming_ = false, broken_ = false;
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponder&)>;
// Writes an error response for transport-level failures (status, short message).
using HttpErrorWriter = std::function<void(HttpResponder&, int status, const std::string& message)>;

const char* http_reason(int status);

class HttpServer {
 public:
  explicit HttpServer(HttpLimits limits) : limits_(limits) {}
  ~HttpServer();

  // Exact-path routes; a path with routes but not this method answers 405.
  void route(const std::string& method, const std::string& path, HttpHandler handler);
  void set_fallback(HttpHandler handler) { fallback_ = std::move(handler); }
  void set_error_writer(HttpErrorWriter writer) { error_writer_ = std::move(writer); }

  int bind(const std::string& host, int port);  // returns the bound port (port 0: any free one)
  void serve();                                 // accepts until stop(); returns when accepting ended
  // Stops accepting, lets requests in flight finish until `grace` has passed, then closes the rest.
  void stop(std::chrono::milliseconds grace);
  bool stopping() const { return stopping_.load(); }
  int active_connections() const { return n_connections_.load(); }

 private:
  void handle_connection(int fd);
  enum class ReadStatus { ok, closed, timeout, too_large_header, too_large_body, bad_request, expectation_failed };
  ReadStatus read_request(int fd, std::string& buffer, HttpRequest& request, bool first);
  void dispatch(const HttpRequest& request, HttpResponder& responder);
  void write_error(HttpResponder& responder, int status, const std::string& message);

  HttpLimits limits_;
  std::map<std::string, std::map<std::string, HttpHandler>> routes_;  // path -> method -> handler
  HttpHandler fallback_;
  HttpErrorWriter error_writer_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<int> n_connections_{0};
  std::mutex mutex_;
  std::condition_variable all_closed_;
  std::vector<int> open_fds_;  // guarded by mutex_
};

}  // namespace regolith::server
