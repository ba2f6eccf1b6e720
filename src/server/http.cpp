#include "server/http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace regolith::server {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kTick = std::chrono::milliseconds(100);  // how often idle waits look at stopping_

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool parse_size(std::string_view s, int base, size_t& out) {
  if (s.empty() || s.size() > 16) return false;
  size_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (base == 16 && c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (base == 16 && c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return false;
    v = v * base + d;
  }
  out = v;
  return true;
}

// Reads from a socket into a buffer until a condition holds, within a deadline.
class SocketReader {
 public:
  SocketReader(int fd, std::string& buffer, const std::atomic<bool>& stopping)
      : fd_(fd), buffer_(buffer), stopping_(stopping) {}

  enum class Result { ok, closed, timeout };

  // Waits for the first byte of a request for at most `idle` (giving up early when stopping).
  Result wait_first(std::chrono::milliseconds idle) {
    if (!buffer_.empty()) return Result::ok;
    auto until = Clock::now() + idle;
    while (Clock::now() < until) {
      if (stopping_.load()) return Result::closed;
      Result r = fill(std::min<Clock::time_point>(until, Clock::now() + kTick));
      if (r == Result::closed) return r;
      if (!buffer_.empty()) return Result::ok;
    }
    return Result::closed;
  }

  // Reads more bytes, waiting until `until` at most.
  Result fill(Clock::time_point until) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) return Result::timeout;
    pollfd p{fd_, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left));
    if (r == 0) return Result::timeout;
    if (r < 0) return errno == EINTR ? Result::ok : Result::closed;
    char chunk[16384];
    ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n <= 0) return n < 0 && errno == EINTR ? Result::ok : Result::closed;
    buffer_.append(chunk, static_cast<size_t>(n));
    return Result::ok;
  }

  // Makes sure buffer_ holds at least n bytes.
  Result need(size_t n, Clock::time_point until) {
    while (buffer_.size() < n) {
      Result r = fill(until);
      if (r != Result::ok) return r;
    }
    return Result::ok;
  }

 private:
  int fd_;
  std::string& buffer_;
  const std::atomic<bool>& stopping_;
};

}  // namespace

bool CaseInsensitiveLess::operator()(const std::string& a, const std::string& b) const {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) < std::tolower(static_cast<unsigned char>(y));
  });
}

std::string HttpRequest::header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

const char* http_reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

// ---- HttpResponder ----

std::string HttpResponder::head(int status, std::string_view content_type, const std::string& length_header) const {
  std::string h = cat("HTTP/1.1 ", status, " ", http_reason(status), "\r\n");
  if (!content_type.empty()) h += cat("Content-Type: ", content_type, "\r\n");
  h += length_header;
  h += keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const auto& [name, value] : extra_) h += name + ": " + value + "\r\n";
  h += "\r\n";
  return h;
}

