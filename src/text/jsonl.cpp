#include "text/jsonl.h"

#include <nlohmann/json.hpp>

#include "core/common.h"

namespace tq::text {
namespace {

int hex4(std::string_view s, size_t i) {  // the \uXXXX value at s[i] (the backslash), or -1
  if (i + 6 > s.size() || s[i + 1] != 'u') return -1;
  int v = 0;
  for (size_t k = i + 2; k < i + 6; ++k) {
    const char c = s[k];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= c - '0';
    else if (c >= 'a' && c <= 'f')
      v |= c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      v |= c - 'A' + 10;
    else
      return -1;
  }
  return v;
}

// The line with each escaped lone surrogate as \ufffd (pairs stay).
std::string without_lone_surrogates(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s[i] != '\\' || i + 1 >= s.size()) {
      out += s[i++];
      continue;
    }
    const int v = hex4(s, i);
    if (v < 0xD800 || v > 0xDFFF) {  // another escape (or \\): copied whole
      out.append(s.substr(i, 2));
      i += 2;
      continue;
    }
    const int low = v < 0xDC00 ? hex4(s, i + 6) : -1;
    if (low >= 0xDC00 && low <= 0xDFFF) {
      out.append(s.substr(i, 12));
      i += 12;
    } else {
      out += "\\ufffd";
      i += 6;
    }
  }
  return out;
}

}  // namespace

bool jsonl_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

std::optional<std::string> jsonl_text(std::string_view line, const std::string& where) {
  if (jsonl_blank(line)) return std::nullopt;
  using json = nlohmann::json;
  json j = json::parse(line, nullptr, false);
  if (j.is_discarded() && line.find("\\u") != std::string_view::npos)
    j = json::parse(without_lone_surrogates(line), nullptr, false);
  if (j.is_discarded()) throw Error(where + ": not JSON (each line must be {\"text\": ...})");
  if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
    throw Error(where + ": no string field \"text\" (each line must be {\"text\": ...})");
  return j["text"].get<std::string>();
}

}  // namespace tq::text
