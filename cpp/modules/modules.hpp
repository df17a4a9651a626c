// C++ module classes: the layers of a LLaMA-style decoder, holding weights in HF LLaMA layout
// ((out, in) for projections): projection and embedding matrices in float32, bf16 or f16 (the
// kernels convert them in registers), projections (and the LM head) also as group-wise int8 /
// int4 codes with float16 scales (docs/quantization.md; the embedding stays float), norms,
// biases and sinks in float32. Each forward is one C++
// call (the GIL is released by the binding) that strings BLAS projections and the package's kernels
// together; scratch buffers are thread-local and reused (bounded between calls, see modules.cpp),
// so a steady-state call allocates nothing and one module can be shared by several threads. A KV
// cache carries a mutex: the bindings hold it for the whole forward that reads and appends it, so
// threads that share a cache are serialised (see bindings/modules.cpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <initializer_list>
#include <utility>
#include <string>
#include <vector>

#include "drivers/linear.hpp"

namespace llmk {

// A named parameter owned by its module (views are handed to Python without copies): float32,
// or for a projection / embedding matrix the module's weight format (bf16 / f16 words; for
// int8 / int4 matrices two parameters: the codes, format q8 (int8) / q4 (uint8 nibble pairs),
// and the scales, format f16).
struct Param {
  std::string name;
  std::vector<std::size_t> shape;
  void* data;  // points into the module's storage
  WeightFormat format = WeightFormat::f32;
  // the storage `data` points into when it is a WeightBuffer's (null: the module's own vectors):
  // a view keeps it alive, so a view taken before quantize() replaced the matrix stays valid
  std::shared_ptr<void> keep = nullptr;
  std::size_t size() const {
    std::size_t n = 1;
    for (auto s : shape) n *= s;
    return n;
  }
};

// Storage of a weight matrix, allocated uninitialised: every entry is written (by a checkpoint
// load or by the random initialisation) before any forward reads it, and zero-filling hundreds
// of MiB first made loading a checkpoint cost twice its page faults. Large matrices sit on 2 MiB
// boundaries with transparent huge pages requested (madvise), so first writing them faults once
// per 2 MiB instead of once per 4 KiB. Throws std::bad_alloc (MemoryError in Python).
// The buffer holds n weights in `format` (4 bytes each for float32, 2 for bf16 / f16): the
// matrix stays at the checkpoint's precision and the kernels convert it in registers. int8 /
// int4 (q8 / q4, with the quantization `group`): n codes (1 byte each, or two a byte) and n /
// group float16 scales, in two allocations; a row block starting at weight `first` (a row
// start, so a multiple of the group) has its codes at at(first) and scales at scales_at(first).
//
// The storage is shared (a WeightBuffer is a handle): quantize() replaces a module's matrices
// while other threads may run a forward or hold state_dict views, so a forward takes its
// handles once with load() (an atomic snapshot) and a view keeps the storage it shows alive
// (Param::keep); store() swaps a new matrix in atomically.
class WeightBuffer {
 public:
  WeightBuffer() = default;
  // zeroed: the storage reads as zeros, from calloc -- for a large buffer, fresh pages the OS
  // maps in as they are first touched (a KV cache of a million slots costs the memory of the
  // tokens written, not of its capacity); 16-byte aligned only
  explicit WeightBuffer(std::size_t n, WeightFormat format = WeightFormat::f32,
                        std::size_t group = 0, bool zeroed = false);
  WeightFormat format() const { return s_ ? s_->format : WeightFormat::f32; }
  std::size_t size() const { return s_ ? s_->n : 0; }
  std::size_t group() const { return s_ ? s_->group : 0; }
  // bytes per weight of the float formats (f32, bf16, f16)
  static std::size_t itemsize(WeightFormat f) { return f == WeightFormat::f32 ? 4 : 2; }
  std::size_t nbytes() const;  // codes / values plus scales
  // the storage from weight number `first` on (a row block of the matrix)
  void* at(std::size_t first) const;
  std::uint16_t* scales_at(std::size_t first) const;  // q8 / q4
  WeightRef ref(std::size_t first = 0) const {
    return {at(first), format(), is_quantized(format()) ? scales_at(first) : nullptr, group(),
            tiles()};
  }
  std::shared_ptr<void> keep() const { return s_; }
  WeightBuffer load() const { return WeightBuffer(std::atomic_load(&s_)); }
  void store(const WeightBuffer& b) { std::atomic_store(&s_, b.s_); }
  // int8 codes in AMX's tile layout (qweights::tiles, drivers/qlinear.hpp) instead of (rows, k)
  bool tiles() const { return s_ && s_->tiles; }
  // a copy of this int8 matrix (rows of k codes) in the tile layout or the plain one
  WeightBuffer relaid(std::size_t k, bool tiles) const;
  // handles to this storage (this one included): the module's, forwards' snapshots, views
  long holders() const { return s_.use_count(); }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  struct Storage {
    std::size_t n = 0, group = 0;
    WeightFormat format = WeightFormat::f32;
    bool tiles = false;
    std::unique_ptr<void, Free> data, scales;
  };
  explicit WeightBuffer(std::shared_ptr<Storage> s) : s_(std::move(s)) {}
  std::shared_ptr<Storage> s_;
};

// New matrices for a module's quantize() / dequantize, staged before any is swapped in: a
// module (or a whole model) either converts all its matrices or, on bad weights, none.
struct StagedWeights {
  std::vector<WeightBuffer> buffers;
};

// The layout of a module's int8 matrices. Where the AMX kernel runs (int8_tiles_wanted), each
// int8 matrix whose rows -- and every row offset the module projects from -- are multiples of
// 16 is kept in the tile layout, so no call repacks it; memory stays that of the codes. Views
// (state_dict) show the plain layout: params() turns the matrices back first, and a forward
// turns a matrix to the tile layout only when no view of it is alive. Either way the results
// are the same bits (the kernels give the AVX2 GEMV's). One mutex per module orders params()
// and the forwards' relayout; a forward that finds it taken runs on the layout it finds.
struct LayoutEntry {
  WeightBuffer* matrix;
  std::size_t k;  // codes per row
  bool eligible;  // rows % 16 == 0, and so is every row offset the module projects from
};
class MatrixLayout {
 public:
  // a forward's: the layout the kernels want, where no view is alive -- without waiting
  void on_forward(std::initializer_list<LayoutEntry> m) const;
  // params()': every matrix plain (views show the plain layout), and the lock, which params()
  // holds until its views exist (a forward must not tile a matrix between the two)
  std::unique_lock<std::mutex> for_views(std::initializer_list<LayoutEntry> m) const;
  // the modules' relayout(views): for_views when views are wanted, else on_forward (no lock)
  std::unique_lock<std::mutex> apply(bool views, std::initializer_list<LayoutEntry> m) const {
    if (views) return for_views(m);
    on_forward(m);
    return {};
  }

