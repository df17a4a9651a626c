// Roofline probes: how fast this core runs FMAs and streams memory (kernels/probe.hpp).
#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "common/dot.hpp"
#include "common/isa.hpp"
#include "common/thread_pool.hpp"
#include "drivers/gemm_routes.hpp"
#include "kernels/ops.hpp"
#include "ops/entry.hpp"

namespace llmk::ops {
namespace {

using clock_type = std::chrono::steady_clock;

void check_probe_threads(int threads) {
  if (threads < 1 || threads > kMaxThreads)
    fail("_probe", "threads must be between 1 and " + std::to_string(kMaxThreads));
}

}  // namespace

void set_threads(long long n) {
  if (n < 1 || n > kMaxThreads)
    fail("set_num_threads",
         "n must be between 1 and " + std::to_string(kMaxThreads) + ", got " + std::to_string(n));
  py::gil_scoped_release nogil;  // starting (or stopping) the workers can take a while
  set_num_threads(static_cast<int>(n));
}

void set_simd_arch(const std::string& name) {
  if (name == "auto") {  // the best ISA, each kernel family on its measured-fastest path
    set_isa_automatic();
    return;
  }
  Isa isa;
  if (!parse_isa(name, &isa)) {
    const std::vector<std::string> names = isa_names();  // "'sse2', 'avx2' or 'avx512'"
    std::string choices;
    for (std::size_t i = 0; i < names.size(); ++i)
      choices += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + ("'" + names[i] + "'");
    fail("set_simd_arch", "arch must be 'auto', " + choices + ", got '" + name + "'");
  }
  if (isa > best_supported_isa())
    fail("set_simd_arch", "arch '" + name + "' is not supported by this CPU (best: " +
                              isa_name(best_supported_isa()) + ")");
  set_active_isa(isa);
}

// Peak FMA throughput of `threads` threads, GFLOP/s: each thread runs the FMA chain loop for
// `iterations` rounds; the wall time of the slowest gives the aggregate rate.
double probe_fma_gflops(int threads, std::size_t iterations) {
  check_probe_threads(threads);
  py::gil_scoped_release nogil;
  std::vector<double> flops(threads, 0.0);
  std::vector<float> sink(threads, 0.f);
  auto t0 = clock_type::now();
  parallel_for_threads(
      threads, [&](int k, int) { dispatch(fma_probe_kernel{}, iterations, &flops[k], &sink[k]); });
  double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
  double total = 0;
  for (double f : flops) total += f;
  return total / secs * 1e-9;
}

// STREAM triad a = b + s*c over n floats per array, split over `threads`; returns GB/s counted
// as 12 bytes per element (STREAM's convention: two loads, one store).
double probe_triad_gbs(int threads, std::size_t n, int repeats) {
  check_probe_threads(threads);
  py::gil_scoped_release nogil;
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]);
  // first touch by the threads that will use each part
  parallel_for_threads(threads, [&](int k, int total) {
    std::size_t lo = n * k / total, hi = n * (k + 1) / total;
    for (std::size_t i = lo; i < hi; ++i) a[i] = 0.f, b[i] = 1.f, c[i] = 2.f;
  });
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = clock_type::now();
    parallel_for_threads(threads, [&](int k, int total) {
      std::size_t lo = n * k / total, hi = n * (k + 1) / total;
      dispatch(triad_kernel{}, a.get() + lo, b.get() + lo, c.get() + lo, 0.5f, hi - lo);
    });
    double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
    double gbs = 12.0 * static_cast<double>(n) / secs * 1e-9;
    if (gbs > best) best = gbs;
  }
  return best;
}

// Read-only bandwidth: the sum of n floats split over `threads` (what a decode step does to its
// weights), best of `repeats`; GB/s counted as 4 bytes per element.
double probe_read_gbs(int threads, std::size_t n, int repeats) {
  check_probe_threads(threads);
  py::gil_scoped_release nogil;
  std::unique_ptr<float[]> a(new float[n]);
  std::vector<float> sink(threads, 0.f);
  parallel_for_threads(threads, [&](int k, int total) {
    std::size_t lo = n * k / total, hi = n * (k + 1) / total;
    for (std::size_t i = lo; i < hi; ++i) a[i] = 1.f;
  });
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = clock_type::now();
    parallel_for_threads(threads, [&](int k, int total) {
      std::size_t lo = n * k / total, hi = n * (k + 1) / total;
      dispatch(read_kernel{}, a.get() + lo, hi - lo, &sink[k]);
    });
    double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
    best = std::max(best, 4.0 * static_cast<double>(n) / secs * 1e-9);
  }
  return best;
}

// Peak of a dot-product instruction, G operations/s (a multiply-add counts 2): "vpdpbusd"
// (AVX512_VNNI, int8), "vdpbf16ps" (AVX512_BF16), AMX's "tdpbssd" (int8) / "tdpbf16ps", or
// "vpmaddubsw" (AVX2: the int8 kernels' sign + maddubs + madd mix where there is no VNNI); the
// CPU must have it.
double probe_dot_gops(const std::string& instruction, int threads, std::size_t iterations) {
  check_probe_threads(threads);
  const bool maddubs = instruction == "vpmaddubsw";
  const bool int8 = instruction == "vpdpbusd" || instruction == "tdpbssd";
  const bool tiles = instruction == "tdpbssd" || instruction == "tdpbf16ps";
  if (!maddubs && !int8 && !tiles && instruction != "vdpbf16ps")
    fail("_probe_dot_gops", "instruction must be 'vpdpbusd', 'vdpbf16ps', 'tdpbssd', "
                            "'tdpbf16ps' or 'vpmaddubsw', got '" + instruction + "'");
  const bool has = maddubs ? best_supported_isa() >= Isa::avx2
                   : tiles ? cpu_has_amx()
                   : int8  ? cpu_has_avx512_vnni()
                           : cpu_has_avx512_bf16();
  if (!has) fail("_probe_dot_gops", "this CPU has no " + instruction);
  py::gil_scoped_release nogil;
  std::vector<double> ops(threads, 0.0);
  std::vector<int> isink(threads, 0);
  std::vector<float> fsink(threads, 0.f);
  auto t0 = clock_type::now();
  parallel_for_threads(threads, [&](int k, int) {
    ops[k] = maddubs ? dot::probe_maddubs(iterations, &isink[k])
             : tiles ? dot::probe_amx(int8, iterations, &fsink[k])
             : int8 ? dot::probe_vpdpbusd(iterations, &isink[k])
                    : dot::probe_vdpbf16ps(iterations, &fsink[k]);
  });
  double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
  double total = 0;
  for (double o : ops) total += o;
  return total / secs * 1e-9;
}

py::dict family_simd_archs() {
  py::dict d;
  for (int f = 0; f < static_cast<int>(Family::count); ++f)
    d[family_name(static_cast<Family>(f))] = isa_name(family_isa(static_cast<Family>(f)));
  return d;
}

std::string set_gemm_route_by_name(const std::string& name) {
  static const char* const names[] = {"auto", "blas", "packed", "tokens"};
  const int previous = static_cast<int>(gemm_route());
  for (int i = 0; i < 4; ++i)
    if (name == names[i]) {
      set_gemm_route(static_cast<GemmRoute>(i));
      return std::string(names[previous]);
    }
  throw py::value_error("[_set_gemm_route] route must be one of auto, blas, packed, tokens");
}

}  // namespace llmk::ops
