#include "data/prepare.h"

#include <dirent.h>
#include <fcntl.h>
#include <omp.h>
#include <openssl/evp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <random>
#include <unordered_map>

#include "core/common.h"
#include "data/brown.h"
#include "data/shard.h"
#include "io/file.h"
#include "text/jsonl.h"
#include "text/tokenizer.h"

namespace tq::data {

PrepareTuning prepare_tuning;

uint64_t val_count(uint64_t n, double val_fraction) {
  if (n < 2 || !(val_fraction > 0)) return 0;
  const double k = std::floor(val_fraction * double(n) + 0.5);
  return std::clamp<uint64_t>(k >= double(n) ? n : uint64_t(k), 1, n - 1);
}

std::vector<uint64_t> val_documents(uint64_t n, double val_fraction, uint64_t seed) {
  const uint64_t k = val_count(n, val_fraction);
  std::mt19937_64 gen(seed);
  // Uniform in [0, b) by rejection: std::uniform_int_distribution differs between libraries.
  auto draw = [&gen](uint64_t b) {
    const uint64_t skip = (0 - b) % b;  // 2^64 mod b: the draws that would favour small values
    uint64_t x;
    do x = gen();
    while (x < skip);
    return x % b;
  };
  // The partial shuffle over a virtual array a = 0..n-1: only the entries it moved are held,
  // so a billion documents cost k entries, not n.
  std::unordered_map<uint64_t, uint64_t> moved;
  auto at = [&moved](uint64_t i) {
    const auto it = moved.find(i);
    return it == moved.end() ? i : it->second;
  };
  std::vector<uint64_t> chosen;
  chosen.reserve(k);
  for (uint64_t i = 0; i < k; ++i) {
    const uint64_t j = i + draw(n - i), ai = at(i), aj = at(j);
    moved[j] = ai;
    moved[i] = aj;
    chosen.push_back(aj);
  }
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

std::string sha256_file(const std::string& path) {
  const MappedFile f(path);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (EVP_Digest(f.data(), f.size(), md, &len, EVP_sha256(), nullptr) != 1)
    throw Error("cannot compute the SHA-256 of " + path + " (OpenSSL failed)");
  static const char hex[] = "0123456789abcdef";
  std::string s;
  for (unsigned i = 0; i < len; ++i) s += hex[md[i] >> 4], s += hex[md[i] & 15];
  return s;
}

namespace {

constexpr const char* kSplits[2] = {"train", "val"};

// ---- The output folder: OUT.tmp.PID until everything is written, then renamed to OUT.

// What a signal handler must remove besides the AtomicFile temporaries (which
// tq::remove_temporaries() removes): the shards and meta.json already finished in the
// temporary folder. Fixed C data, published by atomics; one prepare at a time.
struct Finished {
  char dir[PATH_MAX];
  std::atomic<uint64_t> shards[2];
  std::atomic<bool> meta{false};
  std::atomic<bool> armed{false};
  struct sigaction old[3];
};
Finished g_finished;
constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};

// dir/split_NNNNNN.bin without allocating (async-signal-safe); false if too long.
bool finished_path(char* out, size_t cap, const char* split, uint64_t index) {
  char digits[24];
  int nd = 0;
  do digits[nd++] = char('0' + index % 10), index /= 10;
  while (index);
  while (nd < 6) digits[nd++] = '0';
  const size_t ld = std::strlen(g_finished.dir), ls = std::strlen(split);
  if (ld + 1 + ls + 1 + nd + 4 + 1 > cap) return false;
  char* p = out;
  std::memcpy(p, g_finished.dir, ld), p += ld;
  *p++ = '/';
  std::memcpy(p, split, ls), p += ls;
  *p++ = '_';
  while (nd) *p++ = digits[--nd];
  std::memcpy(p, ".bin", 5);
  return true;
}

void remove_finished() {  // async-signal-safe
  char path[PATH_MAX + 64];
  for (int s = 0; s < 2; ++s)
    for (uint64_t i = 0, n = g_finished.shards[s].load(); i < n; ++i)
      if (finished_path(path, sizeof path, kSplits[s], i)) ::unlink(path);
  if (g_finished.meta.load()) {
    const size_t ld = std::strlen(g_finished.dir);
    std::memcpy(path, g_finished.dir, ld);
    std::memcpy(path + ld, "/meta.json", 11);
    ::unlink(path);
  }
}

void on_signal(int sig) {
  remove_finished();
  remove_temporaries();  // the shard being written, then the (now empty) folder
  // The handlers from before prepare (tq's, or the default) then end the process.
  for (int k = 0; k < 3; ++k) sigaction(kSignals[k], &g_finished.old[k], nullptr);
  raise(sig);
}

class OutputFolder {
 public:
  explicit OutputFolder(std::string out) : out_(std::move(out)) {
    while (out_.size() > 1 && out_.back() == '/') out_.pop_back();
    check_free(out_);
    tmp_ = out_ + ".tmp." + std::to_string(getpid());
    if (tmp_.size() + 32 >= sizeof g_finished.dir)
      throw Error("--out " + out_ + " is too long a path");
    if (::mkdir(tmp_.c_str(), 0777) != 0)
      throw Error("cannot create folder " + tmp_ + " (beside --out " + out_ +
                  "): " + std::strerror(errno));
    folder_.emplace(tmp_);
    if (g_finished.armed.exchange(true)) throw Error("internal: two prepares at once");
    std::memcpy(g_finished.dir, tmp_.c_str(), tmp_.size() + 1);
    g_finished.shards[0] = 0, g_finished.shards[1] = 0, g_finished.meta = false;
    for (int k = 0; k < 3; ++k) {
      sigaction(kSignals[k], nullptr, &g_finished.old[k]);
      if (g_finished.old[k].sa_handler != SIG_IGN) std::signal(kSignals[k], on_signal);
    }
  }
  ~OutputFolder() {
    if (!committed_) remove_finished();  // then folder_ removes the folder, empty by now
    for (int k = 0; k < 3; ++k) sigaction(kSignals[k], &g_finished.old[k], nullptr);
    g_finished.armed = false;
  }
  OutputFolder(const OutputFolder&) = delete;
  OutputFolder& operator=(const OutputFolder&) = delete;

  // Refuses an OUT that holds anything: prepare never mixes its files with others.
  static void check_free(const std::string& out) {
    struct stat st;
    if (::stat(out.c_str(), &st) != 0) return;
    if (!S_ISDIR(st.st_mode))
      throw Error(out + " exists and is not a folder: remove it or choose another --out");
    bool empty = true;
    if (DIR* d = opendir(out.c_str())) {
      while (const dirent* e = readdir(d))
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) empty = false;
      closedir(d);
    }
    if (!empty) throw Error(out + " exists and is not empty: remove it or choose another --out");
  }

  const std::string& tmp() const { return tmp_; }
  // Called before a file is renamed into the folder (removing one not there is harmless).
  void finished_shard(int split) { g_finished.shards[split].fetch_add(1); }
  void finished_meta() { g_finished.meta = true; }

  // Renames the finished folder to OUT (an empty OUT is replaced).
  void commit() {
    check_free(out_);
    if (std::rename(tmp_.c_str(), out_.c_str()) != 0)
      throw Error("cannot rename " + tmp_ + " to " + out_ + ": " + std::strerror(errno));
    committed_ = true;
    folder_->keep();
    const size_t slash = out_.rfind('/');
    const std::string parent = slash == std::string::npos ? "." : out_.substr(0, slash + 1);
    const int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) fsync(fd), ::close(fd);
  }

