// .pt writer and reader: exact bytes for the spec's example, round trips, and hostile files.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>

#include "io/checkpoint.h"
#include "io/model_file.h"
#include "model/init.h"
#include "testing.h"

namespace tq {
namespace {

using test::exists;
using test::read_all;
using test::tmp_path;
using test::write_all;

// A child writes a file through AtomicFile and stops mid-write; the parent sees the
// temporary, then signals the child: the handler must remove it and end the child by that
// signal. A signal ignored from the start (nohup) stays ignored, and the file is completed.
// A child that runs write() with the signal handlers set, then waits to be signalled; its pid
// once write() has returned (-1 if it could not start).
pid_t paused_writer(const std::function<void()>& write_part) {
  int ready[2];
  if (pipe(ready) != 0) return -1;
  const pid_t child = fork();
  if (child == 0) {
    remove_temporaries_on_signals();
    write_part();
    (void)!write(ready[1], "x", 1);
    for (;;) pause();
  }
  char c;
  const bool started = child > 0 && read(ready[0], &c, 1) == 1;
  close(ready[0]), close(ready[1]);
  return started ? child : -1;
}

TEST(AtomicFile, SignalsRemoveTheTemporary) {
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    const std::string path = tmp_path("sig.pt");
    const pid_t child = paused_writer([&] {
      AtomicFile* f = new AtomicFile(path);  // (left open: the child ends by the signal)
      f->write("partial", 7);
    });
    ASSERT_GT(child, 0);
    const std::string tmp = path + ".tmp." + std::to_string(child);
    EXPECT_TRUE(exists(tmp));
    kill(child, sig);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << "signal " << sig;
    EXPECT_FALSE(exists(tmp)) << "signal " << sig;
    EXPECT_FALSE(exists(path));
  }
  const std::string path = tmp_path("nohup.pt");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::signal(SIGHUP, SIG_IGN);
    remove_temporaries_on_signals();
    AtomicFile f(path);
    f.write("whole", 5);
    raise(SIGHUP);
    f.commit();
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(read_all(path), "whole");
  std::remove(path.c_str());
}

// The same with a folder made for the file (an export's): the signal removes the temporary,
// then the folder; a folder kept, or not empty, stays.
TEST(TemporaryFolder, SignalsRemoveItOnceEmpty) {
  const std::string folder = tmp_path("sig_folder");
  const pid_t child = paused_writer([&] {
    if (mkdir(folder.c_str(), 0777) != 0) _exit(1);
    new TemporaryFolder(folder);  // (left listed: the child ends by the signal)
    AtomicFile* f = new AtomicFile(folder + "/model.safetensors");
    f->write("partial", 7);
  });
  ASSERT_GT(child, 0);
  EXPECT_TRUE(exists(folder + "/model.safetensors.tmp." + std::to_string(child)));
  kill(child, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
  EXPECT_FALSE(exists(folder));
  ASSERT_EQ(mkdir(folder.c_str(), 0777), 0);
  {
    TemporaryFolder kept(folder);
    kept.keep();
  }
  EXPECT_TRUE(exists(folder));
  write_all(folder + "/x", "x");
  { TemporaryFolder full(folder); }
  EXPECT_TRUE(exists(folder + "/x"));
  std::remove((folder + "/x").c_str());
  rmdir(folder.c_str());
}

TEST(Pickle, SpecWorkedExampleIsByteExact) {
  TensorRef t;
  t.key = "0", t.storage = "FloatStorage", t.storage_numel = 2;
  ValuePtr d = v_dict();
  dict_set(*d, "w", v_tensor(full_view(t, {2})));
  const std::string hex =
      "80027d2858010000007763746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a2828"
      "580700000073746f72616765637"
      "46f7263680a466c6f617453746f726167650a5801000000305803000000637075"
      "4b0274514b004b02854b0185896363"
      "6f6c6c656374696f6e730a4f726465726564446963740a295274527"
      "52e";
  std::string expect;
  for (size_t i = 0; i < hex.size(); i += 2)
    expect.push_back(char(std::stoi(hex.substr(i, 2), nullptr, 16)));
  EXPECT_EQ(pickle_dumps(*d), expect);
}

TEST(Pickle, ValuesRoundTrip) {
  ValuePtr d = v_dict(true);
  const std::vector<int64_t> ints = {0,
                                     255,
                                     256,
                                     65535,
                                     65536,
                                     -1,
                                     -7,
                                     INT32_MIN,
                                     INT32_MAX,
                                     int64_t(1) << 31,
                                     int64_t(1) << 40,
                                     -(int64_t(1) << 40),
                                     INT64_MAX,
                                     INT64_MIN};
  std::vector<ValuePtr> items;
  for (int64_t i : ints) items.push_back(v_int(i));
  dict_set(*d, "ints", v_list(items));
  dict_set(*d, "f", v_float(7.735438123456789));
  dict_set(*d, "neg", v_float(-0.0));
  dict_set(*d, "s", v_str("ünïcode"));
  dict_set(*d, "empty", v_str(""));
  dict_set(*d, "t", v_bool(true));
  dict_set(*d, "n", v_none());
  dict_set(*d, "nested", v_dict());
  const std::string bytes = pickle_dumps(*d);
  ValuePtr r = pickle_loads(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  ASSERT_EQ(r->kind, Value::Dict);
  EXPECT_TRUE(r->ordered);
  const Value* li = r->get("ints");
  ASSERT_TRUE(li);
  ASSERT_EQ(li->items.size(), ints.size());
  for (size_t i = 0; i < ints.size(); ++i) EXPECT_EQ(li->items[i]->i, ints[i]);
  EXPECT_EQ(r->get("f")->f, 7.735438123456789);
  EXPECT_TRUE(std::signbit(r->get("neg")->f));
  EXPECT_EQ(r->get("s")->s, "ünïcode");
  EXPECT_EQ(r->get("empty")->s, "");
  EXPECT_TRUE(r->get("t")->b);
  EXPECT_EQ(r->get("n")->kind, Value::None);
  EXPECT_EQ(r->get("nested")->kind, Value::Dict);
}

TEST(Pickle, RejectsHostileStreams) {
  const std::vector<std::string> bad = {
      "",                // empty
      "\x80\x02",        // no STOP
      "\x80\x02.",       // STOP on an empty stack
      "\x80\x04K\x01.",  // protocol 4
      "\x80\x02"
      "cos\nsystem\n.",  // forbidden global
      "\x80\x02"
      "X\xff\xff\xff\x7f",     // string longer than the data
      "\x80\x02h\x05.",        // memo never stored
      "\x80\x02K\x01K\x02u.",  // SETITEMS without MARK
      "\x80\x02]K\x01s.",      // SETITEM on a list
      "\x80\x02"
      "\x8a\x09"
      "123456789.",           // int beyond 64 bits
      "\x80\x02(t(K\x01tQ.",  // bad persistent id
      "\x80\x02\x95.",        // FRAME opcode
  };
  for (const std::string& s : bad)
    EXPECT_THROW(pickle_loads(reinterpret_cast<const uint8_t*>(s.data()), s.size()), Error) << s;
}

// A tensor longer than kEncodePiece is read from the arena and emitted by pieces of at most
// kEncodePiece values, in order: the same bytes, and no piece (nor copy) of the whole tensor.
// Limits the format itself lacks: nesting (a checkpoint is a few levels deep; a tree millions
// deep would overflow the stack of any recursive walk, and of its own destruction) and
// containers that hold themselves (the memo can build them; they could never be freed, and
// the sanitizer build's leak check would see it).
template <size_t N>
std::string bytes(const char (&a)[N]) {  // a literal's bytes, NULs included
  return std::string(a, N - 1);
}

TEST(Pickle, RefusesDeepNestingAndCyclesAndFreesEverything) {
  const auto tuples = [](int depth) {  // None in `depth` one-item tuples
    return "\x80\x02N" + std::string(size_t(depth), '\x85') + ".";
  };
  ASSERT_NO_THROW(pickle_loads(reinterpret_cast<const uint8_t*>(tuples(kMaxPickleDepth).data()),
                               tuples(kMaxPickleDepth).size()));
  const std::vector<std::pair<std::string, std::string>> bad = {
      {tuples(kMaxPickleDepth + 1), "nested deeper than 100 levels"},
      {tuples(2'000'000), "nested deeper than 100 levels"},
      {"\x80\x02" + std::string(300'000, '(') + std::string(300'000, 't') + ".",
       "nested deeper than 100 levels"},
      {bytes("\x80\x02]q\x00h\x00"
             "a."),
       "holds itself"},  // a list in itself
      {bytes("\x80\x02}q\x00X\x01\x00\x00\x00"
             "ah\x00s."),
       "holds itself"},
      {bytes("\x80\x02]q\x00]q\x01h\x00"
             "aah\x01."),
       "holds itself"},  // two lists
      {bytes("\x80\x02]q\x00h\x00"
             "a"),
       "unexpected end"},  // a cycle, then cut off
  };
  for (const auto& [pk, why] : bad) {
    try {
      pickle_loads(reinterpret_cast<const uint8_t*>(pk.data()), pk.size());
      ADD_FAILURE() << "accepted: " << why;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
  // A cycle left behind on the stack, not in the result: loaded, and the cycle freed.
  const std::string garbage(
      "\x80\x02]q\x00h\x00"
      "aN.",
      10);
  const ValuePtr r = pickle_loads(reinterpret_cast<const uint8_t*>(garbage.data()), garbage.size());
  EXPECT_EQ(r->kind, Value::None);
  // A shared (not cyclic) container is fine: the same list twice in a tuple.
  const std::string shared(
      "\x80\x02]q\x00K\x01"
      "ah\x00\x86.",
      12);
  const ValuePtr t = pickle_loads(reinterpret_cast<const uint8_t*>(shared.data()), shared.size());
  ASSERT_EQ(t->items.size(), 2u);
  EXPECT_EQ(t->items[0].get(), t->items[1].get());
}

TEST(Checkpoint, EncodesLargeTensorsByPieces) {
  //          name   V      C    L  H  KVH D  F   ctx theta tied   eps
  const Config c{"big", 42001, 100, 1, 2, 1, 8, 16, 64, 1e4, false, 1e-6f};
  const ParamLayout p = make_layout(c);
  std::vector<float> w(p.total);
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(i % 1000003) * 1e-3f - 7.0f;
  for (const StateEntry& e : state_dict_entries(c, p)) {
    if (e.key != "tok_embeddings.weight") continue;
    const size_t n = size_t(c.V * c.C);
    ASSERT_GT(n, kEncodePiece);
    size_t longest = 0;
    const ParamReader whole = arena_reader(w.data());
    const ParamReader read = [&](size_t off, size_t m, float* out) {
      longest = std::max(longest, m);
      whole(off, m, out);
    };
    for (DType dt : {DType::f32, DType::bf16}) {
      std::vector<uint8_t> out;
      size_t pieces = 0, biggest = 0;
      encode_entry(
          [&](const void* p, size_t m) {
            out.insert(out.end(), static_cast<const uint8_t*>(p),
                       static_cast<const uint8_t*>(p) + m);
            ++pieces, biggest = std::max(biggest, m);
          },
          c, e, read, dt);
      ASSERT_EQ(out.size(), n * dtype_size(dt));
      EXPECT_EQ(pieces, (n + kEncodePiece - 1) / kEncodePiece);
      EXPECT_EQ(biggest, kEncodePiece * dtype_size(dt));
      for (size_t i = 0; i < n; i = i + 9973 < n || i == n - 1 ? i + 9973 : n - 1) {
        float v;
        if (dt == DType::f32) {
          std::memcpy(&v, out.data() + 4 * i, 4);
          ASSERT_EQ(v, w[p.tok_emb + i]) << i;
        } else {
          uint16_t h;
          std::memcpy(&h, out.data() + 2 * i, 2);
          ASSERT_EQ(h, f32_to_bf16(w[p.tok_emb + i])) << i;
        }
      }
    }
    EXPECT_EQ(longest, kEncodePiece);
  }
}

// A record written by pieces (its CRC-32 patched into its header afterwards) is the same file,
// byte for byte, as the record written whole; a fill that emits other than the record's size
// is an error, and leaves no file behind.
TEST(Zip, RecordsWrittenByPiecesAreTheRecordsWrittenWhole) {
  std::string data(300007, '\0');
  std::mt19937 rng(7);
  for (char& ch : data) ch = char(rng());
  const auto write = [&](const std::string& path, int how) {
    AtomicFile f(path);
    ZipWriter zip(f);
    zip.add("archive/a", "x", 1);
    if (how == 0) {
      zip.add("archive/data/0", data.data(), data.size());
    } else {
      const uint64_t declared = data.size() + (how == 2 ? 1 : how == 3 ? -1 : 0);
      zip.add("archive/data/0", declared, [&](const ByteSink& emit) {
        for (size_t i = 0; i < data.size(); i += 4093)
          emit(data.data() + i, std::min<size_t>(4093, data.size() - i));
      });
    }
    zip.add("archive/b", "yz", 2);
    zip.finish();
    f.commit();
  };
  const std::string whole = tmp_path("whole.zip"), pieces = tmp_path("pieces.zip");
  write(whole, 0);
  write(pieces, 1);
  EXPECT_EQ(read_all(pieces), read_all(whole));
  {  // every local header's CRC-32 is its data's (the reader checks the central directory's)
    const std::string z = read_all(pieces);
    const auto u = [&](size_t at, int n) {
      uint64_t v = 0;
      for (int i = n - 1; i >= 0; --i) v = v << 8 | uint8_t(z[at + size_t(i)]);
      return v;
    };
    int records = 0;
    for (size_t at = 0; at + 30 <= z.size() && u(at, 4) == 0x04034b50; ++records) {
      const size_t n = u(at + 18, 4), data = at + 30 + u(at + 26, 2) + u(at + 28, 2);
      ASSERT_LE(data + n, z.size());
      EXPECT_EQ(u(at + 14, 4), crc32_of(z.data() + data, n)) << "record " << records;
      at = data + n;
    }
    EXPECT_EQ(records, 3);
  }
  {
    const MappedFile m(pieces);
    const ZipReader z(m);
    EXPECT_NO_THROW(z.verify_crcs());
    EXPECT_EQ(z.entry("archive/data/0").crc, crc32_of(data.data(), data.size()));
  }
  for (int how : {2, 3}) {  // declared one byte more, one less
    const std::string bad = tmp_path("bad.zip");
    EXPECT_THROW(write(bad, how), Error) << how;
    struct stat st;
    EXPECT_NE(stat(bad.c_str(), &st), 0) << how;
    EXPECT_NE(stat((bad + ".tmp." + std::to_string(getpid())).c_str(), &st), 0) << how;
  }
  std::remove(whole.c_str());
  std::remove(pieces.c_str());
}

class CheckpointRoundTrip : public ::testing::TestWithParam<DType> {};
TEST_P(CheckpointRoundTrip, SavesAndLoadsEveryParameterExactly) {
  const DType dtype = GetParam();
  const Config& c = preset("debugmodel");
  const ParamLayout p = make_layout(c);
  std::vector<float> w(p.total);
  init_params(w.data(), c, p, 5);
  if (dtype == DType::bf16)
    for (float& x : w) x = round_bf16(x);
  TrainRecord rec;
  rec.seq_len = 32, rec.seed = 5, rec.steps = 2, rec.learning_rate = 0.05;
  rec.initial_loss = 7.5, rec.final_loss = 6.25, rec.losses = {7.5, 7.0};
  const std::string path = tmp_path("rt.pt");
  save_checkpoint(path, c, arena_reader(w.data()), dtype, rec);
  EXPECT_FALSE(exists(path + ".tmp." + std::to_string(getpid())));
  const Checkpoint ck = load_checkpoint(path);
  EXPECT_EQ(ck.preset, "debugmodel");
  EXPECT_EQ(ck.dtype, dtype);
  EXPECT_EQ(ck.rec.seq_len, 32);
  EXPECT_EQ(ck.rec.final_loss, 6.25);
  EXPECT_EQ(ck.rec.losses, rec.losses);
  EXPECT_EQ(ck.params, w);  // fused qkv split on save and fused back on load
  // the zip layout: records 64-byte aligned, tied weight stored once (90 storages)
  PtReader pt(path);
  int records = 0;
  for (const std::string& n : pt.zip.names()) {
    EXPECT_EQ(pt.zip.entry(n).offset % 64, 0u) << n;
    records += n.rfind("archive/data/", 0) == 0;
  }
  EXPECT_EQ(records, 90);
  const Value* sd = pt.root->get("model");
  EXPECT_EQ(sd->dict.size(), 91u);
  EXPECT_EQ(sd->get("lm_head.weight")->tensor.key, sd->get("tok_embeddings.weight")->tensor.key);
  std::remove(path.c_str());
}
INSTANTIATE_TEST_SUITE_P(DTypes, CheckpointRoundTrip, ::testing::Values(DType::f32, DType::bf16));

// A small torch-style file holding one tensor view, written through our own writer.
std::string one_tensor_file(const std::string& name, int64_t numel, TensorRef view_patch,
                            bool patch = true) {
  PtWriter w;
  TensorRef t = w.add_storage("FloatStorage", numel, [=](const ByteSink& emit) {
    for (int64_t i = 0; i < numel; ++i) {
      const float x = float(i);
      emit(&x, 4);
    }
  });
  TensorRef v = full_view(t, {numel});
  if (patch) {
    v.offset = view_patch.offset, v.size = view_patch.size, v.stride = view_patch.stride;
    if (view_patch.storage_numel) v.storage_numel = view_patch.storage_numel;
  }
  ValuePtr d = v_dict();
  dict_set(*d, "x", v_tensor(v));
  const std::string path = tmp_path(name);
  w.save(path, *d);
  return path;
}

TEST(PtReader, ReadsStridedViewsAndRejectsOutOfBounds) {
  TensorRef tr;  // transpose-like view of a 3x4 storage: size (4, 3), stride (1, 4)
  tr.offset = 0, tr.size = {4, 3}, tr.stride = {1, 4};
  const std::string ok = one_tensor_file("view.pt", 12, tr);
  PtReader r(ok);
  const std::vector<float> t = r.tensor("x", r.root->get("x"), {4, 3});
  EXPECT_EQ(t, (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  for (size_t b = 0; b <= 12; ++b)  // every range of it, read on its own
    for (size_t n = 0; b + n <= 12; ++n) {
      std::vector<float> part(n, -1.0f);
      r.tensor("x", r.root->get("x"), {4, 3}, b, n, part.data());
      EXPECT_TRUE(std::equal(part.begin(), part.end(), t.begin() + b)) << b << " +" << n;
    }
  float one;
  EXPECT_THROW(r.tensor("x", r.root->get("x"), {4, 3}, 12, 1, &one), Error);  // past the end
  EXPECT_THROW(r.tensor("x", r.root->get("x"), {3, 4}), Error);               // wrong shape
  std::remove(ok.c_str());

  TensorRef past;  // view runs past the storage
  past.offset = 5, past.size = {8}, past.stride = {1};
  TensorRef huge;  // overflowing strides
  huge.offset = 0, huge.size = {2, 2}, huge.stride = {INT64_MAX / 2, 1};
  TensorRef neg;
  neg.offset = -1, neg.size = {2}, neg.stride = {1};
  TensorRef lie;  // claims more elements than the record holds
  lie.offset = 0, lie.size = {4}, lie.stride = {1}, lie.storage_numel = 1000;
  for (const auto& [name, view] : std::vector<std::pair<std::string, TensorRef>>{
           {"past", past}, {"huge", huge}, {"neg", neg}, {"lie", lie}}) {
    const std::string path = one_tensor_file(name + ".pt", 12, view);
    PtReader rr(path);
    EXPECT_THROW(rr.tensor("x", rr.root->get("x"), view.size), Error) << name;
    std::remove(path.c_str());
  }
}

TEST(PtReader, RejectsForeignTruncatedAndCorruptFiles) {
  const Config& c = preset("debugmodel");
  std::vector<float> w(make_layout(c).total, 0.5f);
  TrainRecord rec;
  rec.seq_len = 32;
  const std::string good = tmp_path("good.pt");
  save_checkpoint(good, c, arena_reader(w.data()), DType::bf16, rec);
  const std::string bytes = read_all(good);
  const std::string bad = tmp_path("bad.pt");
  auto rejects = [&](const std::string& data, const std::string& what) {
    write_all(bad, data);
    EXPECT_THROW(load_checkpoint(bad), Error) << what;
  };
  rejects("", "empty file");
  rejects("hello world, not a checkpoint", "text");
  rejects(std::string("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", 15) + "xxxx",
          "legacy format");
  rejects("PYTORCH1" + std::string(100, '\0'), "preview format");
  for (size_t cut : {size_t(4), size_t(100), bytes.size() / 2, bytes.size() - 30, bytes.size() - 1})
    rejects(bytes.substr(0, cut), "truncated at " + std::to_string(cut));
  EXPECT_THROW(load_checkpoint(tmp_path("does-not-exist.pt")), Error);
  // random corruption of a small file must never crash (ASan/UBSan builds check the reads)
  TensorRef none;
  const std::string small = one_tensor_file("small.pt", 40, none, false);
  const std::string sb = read_all(small);
  std::mt19937 rng(1);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string m = sb;
    for (int k = 0; k < 1 + trial % 4; ++k) m[rng() % m.size()] = char(rng());
    write_all(bad, m);
    try {
      PtReader r(bad, trial % 2 == 0);  // half past the CRC check, into the parser
      if (const Value* x = r.root->get("x")) r.tensor("x", x, x->tensor.size);
    } catch (const Error&) {
    }
  }
  std::remove(small.c_str());
  std::remove(good.c_str());
  std::remove(bad.c_str());
}

uint32_t get32(const std::string& b, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | uint8_t(b[at + i]);
  return v;
}
// The CRC-32 fields of every record (central directory and local header) set to 0, as torch
// 2.x writes them under torch.serialization.set_crc32_options(False).
std::string without_crcs(std::string b) {
  size_t eocd = b.rfind(std::string("PK\x05\x06", 4));
  EXPECT_NE(eocd, std::string::npos);
  const size_t count = get32(b, eocd + 10) & 0xffff;
  size_t p = get32(b, eocd + 16);
  for (size_t i = 0; i < count; ++i) {
    EXPECT_EQ(get32(b, p), 0x02014b50u);
    const size_t local = get32(b, p + 42);
    b.replace(p + 16, 4, 4, '\0');
    b.replace(local + 14, 4, 4, '\0');
    p += 46 + (get32(b, p + 28) & 0xffff) + (get32(b, p + 30) & 0xffff) +
         (get32(b, p + 32) & 0xffff);
  }
  return b;
}

TEST(PtReader, ChecksEveryRecordAgainstItsCrc) {
  // 9M floats: a 36 MB record, summed in two pieces and combined
  constexpr int64_t n = 9'000'000;
  TensorRef none;
  const std::string path = one_tensor_file("crc.pt", n, none, false);
  const std::string good = read_all(path);
  ZipEntry data, pe;
  {
    PtReader r(path);
    const std::vector<float> x = r.tensor("x", r.root->get("x"), {n});
    EXPECT_EQ(x[n - 1], float(n - 1));
    data = r.zip.entry("archive/data/0"), pe = r.zip.entry("archive/data.pkl");
  }
  const auto rejected = [&](const std::string& bytes, const std::string& record) {
    write_all(path, bytes);
    try {
      PtReader r(path);
      ADD_FAILURE() << "corrupt " << record << " accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("record " + record + " fails its CRC-32 check"), std::string::npos) << m;
    }
  };
  for (uint64_t at : {data.offset, data.offset + data.size / 2, data.offset + data.size - 1}) {
    std::string b = good;
    b[at] = char(b[at] ^ 0x10);  // one bit of one float, in each piece
    rejected(b, "archive/data/0");
    // the same damage where no CRC was recorded loads (nothing to check it against) ...
    write_all(path, without_crcs(b));
    EXPECT_NO_THROW(PtReader r(path));
    // ... as it does with the check turned off
    write_all(path, b);
    EXPECT_NO_THROW(PtReader r(path, false));
  }
  std::string pkl = good;
  pkl[pe.offset + pe.size / 2] = char(pkl[pe.offset + pe.size / 2] ^ 1);
  rejected(pkl, "archive/data.pkl");
  write_all(path, without_crcs(good));
  {
    PtReader r(path);
    EXPECT_EQ(r.tensor("x", r.root->get("x"), {n})[12345], 12345.0f);
  }
  std::remove(path.c_str());
}

TEST(Checkpoint, RejectsMismatchedStateDicts) {
  // a debugmodel state dict relabelled as 0.6B: the first key has the wrong shape
  const Config& c = preset("debugmodel");
  const ParamLayout p = make_layout(c);
  std::vector<float> w(p.total, 0.25f);
  PtWriter wr;
  ValuePtr root = v_dict();
  dict_set(*root, "model", state_dict(wr, c, p, arena_reader(w.data()), DType::f32));
  ValuePtr conf = v_dict();
  dict_set(*conf, "preset", v_str("0.6B"));
  dict_set(*conf, "seq_len", v_int(32));
  dict_set(*root, "config", conf);
  dict_set(*root, "final_loss", v_float(1.0));
  const std::string path = tmp_path("mismatch.pt");
  wr.save(path, *root);
  try {
    load_checkpoint(path);
    FAIL() << "loaded a mismatched checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tok_embeddings.weight: shape [2048, 256] but 0.6B "
                                         "needs [151936, 1024]"),
              std::string::npos)
        << e.what();
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tq

namespace tq {
namespace {

Config small(bool tied) {
  return {"small", 50, 16, 2, 4, 2, 8, 24, 64, 1e4, tied, 1e-6f};
}

// Writes a state dict of cfg's layout (optionally editing it) and loads it back.
// Reads with read_as (default: c).
std::vector<float> state_dict_round_trip(const Config& c, const std::vector<float>& w, DType dt,
                                         const std::function<void(Value&)>& edit = {},
                                         const Config* read_as = nullptr) {
  PtWriter wr;
  ValuePtr root = v_dict();
  dict_set(*root, "model", state_dict(wr, c, make_layout(c), arena_reader(w.data()), dt));
  if (edit) edit(*root->dict[0].second);
  const std::string path = tmp_path("sd.pt");
  wr.save(path, *root);
  const Config& rc = read_as ? *read_as : c;
  std::vector<float> back(make_layout(rc).total);
  try {
    const ModelFile mf = open_model_file(path);
    EXPECT_EQ(mf.dtype, dt);
    load_params(mf, rc, [&](size_t off, const float* x, size_t n) {
      std::copy(x, x + n, back.begin() + ptrdiff_t(off));
    });
  } catch (...) {
    std::remove(path.c_str());
    throw;
  }
  std::remove(path.c_str());
  return back;
}

TEST(StateDict, TiedAndUntiedRoundTripExactly) {
  for (bool tied : {true, false}) {
    const Config c = small(tied);
    const ParamLayout p = make_layout(c);
    std::vector<float> w(p.total);
    for (size_t i = 0; i < w.size(); ++i) w[i] = round_bf16(std::sin(float(i)));
    EXPECT_EQ(state_dict_round_trip(c, w, DType::f32), w) << "tied=" << tied;
    EXPECT_EQ(state_dict_round_trip(c, w, DType::bf16), w) << "tied=" << tied;
    EXPECT_EQ(state_dict_entries(c, p).size(), 3u + 11u * c.L);
  }
}

TEST(StateDict, RejectsMissingExtraAndUntiedEntries) {
  const Config c = small(true);
  std::vector<float> w(make_layout(c).total, 0.5f);
  auto expect_error = [&](const std::function<void(Value&)>& edit, const std::string& what) {
    try {
      state_dict_round_trip(c, w, DType::f32, edit);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error([](Value& sd) { sd.dict.erase(sd.dict.begin() + 5); }, ": missing (small needs it)");
  expect_error([](Value& sd) { dict_set(sd, "extra.weight", v_int(1)); }, "is a int, not a tensor");
  expect_error([](Value& sd) { sd.dict[3].second = v_str("x"); }, "not a tensor");
  // an untied state dict (lm_head its own tensor, other values) read as the tied preset
  const Config untied = small(false);
  std::vector<float> wu(make_layout(untied).total);
  for (size_t i = 0; i < wu.size(); ++i) wu[i] = float(i % 7);
  try {
    state_dict_round_trip(untied, wu, DType::f32, {}, &c);
    ADD_FAILURE() << "accepted an untied lm_head for a tied preset";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head.weight differs from tok_embeddings.weight"),
              std::string::npos)
        << e.what();
  }
}

// Tensors longer than kLoadPiece are read and handed over by pieces: the same values, and a
// tied head stored apart is compared with the embedding piece by piece, to its last value.
TEST(StateDict, LoadsLargeTensorsByPieces) {
  //           name   V      C    L  H  KVH D  F   ctx theta tied eps
  const Config tied{"big", 42001, 100, 1, 2, 1, 8, 16, 64, 1e4, true, 1e-6f};
  Config untied = tied;
  untied.tied = false;
  ASSERT_GT(size_t(tied.V * tied.C), kLoadPiece);
  std::vector<float> w(make_layout(tied).total);
  for (size_t i = 0; i < w.size(); ++i) w[i] = round_bf16(std::sin(float(i)));
  EXPECT_EQ(state_dict_round_trip(tied, w, DType::f32), w);
  EXPECT_EQ(state_dict_round_trip(tied, w, DType::bf16), w);
  // the untied layout with lm_head a copy of the embedding, read as the tied preset
  const ParamLayout pu = make_layout(untied);
  std::vector<float> wu(pu.total);
  for (size_t i = 0; i < wu.size(); ++i) wu[i] = round_bf16(std::cos(float(i)));
  const size_t VC = size_t(tied.V * tied.C);
  std::copy_n(wu.begin() + ptrdiff_t(pu.tok_emb), VC, wu.begin() + ptrdiff_t(pu.lm_head));
  const std::vector<float> back = state_dict_round_trip(untied, wu, DType::f32, {}, &tied);
  const ParamLayout pt = make_layout(tied);
  EXPECT_TRUE(std::equal(back.begin() + ptrdiff_t(pt.tok_emb),
                         back.begin() + ptrdiff_t(pt.tok_emb + VC),
                         wu.begin() + ptrdiff_t(pu.tok_emb)));
  wu[pu.lm_head + VC - 1] += 1.0f;  // the last value of the last piece differs
  EXPECT_THROW(state_dict_round_trip(untied, wu, DType::f32, {}, &tied), Error);
}

}  // namespace
}  // namespace tq
