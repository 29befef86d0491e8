#include "io/pickle.h"

#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>

#include "core/common.h"

namespace tq {

void Value::release_children(std::vector<ValuePtr>& into) {
  for (ValuePtr& x : items) into.push_back(std::move(x));
  for (auto& [k, x] : dict) into.push_back(std::move(k)), into.push_back(std::move(x));
  items.clear();
  dict.clear();
}

Value::~Value() {
  if (items.empty() && dict.empty()) return;
  std::vector<ValuePtr> work;
  release_children(work);
  while (!work.empty()) {
    ValuePtr v = std::move(work.back());
    work.pop_back();
    if (v && v.use_count() == 1) v->release_children(work);  // its last owner: v goes childless
  }
}

const Value* Value::get(const std::string& key) const {
  for (const auto& [k, v] : dict)
    if (k->kind == Str && k->s == key) return v.get();
  return nullptr;
}

ValuePtr v_none() {
  return std::make_shared<Value>(Value::None);
}
ValuePtr v_bool(bool b) {
  auto v = std::make_shared<Value>(Value::Bool);
  v->b = b;
  return v;
}
ValuePtr v_int(int64_t i) {
  auto v = std::make_shared<Value>(Value::Int);
  v->i = i;
  return v;
}
ValuePtr v_float(double f) {
  auto v = std::make_shared<Value>(Value::Float);
  v->f = f;
  return v;
}
ValuePtr v_str(std::string s) {
  auto v = std::make_shared<Value>(Value::Str);
  v->s = std::move(s);
  return v;
}
ValuePtr v_list(std::vector<ValuePtr> items) {
  auto v = std::make_shared<Value>(Value::List);
  v->items = std::move(items);
  return v;
}
ValuePtr v_dict(bool ordered) {
  auto v = std::make_shared<Value>(Value::Dict);
  v->ordered = ordered;
  return v;
}
ValuePtr v_tensor(TensorRef t) {
  auto v = std::make_shared<Value>(Value::Tensor);
  v->tensor = std::move(t);
  return v;
}
void dict_set(Value& d, const std::string& key, ValuePtr v) {
  d.dict.emplace_back(v_str(key), std::move(v));
}

const char* kind_name(Value::Kind k) {
  static const char* names[] = {"None",  "bool", "int",    "float",  "str",    "list",
                                "tuple", "dict", "tensor", "global", "storage"};
  return names[k];
}

size_t storage_element_size(const std::string& s) {
  static const std::map<std::string, size_t> sizes = {
      {"FloatStorage", 4}, {"BFloat16Storage", 2}, {"HalfStorage", 2},  {"DoubleStorage", 8},
      {"LongStorage", 8},  {"IntStorage", 4},      {"ShortStorage", 2}, {"CharStorage", 1},
      {"ByteStorage", 1},  {"BoolStorage", 1}};
  auto it = sizes.find(s);
  return it == sizes.end() ? 0 : it->second;
}

// ---------------------------------------------------------------- writer
namespace {

struct Writer {
  std::string out;
  void op(uint8_t c) { out.push_back(char(c)); }
  void le(uint64_t v, int n) {
    for (int k = 0; k < n; ++k) out.push_back(char((v >> (8 * k)) & 0xff));
  }
  void global(const char* mod, const char* name) {
    op('c');
    out += mod;
    out += '\n';
    out += name;
    out += '\n';
  }
  void integer(int64_t v) {
    if (v >= 0 && v < 256)
      op('K'), le(uint64_t(v), 1);
    else if (v >= 0 && v < 65536)
      op('M'), le(uint64_t(v), 2);
    else if (v >= INT32_MIN && v <= INT32_MAX)
      op('J'), le(uint64_t(uint32_t(int32_t(v))), 4);
    else {  // LONG1, shortest two's complement
      std::string bytes;
      uint64_t u = uint64_t(v);
      for (int k = 0; k < 8; ++k) bytes.push_back(char((u >> (8 * k)) & 0xff));
      while (bytes.size() > 1) {
        const uint8_t last = uint8_t(bytes.back()), prev = uint8_t(bytes[bytes.size() - 2]);
        if ((last == 0 && !(prev & 0x80)) || (last == 0xff && (prev & 0x80)))
          bytes.pop_back();
        else
          break;
      }
      op(0x8a), le(bytes.size(), 1), out += bytes;
    }
  }
  void str(const std::string& s) { op('X'), le(s.size(), 4), out += s; }
  void empty_ordered_dict() { global("collections", "OrderedDict"), op(')'), op('R'); }
  void tuple_of_ints(const std::vector<int64_t>& v) {
    if (v.size() > 3) op('(');
    for (int64_t x : v) integer(x);
    static const uint8_t small[] = {')', 0x85, 0x86, 0x87};
    op(v.size() <= 3 ? small[v.size()] : 't');
  }
  void value(const Value& v) {
    switch (v.kind) {
      case Value::None:
        op('N');
        break;
      case Value::Bool:
        op(v.b ? 0x88 : 0x89);
        break;
      case Value::Int:
        integer(v.i);
        break;
      case Value::Float: {
        uint64_t u;
        std::memcpy(&u, &v.f, 8);
        op('G');
        for (int k = 7; k >= 0; --k) out.push_back(char((u >> (8 * k)) & 0xff));
        break;
      }
      case Value::Str:
        str(v.s);
        break;
      case Value::List:
        op(']');
        if (!v.items.empty()) {
          op('(');
          for (auto& x : v.items) value(*x);
          op('e');
        }
        break;
      case Value::Tuple:  // MARK items TUPLE, or EMPTY_TUPLE
        if (v.items.empty()) {
          op(')');
          break;
        }
        op('(');
        for (auto& x : v.items) value(*x);
        op('t');
        break;
      case Value::Dict:
        if (v.ordered)
          empty_ordered_dict();
        else
          op('}');
        if (!v.dict.empty()) {
          op('(');
          for (auto& [k, x] : v.dict) value(*k), value(*x);
          op('u');
        }
        break;
      case Value::Tensor: {
        const TensorRef& t = v.tensor;
        global("torch._utils", "_rebuild_tensor_v2");
        op('('), op('(');
        str("storage");
        global("torch", t.storage.c_str());
        str(t.key);
        str("cpu");
        integer(t.storage_numel);
        op('t'), op('Q');
        integer(t.offset);
        tuple_of_ints(t.size);
        tuple_of_ints(t.stride);
        op(0x89);
        empty_ordered_dict();
        op('t'), op('R');
        break;
      }
      default:
        throw Error(std::string("cannot pickle a ") + kind_name(v.kind));
    }
  }
};

}  // namespace

std::string pickle_dumps(const Value& v) {
  Writer w;
  w.op(0x80), w.op(2);
  w.value(v);
  w.op('.');
  return w.out;
}

// ---------------------------------------------------------------- reader
namespace {

struct Reader {
  const uint8_t* d;
  size_t n, p = 0;
  std::vector<ValuePtr> stack;
  std::vector<std::vector<ValuePtr>> marks;
  std::map<uint32_t, ValuePtr> memo;
  std::vector<std::weak_ptr<Value>> containers;  // every list, tuple and dict made

