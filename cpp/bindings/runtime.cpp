// Runtime control and introspection: threads, SIMD path, build info, roofline probes.
#include "bindings/bindings.hpp"
#include "common/dot.hpp"
#include "common/isa.hpp"
#include "common/thread_pool.hpp"
#include "ops/entry.hpp"

extern "C" char* openblas_get_config(void);

namespace llmk::bind {

using namespace llmk::ops;

namespace {
// The functions of one dot-product choice of common/dot.hpp
template <class E>
struct DotApi {
  E (*get)();
  void (*set)(E);
  void (*set_auto)();
  const char* (*name)(E);
  bool (*parse)(const std::string&, E*);
  bool (*available)(E);
  std::vector<std::string> (*names)();
};

// `<what>()` -> the active path's name; `_set_<what>(path)` forces one ('auto': the default)
// and returns the previous name
template <class E>
void bind_dot(py::module_& m, const std::string& what, const std::string& cpu_flag,
              const std::string& doc, DotApi<E> api) {
  using namespace pybind11::literals;
  // the portable ones run everywhere; the native ones where the CPU has the instructions
  std::string names;
  for (const std::string& name : api.names()) names += (names.empty() ? "'" : ", '") + name + "'";
  names += " (the native ones on a CPU with " + cpu_flag + ")";
  m.def(
      what.c_str(), [api] { return std::string(api.name(api.get())); },
      (doc + ": " + names + ".").c_str());
  const std::string setter = "_set_" + what;
  m.def(
      setter.c_str(),
      [api, setter, names](const std::string& path) {
        const std::string previous = api.name(api.get());
        E dot;
        if (path == "auto")
          api.set_auto();
        else if (api.parse(path, &dot) && api.available(dot))
          api.set(dot);
        else
          throw py::value_error("[" + setter + "] path must be 'auto', " + names + ", got '" +
                                path + "'");
        return previous;
      },
      "path"_a, "Force the path ('auto' restores the default); returns the previous one.");
}
}  // namespace

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
        "Force a SIMD path (must be supported by the CPU), or 'auto'.");
  m.def("simd_arch_automatic", &isa_automatic,
        "Whether the path is the automatic choice (each kernel family on its fastest path).");
  m.def("family_simd_archs", &family_simd_archs,
        "The SIMD path each kernel family runs now ('other': every kernel of no family).");
  m.attr("cpu_splits_512") = cpu_splits_512();
  // common/dot.hpp: the dot-product paths of the int8-activation and the bfloat16 prefill
  bind_dot<Int8Dot>(m, "int8_dot", "AVX512_VNNI or AMX", "The int8 dot-product path of the prefill",
                    {int8_dot, set_int8_dot, set_int8_dot_auto, int8_dot_name, parse_int8_dot,
                     int8_dot_available, int8_dot_names});
  m.attr("int8_dot_names") = py::tuple(py::cast(int8_dot_names()));
  m.attr("cpu_has_avx512_vnni") = cpu_has_avx512_vnni();
  bind_dot<Bf16Dot>(m, "bf16_dot", "AVX512_BF16 or AMX", "The bf16 dot-product path of the prefill",
                    {bf16_dot, set_bf16_dot, set_bf16_dot_auto, bf16_dot_name, parse_bf16_dot,
                     bf16_dot_available, bf16_dot_names});
  m.attr("bf16_dot_names") = py::tuple(py::cast(bf16_dot_names()));
  m.attr("cpu_has_avx512_bf16") = cpu_has_avx512_bf16();
  m.attr("cpu_has_amx") = cpu_has_amx();
  m.def("openblas_config", [] { return std::string(openblas_get_config()); });
  m.def("_probe_fma_gflops", &probe_fma_gflops, "threads"_a, "iterations"_a);
  m.def("_probe_triad_gbs", &probe_triad_gbs, "threads"_a, "n"_a, "repeats"_a);
  m.def("_probe_read_gbs", &probe_read_gbs, "threads"_a, "n"_a, "repeats"_a);
  m.def("_probe_dot_gops", &probe_dot_gops, "instruction"_a, "threads"_a, "iterations"_a);
  // drivers/gemm_routes.hpp GemmRoute, by name; returns the previous one (tests, bench_gemm.py)
  m.def("_set_gemm_route", &set_gemm_route_by_name, "route"_a);
}

}  // namespace llmk::bind
