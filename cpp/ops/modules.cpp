// The Python entries of the C++ module classes (cpp/modules), bound in bindings/modules.cpp: the
// operands checked with the public messages, the outputs allocated, the GIL released, the KV
// caches held for the whole forward (CacheSession), then one call into the module. The public
// classes are the Python wrappers in llmkernels/modules.py (configuration, state dicts, caches,
// generation).
#include "ops/modules_entry.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

#include "drivers/attend.hpp"

namespace llmk::ops {
namespace {

void expect(bool ok, const char* fn, const std::string& msg) {
  if (!ok) fail(fn, msg);
}

// every one of the n token ids in [0, vocab) (the one check: Python converts only)
void check_token_ids(const char* fn, const std::int64_t* ids, std::size_t n, std::size_t vocab) {
  for (std::size_t r = 0; r < n; ++r)
    expect(ids[r] >= 0 && static_cast<std::size_t>(ids[r]) < vocab, fn,
           "ids must be in [0, vocab_size=" + std::to_string(vocab) + "), got " +
               std::to_string(ids[r]));
}

// optional per-call RoPE frequencies, (head_dim / 2,)
// per-call frequencies: as many as the module's own (head_dim/2, or fewer with partial rotary)
const double* freq_override(const char* fn, const std::optional<f64_array>& f, std::size_t n) {
  if (!f) return nullptr;
  expect(f->ndim() == 1 && static_cast<std::size_t>(f->shape(0)) == n, fn,
         "inv_freq must have shape (" + std::to_string(n) + ",) like the module's frequencies");
  return f->data();
}

// the NumPy dtype of a parameter's storage: bf16 is ml_dtypes.bfloat16 (NumPy has none); int8
// codes are int8, int4 codes uint8 (two a byte)
py::dtype format_dtype(WeightFormat f) {
  switch (f) {
    case WeightFormat::f32: return py::dtype::of<float>();
    case WeightFormat::f16: return py::dtype("float16");
    case WeightFormat::q8: return py::dtype::of<std::int8_t>();
    case WeightFormat::q4: return py::dtype::of<std::uint8_t>();
    default: return py::dtype::from_args(py::module_::import("ml_dtypes").attr("bfloat16"));
  }
}

}  // namespace

// The weight formats by their NumPy names (Python passes and reads these strings).
WeightFormat parse_format(const std::string& name) {
  if (name == "float32") return WeightFormat::f32;
  if (name == "bfloat16") return WeightFormat::bf16;
  if (name == "float16") return WeightFormat::f16;
  if (name == "int8") return WeightFormat::q8;
  if (name == "int4") return WeightFormat::q4;
  fail("modules",
       "weight dtype must be 'float32', 'bfloat16', 'float16', 'int8' or 'int4', got '" + name +
           "'");
}
std::string format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::bf16: return "bfloat16";
    case WeightFormat::f16: return "float16";
    case WeightFormat::q8: return "int8";
    case WeightFormat::q4: return "int4";
    default: return "float32";
  }
}

std::size_t check_group(const std::string& fn, WeightFormat f, long long group, const Dims& dims) {
  if (!is_quantized(f)) return 0;
  if (group != 32 && group != 64 && group != 128)
    fail(fn.c_str(), "group_size must be 32, 64 or 128, got " + std::to_string(group));
  for (const auto& [name, size] : dims)
    if (size % static_cast<std::size_t>(group))
      fail(fn.c_str(), "group_size=" + std::to_string(group) + " does not divide " + name + "=" +
                           std::to_string(size) +
                           ": every projection's input dimension must be a multiple of "
                           "group_size (try 32)");
  return static_cast<std::size_t>(group);
}
Dims group_dims(const FeedForwardModule& m) {
  return {{"dim", m.dim()}, {"hidden_dim", m.hidden()}};
}
Dims group_dims(const MultiHeadAttentionModule& m) {
  return {{"dim", m.dim}, {"n_heads * head_dim", m.n_heads * m.head_dim}};
}
Dims group_dims(const TransformerModule& m) { return {{"dim", m.dim}}; }

