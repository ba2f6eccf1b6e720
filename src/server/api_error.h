// An error the API reports to the client: HTTP status plus OpenAI's error object
// {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <stdexcept>
#include <string>

namespace regolith::server {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = {}, std::string code = {})
      : std::runtime_error(message), status(status), param(std::move(param)), code(std::move(code)) {}

  int status;
  std::string param, code;

  // OpenAI's `type` for the status.
  const char* type() const {
    switch (status) {
      case 401: return "authentication_error";
      case 403: return "permission_error";
      case 404: return "not_found_error";
      case 429: return "rate_limit_error";
      case 503: return "server_overloaded";
      default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
  }
};

inline ApiError invalid_request(std::string message, std::string param = {}, std::string code = "invalid_value") {
  return ApiError(400, std::move(message), std::move(param), std::move(code));
}

}  // namespace regolith::server