  ValuePtr container(Value::Kind k, bool ordered = false) {
    auto v = std::make_shared<Value>(k);
    v->ordered = ordered;
    containers.push_back(v);
    return v;
  }
  // The finished tree must be acyclic and at most kMaxPickleDepth deep (an explicit stack,
  // each shared node visited once).
  void check_tree(const ValuePtr& root) {
    std::unordered_map<const Value*, char> state;  // 1: on the current path, 2: done
    struct Frame {
      const Value* v;
      size_t next;
    };
    std::vector<Frame> path{{root.get(), 0}};
    state[root.get()] = 1;
    while (!path.empty()) {
      Frame& f = path.back();
      const size_t kids = f.v->items.size() + 2 * f.v->dict.size();
      if (f.next == kids) {
        state[f.v] = 2;
        path.pop_back();
        continue;
      }
      const size_t i = f.next++;
      const Value* c = i < f.v->items.size() ? f.v->items[i].get()
                       : (i - f.v->items.size()) % 2 == 0
                           ? f.v->dict[(i - f.v->items.size()) / 2].first.get()
                           : f.v->dict[(i - f.v->items.size()) / 2].second.get();
      if (!c || (c->items.empty() && c->dict.empty())) continue;
      char& st = state[c];
      if (st == 1) fail("a container holds itself (a reference cycle through the memo)");
      if (st == 2) continue;
      if (path.size() >= size_t(kMaxPickleDepth))
        fail("containers nested deeper than " + std::to_string(kMaxPickleDepth) + " levels");
      st = 1;
      path.push_back({c, 0});
    }
  }
  // Empties every container made that `keep`'s tree does not hold (all of them without one), so
  // that no cycle among them outlives the reader.
  void tear_down(const Value* keep) {
    std::unordered_map<const Value*, bool> held;
    if (keep) {
      std::vector<const Value*> todo{keep};
      while (!todo.empty()) {
        const Value* v = todo.back();
        todo.pop_back();
        if (!held.emplace(v, true).second) continue;
        for (const ValuePtr& x : v->items) todo.push_back(x.get());
        for (const auto& [k, x] : v->dict) todo.push_back(k.get()), todo.push_back(x.get());
      }
    }
    std::vector<ValuePtr> loose;  // freed after the loop, when no container refers to another
    for (const std::weak_ptr<Value>& w : containers)
      if (ValuePtr v = w.lock(); v && !held.count(v.get())) v->release_children(loose);
  }