 private:
  std::string out_, tmp_;
  std::optional<TemporaryFolder> folder_;
  bool committed_ = false;
};

// One split's shards, filled in document order; a shard is opened by its first token, so none
// is empty.
class SplitWriter {
 public:
  SplitWriter(OutputFolder& out, int split, uint64_t shard_tokens)
      : out_(out), split_(split), shard_tokens_(shard_tokens) {}
  void append(const uint32_t* p, size_t n) {
    while (n) {
      if (!cur_)
        cur_ = std::make_unique<ShardWriter>(out_.tmp() + "/" +
                                             shard_name(kSplits[split_], meta.shards.size()));
      const size_t m = size_t(std::min<uint64_t>(n, shard_tokens_ - cur_->size()));
      cur_->append(p, m);
      p += m, n -= m;
      meta.tokens += m;
      if (cur_->size() == shard_tokens_) close();
    }
  }
  void finish() {
    if (cur_) close();
  }
  SplitMeta meta;

 private:
  void close() {
    out_.finished_shard(split_);  // first: a signal during the rename still removes it
    cur_->commit();
    cur_.reset();
    meta.shards.push_back(shard_name(kSplits[split_], meta.shards.size()));
    if (prepare_tuning.after_shard) prepare_tuning.after_shard();
  }
  OutputFolder& out_;
  int split_;
  uint64_t shard_tokens_;
  std::unique_ptr<ShardWriter> cur_;
};

