// Bindings of the C++ module classes (cpp/modules): declarations only, each .def naming its
// entry in ops/modules.cpp (operand checks, GIL release, the caches held for the forward). The
// public classes are the Python wrappers in llmkernels/modules.py.
#include "bindings/bindings.hpp"
#include "ops/modules_entry.hpp"

namespace llmk::bind {
namespace {

using namespace llmk::ops;

// What every module holding weight matrices has: Module.params() -> the parameter views;
// Module.converted(dtype, group_size, fn) -> staged matrices; Module.assign(staged)
template <class Module, class Class>
void bind_weights(Class& c) {
  using namespace pybind11::literals;
  c.def("params", &module_params<Module>)
      .def("converted", &module_converted<Module>, "dtype"_a, "group_size"_a, "fn"_a,
           "The weight matrices converted to dtype ('int8', 'int4' in groups of group_size, or "
           "'float32'), not yet in use: assign() swaps them in.")
      .def("assign", &Module::assign, "staged"_a)
      .def_property_readonly("group_size", [](const Module& s) { return s.group(); })
      .def_property_readonly("tiled_matrices", &Module::tiled,
                             "int8 matrices now stored in AMX's tile layout (a forward keeps "
                             "them so where the AMX kernel runs; views show the plain layout).");
}

// forward(x, positions, key_mask, cache, inv_freq=None) of a layer that reads a KV cache (the
// attention, the block): `entry` is its entry in ops/modules.cpp
template <class Class, class Entry>
void bind_cached_forward(Class& c, Entry entry) {
  using namespace pybind11::literals;
  c.def("forward", entry, "x"_a, "positions"_a, "key_mask"_a, "cache"_a, "inv_freq"_a = py::none());
}

}  // namespace

void bind_modules(py::module_& m) {
  using namespace pybind11::literals;
  m.def("_linear", &linear_hook, "x"_a, "w"_a, "dtype"_a, "bias"_a = py::none(), "y"_a = py::none(),
        "scales"_a = py::none(), "group"_a = 0,
        "y = x . w^T [+ bias] [+ y] through the modules' projection path, w (n, k) float32, "
        "the uint16 words of bfloat16 / float16 weights, or int8 / int4 codes with float16 "
        "scales and group (dtype); for tests.");
  m.def("_attention_kv16", &attention_kv16_hook, "q"_a, "k"_a, "v"_a, "dtype"_a,
        "causal"_a = false, "window"_a = 0, "scale"_a = 0.0, "key_mask"_a = py::none(),
        "Attention of float32 q over K/V given as the uint16 words of bfloat16 / float16 "
        "(dtype), read the way a KV cache of that dtype is (widened in the kernel); for tests.");

  py::class_<Norm, std::shared_ptr<Norm>>(m, "NormImpl")
      .def("forward", &run_norm, "x"_a)
      .def("params", &module_params<Norm>)
      .def_property_readonly("dim", &Norm::dim)
      .def_property_readonly("kind", &Norm::kind);
  py::class_<RMSNormModule, Norm, std::shared_ptr<RMSNormModule>>(m, "RMSNormImpl")
      .def(py::init<std::size_t, double, bool>(), "dim"_a, "eps"_a, "unit_offset"_a = false)
      .def_property_readonly("eps", &RMSNormModule::eps)
      .def_property_readonly("unit_offset", &RMSNormModule::unit_offset);
  py::class_<LayerNormModule, Norm, std::shared_ptr<LayerNormModule>>(m, "LayerNormImpl")
      .def(py::init<std::size_t, double, bool>(), "dim"_a, "eps"_a, "bias"_a)
      .def_property_readonly("eps", &LayerNormModule::eps)
      .def_property_readonly("has_bias", &LayerNormModule::has_bias);

  py::class_<StagedWeights, std::shared_ptr<StagedWeights>>(m, "StagedWeights");

  py::class_<FeedForwardModule, std::shared_ptr<FeedForwardModule>> ffn(m, "FeedForwardImpl");
  bind_weights<FeedForwardModule>(ffn);
  ffn.def(py::init(&make_feed_forward), "dim"_a, "hidden"_a, "bias"_a, "gelu_tanh"_a = false,
          "dtype"_a = "float32", "group_size"_a = 32, "fn"_a = "FeedForward")
      .def_property_readonly("gelu_tanh", &FeedForwardModule::gelu_tanh)
      .def_property_readonly("dtype", &module_dtype<FeedForwardModule>)
      .def("forward", &feed_forward_forward, "x"_a)
      .def_property_readonly("dim", &FeedForwardModule::dim)
      .def_property_readonly("hidden", &FeedForwardModule::hidden)
      .def_property_readonly("has_bias", &FeedForwardModule::has_bias)
      .def_readwrite("fused_names", &FeedForwardModule::fused_names);

  py::class_<KVCache, std::shared_ptr<KVCache>>(m, "KVCacheImpl")
      .def(py::init(&make_cache), "batch"_a, "max_len"_a, "n_kv_heads"_a, "head_dim"_a,
           "window"_a = 0, "dtype"_a = "float32")
      .def_property_readonly("dtype", &module_dtype<KVCache>)
      .def_property_readonly("nbytes",  // the K and V storage
                             [](const KVCache& c) { return 2 * c.k.size() * c.itemsize(); })
      .def_readonly("batch", &KVCache::batch)
      .def_readonly("max_len", &KVCache::max_len)
      .def_readonly("n_kv_heads", &KVCache::n_kv_heads)
      .def_readonly("head_dim", &KVCache::head_dim)
      .def_readonly("window", &KVCache::window)
      .def_readonly("slots", &KVCache::slots)
      .def_property_readonly("length", [](const KVCache& c) { return c.length.load(); })
      .def_property_readonly("masked", [](const KVCache& c) { return c.masked.load(); })
      .def("reset", &cache_reset)
      .def("crop", &cache_crop, "n"_a)
      .def("keys", &cache_keys)
      .def("values", &cache_values);

  py::class_<MultiHeadAttentionModule, std::shared_ptr<MultiHeadAttentionModule>> mha(
      m, "MultiHeadAttentionImpl");
  bind_weights<MultiHeadAttentionModule>(mha);
  bind_cached_forward(mha, &attention_module_forward);
  mha.def(py::init(&make_attention), "dim"_a, "n_heads"_a, "n_kv_heads"_a, "head_dim"_a,
          "inv_freq"_a, "attention_factor"_a, "qkv_bias"_a, "o_bias"_a, "causal"_a,
          "window"_a = 0, "softcap"_a = 0.0, "scale"_a = 0.0, "sinks"_a = false,
          "qk_norm"_a = false, "qk_norm_eps"_a = 1e-6, "dtype"_a = "float32", "group_size"_a = 32,
          "fn"_a = "MultiHeadAttention")
      .def_property_readonly("dtype", &module_dtype<MultiHeadAttentionModule>)
      .def_readonly("dim", &MultiHeadAttentionModule::dim)
      .def_readonly("n_heads", &MultiHeadAttentionModule::n_heads)
      .def_readonly("n_kv_heads", &MultiHeadAttentionModule::n_kv_heads)
      .def_readonly("head_dim", &MultiHeadAttentionModule::head_dim)
      .def_readonly("qkv_bias", &MultiHeadAttentionModule::qkv_bias)
      .def_readonly("o_bias", &MultiHeadAttentionModule::o_bias)
      .def_readonly("causal", &MultiHeadAttentionModule::causal)
      .def_readonly("window", &MultiHeadAttentionModule::window)
      .def_readonly("softcap", &MultiHeadAttentionModule::softcap)
      .def_readonly("scale", &MultiHeadAttentionModule::scale)
      .def_readonly("sinks", &MultiHeadAttentionModule::sinks)
      .def_readonly("qk_norm", &MultiHeadAttentionModule::qk_norm)
      .def_readonly("qk_norm_eps", &MultiHeadAttentionModule::qk_norm_eps)
      .def_readwrite("fused_names", &MultiHeadAttentionModule::fused_names)
      .def_readonly("attention_factor", &MultiHeadAttentionModule::attention_factor)
      .def_readonly("inv_freq", &MultiHeadAttentionModule::inv_freq);

  py::class_<TransformerBlockModule, std::shared_ptr<TransformerBlockModule>> block(
      m, "TransformerBlockImpl");
  bind_cached_forward(block, &block_forward);
  block
      .def(py::init<std::shared_ptr<MultiHeadAttentionModule>, std::shared_ptr<FeedForwardModule>,
                    std::shared_ptr<Norm>, std::shared_ptr<Norm>, bool, std::shared_ptr<Norm>,
                    std::shared_ptr<Norm>>(),
           "attention"_a, "feed_forward"_a, "attention_norm"_a, "ffn_norm"_a, "pre_norm"_a,
           "post_attention_norm"_a = nullptr, "post_ffn_norm"_a = nullptr)
      .def_readonly("attention", &TransformerBlockModule::attention)
      .def_readonly("feed_forward", &TransformerBlockModule::feed_forward)
      .def_readonly("attention_norm", &TransformerBlockModule::attention_norm)
      .def_readonly("ffn_norm", &TransformerBlockModule::ffn_norm)
      .def_readonly("pre_norm", &TransformerBlockModule::pre_norm);

  py::class_<TransformerModule, std::shared_ptr<TransformerModule>> model(m, "TransformerImpl");
  bind_weights<TransformerModule>(model);
  model.def(py::init(&make_transformer), "vocab"_a, "dim"_a, "blocks"_a, "final_norm"_a,
            "tie_embeddings"_a, "embed_scale"_a = 0.0, "final_softcap"_a = 0.0,
            "dtype"_a = "float32", "head_dtype"_a = py::none(), "group_size"_a = 32,
            "fn"_a = "Transformer")
      // the LM head's (what the model's dtype reports: int8 / int4 once quantized)
      .def_property_readonly(
          "dtype", [](const TransformerModule& s) { return format_name(s.head_format()); })
      .def_property_readonly("embed_dtype", &module_dtype<TransformerModule>)
      .def("forward", &transformer_forward, "ids"_a, "positions"_a, "key_mask"_a, "caches"_a,
           "last_only"_a, "inv_freq"_a = py::none())
      // the forward of llmkernels.inspect: (logits, weights (n_layers, B, Hq, T, T) or None,
      // rms (5 n_layers + 3, B, T) float64) -- see ForwardObserver
      .def("observe", &transformer_observe, "ids"_a, "positions"_a, "key_mask"_a, "last_only"_a,
           "inv_freq"_a, "weights"_a)
      .def("forward_rows", &transformer_forward_rows, "ids"_a, "positions"_a, "caches"_a,
           "inv_freq"_a = py::none())
      .def_readonly("vocab", &TransformerModule::vocab)
      .def_readonly("dim", &TransformerModule::dim)
      .def_readonly("blocks", &TransformerModule::blocks)
      .def_readonly("final_norm", &TransformerModule::final_norm)
      .def_readonly("tie_embeddings", &TransformerModule::tie_embeddings);
}

}  // namespace llmk::bind
