// Documents as JSON Lines: each line an object with a string field "text".
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace tq::text {

// A line of only spaces, tabs and a carriage return: no document (prepare and tokenizer-train
// number the documents of a JSONL file by the lines that are not blank; a byte order mark
// before the first line is skipped).
bool jsonl_blank(std::string_view line);

// The "text" of one line; nullopt for a blank line; Error naming `where` (file and line) for
// anything else. A \u escape of a lone surrogate reads as U+FFFD, as Python's and JavaScript's
// JSON readers followed by UTF-8 encoding with errors="replace" give it (strict parsers refuse
// the line; real corpora have such lines).
std::optional<std::string> jsonl_text(std::string_view line, const std::string& where);

}  // namespace tq::text