  [[noreturn]] void fail(const std::string& why) const {
    throw Error("checkpoint pickle: " + why + " at byte " + std::to_string(p));
  }
  const uint8_t* take(size_t k) {
    if (n - p < k) fail("unexpected end of data (truncated?)");
    const uint8_t* r = d + p;
    p += k;
    return r;
  }
  uint64_t le(int k) {
    const uint8_t* b = take(k);
    uint64_t v = 0;
    for (int i = k - 1; i >= 0; --i) v = (v << 8) | b[i];
    return v;
  }
  ValuePtr pop() {
    if (stack.empty()) fail("stack underflow");
    ValuePtr v = stack.back();
    stack.pop_back();
    return v;
  }
  ValuePtr& top() {
    if (stack.empty()) fail("stack underflow");
    return stack.back();
  }
  std::vector<ValuePtr> pop_mark() {
    if (marks.empty()) fail("missing MARK");
    std::vector<ValuePtr> items = std::move(stack);
    stack = std::move(marks.back());
    marks.pop_back();
    return items;
  }
  std::string line() {
    const size_t start = p;
    while (p < n && d[p] != '\n') ++p;
    if (p >= n) fail("unterminated GLOBAL");
    return std::string(reinterpret_cast<const char*>(d + start), (p++) - start);
  }
  static int64_t as_int(const ValuePtr& v, const char* what) {
    if (v->kind != Value::Int)
      throw Error(std::string("checkpoint pickle: ") + what + " is not an int");
    return v->i;
  }
  static std::vector<int64_t> int_tuple(const ValuePtr& v, const char* what) {
    if (v->kind != Value::Tuple)
      throw Error(std::string("checkpoint pickle: ") + what + " is not a tuple");
    std::vector<int64_t> r;
    for (auto& x : v->items) r.push_back(as_int(x, what));
    return r;
  }
  ValuePtr call(const ValuePtr& fn, const ValuePtr& args) {
    if (fn->kind != Value::Global || args->kind != Value::Tuple) fail("REDUCE on a non-global");
    const std::vector<ValuePtr>& a = args->items;
    if (fn->s == "collections.OrderedDict") {
      if (!a.empty()) fail("OrderedDict with arguments");
      return container(Value::Dict, true);
    }
    if (fn->s == "torch._utils._rebuild_tensor_v2") {
      if (a.size() < 6 || a.size() > 7) fail("_rebuild_tensor_v2 needs 6 arguments");
      if (a[0]->kind != Value::Storage) fail("_rebuild_tensor_v2 without a storage");
      TensorRef t = a[0]->tensor;
      t.offset = as_int(a[1], "storage offset");
      t.size = int_tuple(a[2], "tensor size");
      t.stride = int_tuple(a[3], "tensor stride");
      if (t.size.size() != t.stride.size()) fail("size and stride ranks differ");
      return v_tensor(t);
    }
    if (fn->s == "torch._utils._rebuild_parameter" ||
        fn->s == "torch._utils._rebuild_parameter_with_state") {
      if (a.empty() || a[0]->kind != Value::Tensor) fail("_rebuild_parameter without a tensor");
      return a[0];
    }
    fail("unsupported call " + fn->s);
  }