 private:
  mutable std::mutex mutex_;
};

class Norm {
 public:
  Norm(std::size_t dim, double eps, float weight0, bool bias = false)
      : dim_(dim), eps_(eps), weight_(dim, weight0), bias_(bias ? dim : 0, 0.f) {}
  virtual ~Norm() = default;
  // out (rows, dim) = norm(x (rows, dim)); out may be x
  virtual void forward(const float* x, float* out, std::size_t rows) const = 0;
  virtual std::string kind() const = 0;
  std::vector<Param> params();  // weight (and bias)
  std::size_t dim() const { return dim_; }
  double eps() const { return eps_; }
  bool has_bias() const { return !bias_.empty(); }

 protected:
  std::size_t dim_;
  double eps_;
  std::vector<float> weight_;  // (dim,)
  std::vector<float> bias_;    // (dim,), or empty: no bias
};

class RMSNormModule : public Norm {
 public:
  // unit_offset (Gemma): the norm scales by (1 + weight); the parameter stays HF's weight
  RMSNormModule(std::size_t dim, double eps, bool unit_offset = false);
  void forward(const float* x, float* out, std::size_t rows) const override;
  std::string kind() const override { return "rms"; }
  bool unit_offset() const { return unit_offset_; }

 private:
  bool unit_offset_;
};

class LayerNormModule : public Norm {
 public:
  LayerNormModule(std::size_t dim, double eps, bool bias) : Norm(dim, eps, 1.f, bias) {}
  void forward(const float* x, float* out, std::size_t rows) const override;
  std::string kind() const override { return "layer"; }
};

// SwiGLU MLP: down(silu(gate(x)) * up(x)). gate and up are stored as one (2*hidden, dim)
// matrix so both projections are a single GEMM; gate_proj/up_proj are views of its halves.
class FeedForwardModule {
 public:
  // gelu_tanh: GeGLU (Gemma), gelu_tanh(gate) * up, instead of SwiGLU's silu(gate) * up
  // format: how gate_up and down are stored (float32, bf16, f16, or int8 / int4 in groups of
  // `group` along the input dimension)
  FeedForwardModule(std::size_t dim, std::size_t hidden, bool bias, bool gelu_tanh = false,
                    WeightFormat format = WeightFormat::f32, std::size_t group = 0);
  // out (m, dim) = [residual +] ffn(x (m, dim)); residual may be out (in-place accumulate)
  void forward(const float* x, std::size_t m, float* out, const float* residual) const;
  std::vector<Param> params();
  std::size_t dim() const { return dim_; }
  std::size_t hidden() const { return hidden_; }
  bool has_bias() const { return bias_; }
  bool gelu_tanh() const { return gelu_tanh_; }
  WeightFormat format() const { return w_down_.load().format(); }
  std::size_t group() const { return w_down_.load().group(); }
  // gate_up and down converted to `to` (q8 / q4 in groups of `group`, or f32); throws
  // std::invalid_argument("[fn] ...") for weights that cannot be quantized. assign() swaps
  // them in.
  StagedWeights converted(WeightFormat to, std::size_t group, const std::string& fn) const;
  void assign(const StagedWeights& w);
  // params() names the fused [gate; up] weight as one tensor, gate_up_proj (Phi-3's layout,
  // which is this module's storage): set before the parameters are first read
  bool fused_names = false;

