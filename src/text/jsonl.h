// Documents as JSON Lines: each line an object with a string field "text".
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace tq::text {

// The "text" of one line; nullopt for a blank line; Error naming `where` (file and line) for
// anything else. A \u escape of a lone surrogate reads as U+FFFD, as Python's and JavaScript's
// JSON readers followed by UTF-8 encoding with errors="replace" give it (strict parsers refuse
// the line; real corpora have such lines).
std::optional<std::string> jsonl_text(std::string_view line, const std::string& where);

}  // namespace tq::text