// name -> zero-copy view of each parameter, in its storage dtype; the view keeps alive the
// module (`owner`), or the weight storage it shows (which quantize() may replace)
py::dict param_views(std::vector<Param> params, py::handle owner) {
  py::dict d;
  for (auto& p : params) {
    std::vector<py::ssize_t> shape(p.shape.begin(), p.shape.end());
    py::object base = py::reinterpret_borrow<py::object>(owner);
    if (p.keep)
      base = py::capsule(new std::shared_ptr<void>(p.keep),
                         [](void* k) { delete static_cast<std::shared_ptr<void>*>(k); });
    d[py::str(p.name)] = py::array(format_dtype(p.format), shape, p.data, base);
  }
  return d;
}

f32_array run_norm(const Norm& norm, f32_array x) {
  expect(x.ndim() >= 1 && static_cast<std::size_t>(x.shape(x.ndim() - 1)) == norm.dim(), "Norm",
         "x must have shape (..., " + std::to_string(norm.dim()) + ")");
  f32_array out(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()));
  std::size_t rows = norm.dim() ? static_cast<std::size_t>(x.size()) / norm.dim() : 0;
  const float* xp = x.data();
  float* op = out.mutable_data();
  py::gil_scoped_release nogil;
  norm.forward(xp, op, rows);
  return out;
}

namespace {

// (B, T) int64 positions and optional (B, T) uint8 key mask, checked against x's (B, T)
void check_bt(const char* fn, const i64_array& positions, const std::optional<u8_array>& mask,
              py::ssize_t b, py::ssize_t t) {
  expect(positions.ndim() == 2 && positions.shape(0) == b && positions.shape(1) == t, fn,
         "positions must have shape (B, T)");
  if (mask)
    expect(mask->ndim() == 2 && mask->shape(0) == b && mask->shape(1) == t, fn,
           "key mask must have shape (B, T)");
}

void check_cache(const char* fn, const KVCache* cache, std::size_t b,
                 const MultiHeadAttentionModule& attn) {
  if (!cache) return;
  expect(cache->batch == b, fn,
         "cache holds " + std::to_string(cache->batch) + " sequences, the input has " +
             std::to_string(b));
  expect(cache->n_kv_heads == attn.n_kv_heads && cache->head_dim == attn.head_dim, fn,
         "cache was made for another attention shape");
  // a rolling cache keeps only `window` positions: right only for a layer with that window
  expect(cache->window == 0 || static_cast<std::int64_t>(cache->window) == attn.window, fn,
         "cache is a rolling buffer for window " + std::to_string(cache->window) +
             ", the layer's window is " + std::to_string(attn.window));
  // (its capacity: CacheSession::check_room, under its mutex)
}

// Exclusive use of the KV caches of one forward call, entered after the GIL is released.
//
// Why: two Python threads calling with the same cache would both pass the capacity check and
// append at the same position (length past max_len: writes past the cache's arrays). Holding
// each cache's mutex from the capacity check until the append and the attention over it are
// done serialises such calls; the second one then sees the first one's tokens (or a full
// cache: a clear ValueError). Caches are locked in address order, so calls whose cache lists
// overlap in any order cannot deadlock. If the forward fails (MemoryError), the lengths are
// restored: a failed call appends nothing.
class CacheSession {
 public:
  explicit CacheSession(std::vector<KVCache*> caches) : caches_(std::move(caches)) {
    std::sort(caches_.begin(), caches_.end());
    lengths_.reserve(caches_.size());  // may throw: nothing is locked yet
    for (KVCache* c : caches_) {
      c->mutex.lock();
      ++locked_;
      lengths_.push_back(c->length.load());
    }
  }
  ~CacheSession() {
    if (!committed_)
      for (RingSave& r : rings_) r.copy(false);  // memcpy only: cannot throw
    for (std::size_t i = locked_; i-- > 0;) {
      if (!committed_) caches_[i]->length.store(lengths_[i]);
      caches_[i]->mutex.unlock();
    }
  }
  CacheSession(const CacheSession&) = delete;
  CacheSession& operator=(const CacheSession&) = delete;

  // the capacity check, now that no other call can append
  void check_room(const char* fn, std::size_t t) const {
    for (const KVCache* c : caches_)
      expect(c->length.load() + t <= c->max_len, fn,
             "KV cache is full: " + std::to_string(c->length.load()) + " cached + " +
                 std::to_string(t) + " new tokens > max_seq_len " + std::to_string(c->max_len));
  }
  void commit() { committed_ = true; }