  ValuePtr run() {
    while (true) {
      const uint8_t op = *take(1);
      switch (op) {
        case 0x80: {
          const uint8_t proto = *take(1);
          if (proto > 2)
            fail("pickle protocol " + std::to_string(proto) + " (torch.save writes protocol 2)");
          break;
        }
        case '.': {
          ValuePtr r = pop();
          return r;
        }
        case '(':
          marks.push_back(std::move(stack)), stack.clear();
          break;
        case '}':
          stack.push_back(container(Value::Dict));
          break;
        case ']':
          stack.push_back(container(Value::List));
          break;
        case ')':
          stack.push_back(container(Value::Tuple));
          break;
        case 's': {
          ValuePtr v = pop(), k = pop();
          if (top()->kind != Value::Dict) fail("SETITEM on a non-dict");
          top()->dict.emplace_back(k, v);
          break;
        }
        case 'u': {
          std::vector<ValuePtr> items = pop_mark();
          if (items.size() % 2) fail("SETITEMS with an odd item count");
          if (top()->kind != Value::Dict) fail("SETITEMS on a non-dict");
          for (size_t i = 0; i < items.size(); i += 2)
            top()->dict.emplace_back(items[i], items[i + 1]);
          break;
        }
        case 'a': {
          ValuePtr v = pop();
          if (top()->kind != Value::List) fail("APPEND on a non-list");
          top()->items.push_back(v);
          break;
        }
        case 'e': {
          std::vector<ValuePtr> items = pop_mark();
          if (top()->kind != Value::List) fail("APPENDS on a non-list");
          for (auto& x : items) top()->items.push_back(x);
          break;
        }
        case 't': {
          auto t = container(Value::Tuple);
          t->items = pop_mark();
          stack.push_back(t);
          break;
        }
        case 0x85:
        case 0x86:
        case 0x87: {
          auto t = container(Value::Tuple);
          t->items.resize(op - 0x84);
          for (size_t i = t->items.size(); i-- > 0;) t->items[i] = pop();
          stack.push_back(t);
          break;
        }
        case 'X': {
          const uint64_t len = le(4);
          const uint8_t* b = take(len);
          stack.push_back(v_str(std::string(reinterpret_cast<const char*>(b), len)));
          break;
        }
        case 'U': {  // SHORT_BINSTRING
          const uint64_t len = le(1);
          const uint8_t* b = take(len);
          stack.push_back(v_str(std::string(reinterpret_cast<const char*>(b), len)));
          break;
        }
        case 'K':
          stack.push_back(v_int(int64_t(le(1))));
          break;
        case 'M':
          stack.push_back(v_int(int64_t(le(2))));
          break;
        case 'J':
          stack.push_back(v_int(int64_t(int32_t(uint32_t(le(4))))));
          break;
        case 0x8a: {
          const uint64_t len = le(1);
          const uint8_t* b = take(len);
          if (len > 8) fail("integer does not fit in 64 bits");
          uint64_t u = 0;
          for (size_t i = len; i-- > 0;) u = (u << 8) | b[i];
          if (len > 0 && len < 8 && (b[len - 1] & 0x80)) u |= ~uint64_t(0) << (8 * len);
          stack.push_back(v_int(int64_t(u)));
          break;
        }
        case 'G': {
          const uint64_t u = [&] {
            const uint8_t* b = take(8);
            uint64_t r = 0;
            for (int i = 0; i < 8; ++i) r = (r << 8) | b[i];
            return r;
          }();
          double f;
          std::memcpy(&f, &u, 8);
          stack.push_back(v_float(f));
          break;
        }
        case 0x88:
          stack.push_back(v_bool(true));
          break;
        case 0x89:
          stack.push_back(v_bool(false));
          break;
        case 'N':
          stack.push_back(v_none());
          break;
        case 'q':
          memo[uint32_t(le(1))] = top();
          break;
        case 'r':
          memo[uint32_t(le(4))] = top();
          break;
        case 'h':
        case 'j': {
          const uint32_t idx = uint32_t(le(op == 'h' ? 1 : 4));
          auto it = memo.find(idx);
          if (it == memo.end()) fail("memo index " + std::to_string(idx) + " was never stored");
          stack.push_back(it->second);
          break;
        }
        case 'c': {
          std::string mod = line(), name = line();
          const std::string full = mod + "." + name;
          auto g = std::make_shared<Value>(Value::Global);
          g->s = full;
          const bool storage =
              mod == "torch" && name.size() > 7 && name.compare(name.size() - 7, 7, "Storage") == 0;
          if (!storage && full != "collections.OrderedDict" &&
              full != "torch._utils._rebuild_tensor_v2" &&
              full != "torch._utils._rebuild_parameter" &&
              full != "torch._utils._rebuild_parameter_with_state")
            fail("unsupported global " + full);
          stack.push_back(g);
          break;
        }
        case 'R': {
          ValuePtr args = pop(), fn = pop();
          stack.push_back(call(fn, args));
          break;
        }
        case 'b': {
          pop();  // state: only the _metadata of a state_dict, which we ignore
          if (top()->kind != Value::Dict) fail("BUILD on a non-dict");
          break;
        }
        case 'Q': {
          ValuePtr id = pop();
          if (id->kind != Value::Tuple || id->items.size() != 5 ||
              id->items[0]->kind != Value::Str || id->items[0]->s != "storage" ||
              id->items[1]->kind != Value::Global || id->items[2]->kind != Value::Str)
            fail("persistent id is not ('storage', class, key, location, numel)");
          auto s = std::make_shared<Value>(Value::Storage);
          const std::string& cls = id->items[1]->s;
          s->tensor.storage = cls.substr(cls.find('.') + 1);
          s->tensor.key = id->items[2]->s;
          s->tensor.storage_numel = as_int(id->items[4], "storage numel");
          if (s->tensor.storage_numel < 0) fail("negative storage size");
          stack.push_back(s);
          break;
        }
        default: {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", op);
          fail(std::string("unsupported pickle opcode ") + hex);
        }
      }
    }
  }
};

}  // namespace

ValuePtr pickle_loads(const uint8_t* data, size_t n) {
  Reader r{data, n, 0, {}, {}, {}, {}};
  ValuePtr root;
  try {
    root = r.run();
    r.check_tree(root);
  } catch (...) {
    r.tear_down(nullptr);
    throw;
  }
  r.tear_down(root.get());
  return root;
}

}  // namespace tq
