// The Python entries of the C++ module classes (ops/modules.cpp): what bindings/modules.cpp binds
// to the NormImpl, FeedForwardImpl, KVCacheImpl, MultiHeadAttentionImpl, TransformerBlockImpl
// and TransformerImpl classes and to the test hooks _linear / _attention_kv16. Each forward
// checks its operands (ValueError "[Module] ..."), allocates the output, releases the GIL, holds
// the KV caches it reads and appends (their mutexes, in address order; a failed call appends
// nothing) and runs the whole forward in C++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "modules/modules.hpp"
#include "ops/common.hpp"

namespace llmk::ops {

using f32_array = py::array_t<float, py::array::c_style>;
using f64_array = py::array_t<double, py::array::c_style>;
using i64_array = py::array_t<std::int64_t, py::array::c_style>;
using u8_array = py::array_t<std::uint8_t, py::array::c_style>;

// The weight formats by their NumPy names (Python passes and reads these strings).
WeightFormat parse_format(const std::string& name);
std::string format_name(WeightFormat f);

// The group size of format f (0 for the float ones), checked once, here, for the Python entry
// `fn` that was given it: 32, 64 or 128, dividing every input dimension of the module's
// quantized matrices (`dims`: name and size, as the message names them).
using Dims = std::vector<std::pair<const char*, std::size_t>>;
std::size_t check_group(const std::string& fn, WeightFormat f, long long group, const Dims& dims);
Dims group_dims(const FeedForwardModule& m);
Dims group_dims(const MultiHeadAttentionModule& m);
Dims group_dims(const TransformerModule& m);

// name -> zero-copy view of each parameter, in its storage dtype; the view keeps alive the
// module (`owner`), or the weight storage it shows (which quantize() may replace)
py::dict param_views(std::vector<Param> params, py::handle owner);

// Module.params: param_views of the module `self`, the views keeping it alive
template <class Module>
py::dict module_params(py::object self) {
  return param_views(self.cast<Module&>().params(), self);
}

// Module.converted(dtype, group_size, fn): the weight matrices converted, staged (assign()
// swaps them in); the conversion runs without the GIL
template <class Module>
StagedWeights module_converted(const Module& self, const std::string& dtype, long long group,
                               const std::string& fn) {
  const WeightFormat f = parse_format(dtype);
  const std::size_t g = check_group(fn, f, group, group_dims(self));
  py::gil_scoped_release nogil;
  return self.converted(f, g, fn);
}

// Module.dtype and friends: the name of a module's weight format
template <class Module>
std::string module_dtype(const Module& self) {
  return format_name(self.format());
}

// NormImpl.forward: x (..., dim) -> (..., dim)
f32_array run_norm(const Norm& norm, f32_array x);

// FeedForwardImpl: the constructor and forward, x (m, dim) -> (m, dim)
std::shared_ptr<FeedForwardModule> make_feed_forward(std::size_t dim, std::size_t hidden,
                                                     bool bias, bool gelu_tanh,
                                                     const std::string& dtype, long long group,
                                                     const std::string& fn);
f32_array feed_forward_forward(const FeedForwardModule& self, f32_array x);

// KVCacheImpl: the constructor; reset (waits for a forward using the cache); keys / values
// (B, Hkv, min(length, slots), hd) in the cache's dtype: a view keeping the cache (`self`)
// alive, or a copy once a rolling buffer has wrapped
std::shared_ptr<KVCache> make_cache(std::size_t batch, std::size_t max_len,
                                    std::size_t n_kv_heads, std::size_t head_dim,
                                    std::size_t window, const std::string& dtype);
void cache_reset(KVCache& c);
// keep the first n tokens (n <= length; not below length once a rolling buffer wrapped)
void cache_crop(KVCache& c, std::size_t n);
py::array cache_keys(py::object self);
py::array cache_values(py::object self);

// MultiHeadAttentionImpl, TransformerBlockImpl: constructor and forward of x (B, T, dim) with
// positions (B, T), key mask (B, T) or None, a cache or None, per-call inv_freq or None
std::shared_ptr<MultiHeadAttentionModule> make_attention(
    std::size_t dim, std::size_t n_heads, std::size_t n_kv_heads, std::size_t head_dim,
    std::vector<double> inv_freq, double attention_factor, bool qkv_bias, bool o_bias,
    bool causal, std::int64_t window, double softcap, double scale, bool sinks, bool qk_norm,
    double qk_norm_eps, const std::string& dtype, long long group, const std::string& fn);
f32_array attention_module_forward(const MultiHeadAttentionModule& self, f32_array x,
                                   i64_array positions, std::optional<u8_array> key_mask,
                                   KVCache* cache, std::optional<f64_array> inv_freq);
f32_array block_forward(const TransformerBlockModule& self, f32_array x, i64_array positions,
                        std::optional<u8_array> key_mask, KVCache* cache,
                        std::optional<f64_array> inv_freq);

// TransformerImpl: the constructor; forward of ids (B, T) -> logits (B, T or 1, vocab) with one
// cache per block (or none); observe, the forward of llmkernels.inspect: (logits, weights
// (n_layers, B, Hq, T, T) or None, rms (5 n_layers + 3, B, T) float64) -- see ForwardObserver
std::shared_ptr<TransformerModule> make_transformer(
    std::size_t vocab, std::size_t dim, std::vector<std::shared_ptr<TransformerBlockModule>> blocks,
    std::shared_ptr<Norm> final_norm, bool tie, double embed_scale, double final_softcap,
    const std::string& dtype, std::optional<std::string> head_dtype, long long group,
    const std::string& fn);
f32_array transformer_forward(const TransformerModule& self, i64_array ids, i64_array positions,
                              std::optional<u8_array> key_mask, std::vector<KVCache*> caches,
                              bool last_only, std::optional<f64_array> inv_freq);
py::tuple transformer_observe(const TransformerModule& self, i64_array ids, i64_array positions,
                              std::optional<u8_array> key_mask, bool last_only,
                              std::optional<f64_array> inv_freq, bool weights);
// one decode step of independent sequences (Transformer.decode): ids (B,), positions (B,),
// caches[b] the n_layers caches of sequence b (batch 1) -> logits (B, vocab)
f32_array transformer_forward_rows(const TransformerModule& self, i64_array ids,
                                   i64_array positions,
                                   std::vector<std::vector<KVCache*>> caches,
                                   std::optional<f64_array> inv_freq);

// _linear (tests): y (m, n) = x (m, k) . w^T [+ bias] [+ y] through the modules' projection path
// (drivers/linear.hpp), w (n, k) float32, the uint16 words of bf16 / f16, or int8 / int4 codes
// (dtype "int8": w int8 (n, k); "int4": w uint8 (n, k / 2)) with `scales` float16 (n, k / group)
f32_array linear_hook(f32_array x, py::array w, const std::string& dtype,
                      std::optional<f32_array> bias, std::optional<f32_array> y,
                      std::optional<py::array> scales, std::size_t group);

// _attention_kv16 (tests): out (B, Hq, Tq, Dv) = attention of q (B, Hq, Tq, D) float32 over k
// (B, Hkv, Tk, D) and v (B, Hkv, Tk, Dv) given as the uint16 words of bfloat16 / float16, read
// as a KV cache's are; optional key mask (B, Tk), causal, window, scale (0: 1/sqrt(D))
f32_array attention_kv16_hook(f32_array q, py::array k, py::array v, const std::string& dtype,
                              bool causal, std::int64_t window, double scale,
                              std::optional<u8_array> key_mask);

}  // namespace llmk::ops