  // A chunk of t > 1 tokens past a rolling cache's end writes its last min(t, slots) tokens
  // into ring slots that still hold positions the chunk's own attention (and a retry of it)
  // needs: MultiHeadAttentionModule::forward appends before the rest of the model has run.
  // Those slots are saved here, before the forward, and put back if it fails, so that a failed
  // call (MemoryError in a later layer, ...) leaves the cache as it found it. Throws
  // std::bad_alloc before anything is written.
  void save_rings(std::size_t t) {
    for (KVCache* c : caches_) {
      const std::size_t C = c->slots, len = c->length.load();
      if (t <= 1 || len + t <= C) continue;  // the slots written are past length, or drop out
      const std::size_t t0 = t > C ? t - C : 0;
      rings_.push_back(RingSave(c, (len + t0) % C, t - t0));
    }
  }

 private:
  // the slots [first, first + n) (mod slots) of every (sequence, head) of a cache
  class RingSave {
   public:
    RingSave(KVCache* c, std::size_t first, std::size_t n)
        : c_(c), first_(first), n_(n), row_(c->head_dim * c->itemsize()),
          k_(c->batch * c->n_kv_heads * n * row_), v_(k_.size()), valid_(c->batch * n) {
      copy(true);
    }
    // save: the cache's slots into this copy; else this copy back into them
    void copy(bool save) {
      const std::size_t C = c_->slots;
      auto* ck = static_cast<unsigned char*>(c_->k.at(0));
      auto* cv = static_cast<unsigned char*>(c_->v.at(0));
      for (std::size_t r = 0; r < c_->batch * c_->n_kv_heads; ++r)
        for (std::size_t j = 0; j < n_; ++j) {
          const std::size_t slot = (first_ + j) % C;
          unsigned char* kc = ck + (r * C + slot) * row_;
          unsigned char* vc = cv + (r * C + slot) * row_;
          unsigned char* ks = k_.data() + (r * n_ + j) * row_;
          unsigned char* vs = v_.data() + (r * n_ + j) * row_;
          if (save) {
            std::memcpy(ks, kc, row_);
            std::memcpy(vs, vc, row_);
          } else {
            std::memcpy(kc, ks, row_);
            std::memcpy(vc, vs, row_);
          }
        }
      for (std::size_t b = 0; b < c_->batch; ++b)
        for (std::size_t j = 0; j < n_; ++j) {
          std::uint8_t& cell = c_->valid[b * C + (first_ + j) % C];
          if (save)
            valid_[b * n_ + j] = cell;
          else
            cell = valid_[b * n_ + j];
        }
    }
   private:
    KVCache* c_;
    std::size_t first_, n_, row_;
    std::vector<unsigned char> k_, v_;
    std::vector<std::uint8_t> valid_;
  };
  std::vector<RingSave> rings_;
  std::vector<KVCache*> caches_;
  std::vector<std::size_t> lengths_;
  std::size_t locked_ = 0;
  bool committed_ = false;
};

std::vector<KVCache*> one_cache(KVCache* cache) {
  return cache ? std::vector<KVCache*>{cache} : std::vector<KVCache*>{};
}

// One forward of a module with an attention layer `attn` (MultiHeadAttention, TransformerBlock)
// on x (B, T, dim): checks x, positions, key mask, cache and inv_freq, allocates the output,
// releases the GIL, holds the cache (CacheSession) and calls
// forward(x, b, t, positions, key_mask, cache, out, inv_freq_override).
template <class Forward>
f32_array attention_forward(const char* fn, const MultiHeadAttentionModule& attn, f32_array x,
                            i64_array positions, std::optional<u8_array> key_mask, KVCache* cache,
                            std::optional<f64_array> inv_freq, Forward forward) {
  const double* fo = freq_override(fn, inv_freq, attn.inv_freq.size());
  expect(x.ndim() == 3 && static_cast<std::size_t>(x.shape(2)) == attn.dim, fn,
         "x must have shape (B, T, dim)");
  check_bt(fn, positions, key_mask, x.shape(0), x.shape(1));
  const std::size_t b = x.shape(0), t = x.shape(1);
  check_cache(fn, cache, b, attn);
  f32_array out({x.shape(0), x.shape(1), x.shape(2)});
  const float* xp = x.data();
  const std::int64_t* pp = positions.data();
  const std::uint8_t* mp = key_mask ? key_mask->data() : nullptr;
  float* op = out.mutable_data();
  py::gil_scoped_release nogil;
  CacheSession session(one_cache(cache));
  session.check_room(fn, t);
  session.save_rings(t);
  if (b * t > 0) forward(xp, b, t, pp, mp, cache, op, fo);
  session.commit();
  return out;
}

// One forward of a whole model (Transformer.__call__), observed by llmkernels.inspect or not
f32_array model_forward(const TransformerModule& self, i64_array ids, i64_array positions,
                        std::optional<u8_array> key_mask, std::vector<KVCache*> caches,
                        bool last_only, std::optional<f64_array> inv_freq,
                        const ForwardObserver* observer) {
  const char* fn = "Transformer";
  const double* fo =
      self.blocks.empty()
          ? nullptr
          : freq_override(fn, inv_freq, self.blocks[0]->attention->inv_freq.size());
  for (auto& blk : self.blocks)
    expect(!fo || blk->attention->head_dim == self.blocks[0]->attention->head_dim, fn,
           "inv_freq needs one head_dim for all blocks");
  expect(ids.ndim() == 2, fn, "ids must have shape (B, T)");
  check_bt(fn, positions, key_mask, ids.shape(0), ids.shape(1));
  const std::size_t b = ids.shape(0), t = ids.shape(1);
  expect(caches.empty() || caches.size() == self.blocks.size(), fn,
         "one cache per block is needed");
  for (std::size_t i = 0; i < caches.size(); ++i) {
    expect(caches[i] != nullptr, fn, "cache " + std::to_string(i) + " is None");
    for (std::size_t j = 0; j < i; ++j)
      expect(caches[j] != caches[i], fn,
             "caches " + std::to_string(j) + " and " + std::to_string(i) +
                 " are the same KVCache: each block needs its own");
    check_cache(fn, caches[i], b, *self.blocks[i]->attention);
  }
  const std::int64_t* ip = ids.data();
  check_token_ids(fn, ip, b * t, self.vocab);
  f32_array logits({static_cast<py::ssize_t>(b),
                    static_cast<py::ssize_t>(last_only ? 1 : t),
                    static_cast<py::ssize_t>(self.vocab)});
  const std::int64_t* pp = positions.data();
  const std::uint8_t* mp = key_mask ? key_mask->data() : nullptr;
  float* lp = logits.mutable_data();
  py::gil_scoped_release nogil;
  CacheSession session(caches);
  session.check_room(fn, t);
  session.save_rings(t);
  if (b * t > 0) self.forward(ip, b, t, pp, mp, caches, last_only, lp, fo, observer);
  session.commit();
  return logits;
}

// f() with the cache's mutex held (taken without the GIL, as a forward holds the mutex without
// it), so that a forward in another thread does not append while the cache is read
template <class F>
auto locked(KVCache& c, F f) {
  std::unique_lock<std::mutex> lk(c.mutex, std::defer_lock);
  {
    py::gil_scoped_release nogil;
    lk.lock();
  }
  return f();
}

// (B, Hkv, n, hd) keys or values of the cache in position order, n = min(length, slots), in the
// cache's dtype (float32, ml_dtypes.bfloat16, float16): a view (`owner` keeps the cache alive),
// or a copy once a rolling buffer has wrapped
py::array cache_view(py::object owner, const KVCache& c, const WeightBuffer& a) {
  const std::size_t len = c.length.load(), C = c.slots, hd = c.head_dim, isz = c.itemsize();
  const py::dtype dt = format_dtype(c.format());
  if (len <= C)
    return py::array(dt, std::vector<std::size_t>{c.batch, c.n_kv_heads, len, hd},
                     std::vector<std::size_t>{c.n_kv_heads * C * hd * isz, C * hd * isz,
                                              hd * isz, isz},
                     a.at(0), owner);
  py::array out(dt, std::vector<std::size_t>{c.batch, c.n_kv_heads, C, hd});
  auto* o = static_cast<char*>(out.mutable_data());
  const auto* src = static_cast<const char*>(a.at(0));
  // (called with the cache's mutex held: see "keys" below)
  for (std::size_t bg = 0; bg < c.batch * c.n_kv_heads; ++bg)
    for (std::size_t j = 0; j < C; ++j)  // position len - C + j
      std::memcpy(o + (bg * C + j) * hd * isz, src + (bg * C + (len - C + j) % C) * hd * isz,
                  hd * isz);
  return out;
}

}  // namespace