// ---- The documents

// A batch, encoded in parallel, ends at this many bytes or documents.
constexpr uint64_t kBatchBytes = 32ull << 20;
constexpr size_t kBatchDocs = 4096;

// Blank as text::jsonl_text has it: such a line is no document.
// Lets the kernel drop the pages of a mapping before `upto`: a 1 GB JSONL read once does not
// stay resident (the pages come back from the file if read again).
void release(const MappedFile& f, size_t upto) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE)), n = upto / page * page;
  if (n) madvise(const_cast<uint8_t*>(f.data()), n, MADV_DONTNEED);
}

std::string absolute(const std::string& path) {
  char* r = ::realpath(path.c_str(), nullptr);
  if (!r) throw Error("cannot resolve " + path + ": " + std::strerror(errno));
  std::string s = r;
  std::free(r);
  return s;
}

struct Job {
  std::string_view text;  // brown: the text; jsonl: the line
  uint64_t line = 0;      // jsonl: its line number
  size_t input = 0;       // inputs: the file's index
};

// Reads documents in order, a batch at a time.
class Documents {
 public:
  enum Kind { kInputs, kJsonl, kBrown };
  explicit Documents(const PrepareArgs& a) : a_(a) {
    if (!a.inputs.empty()) {
      kind_ = kInputs;
      for (const std::string& p : a.inputs) {
        struct stat st;
        if (::stat(p.c_str(), &st) != 0)
          throw Error("cannot read input " + p + ": " + std::strerror(errno));
        if (!S_ISREG(st.st_mode)) throw Error("input " + p + " is not a regular file");
        sizes_.push_back(uint64_t(st.st_size));
        bytes_ += uint64_t(st.st_size);
      }
      n_ = a.inputs.size();
    } else if (!a.jsonl.empty()) {
      kind_ = kJsonl;
      jsonl_ = std::make_unique<MappedFile>(a.jsonl);
      bytes_ = jsonl_->size();
      const std::string_view all = view();
      pos_ = all.substr(0, 3) == "\xEF\xBB\xBF" ? 3 : 0;  // a UTF-8 byte order mark
      size_t released = 0;
      for (size_t at = pos_; at < all.size();) {  // the pre-pass: N, for the val choice
        const size_t nl = std::min(all.find('\n', at), all.size());
        n_ += !text::jsonl_blank(all.substr(at, nl - at));
        at = nl + 1;
        if (at - released > kBatchBytes) release(*jsonl_, released = at);
      }
      release(*jsonl_, all.size());
    } else {
      kind_ = kBrown;
      brown_ = brown_documents(a.brown, &bytes_);
      n_ = brown_.size();
    }
  }
  uint64_t size() const { return n_; }
  uint64_t bytes() const { return bytes_; }
  Kind kind() const { return kind_; }
  bool done() const { return next_ == n_; }
  // The next input is to be streamed alone (then next_batch() is empty).
  bool stream_next() const {
    return kind_ == kInputs && !done() && sizes_[next_] > prepare_tuning.stream_bytes;
  }
  const std::string& input(size_t i) const { return a_.inputs[i]; }
  uint64_t next() const { return next_; }  // the next document's index
  void skip_streamed() { ++next_; }

