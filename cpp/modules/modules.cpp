#include "modules/modules.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "common/isa.hpp"
#include "common/rope_tables.hpp"
#include "common/scratch.hpp"
#include "common/thread_pool.hpp"
#include "kernels/ops.hpp"
#include "drivers/attend.hpp"
#include "drivers/linear.hpp"
#include "drivers/qlinear.hpp"

namespace llmk {

namespace {

// `bytes` uninitialised bytes (see WeightBuffer): 64-byte aligned, 2 MiB aligned with huge pages
// requested from 4 MiB on
void* alloc_weights(std::size_t bytes) {
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  if (bytes > SIZE_MAX - kHuge) throw std::bad_alloc();
  bool huge = bytes >= 2 * kHuge;
  std::size_t align = huge ? kHuge : 64;
  bytes = (bytes + align - 1) / align * align;  // aligned_alloc wants a multiple of the alignment
  void* p = std::aligned_alloc(align, bytes);
  if (!p) throw std::bad_alloc();
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);  // a hint: ignored where THP is off
  return p;
}

// bytes of the codes / values of n weights in format f
std::size_t data_bytes(std::size_t n, WeightFormat f) {
  if (f == WeightFormat::q8) return n;
  if (f == WeightFormat::q4) return n / 2;
  if (n > SIZE_MAX / 4) throw std::bad_alloc();
  return n * WeightBuffer::itemsize(f);
}

}  // namespace

WeightBuffer::WeightBuffer(std::size_t n, WeightFormat format, std::size_t group, bool zeroed)
    : s_(std::make_shared<Storage>()) {
  s_->n = n;
  s_->format = format;
  if (is_quantized(format)) {
    if (group != 32 && group != 64 && group != 128)
      throw std::invalid_argument("[modules] group_size must be 32, 64 or 128, got " +
                                  std::to_string(group));
    if (n % group) throw std::invalid_argument("[modules] the matrix is not whole groups");
    s_->group = group;
  }
  if (n == 0) return;
  if (zeroed) {
    if (is_quantized(format)) throw std::invalid_argument("[modules] a zeroed buffer is of floats");
    void* p = std::calloc(1, data_bytes(n, format));
    if (!p) throw std::bad_alloc();
    s_->data.reset(p);
    return;
  }
  s_->data.reset(alloc_weights(data_bytes(n, format)));
  if (is_quantized(format)) s_->scales.reset(alloc_weights(n / group * sizeof(std::uint16_t)));
}

void WeightBuffer::Free::operator()(void* p) const { std::free(p); }

std::size_t WeightBuffer::nbytes() const {
  if (!s_) return 0;
  return data_bytes(s_->n, s_->format) +
         (is_quantized(s_->format) ? s_->n / s_->group * sizeof(std::uint16_t) : 0);
}

void* WeightBuffer::at(std::size_t first) const {
  if (!s_) return nullptr;
  return static_cast<char*>(s_->data.get()) + data_bytes(first, s_->format);
}

std::uint16_t* WeightBuffer::scales_at(std::size_t first) const {
  if (!s_ || !s_->group) return nullptr;
  return static_cast<std::uint16_t*>(s_->scales.get()) + first / s_->group;
}

WeightBuffer WeightBuffer::relaid(std::size_t k, bool tiles) const {
  WeightBuffer out(s_->n, s_->format, s_->group);
  if (s_->n)
    tile_int8(static_cast<const std::uint8_t*>(at(0)), scales_at(0), s_->n / k, k, s_->group,
              static_cast<std::uint8_t*>(out.at(0)), out.scales_at(0), /*inverse=*/!tiles);
  out.s_->tiles = tiles;
  return out;
}

void MatrixLayout::on_forward(std::initializer_list<LayoutEntry> m) const {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // params() or another forward is at it
  const bool want = int8_tiles_wanted();
  for (const LayoutEntry& e : m) {
    const WeightBuffer b = e.matrix->load();
    if (b.format() != WeightFormat::q8 || b.size() == 0 || e.k == 0) continue;
    const bool tiles = want && e.eligible;
    if (b.tiles() == tiles) continue;
    // to the tile layout only if nothing but the module (and b here) holds the storage: a
    // state_dict view of it must keep showing the module's codes
    if (tiles && b.holders() > 2) continue;
    e.matrix->store(b.relaid(e.k, tiles));
  }
}

std::unique_lock<std::mutex> MatrixLayout::for_views(std::initializer_list<LayoutEntry> m) const {
  std::unique_lock<std::mutex> lock(mutex_);
  for (const LayoutEntry& e : m) {
    const WeightBuffer b = e.matrix->load();
    if (b.tiles()) e.matrix->store(b.relaid(e.k, false));
  }
  return lock;
}

namespace {

// Thread-local scratch buffers, one slot per purpose, reused from call to call: a steady-state
// call allocates nothing, and threads that share a module never share scratch. Bound: when the
// outermost forward of a thread returns (or fails), slots are freed, largest first, until the
// thread keeps at most kScratchKeepBytes (common/scratch.hpp, 4 MiB): decode steps keep theirs,
// a long prefill's buffers (hundreds of MiB for a large model) are not kept for the life of
// the thread.
enum Slot {
  kNormOut,
  kSandwich,
  kResidual,
  kQKV,
  kAttnOut,
  kGateUp,
  kHidden,
  kRope,
  kBlockTmp,
  kLastRows,
  kKV,
  kSlots
};

struct ThreadScratch {
  std::unique_ptr<float[]> slot[kSlots];
  std::size_t size[kSlots] = {};
  int depth = 0;  // forwards of this thread in progress (they nest: model > block > attention)