f32_array feed_forward_forward(const FeedForwardModule& self, f32_array x) {
  expect(x.ndim() == 2 && static_cast<std::size_t>(x.shape(1)) == self.dim(), "FeedForward",
         "x must have shape (m, dim)");
  f32_array out({x.shape(0), x.shape(1)});
  const float* xp = x.data();
  float* op = out.mutable_data();
  std::size_t rows = static_cast<std::size_t>(x.shape(0));
  py::gil_scoped_release nogil;
  self.forward(xp, rows, op, nullptr);
  return out;
}

std::shared_ptr<FeedForwardModule> make_feed_forward(std::size_t dim, std::size_t hidden,
                                                     bool bias, bool gelu_tanh,
                                                     const std::string& dtype, long long group,
                                                     const std::string& fn) {
  const WeightFormat f = parse_format(dtype);
  const std::size_t g = check_group(fn, f, group, {{"dim", dim}, {"hidden_dim", hidden}});
  return std::make_shared<FeedForwardModule>(dim, hidden, bias, gelu_tanh, f, g);
}

std::shared_ptr<KVCache> make_cache(std::size_t batch, std::size_t max_len,
                                    std::size_t n_kv_heads, std::size_t head_dim,
                                    std::size_t window, const std::string& dtype) {
  return std::make_shared<KVCache>(batch, max_len, n_kv_heads, head_dim, window,
                                   parse_format(dtype));
}

