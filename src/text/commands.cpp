#include "text/commands.h"

#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/common.h"
#include "data/brown.h"
#include "data/prepare.h"
#include "io/file.h"
#include "text/bpe_train.h"
#include "text/jsonl.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace tq::text {
namespace {

using json = nlohmann::json;
constexpr size_t kBlock = 1 << 20;

// An input read in blocks: a file, or stdin for "-".
class Input {
 public:
  explicit Input(const std::string& path) : path_(path == "-" ? "stdin" : path) {
    fd_ = path == "-" ? 0 : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw Error(path + ": cannot open (" + std::strerror(errno) + ")");
  }
  ~Input() {
    if (fd_ > 0) ::close(fd_);
  }
  // Appends up to n bytes; false at the end.
  bool read(std::string& buf, size_t n = kBlock) {
    const size_t at = buf.size();
    buf.resize(at + n);
    ssize_t got;
    do got = ::read(fd_, buf.data() + at, n);
    while (got < 0 && errno == EINTR);
    if (got < 0) throw Error(path_ + ": read failed (" + std::strerror(errno) + ")");
    buf.resize(at + size_t(got));
    total_ += size_t(got);
    return got > 0;
  }
  const std::string& path() const { return path_; }
  uint64_t total() const { return total_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t total_ = 0;
};

// stdout, or a file written atomically (an error leaves no partial file).
class Output {
 public:
  explicit Output(const std::string& path) {
    if (!path.empty()) file_ = std::make_unique<AtomicFile>(path);
  }
  void write(std::string_view s) {
    buf_ += s;
    if (buf_.size() >= kBlock) flush();
  }
  std::string& buffer() { return buf_; }
  void maybe_flush() {
    if (buf_.size() >= kBlock) flush();
  }
  void finish() {
    flush();
    if (file_)
      file_->commit();
    else if (std::fflush(stdout) != 0)
      throw Error("writing stdout failed");
  }

 private:
  void flush() {
    if (file_)
      file_->write(buf_.data(), buf_.size());
    else if (!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), stdout) != buf_.size())
      throw Error(std::string("writing stdout failed (") + std::strerror(errno) + ")");
    buf_.clear();
  }
  std::unique_ptr<AtomicFile> file_;
  std::string buf_;
};

void append_id(std::string& out, uint32_t id) {
  char b[16];
  const auto r = std::to_chars(b, b + sizeof b, id);
  out.append(b, r.ptr);
}

int threads_or_all(int n) {
  return n > 0 ? n : omp_get_max_threads();
}

// Lines of JSONL handled in batches: read, worked on in parallel (in any order), written in
// order. work(line, number, out) fills one line's output (empty: no output). Returns how many
// lines gave output.
template <class Work>
uint64_t each_jsonl_batch(Input& in, Output& out, int threads, Work&& work) {
  std::string buf;
  uint64_t line_no = 0;
  bool more = true;
  std::vector<std::string_view> lines;
  std::vector<std::string> results;
  uint64_t produced = 0;
  bool first_block = true;
  while (more) {
    while (more && buf.size() < 8 * kBlock) more = in.read(buf);
    if (first_block && buf.compare(0, 3, "\xEF\xBB\xBF") == 0) buf.erase(0, 3);  // a BOM
    first_block = false;
    size_t end = more ? buf.rfind('\n') : buf.size();
    if (end == std::string::npos) continue;  // one line longer than the buffer: read on
    if (more) ++end;
    lines.clear();
    for (size_t i = 0; i < end;) {
      size_t e = buf.find('\n', i);
      if (e == std::string::npos || e > end) e = end;
      lines.emplace_back(buf.data() + i, e - i);
      i = e + 1;
    }
    results.assign(lines.size(), {});
    std::vector<std::string> errors(lines.size());
    const uint64_t first = line_no;
#pragma omp parallel for schedule(dynamic, 4) num_threads(threads)
    for (size_t k = 0; k < lines.size(); ++k) {
      try {
        work(lines[k], first + k + 1, results[k]);
      } catch (const std::exception& e) {
        errors[k] = e.what();
      }
    }
    for (size_t k = 0; k < lines.size(); ++k) {
      if (!errors[k].empty()) throw Error(errors[k]);
      produced += !results[k].empty();
      out.write(results[k]);
    }
    line_no += lines.size();
    buf.erase(0, std::min(end, buf.size()));
  }
  return produced;
}

}  // namespace

