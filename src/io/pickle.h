// The pickle subset of torch.save (spec pytorch-checkpoint.md §2-3): a value tree, a
// protocol-2 writer that emits only what weights_only loaders accept, and a reader VM
// that rejects everything else with a message naming the opcode or global.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tq {

struct Value;
using ValuePtr = std::shared_ptr<Value>;

// A tensor view into a storage record `data/<key>`.
struct TensorRef {
  std::string key;
  std::string storage;  // torch storage class, e.g. "FloatStorage", "BFloat16Storage"
  int64_t storage_numel = 0;
  int64_t offset = 0;
  std::vector<int64_t> size, stride;
};

struct Value {
  enum Kind { None, Bool, Int, Float, Str, List, Tuple, Dict, Tensor, Global, Storage } kind;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                                    // Str; Global "module.name"
  std::vector<ValuePtr> items;                      // List, Tuple
  std::vector<std::pair<ValuePtr, ValuePtr>> dict;  // Dict, insertion order
  bool ordered = false;                             // Dict written as OrderedDict
  TensorRef tensor;                                 // Tensor; Storage uses key/storage/numel

  explicit Value(Kind k) : kind(k) {}
  Value(const Value&) = delete;
  Value& operator=(const Value&) = delete;
  // Frees the children it owns alone one after another, not by recursion: a tree of any depth
  // goes without exhausting the stack.
  ~Value();
  // Moves its children (items, and dict keys and values) to the end of `into`, leaving it empty.
  void release_children(std::vector<ValuePtr>& into);
  const Value* get(const std::string& key) const;  // Dict lookup by string key, or null
};

ValuePtr v_none();
ValuePtr v_bool(bool b);
ValuePtr v_int(int64_t i);
ValuePtr v_float(double f);
ValuePtr v_str(std::string s);
ValuePtr v_list(std::vector<ValuePtr> items);
ValuePtr v_dict(bool ordered = false);
ValuePtr v_tensor(TensorRef t);
void dict_set(Value& d, const std::string& key, ValuePtr v);

std::string pickle_dumps(const Value& v);
// Error on anything unsupported, on a container inside itself (a pickle may build one through
// its memo; such a tree could never be freed) and on nesting deeper than kMaxPickleDepth.
constexpr int kMaxPickleDepth = 100;
ValuePtr pickle_loads(const uint8_t* data, size_t n);

const char* kind_name(Value::Kind k);
size_t storage_element_size(const std::string& storage);  // 0 if unknown

}  // namespace tq