 private:
  std::size_t dim_, hidden_;
  bool bias_, gelu_tanh_;
  // (mutable: a forward may swap in the same matrix in the tile layout, MatrixLayout)
  mutable WeightBuffer w_gate_up_;  // (2*hidden, dim)
  std::vector<float> b_gate_up_;  // (2*hidden,)
  mutable WeightBuffer w_down_;     // (dim, hidden)
  MatrixLayout layout_;
  // MatrixLayout: before a forward / params() (views: the lock params() holds)
  std::unique_lock<std::mutex> relayout(bool views) const;

 public:
  int tiled() const;  // matrices now in the tile layout (MatrixLayout)

 private:
  std::vector<float> b_down_;     // (dim,)
};

// K/V of past tokens for one layer: k, v (B, Hkv, slots, head_dim), key validity (B, slots).
// `length` tokens have been appended (at most max_len). A cache of a sliding-window layer is a
// rolling buffer: slots = min(max_len, window), and the token at position p sits in slot
// p % slots -- memory O(window) however long the sequence grows (the attention of such a layer
// never looks further back). Otherwise slots = max_len and token p sits in slot p.
// `mutex` is held by whoever appends to or reads the cache in a forward (and by reset);
// `length` is atomic so that it can be read (Python's cache.length) while a forward runs.
// k and v hold elements of `format`: float32, or bf16 / f16 words (half the bytes). Keys and
// values are rounded to nearest even as they are written; attention reads them widened in
// registers (kernels/attention.hpp), never a float32 copy of the cache.
class KVCache {
 public:
  KVCache(std::size_t batch, std::size_t max_len, std::size_t n_kv_heads, std::size_t head_dim,
          std::size_t window = 0, WeightFormat format = WeightFormat::f32);
  std::size_t batch, max_len, n_kv_heads, head_dim;
  std::size_t window;  // 0: not a rolling buffer
  std::size_t slots;   // token slots per sequence and head
  std::atomic<std::size_t> length{0};
  // some token appended since the last reset was padding (key mask 0): only then does
  // attention read `valid` (sticky: a rollback that restores `valid` leaves it set)
  std::atomic<bool> masked{false};
  WeightBuffer k, v;  // (B, Hkv, slots, head_dim) each, zero-filled at construction
  std::vector<std::uint8_t> valid;
  WeightFormat format() const { return k.format(); }
  std::size_t itemsize() const { return WeightBuffer::itemsize(format()); }
  std::mutex mutex;
  void reset() {  // call with `mutex` held
    length = 0;
    masked = false;
  }
  bool wrapped() const { return length.load() > slots; }
};

class MultiHeadAttentionModule {
 public:
  MultiHeadAttentionModule(std::size_t dim, std::size_t n_heads, std::size_t n_kv_heads,
                           std::size_t head_dim, std::vector<double> inv_freq,
                           double attention_factor, bool qkv_bias, bool o_bias, bool causal,
                           std::int64_t window = 0, double softcap = 0.0, double scale = 0.0,
                           bool sinks = false, bool qk_norm = false, double qk_norm_eps = 1e-6,
                           WeightFormat format = WeightFormat::f32, std::size_t group = 0);
  // out (B*T, dim) = [residual +] attn(x (B*T, dim)). positions (B, T): RoPE positions.
  // key_mask: null or (B, T) (no cache) / (B, T) for the new tokens (with cache): 1 = real.
  // With a cache, the new K/V are appended at cache->length and attention covers the cache.
  // inv_freq: null, or (head_dim/2,) frequencies for this call (sequence-length dependent RoPE
  // scaling: dynamic NTK, longrope).
  // last_only: only the last token of each sequence is a query (the K/V of all are computed,
  // appended and attended): out (B, dim) = [the last rows of residual +] attn.
  // weights: null, or (B, Hq, T, T) zeros that take the softmax weights (inspection: no cache,
  // not last_only; the kernel's weights path instead of its streaming one).
  void forward(const float* x, std::size_t batch, std::size_t seq, const std::int64_t* positions,
               const std::uint8_t* key_mask, KVCache* cache, float* out, const float* residual,
               const double* inv_freq_override = nullptr, bool last_only = false,
               float* weights = nullptr) const;
  // One decode step of `rows` independent sequences, one token each: x (rows, dim), positions
  // (rows,), caches (rows,): each sequence's own cache (batch 1), appended to at its own
  // length. The projections run over all rows at once; attention row by row.
  void forward_rows(const float* x, std::size_t rows, const std::int64_t* positions,
                    KVCache* const* caches, float* out, const float* residual,
                    const double* inv_freq_override = nullptr) const;
  std::vector<Param> params();
  WeightFormat format() const { return w_o_.load().format(); }  // of the QKV and O matrices
  std::size_t group() const { return w_o_.load().group(); }
  StagedWeights converted(WeightFormat to, std::size_t group, const std::string& fn) const;
  void assign(const StagedWeights& w);  // qkv and o (see FeedForwardModule::converted)
  std::size_t dim, n_heads, n_kv_heads, head_dim;
  bool qkv_bias, o_bias, causal;
  std::vector<double> inv_freq;
  double attention_factor;
  // attention options (kernels/ops.hpp attn_params): sliding window (0 = none), logit
  // soft-capping (0 = none), score scale (0 = 1/sqrt(head_dim)), learned per-head sinks
  std::int64_t window;
  double softcap, scale;
  bool sinks;
  // Qwen3: RMSNorm of each head of q and of k (weights (head_dim,)) before RoPE
  bool qk_norm;
  double qk_norm_eps;
  // params() names the fused [q; k; v] weight (and bias) as one tensor, qkv_proj (Phi-3's
  // layout, which is this module's storage)
  bool fused_names = false;