int encode_command(const EncodeArgs& a) {
  const Tokenizer tok = Tokenizer::load(a.tokenizer);
  Input in(a.input);
  Output out(a.output);
  const bool special = !a.no_special;
  if (a.jsonl) {
    const uint64_t docs = each_jsonl_batch(
        in, out, threads_or_all(a.threads),
        [&](std::string_view line, uint64_t no, std::string& res) {
          const auto text = jsonl_text(line, in.path() + " line " + std::to_string(no));
          if (!text) return;
          std::vector<uint32_t> ids;
          tok.encode(*text, ids, special);
          res += '[';
          for (size_t i = 0; i < ids.size(); ++i) {
            if (i) res += ',';
            append_id(res, ids[i]);
          }
          res += "]\n";
        });
    if (docs == 0) throw Error(in.path() + ": no documents (empty input)");
    out.finish();
    return 0;
  }
  bool first = true;
  StreamEncoder enc(
      tok,
      [&](const uint32_t* ids, size_t n) {
        std::string& b = out.buffer();
        for (size_t i = 0; i < n; ++i) {
          if (!first) b += ' ';
          first = false;
          append_id(b, ids[i]);
        }
        out.maybe_flush();
      },
      special);
  std::string block;
  while (in.read(block)) {
    enc.feed(block);
    block.clear();
  }
  if (in.total() == 0) throw Error(in.path() + ": empty input, nothing to encode");
  enc.finish();
  out.write("\n");
  out.finish();
  return 0;
}

int decode_command(const DecodeArgs& a) {
  const Tokenizer tok = Tokenizer::load(a.tokenizer);
  Input in(a.input);
  Output out(a.output);
  if (a.jsonl) {
    each_jsonl_batch(in, out, 1, [&](std::string_view line, uint64_t no, std::string& res) {
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) return;
      json j = json::parse(line, nullptr, false);
      std::vector<uint32_t> ids;
      bool ok = j.is_array();
      for (const json& v : ok ? j : json::array()) {
        if (!v.is_number_unsigned() || v.get<uint64_t>() > 0xffffffffu)
          ok = false;
        else
          ids.push_back(v.get<uint32_t>());
      }
      if (!ok)
        throw Error(in.path() + " line " + std::to_string(no) +
                    ": expected a JSON array of token ids");
      res = json{{"text", tok.decode(ids, a.skip_special)}}.dump() + "\n";
    });
    out.finish();
    return 0;
  }
  // Whitespace-separated ids, decoded in batches; the UTF-8 repair holds back a character
  // split between batches.
  std::string buf, bytes;
  std::vector<uint32_t> ids;
  bool first = true, more = true;  // no ids decode to no text (some texts encode to none)
  uint64_t offset = 0;             // of buf[0] in the input
  while (more) {
    more = in.read(buf);
    size_t end = buf.size();
    if (more)  // a number may continue into the next block
      while (end > 0 && buf[end - 1] >= '0' && buf[end - 1] <= '9') --end;
    ids.clear();
    for (size_t i = 0; i < end;) {
      const char c = buf[i];
      if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
        ++i;
        continue;
      }
      uint32_t v = 0;
      const auto r = std::from_chars(buf.data() + i, buf.data() + end, v);
      if (r.ec != std::errc() || (r.ptr != buf.data() + end && !std::strchr(" \n\t\r", *r.ptr)))
        throw Error(in.path() + ": byte " + std::to_string(offset + i) +
                    ": expected token ids (decimal numbers separated by whitespace)");
      ids.push_back(v);
      i = size_t(r.ptr - buf.data());
    }
    tok.decode_append(ids.data(), ids.size(), a.skip_special, bytes, first);
    if (tok.decodes_bytes()) {
      size_t held = 0;
      out.write(repair_utf8(bytes, !more, &held));
      bytes.erase(0, bytes.size() - held);
    } else {
      out.write(bytes);
      bytes.clear();
    }
    buf.erase(0, end);
    offset += end;
  }
  out.finish();
  return 0;
}

// Each line of a file, in order, read in blocks (a UTF-8 byte order mark before the first is
// skipped): fn(line without its '\n', line number).
template <class Fn>
void each_line(const std::string& path, Fn&& fn) {
  Input in(path);
  std::string buf;
  bool more = true, first = true;
  uint64_t no = 0;
  while (more) {
    more = in.read(buf);
    const size_t last = buf.rfind('\n');
    if (more && last == std::string::npos) continue;  // a line longer than the buffer
    const size_t limit = more ? last + 1 : buf.size();
    size_t i = first && buf.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;
    first = false;
    while (i < limit) {
      size_t e = buf.find('\n', i);
      if (e == std::string::npos || e > limit) e = limit;
      fn(std::string_view(buf).substr(i, e - i), ++no);
      i = e + 1;
    }
    buf.erase(0, limit);
  }
}