void cache_reset(KVCache& c) {
  py::gil_scoped_release nogil;  // waits for a forward using the cache to finish
  std::lock_guard<std::mutex> lk(c.mutex);
  c.reset();
}

void cache_crop(KVCache& c, std::size_t n) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lk(c.mutex);
  const std::size_t len = c.length.load();
  if (n > len) {
    throw py::value_error("[KVCache.crop] n must be <= the cached length " + std::to_string(len) +
                          ", got " + std::to_string(n));
  }
  // a rolling buffer that wrapped holds positions length - slots .. length - 1 only: the token
  // after a crop to n (position n) looks back to n - slots + 1, so n >= length - 1
  if (c.wrapped() && n + 1 < len) {
    throw py::value_error("[KVCache.crop] the sliding-window cache has wrapped (" +
                          std::to_string(len) + " tokens in " + std::to_string(c.slots) +
                          " slots): it can drop its last token only, got n = " +
                          std::to_string(n));
  }
  c.length = n;  // (the slots past n are written again by the next tokens)
}

py::array cache_keys(py::object self) {  // (B, Hkv, min(length, slots), hd)
  auto& c = self.cast<KVCache&>();
  return locked(c, [&] { return cache_view(self, c, c.k); });
}

py::array cache_values(py::object self) {  // (B, Hkv, min(length, slots), hd)
  auto& c = self.cast<KVCache&>();
  return locked(c, [&] { return cache_view(self, c, c.v); });
}

std::shared_ptr<MultiHeadAttentionModule> make_attention(
    std::size_t dim, std::size_t n_heads, std::size_t n_kv_heads, std::size_t head_dim,
    std::vector<double> inv_freq, double attention_factor, bool qkv_bias, bool o_bias,
    bool causal, std::int64_t window, double softcap, double scale, bool sinks, bool qk_norm,
    double qk_norm_eps, const std::string& dtype, long long group, const std::string& fn) {
  const WeightFormat f = parse_format(dtype);
  const std::size_t g =
      check_group(fn, f, group, {{"dim", dim}, {"n_heads * head_dim", n_heads * head_dim}});
  return std::make_shared<MultiHeadAttentionModule>(
      dim, n_heads, n_kv_heads, head_dim, std::move(inv_freq), attention_factor, qkv_bias,
      o_bias, causal, window, softcap, scale, sinks, qk_norm, qk_norm_eps, f, g);
}