bool HttpResponder::send_all(std::string_view data) {
  if (broken_) return false;
  while (!data.empty()) {
    ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {  // error, or EAGAIN after SO_SNDTIMEO: the client stopped reading
      broken_ = true;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

void HttpResponder::send(int status, std::string_view content_type, std::string_view body) {
  if (responded_) return;
  responded_ = true;
  std::string out = head(status, content_type, cat("Content-Length: ", body.size(), "\r\n"));
  out.append(body);
  send_all(out);
}

bool HttpResponder::begin_stream(int status, std::string_view content_type) {
  if (responded_) return false;
  responded_ = streaming_ = true;
  return send_all(head(status, content_type, "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n"));
}

bool HttpResponder::write(std::string_view data) {
  if (!streaming_) return false;
  if (data.empty()) return !broken_;
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string out = size;
  out.append(data);
  out += "\r\n";
  return send_all(out);
}

void HttpResponder::end_stream() {
  if (!streaming_) return;
  streaming_ = false;
  send_all("0\r\n\r\n");
}

bool HttpResponder::peer_closed() const {
  if (broken_) return true;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLIN) {  // data (a pipelined request) or end of stream
    char c;
    return ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }
  return false;
}

// ---- HttpServer ----

HttpServer::~HttpServer() {
  if (n_connections_.load() > 0) stop(std::chrono::milliseconds(0));
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void HttpServer::route(const std::string& method, const std::string& path, HttpHandler handler) {
  routes_[path][method] = std::move(handler);
}

int HttpServer::bind(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  if (int e = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); e != 0)
    fail("cannot resolve host '", host, "': ", gai_strerror(e));
  std::string last_error = "no address";
  for (addrinfo* a = found; a && listen_fd_ < 0; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 512) == 0) {
      listen_fd_ = fd;
    } else {
      last_error = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  if (listen_fd_ < 0) fail("cannot listen on ", host, ":", port, ": ", last_error);
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

void HttpServer::serve() {
  while (!stopping_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(kTick.count())) <= 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        std::this_thread::sleep_for(kTick);  // out of descriptors: the pending connection would spin us
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    timeval tv{static_cast<time_t>(limits_.write_timeout.count() / 1000),
               static_cast<suseconds_t>(limits_.write_timeout.count() % 1000 * 1000)};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (n_connections_.load() >= limits_.max_connections) {
      HttpResponder r(fd, false);
      write_error(r, 503, cat("too many connections (limit ", limits_.max_connections, ")"));
      ::close(fd);
      continue;
    }
    {
      std::lock_guard lock(mutex_);
      open_fds_.push_back(fd);
      ++n_connections_;
    }
    std::thread([this, fd] { handle_connection(fd); }).detach();
  }
  std::lock_guard lock(mutex_);
  ::close(listen_fd_);
  listen_fd_ = -1;
}

void HttpServer::stop(std::chrono::milliseconds grace) {
  stopping_ = true;  // serve() sees it within a tick and closes the listening socket
  std::unique_lock lock(mutex_);
  all_closed_.wait_for(lock, grace, [&] { return n_connections_.load() == 0; });
  // Past the grace period: break the remaining connections; their handlers see the peer gone.
  for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
  all_closed_.wait_for(lock, std::chrono::seconds(5), [&] { return n_connections_.load() == 0; });
}

void HttpServer::write_error(HttpResponder& responder, int status, const std::string& message) {
  if (error_writer_) error_writer_(responder, status, message);
  else responder.send(status, "text/plain; charset=utf-8", message + "\n");
}

HttpServer::ReadStatus HttpServer::read_request(int fd, std::string& buffer, HttpRequest& request, bool first) {
  using R = SocketReader::Result;
  SocketReader reader(fd, buffer, stopping_);
  if (reader.wait_first(first ? limits_.request_deadline : limits_.keep_alive_idle) != R::ok) return ReadStatus::closed;
  const auto deadline = Clock::now() + limits_.request_deadline;
  auto fail_status = [](R r) { return r == R::timeout ? ReadStatus::timeout : ReadStatus::closed; };

  size_t header_end;
  while (true) {
    while (buffer.starts_with("\r\n")) buffer.erase(0, 2);  // RFC 9112 §2.2: ignore leading empty lines
    header_end = buffer.find("\r\n\r\n");
    if (header_end != std::string::npos) break;
    if (buffer.size() > limits_.max_header_bytes) return ReadStatus::too_large_header;
    if (R r = reader.fill(deadline); r != R::ok) return buffer.empty() ? ReadStatus::closed : fail_status(r);
  }
  if (header_end > limits_.max_header_bytes) return ReadStatus::too_large_header;

  std::string_view head(buffer.data(), header_end);
  size_t eol = head.find("\r\n");
  std::string_view line = head.substr(0, eol);
  size_t sp1 = line.find(' '), sp2 = line.rfind(' ');
  if (sp1 == std::string_view::npos || sp2 == sp1) return ReadStatus::bad_request;
  request.method = std::string(line.substr(0, sp1));
  request.target = std::string(line.substr(sp1 + 1, sp2 - sp1 - 1));
  request.version = std::string(line.substr(sp2 + 1));
  if (request.version != "HTTP/1.1" && request.version != "HTTP/1.0") return ReadStatus::bad_request;
  if (request.target.empty() || request.method.empty()) return ReadStatus::bad_request;
  size_t q = request.target.find('?');
  request.path = request.target.substr(0, q);
  request.query = q == std::string::npos ? "" : request.target.substr(q + 1);
  request.headers.clear();
  while (eol != std::string_view::npos) {
    size_t next = head.find("\r\n", eol + 2);
    std::string_view h = head.substr(eol + 2, next == std::string_view::npos ? std::string_view::npos : next - eol - 2);
    eol = next;
    if (h.empty()) continue;
    if (h.front() == ' ' || h.front() == '\t') return ReadStatus::bad_request;  // obsolete line folding
    size_t colon = h.find(':');
    if (colon == std::string_view::npos || colon == 0) return ReadStatus::bad_request;
    std::string name(h.substr(0, colon));
    std::string value(trim(h.substr(colon + 1)));
    auto [it, inserted] = request.headers.emplace(name, value);
    if (!inserted) {
      if (lower(name) == "content-length" && it->second != value) return ReadStatus::bad_request;
      it->second += ", " + value;
    }
  }
  size_t pos = header_end + 4;

  std::string te = lower(request.header("Transfer-Encoding"));
  std::string cl = request.header("Content-Length");
  std::string expect = lower(request.header("Expect"));
  if (!expect.empty() && expect != "100-continue") return ReadStatus::expectation_failed;
  request.body.clear();
  if (!te.empty()) {
    if (!cl.empty() || te != "chunked") return ReadStatus::bad_request;
    if (!expect.empty()) ::send(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25, MSG_NOSIGNAL);
    while (true) {
      size_t line_end;
      while ((line_end = buffer.find("\r\n", pos)) == std::string::npos) {
        if (buffer.size() - pos > 1024) return ReadStatus::bad_request;
        if (R r = reader.fill(deadline); r != R::ok) return fail_status(r);
      }
      std::string_view size_text(buffer.data() + pos, line_end - pos);
      size_text = trim(size_text.substr(0, size_text.find(';')));
      size_t size;
      if (!parse_size(size_text, 16, size)) return ReadStatus::bad_request;
      pos = line_end + 2;
      if (size == 0) {  // trailers, then an empty line
        while (true) {
          while ((line_end = buffer.find("\r\n", pos)) == std::string::npos) {
            if (buffer.size() - pos > limits_.max_header_bytes) return ReadStatus::too_large_header;
            if (R r = reader.fill(deadline); r != R::ok) return fail_status(r);
          }
          bool empty = line_end == pos;
          pos = line_end + 2;
          if (empty) break;
        }
        break;
      }
      if (request.body.size() + size > limits_.max_body_bytes) return ReadStatus::too_large_body;
      if (R r = reader.need(pos + size + 2, deadline); r != R::ok) return fail_status(r);
      if (buffer.compare(pos + size, 2, "\r\n") != 0) return ReadStatus::bad_request;
      request.body.append(buffer, pos, size);
      pos += size + 2;
    }
  } else if (!cl.empty()) {
    size_t length;
    if (!parse_size(cl, 10, length)) return ReadStatus::bad_request;
    if (length > limits_.max_body_bytes) return ReadStatus::too_large_body;
    if (!expect.empty() && buffer.size() < pos + length) ::send(fd, "HTTP/1.1 100 Continue\r\n\r\n", 25, MSG_NOSIGNAL);
    if (R r = reader.need(pos + length, deadline); r != R::ok) return fail_status(r);
    request.body.assign(buffer, pos, length);
    pos += length;
  }
  buffer.erase(0, pos);
  return ReadStatus::ok;
}

void HttpServer::dispatch(const HttpRequest& request, HttpResponder& responder) {
  auto path = routes_.find(request.path);
  if (path == routes_.end()) {
    if (fallback_) fallback_(request, responder);
    else write_error(responder, 404, "no route " + request.path);
    return;
  }
  auto handler = path->second.find(request.method);
  if (handler == path->second.end()) {
    std::string allowed;
    for (const auto& [method, _] : path->second) allowed += (allowed.empty() ? "" : ", ") + method;
    responder.add_header("Allow", allowed);
    write_error(responder, 405, cat("method ", request.method, " is not allowed on ", request.path, " (allowed: ", allowed, ")"));
    return;
  }
  handler->second(request, responder);
}

void HttpServer::handle_connection(int fd) {
  std::string buffer;
  for (bool first = true;; first = false) {
    HttpRequest request;
    ReadStatus status = read_request(fd, buffer, request, first);
    if (status == ReadStatus::closed) break;
    if (status != ReadStatus::ok) {
      HttpResponder r(fd, false);
      switch (status) {
        case ReadStatus::timeout:
          write_error(r, 408, cat("the request did not arrive completely within ", limits_.request_deadline.count(), " ms"));
          break;
        case ReadStatus::too_large_header:
          write_error(r, 431, cat("request headers exceed ", limits_.max_header_bytes, " bytes"));
          break;
        case ReadStatus::too_large_body:
          write_error(r, 413, cat("request body exceeds ", limits_.max_body_bytes, " bytes"));
          break;
        case ReadStatus::expectation_failed: write_error(r, 417, "only 'Expect: 100-continue' is supported"); break;
        default: write_error(r, 400, "malformed HTTP request"); break;
      }
      break;
    }
    std::string connection = lower(request.header("Connection"));
    bool keep_alive = request.version == "HTTP/1.1" ? connection.find("close") == std::string::npos
                                                    : connection.find("keep-alive") != std::string::npos;
    HttpResponder responder(fd, keep_alive && !stopping_.load());
    try {
      dispatch(request, responder);
    } catch (const std::exception& e) {
      if (!responder.responded()) write_error(responder, 500, e.what());
    }
    if (!responder.responded()) write_error(responder, 500, "the handler produced no response");
    if (!responder.keep_alive() || stopping_.load()) break;
  }
  std::lock_guard lock(mutex_);  // erased before close, so stop() never touches a reused fd number
  open_fds_.erase(std::remove(open_fds_.begin(), open_fds_.end(), fd), open_fds_.end());
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
  --n_connections_;
  all_closed_.notify_all();
}

}  // namespace regolith::server