// Feeds units of text (documents, or blocks of a file cut at line ends) to per-thread trainers,
// in rounds of a few MB.
class Feeder {
 public:
  explicit Feeder(int threads) : per_(size_t(threads)) {
    for (auto& p : per_) p = std::make_unique<BpeTrainer>();
  }
  void add(std::string unit) {
    bytes_ += unit.size();
    units_.push_back(std::move(unit));
    if (bytes_ >= per_.size() * 4 * kBlock) run();
  }
  BpeTrainer& finish() {
    run();
    for (size_t k = 1; k < per_.size(); ++k) per_[0]->absorb(*per_[k]);
    return *per_[0];
  }

 private:
  void run() {
#pragma omp parallel for schedule(dynamic, 1) num_threads(int(per_.size()))
    for (size_t k = 0; k < units_.size(); ++k) per_[size_t(omp_get_thread_num())]->feed(units_[k]);
    units_.clear();
    bytes_ = 0;
  }
  std::vector<std::unique_ptr<BpeTrainer>> per_;
  std::vector<std::string> units_;
  size_t bytes_ = 0;
};

int train_tokenizer_command(const TrainTokenizerArgs& a) {
  if (a.inputs.empty() == a.jsonl.empty())
    throw Error("give the text to train on: --input FILE... or --jsonl FILE");
  if (a.val_fraction != 0 && a.jsonl.empty())
    throw Error("--val-fraction chooses documents of --jsonl; text files are read whole");
  const auto t0 = std::chrono::steady_clock::now();
  Feeder feeder(threads_or_all(a.threads));
  uint64_t bytes = 0, docs = 0, left_out = 0;
  if (!a.jsonl.empty()) {
    // Documents numbered as prepare numbers them; those it would put in val are left out.
    uint64_t n = 0;
    each_line(a.jsonl, [&](std::string_view line, uint64_t) { n += !jsonl_blank(line); });
    const std::vector<uint64_t> val = data::val_documents(n, a.val_fraction, a.seed);
    uint64_t doc = 0;
    size_t next_val = 0;
    each_line(a.jsonl, [&](std::string_view line, uint64_t no) {
      auto text = jsonl_text(line, a.jsonl + " line " + std::to_string(no));
      if (!text) return;
      if (next_val < val.size() && val[next_val] == doc) {
        ++next_val, ++doc, ++left_out;
        return;
      }
      ++doc;
      bytes += text->size();
      feeder.add(std::move(*text));  // a document is read a line at a time, as a file is
    });
    docs = doc - left_out;
  }
  // Text files in blocks cut after a line end (lines are the trainer's units, so any such cut
  // counts the same words).
  for (const std::string& path : a.inputs) {
    Input in(path);
    std::string buf;
    bool more = true;
    while (more) {
      while (more && buf.size() < 4 * kBlock) more = in.read(buf);
      size_t end = more ? buf.rfind('\n') : buf.size();
      if (end == std::string::npos) continue;
      if (more) ++end;
      feeder.add(buf.substr(0, end));
      buf.erase(0, end);
    }
    bytes += in.total();
  }
  BpeTrainer& trainer = feeder.finish();
  BpeTrainOptions opt;
  opt.vocab_size = a.vocab_size;
  opt.special_tokens = a.special;
  opt.min_frequency = a.min_frequency;
  const BpeTrainer::Result r = trainer.train(opt);
  Tokenizer::from_json(r.json, a.out);  // what we write, we can read
  AtomicFile f(a.out);
  f.write(r.json.data(), r.json.size());
  f.commit();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "tokenizer: %zu tokens (256 bytes, %zu merged, %zu special) from %.1f MB, %zu "
      "distinct words, in %.1f s\n",
      r.vocab, r.merges, a.special.size(), double(bytes) / 1e6, trainer.distinct_words(), s);
  if (!a.jsonl.empty())
    std::printf("documents: %llu (%llu left out for val)\n", (unsigned long long)docs,
                (unsigned long long)left_out);
  if (r.vocab < a.vocab_size)
    std::printf("note: the text has no more pairs to merge: %zu tokens, not %zu\n", r.vocab,
                a.vocab_size);
  std::printf("written: %s\n", a.out.c_str());
  return 0;
}

}  // namespace tq::text

namespace tq::text {

int brown_text_command(const std::string& dir, const std::string& out) {
  uint64_t tagged = 0;
  const std::vector<std::string> docs = data::brown_documents(dir, &tagged);
  AtomicFile f(out);
  uint64_t bytes = 0;
  for (const std::string& d : docs) {
    const std::string line = json{{"text", d}}.dump() + "\n";
    f.write(line.data(), line.size());
    bytes += d.size();
  }
  f.commit();
  std::printf("brown-text: %zu documents, %.1f MB of text (from %.1f MB tagged): %s\n", docs.size(),
              double(bytes) / 1e6, double(tagged) / 1e6, out.c_str());
  return 0;
}

}  // namespace tq::text