 private:
  // (mutable: a forward may swap in the same matrix in the tile layout, MatrixLayout)
  mutable WeightBuffer w_qkv_;          // ((Hq + 2 Hkv) * hd, dim)
  std::vector<float> b_qkv_;            // ((Hq + 2 Hkv) * hd,)
  mutable WeightBuffer w_o_;            // (dim, Hq * hd)
  MatrixLayout layout_;
  // MatrixLayout: before a forward / params() (views: the lock params() holds)
  std::unique_lock<std::mutex> relayout(bool views) const;

 public:
  int tiled() const;  // matrices now in the tile layout (MatrixLayout)

 private:
  std::vector<float> b_o_;              // (dim,)
  std::vector<float> sinks_;            // (Hq,) when sinks
  std::vector<float> q_norm_, k_norm_;  // (head_dim,) each, when qk_norm
  // the stages of forward: RoPE of the projected rows, then attention (appending to cache)
  void rotate(float* qkv, std::size_t m, std::size_t seq, const std::int64_t* positions,
              const double* freqs, bool last_only) const;
  void attend(const float* qkv, std::size_t batch, std::size_t seq, const std::uint8_t* key_mask,
              KVCache* cache, bool last_only, float* weights, float* attn) const;
};

// What an inspection of a forward keeps (llmkernels.inspect), for one block or a whole model:
// null members are not recorded. The model's own forward records nothing; with an observer it
// runs every layer on every position (no last_only inside the blocks) and without a cache.
struct ForwardObserver {
  // The residual stream's per-token RMS at the points a block meets (in this order): pre-norm
  // and sandwich blocks x, norm1(x), h, norm2(h), y; post-norm blocks x + attn(x), h = norm1(.),
  // h + ffn(h), y, y
  static constexpr std::size_t kPoints = 5;
  float* weights = nullptr;  // (n_layers, B, Hq, T, T) zeros: softmax weights of each layer
  // (5 n_layers + 3, B*T) float64: the embedding, each layer's kPoints, the final norm's input
  // and output
  double* rms = nullptr;
};

class TransformerBlockModule {
 public:
  TransformerBlockModule(std::shared_ptr<MultiHeadAttentionModule> attention,
                         std::shared_ptr<FeedForwardModule> feed_forward,
                         std::shared_ptr<Norm> attention_norm, std::shared_ptr<Norm> ffn_norm,
                         bool pre_norm, std::shared_ptr<Norm> post_attention_norm = nullptr,
                         std::shared_ptr<Norm> post_ffn_norm = nullptr);
  // out (B*T, dim) = block(x (B*T, dim)); out may not alias x. last_only: out (B, dim), the
  // last position of each sequence (the cache still takes every token's K/V)
  // weights: null or (B, Hq, T, T) zeros; rms: null or (ForwardObserver::kPoints, B*T) (both
  // need last_only false)
  void forward(const float* x, std::size_t batch, std::size_t seq, const std::int64_t* positions,
               const std::uint8_t* key_mask, KVCache* cache, float* out,
               const double* inv_freq_override = nullptr, bool last_only = false,
               float* weights = nullptr, double* rms = nullptr) const;
  // one decode step of independent sequences (MultiHeadAttentionModule::forward_rows)
  void forward_rows(const float* x, std::size_t rows, const std::int64_t* positions,
                    KVCache* const* caches, float* out,
                    const double* inv_freq_override = nullptr) const;
  std::shared_ptr<MultiHeadAttentionModule> attention;
  std::shared_ptr<FeedForwardModule> feed_forward;
  std::shared_ptr<Norm> attention_norm, ffn_norm;
  bool pre_norm;
  // sandwich layout (Gemma 2), both set: norms before *and* after attention and the MLP
  std::shared_ptr<Norm> post_attention_norm, post_ffn_norm;
};

class TransformerModule {
 public:
  TransformerModule(std::size_t vocab, std::size_t dim,
                    std::vector<std::shared_ptr<TransformerBlockModule>> blocks,
                    std::shared_ptr<Norm> final_norm, bool tie_embeddings, double embed_scale = 0.0,
                    double final_softcap = 0.0, WeightFormat format = WeightFormat::f32,
                    WeightFormat head_format = WeightFormat::f32, std::size_t group = 0);
  // logits (B, T or 1, vocab) for ids (B, T); last_only: logits of the last position only
  void forward(const std::int64_t* ids, std::size_t batch, std::size_t seq,
               const std::int64_t* positions, const std::uint8_t* key_mask,
               std::vector<KVCache*> caches, bool last_only, float* logits,
               const double* inv_freq_override = nullptr,
               const ForwardObserver* observer = nullptr) const;
  // logits (rows, vocab) of one decode step of `rows` independent sequences: ids (rows,),
  // positions (rows,), caches[layer][row] (each sequence's own, batch 1)
  void forward_rows(const std::int64_t* ids, std::size_t rows, const std::int64_t* positions,
                    const std::vector<std::vector<KVCache*>>& caches, float* logits,
                    const double* inv_freq_override = nullptr) const;
  // embed_tokens, lm_head (a view of the embedding when tied, unless the head is quantized)
  std::vector<Param> params();
  WeightFormat format() const { return embed_.format(); }  // of the embedding
  WeightFormat head_format() const;                       // of the LM head
  std::size_t group() const { return lm_head_.load().group(); }
  // the LM head converted to `to` (q8 / q4, or f32: see FeedForwardModule::converted); with
  // tied embeddings a quantized head is a quantized copy of the embedding (which stays float),
  // and converting back to float drops it (the embedding is the head again)
  StagedWeights converted(WeightFormat to, std::size_t group, const std::string& fn) const;
  void assign(const StagedWeights& w);
  std::size_t vocab, dim;
  std::vector<std::shared_ptr<TransformerBlockModule>> blocks;
  std::shared_ptr<Norm> final_norm;
  bool tie_embeddings;
  // the embedding rows are multiplied by this (rounded to float32 first, as transformers'
  // Gemma does with sqrt(dim)); 0 = not scaled
  double embed_scale;
  double final_softcap;  // logits become c * tanh(logits / c) (Gemma 2); 0 = none

 private:
  WeightBuffer embed_;    // (vocab, dim), float formats only
  // (vocab, dim); empty when tied (and not quantized). (mutable: MatrixLayout)
  mutable WeightBuffer lm_head_;
  MatrixLayout layout_;
  // MatrixLayout: before a forward / params() (views: the lock params() holds)
  std::unique_lock<std::mutex> relayout(bool views) const;

 public:
  int tiled() const;  // matrices now in the tile layout (MatrixLayout)

 private:
  // x (m, dim) = the (scaled) embedding rows of ids (m,)
  void embed(const std::int64_t* ids, std::size_t m, float* x) const;
  // logits (rows, vocab) = head(y), y (rows, dim) = final_norm(x (rows, dim)) (y may be x)
  void head_logits(const float* x, float* y, std::size_t rows, float* logits) const;
  // Gemma 2's final soft-capping of n logits (none when final_softcap is 0)
  void cap(float* logits, std::size_t n) const;
};

}  // namespace llmk
