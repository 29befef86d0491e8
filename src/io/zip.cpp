#include "io/zip.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>

#include "core/common.h"

namespace tq {
namespace {

constexpr uint64_t kMax32 = 0xFFFFFFFFull;

struct Bytes {
  std::string b;
  void u16(uint32_t v) { b.push_back(char(v & 0xff)), b.push_back(char((v >> 8) & 0xff)); }
  void u32(uint64_t v) { u16(uint32_t(v & 0xffff)), u16(uint32_t((v >> 16) & 0xffff)); }
  void u64(uint64_t v) { u32(v & kMax32), u32(v >> 32); }
  void str(const std::string& s) { b += s; }
};

uint64_t rd(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

// crc (of the bytes before) continued over n more
static uint32_t crc32_more(uint32_t crc, const void* data, uint64_t n) {
  uLong c = crc;
  const Bytef* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<uint64_t>(n, 1u << 30));
    c = crc32(c, p, chunk);
    p += chunk, n -= chunk;
  }
  return static_cast<uint32_t>(c);
}
uint32_t crc32_of(const void* data, uint64_t n) {
  return crc32_more(0, data, n);
}

void ZipWriter::add(const std::string& name, const void* data, uint64_t n) {
  add(name, n, [&](const ByteSink& emit) { emit(data, n); });
}

void ZipWriter::add(const std::string& name, uint64_t n, const Fill& fill) {
  const uint64_t off = out_.offset();
  const bool z64 = n >= kMax32;
  Bytes h;
  h.u32(0x04034b50);
  h.u16(z64 ? 45 : 20);
  h.u16(0);               // flags
  h.u16(0);               // stored
  h.u16(0), h.u16(0x21);  // time, date 1980-01-01
  h.u32(0);               // CRC-32: patched below
  h.u32(z64 ? kMax32 : n);
  h.u32(z64 ? kMax32 : n);
  h.u16(uint32_t(name.size()));
  const uint64_t before_pad = off + 30 + name.size() + (z64 ? 20 : 0) + 4;
  const uint32_t pad = uint32_t((64 - before_pad % 64) % 64);
  h.u16((z64 ? 20 : 0) + 4 + pad);
  h.str(name);
  if (z64) h.u16(1), h.u16(16), h.u64(n), h.u64(n);
  h.u16(0x4246), h.u16(pad), h.str(std::string(pad, 'Z'));  // torch's alignment field
  out_.write(h.b.data(), h.b.size());
  uint32_t crc = 0;
  out_.write_fill(n, fill, "zip record " + name,
                  [&](const void* p, size_t m) { crc = crc32_more(crc, p, m); });
  Bytes c;
  c.u32(crc);
  out_.patch(off + 14, c.b.data(), 4);
  entries_.push_back({name, crc, n, off});
}

void ZipWriter::finish() {
  const uint64_t cd_start = out_.offset();
  Bytes cd;
  for (const Entry& e : entries_) {
    Bytes x;  // zip64 extra: only the saturated fields, in order
    if (e.size >= kMax32) x.u64(e.size), x.u64(e.size);
    if (e.offset >= kMax32) x.u64(e.offset);
    const bool z64 = !x.b.empty();
    cd.u32(0x02014b50);
    cd.u16(z64 ? 45 : 20), cd.u16(z64 ? 45 : 20);
    cd.u16(0), cd.u16(0), cd.u16(0), cd.u16(0x21);
    cd.u32(e.crc);
    cd.u32(std::min(e.size, kMax32)), cd.u32(std::min(e.size, kMax32));
    cd.u16(uint32_t(e.name.size()));
    cd.u16(z64 ? uint32_t(4 + x.b.size()) : 0);
    cd.u16(0), cd.u16(0), cd.u16(0), cd.u32(0);
    cd.u32(std::min(e.offset, kMax32));
    cd.str(e.name);
    if (z64) cd.u16(1), cd.u16(uint32_t(x.b.size())), cd.str(x.b);
  }
  out_.write(cd.b.data(), cd.b.size());
  const uint64_t cd_size = cd.b.size(), count = entries_.size();
  Bytes end;
  if (count >= 0xFFFF || cd_start >= kMax32 || cd_size >= kMax32) {
    const uint64_t z64_at = out_.offset();
    end.u32(0x06064b50), end.u64(44), end.u16(45), end.u16(45), end.u32(0), end.u32(0);
    end.u64(count), end.u64(count), end.u64(cd_size), end.u64(cd_start);
    end.u32(0x07064b50), end.u32(0), end.u64(z64_at), end.u32(1);
  }
  end.u32(0x06054b50), end.u16(0), end.u16(0);
  end.u16(uint32_t(std::min<uint64_t>(count, 0xFFFF))),
      end.u16(uint32_t(std::min<uint64_t>(count, 0xFFFF)));
  end.u32(std::min(cd_size, kMax32)), end.u32(std::min(cd_start, kMax32)), end.u16(0);
  out_.write(end.b.data(), end.b.size());
}

ZipReader::ZipReader(const MappedFile& f) : file_(f) {
  const uint8_t* d = f.data();
  const uint64_t size = f.size();
  const std::string where = f.path() + ": ";
  if (size < 22) throw Error(where + "not a zip archive (too short)");
  // classic end record within the last 65,557 bytes
  int64_t eocd = -1;
  for (int64_t p = int64_t(size) - 22; p >= 0 && p >= int64_t(size) - 65557; --p)
    if (rd(d + p, 4) == 0x06054b50) {
      eocd = p;
      break;
    }
  if (eocd < 0) throw Error(where + "not a zip archive (no end of central directory; truncated?)");
  uint64_t count = rd(d + eocd + 10, 2), cd_size = rd(d + eocd + 12, 4),
           cd_off = rd(d + eocd + 16, 4);
  if (eocd >= 20 && rd(d + eocd - 20, 4) == 0x07064b50) {
    const uint64_t z = rd(d + eocd - 20 + 8, 8);
    if (z > size || size - z < 56 || rd(d + z, 4) != 0x06064b50)
      throw Error(where + "corrupt zip64 end record");
    count = rd(d + z + 32, 8), cd_size = rd(d + z + 40, 8), cd_off = rd(d + z + 48, 8);
  }
  if (cd_off > size || cd_size > size - cd_off)
    throw Error(where + "central directory out of bounds (truncated file?)");
  uint64_t p = cd_off;
  const uint64_t cd_end = cd_off + cd_size;
  for (uint64_t i = 0; i < count; ++i) {
    if (cd_end - p < 46 || rd(d + p, 4) != 0x02014b50)
      throw Error(where + "corrupt central directory entry " + std::to_string(i));
    const uint32_t method = uint32_t(rd(d + p + 10, 2));
    uint64_t csize = rd(d + p + 20, 4), usize = rd(d + p + 24, 4), loff = rd(d + p + 42, 4);
    const uint64_t nlen = rd(d + p + 28, 2), xlen = rd(d + p + 30, 2), clen = rd(d + p + 32, 2);
    if (cd_end - p - 46 < nlen + xlen + clen) throw Error(where + "corrupt central directory");
    std::string name(reinterpret_cast<const char*>(d + p + 46), nlen);
    for (uint64_t x = p + 46 + nlen; x + 4 <= p + 46 + nlen + xlen;) {
      const uint64_t id = rd(d + x, 2), len = rd(d + x + 2, 2);
      if (x + 4 + len > p + 46 + nlen + xlen) throw Error(where + "corrupt zip extra field");
      if (id == 1) {
        uint64_t q = x + 4;
        auto take = [&](uint64_t& v) {
          if (v != kMax32) return;
          if (q + 8 > x + 4 + len) throw Error(where + "corrupt zip64 extra field");
          v = rd(d + q, 8), q += 8;
        };
        take(usize), take(csize), take(loff);
      }
      x += 4 + len;
    }
    if (method != 0 || csize != usize)
      throw Error(where + "entry " + name + " is compressed; only stored entries are supported");
    if (loff > size || size - loff < 30 || rd(d + loff, 4) != 0x04034b50)
      throw Error(where + "local header of " + name + " out of bounds or corrupt");
    const uint64_t data = loff + 30 + rd(d + loff + 26, 2) + rd(d + loff + 28, 2);
    if (data > size || size - data < usize)
      throw Error(where + "entry " + name + " runs past the end of the file (truncated?)");
    const uint32_t crc = uint32_t(rd(d + p + 16, 4));
    if (!entries_.emplace(name, ZipEntry{data, usize, crc}).second)
      throw Error(where + "duplicate zip entry " + name);
    order_.push_back(name);
    p += 46 + nlen + xlen + clen;
  }
}

void ZipReader::verify_crcs() const {
  // in pieces of at most 32 MiB, summed on every thread, then combined record by record
  constexpr uint64_t kPiece = 32u << 20;
  struct Piece {
    const std::string* name;
    const ZipEntry* e;
    uint64_t off, n;
  };
  std::vector<Piece> pieces;
  for (const std::string& name : order_) {
    const ZipEntry& e = entries_.at(name);
    if (e.crc == 0) continue;
    for (uint64_t off = 0; off == 0 || off < e.size; off += kPiece)
      pieces.push_back({&name, &e, off, std::min(kPiece, e.size - off)});
  }
  std::vector<uint32_t> crc(pieces.size());
#pragma omp parallel for schedule(dynamic)
  for (size_t i = 0; i < pieces.size(); ++i)
    crc[i] = crc32_of(data(*pieces[i].e) + pieces[i].off, pieces[i].n);
  for (size_t i = 0; i < pieces.size();) {
    const ZipEntry& e = *pieces[i].e;
    const std::string& name = *pieces[i].name;
    uLong sum = crc[i++];
    for (; i < pieces.size() && pieces[i].e == &e; ++i)
      sum = crc32_combine64(sum, crc[i], z_off64_t(pieces[i].n));
    if (uint32_t(sum) == e.crc) continue;
    char hex[64];
    std::snprintf(hex, sizeof hex, "(recorded %08x, data %08x)", e.crc, unsigned(uint32_t(sum)));
    throw Error(file_.path() + ": record " + name + " fails its CRC-32 check " + hex +
                ": the file is corrupt (a damaged copy or disk); copy or save it again");
  }
}

const ZipEntry& ZipReader::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw Error(file_.path() + ": missing record " + name);
  return it->second;
}

}  // namespace tq
