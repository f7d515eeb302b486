// Minimal JSON output for the CLI: enough for flat objects of strings, numbers and booleans.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

namespace flamia::cli {

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

// Shortest round-tripping form; JSON has no NaN or Inf, so those become null.
inline std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

inline std::string json_bool(bool b) { return b ? "true" : "false"; }

}  // namespace flamia::cli