  // The next documents, up to a batch; the views stay valid until the next call.
  const std::vector<Job>& next_batch() {
    if (kind_ == kJsonl) release(*jsonl_, pos_);
    jobs_.clear();
    first_ = next_;
    uint64_t bytes = 0;
    while (!done() && jobs_.size() < kBatchDocs && bytes < kBatchBytes && !stream_next()) {
      Job j;
      if (kind_ == kInputs) {
        j.input = next_;
        bytes += sizes_[next_];
      } else if (kind_ == kBrown) {
        j.text = brown_[next_];
        bytes += j.text.size();
      } else {
        const std::string_view all = view();
        for (;;) {  // the next non-blank line (the pre-pass counted them)
          const size_t nl = std::min(all.find('\n', pos_), all.size());
          j.text = all.substr(pos_, nl - pos_);
          j.line = ++line_;
          pos_ = nl + 1;
          if (!text::jsonl_blank(j.text)) break;
        }
        bytes += j.text.size();
      }
      jobs_.push_back(j);
      ++next_;
    }
    return jobs_;
  }
  uint64_t first() const { return first_; }  // the batch's first document

 private:
  std::string_view view() const {
    return {reinterpret_cast<const char*>(jsonl_->data()), jsonl_->size()};
  }
  const PrepareArgs& a_;
  Kind kind_;
  uint64_t n_ = 0, bytes_ = 0, next_ = 0, first_ = 0;
  std::vector<uint64_t> sizes_;
  std::unique_ptr<MappedFile> jsonl_;
  size_t pos_ = 0;
  uint64_t line_ = 0;
  std::vector<std::string> brown_;
  std::vector<Job> jobs_;
};

}  // namespace