f32_array attention_module_forward(const MultiHeadAttentionModule& self, f32_array x,
                                   i64_array positions, std::optional<u8_array> key_mask,
                                   KVCache* cache, std::optional<f64_array> inv_freq) {
  return attention_forward(
      "MultiHeadAttention", self, x, positions, key_mask, cache, inv_freq,
      [&self](const float* xp, std::size_t b, std::size_t t, const std::int64_t* pp,
              const std::uint8_t* mp, KVCache* c, float* op,
              const double* fo) { self.forward(xp, b, t, pp, mp, c, op, nullptr, fo); });
}

f32_array block_forward(const TransformerBlockModule& self, f32_array x, i64_array positions,
                        std::optional<u8_array> key_mask, KVCache* cache,
                        std::optional<f64_array> inv_freq) {
  return attention_forward(
      "TransformerBlock", *self.attention, x, positions, key_mask, cache, inv_freq,
      [&self](const float* xp, std::size_t b, std::size_t t, const std::int64_t* pp,
              const std::uint8_t* mp, KVCache* c, float* op,
              const double* fo) { self.forward(xp, b, t, pp, mp, c, op, fo); });
}

std::shared_ptr<TransformerModule> make_transformer(
    std::size_t vocab, std::size_t dim, std::vector<std::shared_ptr<TransformerBlockModule>> blocks,
    std::shared_ptr<Norm> final_norm, bool tie, double embed_scale, double final_softcap,
    const std::string& dtype, std::optional<std::string> head_dtype, long long group,
    const std::string& fn) {
  const WeightFormat f = parse_format(dtype);
  const WeightFormat hf = head_dtype ? parse_format(*head_dtype) : f;
  if (is_quantized(f)) fail(fn.c_str(), "the embedding is stored in a float dtype");
  const std::size_t g = check_group(fn, hf, group, {{"dim", dim}});
  return std::make_shared<TransformerModule>(vocab, dim, std::move(blocks), std::move(final_norm),
                                             tie, embed_scale, final_softcap, f, hf, g);
}

f32_array transformer_forward(const TransformerModule& self, i64_array ids, i64_array positions,
                              std::optional<u8_array> key_mask, std::vector<KVCache*> caches,
                              bool last_only, std::optional<f64_array> inv_freq) {
  return model_forward(self, ids, positions, key_mask, std::move(caches), last_only, inv_freq,
                       nullptr);
}

py::tuple transformer_observe(const TransformerModule& self, i64_array ids, i64_array positions,
                              std::optional<u8_array> key_mask, bool last_only,
                              std::optional<f64_array> inv_freq, bool weights) {
  const char* fn = "Transformer";
  expect(ids.ndim() == 2, fn, "ids must have shape (B, T)");
  const auto b = ids.shape(0), t = ids.shape(1);
  const auto layers = static_cast<py::ssize_t>(self.blocks.size());
  const auto hq =
      static_cast<py::ssize_t>(self.blocks.empty() ? 0 : self.blocks[0]->attention->n_heads);
  for (auto& blk : self.blocks)
    expect(!weights || static_cast<py::ssize_t>(blk->attention->n_heads) == hq, fn,
           "return_attention needs one head count for all blocks");
  py::object w = py::none();
  ForwardObserver observer;
  if (weights) {
    py::array a = new_output<float>({layers, b, hq, t, t});  // (n_layers, B, Hq, T, T) zeros
    std::memset(a.mutable_data(), 0, static_cast<std::size_t>(a.nbytes()));
    observer.weights = static_cast<float*>(a.mutable_data());
    w = a;
  }
  const auto points = static_cast<py::ssize_t>(ForwardObserver::kPoints);
  f64_array rms(std::vector<py::ssize_t>{points * layers + 3, b, t});  // (5 n_layers + 3, B, T)
  observer.rms = rms.mutable_data();
  py::array logits =
      model_forward(self, ids, positions, key_mask, {}, last_only, inv_freq, &observer);
  return py::make_tuple(logits, w, rms);
}