  void trim() {
    for (;;) {
      std::size_t total = 0, largest = 0;
      int which = -1;
      for (int i = 0; i < kSlots; ++i) {
        total += size[i] * sizeof(float);
        if (size[i] > largest) largest = size[i], which = i;
      }
      if (total <= kScratchKeepBytes || which < 0) return;
      slot[which].reset();
      size[which] = 0;
    }
  }
};

thread_local ThreadScratch t_scratch;

// Marks a forward in progress on this thread; the outermost one trims the scratch on exit.
class ScratchScope {
 public:
  ScratchScope() { ++t_scratch.depth; }
  ~ScratchScope() {
    if (--t_scratch.depth == 0) t_scratch.trim();
  }
  ScratchScope(const ScratchScope&) = delete;
  ScratchScope& operator=(const ScratchScope&) = delete;
};

// n floats of slot `slot`, uninitialised. Throws std::bad_alloc (nothing is written by then:
// every forward takes its slots before it writes its output or a cache).
float* scratch(Slot which, std::size_t n) {
  if (t_scratch.size[which] < n) {
    t_scratch.slot[which].reset();  // free first: never hold the old and the new at once
    t_scratch.size[which] = 0;
    t_scratch.slot[which].reset(new float[n]);
    t_scratch.size[which] = n;
  }
  return t_scratch.slot[which].get();
}

// y (m, n) [+]= x (m, k) . w^T [+ bias]: the package's one projection path (drivers/linear.hpp),
// weights in HF's (out, in) layout, float32, 16-bit or int8 / int4 (converted in registers)
void project(const float* x, std::size_t m, std::size_t k, WeightRef w, std::size_t n,
             const float* bias, float* y, bool accumulate) {
  linear(x, m, k, w, n, bias, y, accumulate);
}

// The parameters of the (rows, k) matrix stored in b from weight `first` on: name.weight, or
// for int8 / int4 name.qweight (codes) and name.scales (float16), the layout of
// save_pretrained's quantized checkpoints (docs/quantization.md)
void add_matrix(std::vector<Param>& p, const std::string& name, const WeightBuffer& b,
                std::size_t first, std::size_t rows, std::size_t k) {
  const WeightFormat f = b.format();
  if (!is_quantized(f)) {
    p.push_back({name + ".weight", {rows, k}, b.at(first), f, b.keep()});
    return;
  }
  p.push_back(
      {name + ".qweight", {rows, f == WeightFormat::q8 ? k : k / 2}, b.at(first), f, b.keep()});
  p.push_back({name + ".scales", {rows, k / b.group()}, b.scales_at(first), WeightFormat::f16,
               b.keep()});
}

// The matrix src, seen as (src.size() / k, k), in format `to`: int8 / int4 in groups of `group`
// (drivers/qlinear.hpp's quantizer, the bits of lk.quantize) or float32 (exact from every format).
// Row blocks are widened to a float32 tile (at most 1 MiB) and encoded from it: never a float32
// copy of the whole matrix. Throws std::invalid_argument("[fn] <what> ...") for weights that
// cannot be quantized (non-finite, or beyond float16 scales).
WeightBuffer convert_matrix(const WeightBuffer& src, std::size_t k, WeightFormat to,
                            std::size_t group, const std::string& fn, const std::string& what) {
  if (src.tiles()) return convert_matrix(src.relaid(k, false), k, to, group, fn, what);
  const std::size_t n = src.size();
  if (is_quantized(to) && k % group)
    throw std::invalid_argument("[" + fn + "] group_size=" + std::to_string(group) +
                                " does not divide the input dimension " + std::to_string(k) +
                                " of " + what);
  WeightBuffer dst(n, to, group);
  if (n == 0 || k == 0) return dst;
  if (!is_quantized(to) && to != WeightFormat::f32)
    throw std::invalid_argument("[" + fn + "] conversion to bf16 / f16 is not done here");
  const std::size_t rows = n / k;
  const std::size_t block = std::max<std::size_t>(1, (std::size_t{1} << 18) / k);
  std::vector<float> tile;
  const WeightFormat from = src.format();
  for (std::size_t r0 = 0; r0 < rows; r0 += block) {
    const std::size_t nr = std::min(block, rows - r0);
    const float* f;
    if (from == WeightFormat::f32) {
      f = static_cast<const float*>(src.at(r0 * k));
    } else {
      tile.resize(block * k);
      if (is_quantized(from)) {
        const qweights qw{static_cast<const std::uint8_t*>(src.at(r0 * k)), src.scales_at(r0 * k),
                          nr, k, src.group()};
        dequantize_rows(qw, from == WeightFormat::q8 ? 8 : 4, tile.data());
      } else {
        dispatch(widen_w16_kernel{}, tile.data(),
                 static_cast<const std::uint16_t*>(src.at(r0 * k)), from, nr * k);
      }
      f = tile.data();
    }
    if (to == WeightFormat::f32) {
      std::memcpy(dst.at(r0 * k), f, nr * k * sizeof(float));
      continue;
    }
    const int bits = to == WeightFormat::q8 ? 8 : 4;
    QuantStatus st =
        quantize_rows(f, nr, k, group, bits, static_cast<std::uint8_t*>(dst.at(r0 * k)),
                           dst.scales_at(r0 * k));
    if (st.code) {
      st.row += r0;
      throw std::invalid_argument("[" + fn + "] " + what + " cannot be quantized: " +
                                  quant_status_message(st, bits));
    }
  }
  return dst;
}

// out[r] = sqrt(mean(h[r]**2)) over the dim features of each of the rows, in float64 (the
// statistics an observed forward keeps: ForwardObserver)
void row_rms(const float* h, std::size_t rows, std::size_t dim, double* out) {
  for (std::size_t r = 0; r < rows; ++r) {
    double s = 0.0;
    for (std::size_t i = 0; i < dim; ++i) {
      const double v = h[r * dim + i];
      s += v * v;
    }
    out[r] = std::sqrt(s / static_cast<double>(dim));
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// norms

RMSNormModule::RMSNormModule(std::size_t dim, double eps, bool unit_offset)
    : Norm(dim, eps, unit_offset ? 0.f : 1.f), unit_offset_(unit_offset) {}

void RMSNormModule::forward(const float* x, float* out, std::size_t rows) const {
  const std::size_t n = dim_;
  const float* w = weight_.data();
  std::vector<float> w1;  // (dim,) 1 + weight in float32, as Gemma computes it
  if (unit_offset_) {
    w1.resize(n);
    for (std::size_t i = 0; i < n; ++i) w1[i] = 1.f + weight_[i];
    w = w1.data();
  }
  parallel_for(rows, 1, static_cast<double>(n), [&](std::size_t b, std::size_t e) {
    dispatch(rms_norm_kernel{}, out + b * n, x + b * n, w, e - b, n, eps_, false);
  });
}

std::vector<Param> Norm::params() {
  std::vector<Param> p{{"weight", {dim_}, weight_.data()}};
  if (has_bias()) p.push_back({"bias", {dim_}, bias_.data()});
  return p;
}

void LayerNormModule::forward(const float* x, float* out, std::size_t rows) const {
  const std::size_t n = dim_;
  const float* w = weight_.data();
  const float* b = has_bias() ? bias_.data() : nullptr;
  parallel_for(rows, 1, 2.0 * n, [&](std::size_t r0, std::size_t r1) {
    dispatch(layer_norm_kernel{}, out + r0 * n, x + r0 * n, w, b, r1 - r0, n, eps_, false);
  });
}

// ---------------------------------------------------------------------------------------------
// feed-forward

FeedForwardModule::FeedForwardModule(std::size_t dim, std::size_t hidden, bool bias, bool gelu_tanh,
                                     WeightFormat format, std::size_t group)
    : dim_(dim),
      hidden_(hidden),
      bias_(bias),
      gelu_tanh_(gelu_tanh),
      w_gate_up_(2 * hidden * dim, format, group),
      b_gate_up_(bias ? 2 * hidden : 0, 0.f),
      w_down_(dim * hidden, format, group),
      b_down_(bias ? dim : 0, 0.f) {}

void FeedForwardModule::forward(const float* x, std::size_t m, float* out,
                                const float* residual) const {
  ScratchScope scope;
  const std::size_t h = hidden_;
  float* gu = scratch(kGateUp, m * 2 * h);  // (m, 2h): [gate | up]
  float* act = scratch(kHidden, m * h);     // (m, h)
  relayout(false);
  const WeightBuffer w_gate_up = w_gate_up_.load(), w_down = w_down_.load();
  project(x, m, dim_, w_gate_up.ref(), 2 * h, bias_ ? b_gate_up_.data() : nullptr, gu, false);
  swiglu_rows<float>(act, gu, gu + h, m, h, 2 * h, gelu_tanh_);
  if (residual && residual != out) std::memcpy(out, residual, m * dim_ * sizeof(float));
  project(act, m, h, w_down.ref(), dim_, bias_ ? b_down_.data() : nullptr, out,
          residual != nullptr);
}

std::unique_lock<std::mutex> FeedForwardModule::relayout(bool views) const {
  const std::initializer_list<LayoutEntry> m{{&w_gate_up_, dim_, (2 * hidden_) % 16 == 0},
                                              {&w_down_, hidden_, dim_ % 16 == 0}};
  return layout_.apply(views, m);
}

int FeedForwardModule::tiled() const {
  return int(w_gate_up_.load().tiles()) + int(w_down_.load().tiles());
}

StagedWeights FeedForwardModule::converted(WeightFormat to, std::size_t group,
                                           const std::string& fn) const {
  const std::string what = fused_names ? "gate_up_proj" : "gate_proj / up_proj";
  return {{convert_matrix(w_gate_up_.load(), dim_, to, group, fn, what),
           convert_matrix(w_down_.load(), hidden_, to, group, fn, "down_proj")}};
}

void FeedForwardModule::assign(const StagedWeights& w) {
  w_gate_up_.store(w.buffers.at(0));
  w_down_.store(w.buffers.at(1));
}

std::vector<Param> FeedForwardModule::params() {
  const std::unique_lock<std::mutex> layout_lock = relayout(true);  // (until the views exist)
  const WeightBuffer w_gate_up = w_gate_up_.load(), w_down = w_down_.load();
  if (fused_names) {
    std::vector<Param> p;
    add_matrix(p, "gate_up_proj", w_gate_up, 0, 2 * hidden_, dim_);
    add_matrix(p, "down_proj", w_down, 0, dim_, hidden_);
    if (bias_) {
      p.push_back({"gate_up_proj.bias", {2 * hidden_}, b_gate_up_.data()});
      p.push_back({"down_proj.bias", {dim_}, b_down_.data()});
    }
    return p;
  }
  std::vector<Param> p;
  add_matrix(p, "gate_proj", w_gate_up, 0, hidden_, dim_);
  add_matrix(p, "up_proj", w_gate_up, hidden_ * dim_, hidden_, dim_);
  add_matrix(p, "down_proj", w_down, 0, dim_, hidden_);
  if (bias_) {
    p.push_back({"gate_proj.bias", {hidden_}, b_gate_up_.data()});
    p.push_back({"up_proj.bias", {hidden_}, b_gate_up_.data() + hidden_});
    p.push_back({"down_proj.bias", {dim_}, b_down_.data()});
  }
  return p;
}

// ---------------------------------------------------------------------------------------------
// attention

namespace {
WeightFormat check_kv_format(WeightFormat format) {
  if (format != WeightFormat::f32 && format != WeightFormat::bf16 && format != WeightFormat::f16)
    throw std::invalid_argument("[KVCache] dtype must be float32, bfloat16 or float16");
  return format;
}
}  // namespace

KVCache::KVCache(std::size_t b, std::size_t l, std::size_t hkv, std::size_t hd, std::size_t w,
                 WeightFormat format)
    : batch(b),
      max_len(l),
      n_kv_heads(hkv),
      head_dim(hd),
      window(w),
      slots(w > 0 && w < l ? w : l),
      // zeros (slots past `length` are never read; zeros keep a fresh cache's bytes defined),
      // from calloc: only the pages of the tokens written are ever resident
      k(b * hkv * slots * hd, check_kv_format(format), 0, true),
      v(b * hkv * slots * hd, format, 0, true),
      valid(b * slots, 0) {}

namespace {

// float32 -> bfloat16, rounded to nearest even (as ml_dtypes and torch round); NaN stays a
// quiet NaN of the same sign
inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

// float32 -> IEEE float16, rounded to nearest even (as NumPy's astype and F16C's vcvtps2ph):
// past the largest half (65504, ties included) an infinity, below 2^-14 a subnormal; integer
// arithmetic only, so the MXCSR (FTZ/DAZ) cannot change it. NaN stays a quiet NaN.
inline std::uint16_t f32_to_f16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
  if (u >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (u >= 0x38800000u) {  // a normal half: exponent rebased (127 -> 15), 13 bits rounded off
    std::uint32_t r = u - (112u << 23);
    r += 0xfffu + ((r >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (r >> 13));
  }
  if (u <= 0x33000000u) return sign;  // <= 2^-25 (half the smallest subnormal, a tie): zero
  // subnormal half: round(|f| / 2^-24), ties to even (2^-14 itself may come out of the rounding)
  const std::uint32_t e = u >> 23, mant = (u & 0x7fffffu) | 0x800000u, shift = 126u - e;
  std::uint32_t m = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (m & 1u))) ++m;
  return static_cast<std::uint16_t>(sign | m);
}

// n float32 values into K/V storage of format f (a cache's, or a window copy) at element
// `first` of `dst`, rounded to the format
void store_kv(void* dst, WeightFormat f, std::size_t first, const float* src, std::size_t n) {
  if (f == WeightFormat::bf16) {
    auto* d = static_cast<std::uint16_t*>(dst) + first;
    for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
  } else if (f == WeightFormat::f16) {
    auto* d = static_cast<std::uint16_t*>(dst) + first;
    for (std::size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
  } else {
    std::memcpy(static_cast<float*>(dst) + first, src, n * sizeof(float));
  }
}

}  // namespace

MultiHeadAttentionModule::MultiHeadAttentionModule(
    std::size_t dim_, std::size_t n_heads_, std::size_t n_kv_heads_, std::size_t head_dim_,
    std::vector<double> inv_freq_, double attention_factor_, bool qkv_bias_, bool o_bias_,
    bool causal_, std::int64_t window_, double softcap_, double scale_, bool sinks_on,
    bool qk_norm_, double qk_norm_eps_, WeightFormat format, std::size_t group)
    : dim(dim_),
      n_heads(n_heads_),
      n_kv_heads(n_kv_heads_),
      head_dim(head_dim_),
      qkv_bias(qkv_bias_),
      o_bias(o_bias_),
      causal(causal_),
      inv_freq(std::move(inv_freq_)),
      attention_factor(attention_factor_),
      window(window_),
      softcap(softcap_),
      scale(scale_),
      sinks(sinks_on),
      qk_norm(qk_norm_),
      qk_norm_eps(qk_norm_eps_),
      w_qkv_((n_heads_ + 2 * n_kv_heads_) * head_dim_ * dim_, format, group),
      b_qkv_(qkv_bias_ ? (n_heads_ + 2 * n_kv_heads_) * head_dim_ : 0, 0.f),
      w_o_(dim_ * n_heads_ * head_dim_, format, group),
      b_o_(o_bias_ ? dim_ : 0, 0.f),
      sinks_(sinks_on ? n_heads_ : 0, 0.f),
      q_norm_(qk_norm_ ? head_dim_ : 0, 1.f),
      k_norm_(qk_norm_ ? head_dim_ : 0, 1.f) {
  // (the Python module validates these with its own messages; this guards direct use)
  if (window < 0 || window > (std::int64_t{1} << 62))
    throw std::invalid_argument("[MultiHeadAttention] window must be in [0, 2^62]");
  if (!(softcap >= 0.0) || !std::isfinite(softcap) || !(scale >= 0.0) || !std::isfinite(scale))
    throw std::invalid_argument("[MultiHeadAttention] softcap and scale must be finite, >= 0");
  if (2 * inv_freq.size() > head_dim)
    throw std::invalid_argument("[MultiHeadAttention] inv_freq must have at most head_dim/2 = " +
                                std::to_string(head_dim / 2) + " entries, got " +
                                std::to_string(inv_freq.size()));
}

std::unique_lock<std::mutex> MultiHeadAttentionModule::relayout(bool views) const {
  // the q-only and k / v-only projections start at rows hq * hd and (hq + hkv) * hd
  const std::size_t q = n_heads * head_dim, kv = n_kv_heads * head_dim;
  const std::initializer_list<LayoutEntry> m{{&w_qkv_, dim, q % 16 == 0 && kv % 16 == 0},
                                              {&w_o_, q, dim % 16 == 0}};
  return layout_.apply(views, m);
}

int MultiHeadAttentionModule::tiled() const {
  return int(w_qkv_.load().tiles()) + int(w_o_.load().tiles());
}

StagedWeights MultiHeadAttentionModule::converted(WeightFormat to, std::size_t group,
                                                  const std::string& fn) const {
  const std::string what = fused_names ? "qkv_proj" : "q_proj / k_proj / v_proj";
  return {{convert_matrix(w_qkv_.load(), dim, to, group, fn, what),
           convert_matrix(w_o_.load(), n_heads * head_dim, to, group, fn, "o_proj")}};
}

void MultiHeadAttentionModule::assign(const StagedWeights& w) {
  w_qkv_.store(w.buffers.at(0));
  w_o_.store(w.buffers.at(1));
}

std::vector<Param> MultiHeadAttentionModule::params() {
  const std::unique_lock<std::mutex> layout_lock = relayout(true);  // (until the views exist)
  const std::size_t q = n_heads * head_dim, kv = n_kv_heads * head_dim;
  const WeightBuffer w_qkv = w_qkv_.load(), w_o = w_o_.load();
  std::vector<Param> p;
  if (fused_names) {  // Phi-3: [q; k; v] is one tensor, as it is stored
    add_matrix(p, "qkv_proj", w_qkv, 0, q + 2 * kv, dim);
    if (qkv_bias) p.push_back({"qkv_proj.bias", {q + 2 * kv}, b_qkv_.data()});
  } else {
    const char* names[3] = {"q_proj", "k_proj", "v_proj"};
    const std::size_t rows[3] = {q, kv, kv}, first[3] = {0, q, q + kv};
    for (int i = 0; i < 3; ++i) add_matrix(p, names[i], w_qkv, first[i] * dim, rows[i], dim);
    add_matrix(p, "o_proj", w_o, 0, dim, q);
    for (int i = 0; qkv_bias && i < 3; ++i)
      p.push_back({std::string(names[i]) + ".bias", {rows[i]}, b_qkv_.data() + first[i]});
  }
  if (fused_names) add_matrix(p, "o_proj", w_o, 0, dim, q);
  if (o_bias) p.push_back({"o_proj.bias", {dim}, b_o_.data()});
  if (sinks) p.push_back({"sinks", {n_heads}, sinks_.data()});
  if (qk_norm) {
    p.push_back({"q_norm.weight", {head_dim}, q_norm_.data()});
    p.push_back({"k_norm.weight", {head_dim}, k_norm_.data()});
  }
  return p;
}

namespace {
// table rows of 0 for the heads of one token (RoPE below). At namespace scope, built when the
// library loads: a function-local static is built under a guard by the first forward, and a
// process forked while another thread builds it would wait for that guard forever.
const std::vector<std::int64_t> kZeroTableRows(4096, 0);
}  // namespace

// RoPE (after Qwen3's q / k norms) in place on the q and k parts of the rows of qkv
// (m = B*T, width): cos / sin of each token's position in float64; with last_only only the last
// token of each sequence has a query
void MultiHeadAttentionModule::rotate(float* qkv, std::size_t m, std::size_t seq,
                                      const std::int64_t* positions, const double* freqs,
                                      bool last_only) const {
  const std::size_t hd = head_dim, half = inv_freq.size(), hq = n_heads, hkv = n_kv_heads;
  const std::size_t width = (hq + 2 * hkv) * hd;
  ScratchScope scope;
  float* rope_tab = scratch(kRope, m * hd);  // (B*T, [cos half | sin half])
  const std::vector<std::int64_t>& zeros = kZeroTableRows;
  parallel_for(m, 1, 40.0 * half + 4.0 * width, [&](std::size_t b, std::size_t e) {
    for (std::size_t r = b; r < e; ++r) {
      float* c = rope_tab + r * hd;
      float* s = c + half;
      rope_table_row(positions[r], freqs, half, attention_factor, c, s);
      float* q = qkv + r * width;
      // with last_only, a token before the last of its sequence has no query: its k alone
      const bool has_q = !last_only || r % seq == seq - 1;
      if (qk_norm) {  // Qwen3: each q head and each k head RMS-normalised, then rotated
        if (has_q)
          dispatch(rms_norm_kernel{}, q, static_cast<const float*>(q), q_norm_.data(), hq, hd,
                   qk_norm_eps, false);
        dispatch(rms_norm_kernel{}, q + hq * hd, static_cast<const float*>(q + hq * hd),
                 k_norm_.data(), hkv, hd, qk_norm_eps, false);
      }
      // heads of one token share the table row: table_row = 0 with the table at this token
      for (std::size_t h0 = has_q ? 0 : hq; h0 < hq + hkv; h0 += zeros.size()) {
        std::size_t rows = std::min(zeros.size(), hq + hkv - h0);
        dispatch(rope_kernel{}, q + h0 * hd, static_cast<const float*>(q + h0 * hd), zeros.data(),
                 static_cast<const float*>(c), static_cast<const float*>(s), rows, hd, 2 * half,
                 false, false);
      }
    }
  });
}

// The attention of one call's rotated qkv (B*T, width) into attn (mo, Hq*hd): with a cache, the
// new keys and values are appended to it first and attention covers it; weights: null or
// (B, Hq, T, T) (MultiHeadAttentionModule::forward)
void MultiHeadAttentionModule::attend(const float* qkv, std::size_t batch, std::size_t seq,
                                      const std::uint8_t* key_mask, KVCache* cache,
                                      bool last_only, float* weights, float* attn) const {
  const std::size_t m = batch * seq, hd = head_dim, hq = n_heads, hkv = n_kv_heads;
  const std::size_t width = (hq + 2 * hkv) * hd;
  const std::size_t mo = last_only ? batch : m;
  attn_params<float> p{};
  // last_only: one query per sequence, the last token's, which the bottom-right alignment of
  // the causal and window masks places after every key (as a decode step's)
  p.b = batch, p.hq = hq, p.hkv = hkv, p.tq = mo / batch, p.d = hd, p.dv = hd;
  p.q = qkv + (last_only ? (seq - 1) * width : 0);
  p.qs[0] = seq * width, p.qs[1] = hd, p.qs[2] = width;
  p.out = attn;
  p.os[0] = p.tq * hq * hd, p.os[1] = hd, p.os[2] = hq * hd;
  p.scale = scale > 0.0 ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  p.causal = causal;
  p.window = window;
  p.softcap = softcap;
  p.sinks = sinks ? sinks_.data() : nullptr;
  p.weights = weights;
  std::optional<ScratchLease> window_lease;  // the K/V a chunk sees past a rolling cache's end
  if (cache) {
    const std::size_t C = cache->slots, len = cache->length.load();
    // write the new (rotated) keys and values of tokens [t0, seq) at their slots, (len + t) % C
    auto append = [&](std::size_t t0) {
      parallel_for(batch * (seq - t0), 1, 2.0 * hkv * hd, [&](std::size_t b0, std::size_t b1) {
        for (std::size_t i = b0; i < b1; ++i) {
          const std::size_t b = i / (seq - t0), t = t0 + i % (seq - t0), r = b * seq + t;
          const std::size_t slot = (len + t) % C;
          const float* kr = qkv + r * width + hq * hd;
          const float* vr = kr + hkv * hd;
          for (std::size_t g = 0; g < hkv; ++g) {  // rounded to the cache's dtype
            std::size_t off = ((b * hkv + g) * C + slot) * hd;
            store_kv(cache->k.at(0), p.kv_format, off, kr + g * hd, hd);
            store_kv(cache->v.at(0), p.kv_format, off, vr + g * hd, hd);
          }
          const bool real = !key_mask || key_mask[r];
          cache->valid[b * C + slot] = real ? 1 : 0;
          if (!real) cache->masked = true;
        }
      });
    };
    p.mask_kind = AttnMask::boolean;
    // K/V pointers of the attention: the cache's storage (float32, or 16-bit words the kernel
    // widens in registers), or a window copy in the same format
    p.kv_format = cache->format();
    const bool kv16 = p.kv_format != WeightFormat::f32;
    auto set_kv = [&](void* k, void* v) {
      if (kv16) {
        p.k16 = static_cast<const std::uint16_t*>(k);
        p.v16 = static_cast<const std::uint16_t*>(v);
      } else {
        p.k = static_cast<const float*>(k);
        p.v = static_cast<const float*>(v);
      }
    };
    if (len + seq <= C || seq == 1) {
      // In place. Either nothing wraps (slot = position), or one token is decoded past a
      // rolling buffer's end: its C slots then hold exactly the last C = window positions, all
      // of which the new token sees, so the order of the slots does not matter (softmax is a
      // sum over keys) and attention covers all of them.
      append(0);
      const std::size_t tk = std::min(len + seq, C);
      p.tk = tk;
      set_kv(cache->k.at(0), cache->v.at(0));
      p.ks[0] = p.vs[0] = hkv * C * hd, p.ks[1] = p.vs[1] = C * hd, p.ks[2] = p.vs[2] = hd;
      p.mask = cache->valid.data();
      p.mask_strides[0] = static_cast<std::int64_t>(C), p.mask_strides[3] = 1;
      // every slot attention reads holds a real token unless one appended since the last
      // reset was padding: then no mask (the kernel's scalar mask pass was 2% of a prefill)
      if (!cache->masked) p.mask_kind = AttnMask::none;
    } else {
      // Several tokens past a rolling buffer's end: the first of them still sees the
      // window - 1 positions before it, which the later ones push out of the ring. Attention runs
      // over a copy of those P cached positions in order followed by the new tokens (the window
      // and causal masks then apply as without a cache), and the ring takes the new tokens after.
      // The copy is in the cache's dtype (the new tokens rounded as the ring will hold them).
      const std::size_t P = std::min(len, C - 1), tk = P + seq, isz = cache->itemsize();
      window_lease.emplace(batch * tk * (2 * hkv * hd * isz + 1));
      // (B, Hkv, tk, hd) each, in the cache's format
      char* kw = window_lease->as<char>();
      char* vw = kw + batch * hkv * tk * hd * isz;
      auto* mw = reinterpret_cast<std::uint8_t*>(vw + batch * hkv * tk * hd * isz);  // (B, tk)
      const auto* ck = static_cast<const char*>(cache->k.at(0));
      const auto* cv = static_cast<const char*>(cache->v.at(0));
      parallel_for(batch * tk, 1, 2.0 * hkv * hd, [&](std::size_t b0, std::size_t b1) {
        for (std::size_t i = b0; i < b1; ++i) {
          const std::size_t b = i / tk, j = i % tk;
          for (std::size_t g = 0; g < hkv; ++g) {
            const std::size_t dst = ((b * hkv + g) * tk + j) * hd;  // element offset
            if (j < P) {  // cached position len - P + j
              const std::size_t off = ((b * hkv + g) * C + (len - P + j) % C) * hd;
              std::memcpy(kw + dst * isz, ck + off * isz, hd * isz);
              std::memcpy(vw + dst * isz, cv + off * isz, hd * isz);
            } else {  // new token j - P
              const float* kr = qkv + (b * seq + j - P) * width + hq * hd;
              store_kv(kw, p.kv_format, dst, kr + g * hd, hd);
              store_kv(vw, p.kv_format, dst, kr + (hkv + g) * hd, hd);
            }
          }
          mw[b * tk + j] = j < P ? cache->valid[b * C + (len - P + j) % C]
                                 : (key_mask ? (key_mask[b * seq + j - P] ? 1 : 0) : 1);
        }
      });
      append(seq > C ? seq - C : 0);  // only the last C tokens stay
      p.tk = tk;
      set_kv(kw, vw);
      p.ks[0] = p.vs[0] = hkv * tk * hd, p.ks[1] = p.vs[1] = tk * hd, p.ks[2] = p.vs[2] = hd;
      p.mask = mw;
      p.mask_strides[0] = static_cast<std::int64_t>(tk), p.mask_strides[3] = 1;
    }
  } else {
    p.tk = seq;
    p.k = qkv + hq * hd;
    p.v = qkv + (hq + hkv) * hd;
    p.ks[0] = p.vs[0] = seq * width, p.ks[1] = p.vs[1] = hd, p.ks[2] = p.vs[2] = width;
    // (an all-true mask, as a tokenizer gives for unpadded prompts, masks nothing)
    if (key_mask && std::find(key_mask, key_mask + m, std::uint8_t{0}) != key_mask + m) {
      p.mask_kind = AttnMask::boolean;
      p.mask = key_mask;
      p.mask_strides[0] = static_cast<std::int64_t>(seq), p.mask_strides[3] = 1;
    }
  }
  attention<float>(p);
  if (cache) cache->length += seq;
}

void MultiHeadAttentionModule::forward(const float* x, std::size_t batch, std::size_t seq,
                                       const std::int64_t* positions, const std::uint8_t* key_mask,
                                       KVCache* cache, float* out, const float* residual,
                                       const double* inv_freq_override, bool last_only,
                                       float* weights) const {
  const double* freqs = inv_freq_override ? inv_freq_override : inv_freq.data();
  // partial rotary (HF partial_rotary_factor): the first 2 * len(inv_freq) features of each head
  // are rotated, the rest pass through (the constructor checks len(inv_freq) <= head_dim / 2)
  const std::size_t m = batch * seq, hd = head_dim;
  const std::size_t hq = n_heads, hkv = n_kv_heads;
  const std::size_t width = (hq + 2 * hkv) * hd;  // one token's [q | k | v]
  last_only = last_only && seq > 1;
  const std::size_t mo = last_only ? batch : m;  // query rows (and rows of out)
  ScratchScope scope;
  float* qkv = scratch(kQKV, m * width);          // (B*T, width)
  float* attn = scratch(kAttnOut, mo * hq * hd);  // (mo, Hq*hd)
  relayout(false);
  const WeightBuffer w_qkv = w_qkv_.load(), w_o = w_o_.load();
  const float* b_qkv = qkv_bias ? b_qkv_.data() : nullptr;
  if (!last_only) {
    project(x, m, dim, w_qkv.ref(), width, b_qkv, qkv, false);
  } else {
    // Only the last token's query is asked for (and every token's key and value, which the
    // cache keeps or the last query reads): k and v of all B*T tokens, q of B of them, each
    // copied into its token's [q | k | v] (the q of the other tokens is never read)
    float* last = scratch(kLastRows, batch * (dim + hq * hd));  // (B, dim), then (B, Hq*hd)
    float* kv = scratch(kKV, m * 2 * hkv * hd);                  // (B*T, 2*Hkv*hd)
    project(x, m, dim, weight_rows(w_qkv.ref(), hq * hd, dim), 2 * hkv * hd,
            b_qkv ? b_qkv + hq * hd : nullptr, kv, false);
    for (std::size_t b = 0; b < batch; ++b)
      std::memcpy(last + b * dim, x + (b * seq + seq - 1) * dim, dim * sizeof(float));
    float* q_last = last + batch * dim;
    project(last, batch, dim, w_qkv.ref(), hq * hd, b_qkv, q_last, false);
    for (std::size_t r = 0; r < m; ++r)
      std::memcpy(qkv + r * width + hq * hd, kv + r * 2 * hkv * hd, 2 * hkv * hd * sizeof(float));
    for (std::size_t b = 0; b < batch; ++b)
      std::memcpy(qkv + (b * seq + seq - 1) * width, q_last + b * hq * hd,
                  hq * hd * sizeof(float));
  }

  rotate(qkv, m, seq, positions, freqs, last_only);
  attend(qkv, batch, seq, key_mask, cache, last_only, weights, attn);

  if (residual && last_only) {  // the last row of each sequence (in place: rows move down)
    for (std::size_t b = 0; b < batch; ++b)
      std::memmove(out + b * dim, residual + (b * seq + seq - 1) * dim, dim * sizeof(float));
  } else if (residual && residual != out) {
    std::memcpy(out, residual, m * dim * sizeof(float));
  }
  project(attn, mo, hq * hd, w_o.ref(), dim, o_bias ? b_o_.data() : nullptr, out,
          residual != nullptr);
}

// One decode step of `rows` independent sequences, each with its own cache (batch 1): the
// projections run once over all rows (each weight read once for every sequence), attention
// row by row over that row's cache. x (rows, dim), positions (rows,), caches (rows,).
void MultiHeadAttentionModule::forward_rows(const float* x, std::size_t rows,
                                            const std::int64_t* positions,
                                            KVCache* const* caches, float* out,
                                            const float* residual,
                                            const double* inv_freq_override) const {
  const double* freqs = inv_freq_override ? inv_freq_override : inv_freq.data();
  const std::size_t hd = head_dim, hq = n_heads, hkv = n_kv_heads;
  const std::size_t width = (hq + 2 * hkv) * hd;  // one token's [q | k | v]
  ScratchScope scope;
  float* qkv = scratch(kQKV, rows * width);         // (rows, width)
  float* attn = scratch(kAttnOut, rows * hq * hd);  // (rows, Hq*hd)
  relayout(false);
  const WeightBuffer w_qkv = w_qkv_.load(), w_o = w_o_.load();
  project(x, rows, dim, w_qkv.ref(), width, qkv_bias ? b_qkv_.data() : nullptr, qkv, false);
  rotate(qkv, rows, 1, positions, freqs, false);
  for (std::size_t r = 0; r < rows; ++r)
    attend(qkv + r * width, 1, 1, nullptr, caches[r], false, nullptr, attn + r * hq * hd);
  if (residual && residual != out) std::memcpy(out, residual, rows * dim * sizeof(float));
  project(attn, rows, hq * hd, w_o.ref(), dim, o_bias ? b_o_.data() : nullptr, out,
          residual != nullptr);
}

// ---------------------------------------------------------------------------------------------
// block and model

TransformerBlockModule::TransformerBlockModule(std::shared_ptr<MultiHeadAttentionModule> a,
                                               std::shared_ptr<FeedForwardModule> f,
                                               std::shared_ptr<Norm> n1, std::shared_ptr<Norm> n2,
                                               bool pre, std::shared_ptr<Norm> post1,
                                               std::shared_ptr<Norm> post2)
    : attention(std::move(a)),
      feed_forward(std::move(f)),
      attention_norm(std::move(n1)),
      ffn_norm(std::move(n2)),
      pre_norm(pre),
      post_attention_norm(std::move(post1)),
      post_ffn_norm(std::move(post2)) {
  if (!post_attention_norm != !post_ffn_norm)
    throw std::invalid_argument("[TransformerBlock] a sandwich block needs both post norms");
}

namespace {

// A block's forward around its attention call attend(in, out, residual) (out = [residual +]
// attention(in), mo rows): m rows in x, mo rows out (the last row of each sequence of `seq`
// with last_only); rms: null or (ForwardObserver::kPoints, m)
template <class Attend>
void block_forward(const TransformerBlockModule& blk, const float* x, std::size_t m,
                   std::size_t seq, bool last_only, float* out, double* rms, Attend&& attend) {
  ScratchScope scope;
  const std::size_t dim = blk.attention->dim;
  const std::size_t mo = last_only ? m / seq : m;  // rows of out
  float* tmp = scratch(kNormOut, m * dim);
  // the RMS of the residual stream at point i (ForwardObserver), when observed
  auto seen = [&](std::size_t i, const float* h) {
    if (rms) row_rms(h, m, dim, rms + i * m);
  };
  if (blk.post_attention_norm) {
    // sandwich (Gemma 2): h = x + post1(attn(norm1(x))); y = h + post2(ffn(norm2(h)))
    float* a = scratch(kSandwich, mo * dim);  // (mo, dim)
    seen(0, x);
    blk.attention_norm->forward(x, tmp, m);
    seen(1, tmp);
    attend(tmp, a, nullptr);
    blk.post_attention_norm->forward(a, a, mo);
    for (std::size_t r = 0; r < mo; ++r) {
      const float* xr = x + (last_only ? r * seq + seq - 1 : r) * dim;
      for (std::size_t i = 0; i < dim; ++i) out[r * dim + i] = xr[i] + a[r * dim + i];
    }
    seen(2, out);
    blk.ffn_norm->forward(out, tmp, mo);
    seen(3, tmp);
    blk.feed_forward->forward(tmp, mo, a, nullptr);
    blk.post_ffn_norm->forward(a, a, mo);
    for (std::size_t i = 0; i < mo * dim; ++i) out[i] += a[i];
    seen(4, out);
  } else if (blk.pre_norm) {
    // h = x + attn(norm1(x)); y = h + ffn(norm2(h))    (h lives in out)
    seen(0, x);
    blk.attention_norm->forward(x, tmp, m);
    seen(1, tmp);
    attend(tmp, out, x);
    seen(2, out);
    blk.ffn_norm->forward(out, tmp, mo);
    seen(3, tmp);
    blk.feed_forward->forward(tmp, mo, out, out);
    seen(4, out);
  } else {
    // h = norm1(x + attn(x)); y = norm2(h + ffn(h))
    attend(x, tmp, x);
    seen(0, tmp);
    blk.attention_norm->forward(tmp, out, mo);
    seen(1, out);
    blk.feed_forward->forward(out, mo, tmp, out);
    seen(2, tmp);
    blk.ffn_norm->forward(tmp, out, mo);
    seen(3, out);
    seen(4, out);
  }
}

}  // namespace

void TransformerBlockModule::forward(const float* x, std::size_t batch, std::size_t seq,
                                     const std::int64_t* positions, const std::uint8_t* key_mask,
                                     KVCache* cache, float* out,
                                     const double* inv_freq_override, bool last_only,
                                     float* weights, double* rms) const {
  last_only = last_only && seq > 1;
  block_forward(*this, x, batch * seq, seq, last_only, out, rms,
                [&](const float* in, float* o, const float* residual) {
                  attention->forward(in, batch, seq, positions, key_mask, cache, o, residual,
                                     inv_freq_override, last_only, weights);
                });
}

void TransformerBlockModule::forward_rows(const float* x, std::size_t rows,
                                          const std::int64_t* positions, KVCache* const* caches,
                                          float* out, const double* inv_freq_override) const {
  block_forward(*this, x, rows, 1, false, out, nullptr,
                [&](const float* in, float* o, const float* residual) {
                  attention->forward_rows(in, rows, positions, caches, o, residual,
                                          inv_freq_override);
                });
}

TransformerModule::TransformerModule(std::size_t vocab_, std::size_t dim_,
                                     std::vector<std::shared_ptr<TransformerBlockModule>> b,
                                     std::shared_ptr<Norm> n, bool tie, double embed_scale_,
                                     double final_softcap_, WeightFormat format,
                                     WeightFormat head_format, std::size_t group)
    : vocab(vocab_),
      dim(dim_),
      blocks(std::move(b)),
      final_norm(std::move(n)),
      tie_embeddings(tie),
      embed_scale(embed_scale_),
      final_softcap(final_softcap_),
      embed_(vocab_ * dim_, format),
      lm_head_(tie && !is_quantized(head_format) ? 0 : vocab_ * dim_, head_format, group) {
  if (is_quantized(format))
    throw std::invalid_argument("[Transformer] the embedding is stored in a float format");
  if (!tie && !is_quantized(head_format) && head_format != format)
    throw std::invalid_argument("[Transformer] a float LM head has the embedding's format");
}

WeightFormat TransformerModule::head_format() const {
  const WeightBuffer head = lm_head_.load();
  return head.size() ? head.format() : embed_.format();
}

std::unique_lock<std::mutex> TransformerModule::relayout(bool views) const {
  const std::initializer_list<LayoutEntry> m{{&lm_head_, dim, vocab % 16 == 0}};
  return layout_.apply(views, m);
}

int TransformerModule::tiled() const { return int(lm_head_.load().tiles()); }

StagedWeights TransformerModule::converted(WeightFormat to, std::size_t group,
                                           const std::string& fn) const {
  if (tie_embeddings) {  // the head is the embedding, or a quantized copy of it
    if (!is_quantized(to)) return {{WeightBuffer(0, to)}};
    return {{convert_matrix(embed_, dim, to, group, fn, "lm_head (the tied embedding)")}};
  }
  return {{convert_matrix(lm_head_.load(), dim, to, group, fn, "lm_head")}};
}

void TransformerModule::assign(const StagedWeights& w) { lm_head_.store(w.buffers.at(0)); }

std::vector<Param> TransformerModule::params() {
  const std::unique_lock<std::mutex> layout_lock = relayout(true);  // (until the views exist)
  std::vector<Param> p{
      {"model.embed_tokens.weight", {vocab, dim}, embed_.at(0), embed_.format(), embed_.keep()}};
  const WeightBuffer head = lm_head_.load();
  if (head.size()) {
    add_matrix(p, "lm_head", head, 0, vocab, dim);
  } else {
    // tied: HF's state dict still lists lm_head.weight (the same tensor); so do we, as a view
    p.push_back(
        {"lm_head.weight", {vocab, dim}, embed_.at(0), embed_.format(), embed_.keep()});
  }
  return p;
}

void TransformerModule::forward(const std::int64_t* ids, std::size_t batch, std::size_t seq,
                                const std::int64_t* positions, const std::uint8_t* key_mask,
                                std::vector<KVCache*> caches, bool last_only, float* logits,
                                const double* inv_freq_override,
                                const ForwardObserver* observer) const {
  ScratchScope scope;
  const std::size_t m = batch * seq;
  double* rms = observer ? observer->rms : nullptr;  // (5 n_layers + 3, B*T) or null
  float* x = scratch(kResidual, m * dim);  // (B*T, dim)
  float* y = scratch(kBlockTmp, m * dim);
  embed(ids, m, x);
  // last_only: the last block computes the last position of each sequence only (every
  // position's key and value still, which the cache keeps and the last query reads): its
  // output is (B, dim) -- as llama.cpp skips the last layer's unused outputs
  // (an observed forward runs every position through every block: it records them all)
  if (rms) row_rms(x, m, dim, rms);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const bool last_block = last_only && !observer && i + 1 == blocks.size();
    float* weights = nullptr;
    if (observer && observer->weights) {
      const std::size_t per_layer = m * blocks[i]->attention->n_heads * seq;  // (B, Hq, T, T)
      weights = observer->weights + i * per_layer;
    }
    blocks[i]->forward(x, batch, seq, positions, key_mask, caches.empty() ? nullptr : caches[i], y,
                       inv_freq_override, last_block, weights,
                       rms ? rms + (1 + ForwardObserver::kPoints * i) * m : nullptr);
    std::swap(x, y);
  }
  relayout(false);
  const WeightBuffer lm_head = lm_head_.load();  // empty when tied (and not quantized)
  const WeightRef head = lm_head.size() ? lm_head.ref() : embed_.ref();
  if (rms) {  // every position normed (and recorded); the head reads the last ones if asked
    double* fin = rms + (1 + ForwardObserver::kPoints * blocks.size()) * m;
    row_rms(x, m, dim, fin);
    final_norm->forward(x, y, m);
    row_rms(y, m, dim, fin + m);
    if (last_only)
      for (std::size_t b = 0; b < batch; ++b)
        std::memmove(y + b * dim, y + (b * seq + seq - 1) * dim, dim * sizeof(float));
    project(y, last_only ? batch : m, dim, head, vocab, nullptr, logits, false);
    cap(logits, (last_only ? batch : m) * vocab);
  } else if (last_only) {  // x: the last position of each sequence (B, dim); normalise only those
    if (blocks.empty())
      for (std::size_t b = 0; b < batch; ++b)
        std::memmove(x + b * dim, x + (b * seq + seq - 1) * dim, dim * sizeof(float));
    head_logits(x, y, batch, logits);
  } else {
    head_logits(x, x, m, logits);
  }
}

void TransformerModule::forward_rows(const std::int64_t* ids, std::size_t rows,
                                     const std::int64_t* positions,
                                     const std::vector<std::vector<KVCache*>>& caches,
                                     float* logits, const double* inv_freq_override) const {
  ScratchScope scope;
  float* x = scratch(kResidual, rows * dim);  // (rows, dim)
  float* y = scratch(kBlockTmp, rows * dim);
  embed(ids, rows, x);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    blocks[i]->forward_rows(x, rows, positions, caches[i].data(), y, inv_freq_override);
    std::swap(x, y);
  }
  head_logits(x, y, rows, logits);  // (as a last_only decode step of one sequence)
}

void TransformerModule::embed(const std::int64_t* ids, std::size_t m, float* x) const {
  if (embed_.format() == WeightFormat::f32) {
    for (std::size_t r = 0; r < m; ++r)
      std::memcpy(x + r * dim, embed_.at(ids[r] * dim), dim * sizeof(float));
  } else {  // each looked-up row widened to float32 (the matrix stays 16-bit)
    for (std::size_t r = 0; r < m; ++r)
      dispatch(widen_w16_kernel{}, x + r * dim,
               static_cast<const std::uint16_t*>(embed_.at(ids[r] * dim)), embed_.format(), dim);
  }
  if (embed_scale != 0.0) {
    const float sc = static_cast<float>(embed_scale);
    for (std::size_t i = 0; i < m * dim; ++i) x[i] *= sc;
  }
}

void TransformerModule::head_logits(const float* x, float* y, std::size_t rows,
                                    float* logits) const {
  relayout(false);
  const WeightBuffer lm_head = lm_head_.load();  // empty when tied (and not quantized)
  const WeightRef head = lm_head.size() ? lm_head.ref() : embed_.ref();
  final_norm->forward(x, y, rows);
  project(y, rows, dim, head, vocab, nullptr, logits, false);
  cap(logits, rows * vocab);
}

void TransformerModule::cap(float* logits, std::size_t n) const {
  if (final_softcap == 0.0) return;
  // Gemma 2: logits / c, tanh, * c (transformers' order)
  const float c = static_cast<float>(final_softcap);
  parallel_for(n, 1024, 20.0, [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) logits[i] = std::tanh(logits[i] / c) * c;
  });
}

}  // namespace llmk
