// Runtime control and introspection: threads, SIMD path, build info, roofline probes.
#include "bindings/bindings.hpp"
#include "common/dot.hpp"
#include "common/isa.hpp"
#include "common/thread_pool.hpp"
#include "ops/linear.hpp"
#include "ops/ops.hpp"

extern "C" char* openblas_get_config(void);

namespace llmk::bind {

using namespace llmk::ops;

void bind_runtime(py::module_& m) {
  using namespace pybind11::literals;
  m.def("get_num_threads", &get_num_threads, "Number of threads the kernels use.");
  m.def("set_num_threads", &set_threads, "n"_a,
        "Set the number of threads the kernels (and OpenBLAS) use.");
  m.attr("max_threads") = kMaxThreads;
  m.def(
      "simd_arch", [] { return std::string(isa_name(active_isa())); },
      "The SIMD path in use (one of isa_names).");
  m.attr("isa_names") = py::tuple(py::cast(isa_names()));
  m.def(
      "_is_simd_arch_name",
      [](const std::string& name) {
        Isa isa;
        return parse_isa(name, &isa);
      },
      "name"_a, "Whether LLMKERNELS_ARCH / set_simd_arch accept this spelling.");
  m.def(
      "best_simd_arch", [] { return std::string(isa_name(best_supported_isa())); },
      "The best SIMD path this CPU supports.");
  m.def("set_simd_arch", &ops::set_simd_arch, "arch"_a,
        "Force a SIMD path (must be supported by the CPU).");
  // common/dot.hpp: the int8 dot-product extension of the int8-activation prefill
  m.def(
      "int8_dot", [] { return std::string(int8_dot_name(int8_dot())); },
      "The int8 dot-product path of the int8-activation prefill: 'vnni', 'vnni_simde' or 'none'.");
  m.attr("cpu_has_avx512_vnni") = cpu_has_avx512_vnni();
  m.def(
      "_set_int8_dot",
      [](const std::string& name) {
        const std::string previous = int8_dot_name(int8_dot());
        Int8Dot dot;
        if (name == "auto")
          set_int8_dot_auto();
        else if (parse_int8_dot(name, &dot) && int8_dot_available(dot))
          set_int8_dot(dot);
        else
          throw py::value_error(
              "[_set_int8_dot] path must be 'auto', 'none', 'vnni_simde' or (on a CPU with "
              "AVX512_VNNI) 'vnni', got '" + name + "'");
        return previous;
      },
      "path"_a, "Force the int8 dot-product path ('auto' restores the default); returns the old.");
  // common/dot.hpp: the bf16 dot-product path of the prefill of bfloat16 weights
  m.def(
      "bf16_dot", [] { return std::string(bf16_dot_name(bf16_dot())); },
      "The dot-product path of the bfloat16-weight prefill: 'avx512bf16', 'bf16_simde' or "
      "'none'.");
  m.attr("cpu_has_avx512_bf16") = cpu_has_avx512_bf16();
  m.def(
      "_set_bf16_dot",
      [](const std::string& name) {
        const std::string previous = bf16_dot_name(bf16_dot());
        Bf16Dot dot;
        if (name == "auto")
          set_bf16_dot_auto();
        else if (parse_bf16_dot(name, &dot) && bf16_dot_available(dot))
          set_bf16_dot(dot);
        else
          throw py::value_error(
              "[_set_bf16_dot] path must be 'auto', 'none', 'bf16_simde' or (on a CPU with "
              "AVX512_BF16) 'avx512bf16', got '" + name + "'");
        return previous;
      },
      "path"_a, "Force the bf16 dot-product path ('auto' restores the default); returns the old.");
  m.def("openblas_config", [] { return std::string(openblas_get_config()); });
  m.def("_probe_fma_gflops", &probe_fma_gflops, "threads"_a, "iterations"_a);
  m.def("_probe_triad_gbs", &probe_triad_gbs, "threads"_a, "n"_a, "repeats"_a);
  // ops/linear.hpp GemmRoute, by name; returns the previous one (tests, bench_gemm.py)
  m.def(
      "_set_gemm_route",
      [](const std::string& name) {
        static const char* const names[] = {"auto", "blas", "packed", "tokens"};
        const int previous = static_cast<int>(gemm_route());
        for (int i = 0; i < 4; ++i)
          if (name == names[i]) {
            set_gemm_route(static_cast<GemmRoute>(i));
            return std::string(names[previous]);
          }
        throw py::value_error("[_set_gemm_route] route must be one of auto, blas, packed, tokens");
      },
      "route"_a);
}

}  // namespace llmk::bind