// One decode step of independent sequences (Transformer.decode): ids (B,), positions (B,),
// caches[b]: sequence b's own caches, one per block, each of batch 1 -> logits (B, vocab)
f32_array transformer_forward_rows(const TransformerModule& self, i64_array ids,
                                   i64_array positions,
                                   std::vector<std::vector<KVCache*>> caches,
                                   std::optional<f64_array> inv_freq) {
  const char* fn = "Transformer.decode";
  const std::size_t layers = self.blocks.size();
  const double* fo = layers == 0 ? nullptr
                                 : freq_override(fn, inv_freq,
                                                 self.blocks[0]->attention->inv_freq.size());
  expect(ids.ndim() == 1, fn, "ids must have shape (B,)");
  const std::size_t b = ids.shape(0);
  expect(positions.ndim() == 1 && static_cast<std::size_t>(positions.shape(0)) == b, fn,
         "positions must have shape (B,)");
  expect(caches.size() == b, fn, "one list of caches per sequence is needed");
  std::vector<std::vector<KVCache*>> by_layer(layers, std::vector<KVCache*>(b));
  std::vector<KVCache*> all;
  for (std::size_t r = 0; r < b; ++r) {
    expect(caches[r].size() == layers, fn, "each sequence needs one cache per block");
    for (std::size_t i = 0; i < layers; ++i) {
      KVCache* c = caches[r][i];
      expect(c != nullptr, fn, "a cache is None");
      expect(c->batch == 1, fn, "each sequence's caches hold one sequence (batch 1)");
      check_cache(fn, c, 1, *self.blocks[i]->attention);
      by_layer[i][r] = c;
      all.push_back(c);
    }
  }
  std::vector<KVCache*> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  expect(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), fn,
         "a cache appears twice: every sequence and block needs its own");
  const std::int64_t* ip = ids.data();
  check_token_ids(fn, ip, b, self.vocab);
  f32_array logits(
      std::vector<py::ssize_t>{static_cast<py::ssize_t>(b), static_cast<py::ssize_t>(self.vocab)});
  const std::int64_t* pp = positions.data();
  float* lp = logits.mutable_data();
  py::gil_scoped_release nogil;
  CacheSession session(all);
  session.check_room(fn, 1);
  if (b > 0) self.forward_rows(ip, b, pp, by_layer, lp, fo);
  session.commit();
  return logits;
}

// y (m, n) = x (m, k) . w^T [+ bias] [+ y]: the modules' projection path (drivers/linear.hpp) on
// (n, k) weights given as float32, as the uint16 words of bf16 / f16 (`dtype`), or as int8 /
// int4 codes (dtype "int8": w int8 (n, k); "int4": w uint8 (n, k / 2)) with `scales` float16
// (n, k / group) and `group`; for tests.
f32_array linear_hook(f32_array x, py::array w, const std::string& dtype,
                      std::optional<f32_array> bias, std::optional<f32_array> y,
                      std::optional<py::array> scales, std::size_t group) {
  const char* fn = "_linear";
  const WeightFormat f = parse_format(dtype);
  const bool quantized = is_quantized(f);
  expect(x.ndim() == 2, fn, "x must have shape (m, k)");
  const py::ssize_t wk = quantized && f == WeightFormat::q4 ? x.shape(1) / 2 : x.shape(1);
  expect(w.ndim() == 2 && w.shape(1) == wk && (f != WeightFormat::q4 || x.shape(1) % 2 == 0), fn,
         "w must have shape (n, k) (int4: (n, k / 2))");
  expect(w.flags() & py::array::c_style, fn, "w must be C-contiguous");
  expect(w.itemsize() == (quantized ? 1 : static_cast<py::ssize_t>(WeightBuffer::itemsize(f))),
         fn, "w's itemsize does not match dtype");
  if (quantized) {
    expect(group == 32 || group == 64 || group == 128, fn, "group must be 32, 64 or 128");
    expect(x.shape(1) % static_cast<py::ssize_t>(group) == 0, fn, "k must be a multiple of group");
    expect(scales.has_value() && scales->ndim() == 2 && scales->shape(0) == w.shape(0) &&
               scales->shape(1) == x.shape(1) / static_cast<py::ssize_t>(group) &&
               scales->itemsize() == 2 && (scales->flags() & py::array::c_style),
           fn, "scales must be C-contiguous float16 (n, k / group)");
  }
  const std::size_t m = x.shape(0), k = x.shape(1), n = w.shape(0);
  if (bias)
    expect(bias->ndim() == 1 && static_cast<std::size_t>(bias->shape(0)) == n, fn,
           "bias must have shape (n,)");
  f32_array out({static_cast<py::ssize_t>(m), static_cast<py::ssize_t>(n)});
  if (y) {
    expect(y->ndim() == 2 && static_cast<std::size_t>(y->shape(0)) == m &&
               static_cast<std::size_t>(y->shape(1)) == n,
           fn, "y must have shape (m, n)");
    std::memcpy(out.mutable_data(), y->data(), m * n * sizeof(float));
  }
  const float* xp = x.data();
  const void* wp = w.data();
  const float* bp = bias ? bias->data() : nullptr;
  float* op = out.mutable_data();
  const bool acc = y.has_value();
  const auto* sp = quantized ? static_cast<const std::uint16_t*>(scales->data()) : nullptr;
  py::gil_scoped_release nogil;
  linear(xp, m, k, WeightRef{wp, f, sp, quantized ? group : 0}, n, bp, op, acc);
  return out;
}