int prepare(const PrepareArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  if (a.tokenizer.empty()) throw Error("give --tokenizer FILE (a tokenizer.json)");
  if (a.out.empty()) throw Error("give --out DIR, the folder to write the shards into");
  if (!a.inputs.empty() + !a.jsonl.empty() + !a.brown.empty() != 1)
    throw Error("give exactly one source of documents: input files, --jsonl FILE or --brown DIR");
  if (!(a.val_fraction >= 0 && a.val_fraction < 1))
    throw Error("--val-fraction must be in [0, 1), not " + std::to_string(a.val_fraction));
  if (a.shard_tokens < 1 || a.shard_tokens > kMaxShardTokens)
    throw Error("--shard-tokens must be 1.." + std::to_string(kMaxShardTokens) + ", not " +
                std::to_string(a.shard_tokens));
  if (a.threads < 0) throw Error("--threads must be 0 (all) or more");
  OutputFolder::check_free(a.out);  // before the work; again before the rename

  const text::Tokenizer tok = text::Tokenizer::load(a.tokenizer);
  const std::optional<uint32_t> eos = tok.end_of_text();
  if (!eos)
    throw Error(a.tokenizer + " has no end-of-text token (<|endoftext|>, <|end_of_text|>, " +
                "</s> or <eos>): use a tokenizer that has one");
  ShardMeta meta;
  meta.tokenizer_path = absolute(a.tokenizer);
  meta.tokenizer_sha256 = sha256_file(a.tokenizer);
  meta.vocab_size = tok.vocab_size();
  meta.eos_id = *eos;
  meta.val_fraction = a.val_fraction;
  meta.seed = a.seed;
  meta.shard_tokens = a.shard_tokens;
  meta.command = a.command_line;

  Documents docs(a);
  const uint64_t n = docs.size();
  if (n == 0)
    throw Error(std::string(docs.kind() == Documents::kJsonl ? a.jsonl : "the input") +
                " has no documents: give some text");
  std::vector<bool> is_val(n);
  for (uint64_t d : val_documents(n, a.val_fraction, a.seed)) is_val[d] = true;
  const int threads = a.threads ? a.threads : omp_get_max_threads();

  OutputFolder out(a.out);
  SplitWriter split[2] = {{out, 0, a.shard_tokens}, {out, 1, a.shard_tokens}};
  uint64_t text_tokens = 0;
  std::vector<std::vector<uint32_t>> ids;
  std::vector<std::exception_ptr> errs;
  while (!docs.done()) {
    if (docs.stream_next()) {
      const uint64_t doc = docs.next();
      SplitWriter& w = split[is_val[doc]];
      ++w.meta.documents;
      const MappedFile f(docs.input(doc));
      uint64_t got = 0;
      text::StreamEncoder enc(tok, [&](const uint32_t* p, size_t m) {
        w.append(p, m);
        got += m;
      });
      constexpr size_t kPiece = 16 << 20;
      for (size_t at = 0; at < f.size(); at += kPiece) {
        enc.feed({reinterpret_cast<const char*>(f.data()) + at, std::min(kPiece, f.size() - at)});
        release(f, at);
      }
      enc.finish();
      if (got) w.append(&*eos, 1);
      text_tokens += got;
      docs.skip_streamed();
      continue;
    }
    const std::vector<Job>& jobs = docs.next_batch();
    ids.resize(std::max(ids.size(), jobs.size()));
    errs.assign(jobs.size(), nullptr);
    const Documents::Kind kind = docs.kind();
#pragma omp parallel for schedule(dynamic) num_threads(threads)
    for (size_t i = 0; i < jobs.size(); ++i) {
      try {
        ids[i].clear();
        if (kind == Documents::kInputs) {
          const MappedFile f(docs.input(jobs[i].input));
          tok.encode({reinterpret_cast<const char*>(f.data()), f.size()}, ids[i]);
        } else if (kind == Documents::kJsonl) {
          const std::string where = a.jsonl + " line " + std::to_string(jobs[i].line);
          tok.encode(*text::jsonl_text(jobs[i].text, where), ids[i]);  // (never a blank line)
        } else {
          tok.encode(jobs[i].text, ids[i]);
        }
      } catch (...) {
        errs[i] = std::current_exception();
      }
    }
    for (size_t i = 0; i < jobs.size(); ++i) {  // in document order: the first failure
      if (errs[i]) std::rethrow_exception(errs[i]);
      SplitWriter& w = split[is_val[docs.first() + i]];
      ++w.meta.documents;
      if (ids[i].empty()) continue;
      w.append(ids[i].data(), ids[i].size());
      w.append(&*eos, 1);
      text_tokens += ids[i].size();
    }
  }
  if (text_tokens == 0)
    throw Error("the " + with_commas(int64_t(n)) + " documents have no tokens: give some text");
  split[0].finish(), split[1].finish();
  meta.train = split[0].meta;
  meta.val = split[1].meta;
  out.finished_meta();
  write_meta(out.tmp(), meta);
  out.commit();

  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "prepare: %s documents, %s tokens, %.1f MB of input in %.2f s (%.1f MB/s, %d "
      "threads)\n",
      with_commas(int64_t(n)).c_str(),
      with_commas(int64_t(meta.train.tokens + meta.val.tokens)).c_str(), double(docs.bytes()) / 1e6,
      secs, double(docs.bytes()) / 1e6 / std::max(secs, 1e-9), threads);
  for (int s = 0; s < 2; ++s) {
    const SplitMeta& m = s ? meta.val : meta.train;
    std::printf("  %-5s %s documents, %s tokens, %zu shard%s\n", kSplits[s],
                with_commas(int64_t(m.documents)).c_str(), with_commas(int64_t(m.tokens)).c_str(),
                m.shards.size(), m.shards.size() == 1 ? "" : "s");
  }
  std::printf("wrote %s (meta.json and %zu shards)\n", a.out.c_str(),
              meta.train.shards.size() + meta.val.shards.size());
  std::fflush(stdout);
  return 0;
}

}  // namespace tq::data