// out (B, Hq, Tq, Dv) = attention of q (B, Hq, Tq, D) float32 over k (B, Hkv, Tk, D) and
// v (B, Hkv, Tk, Dv) given as the uint16 words of bfloat16 / float16 (`dtype`), read as a KV
// cache's are (widened in the kernel); optional key mask (B, Tk) (1 = may attend), causal,
// window, scale (0: 1/sqrt(D)). For tests.
f32_array attention_kv16_hook(f32_array q, py::array k, py::array v, const std::string& dtype,
                              bool causal, std::int64_t window, double scale,
                              std::optional<u8_array> key_mask) {
  const char* fn = "_attention_kv16";
  const WeightFormat f = parse_format(dtype);
  expect(f != WeightFormat::f32, fn, "dtype must be 'bfloat16' or 'float16'");
  expect(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4, fn, "q, k, v must be 4-D");
  expect((k.flags() & py::array::c_style) && (v.flags() & py::array::c_style), fn,
         "k and v must be C-contiguous");
  expect(k.itemsize() == 2 && v.itemsize() == 2, fn, "k and v must hold 16-bit words");
  const std::size_t B = q.shape(0), Hq = q.shape(1), Tq = q.shape(2), D = q.shape(3);
  const std::size_t Hkv = k.shape(1), Tk = k.shape(2), Dv = v.shape(3);
  expect(k.shape(0) == q.shape(0) && v.shape(0) == q.shape(0) &&
             static_cast<std::size_t>(k.shape(3)) == D && v.shape(1) == k.shape(1) &&
             v.shape(2) == k.shape(2),
         fn, "q, k, v shapes do not match");
  expect(Hkv > 0 && Hq % Hkv == 0 && D > 0 && Dv > 0, fn, "need Hq % Hkv == 0, D, Dv > 0");
  expect(window >= 0 && std::isfinite(scale) && scale >= 0.0, fn, "bad window or scale");
  if (key_mask)
    expect(key_mask->ndim() == 2 && static_cast<std::size_t>(key_mask->shape(0)) == B &&
               static_cast<std::size_t>(key_mask->shape(1)) == Tk,
           fn, "key_mask must have shape (B, Tk)");
  f32_array out(std::vector<py::ssize_t>{q.shape(0), q.shape(1), q.shape(2), v.shape(3)});
  attn_params<float> p{};
  p.q = q.data();
  p.kv_format = f;
  p.k16 = static_cast<const std::uint16_t*>(k.data());
  p.v16 = static_cast<const std::uint16_t*>(v.data());
  p.out = out.mutable_data();
  p.b = B, p.hq = Hq, p.hkv = Hkv, p.tq = Tq, p.tk = Tk, p.d = D, p.dv = Dv;
  p.qs[2] = D, p.qs[1] = Tq * D, p.qs[0] = Hq * Tq * D;
  p.ks[2] = D, p.ks[1] = Tk * D, p.ks[0] = Hkv * Tk * D;
  p.vs[2] = Dv, p.vs[1] = Tk * Dv, p.vs[0] = Hkv * Tk * Dv;
  p.os[2] = Dv, p.os[1] = Tq * Dv, p.os[0] = Hq * Tq * Dv;
  p.scale = scale > 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(D));
  p.causal = causal;
  p.window = window;
  if (key_mask) {
    p.mask_kind = AttnMask::boolean;
    p.mask = key_mask->data();
    p.mask_strides[0] = static_cast<std::int64_t>(Tk), p.mask_strides[3] = 1;
  }
  py::gil_scoped_release nogil;
  if (B * Hq * Tq > 0) llmk::attention<float>(p);
  return out;
}

}  // namespace llmk::ops
