// rope: rotary position embedding of rows (kernels/rope.hpp); cos/sin tables built in
// common/rope_tables.hpp (shared with the attention module)
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "common/isa.hpp"
#include "common/rope_tables.hpp"
#include "common/thread_pool.hpp"
#include "kernels/ops.hpp"
#include "ops/entry.hpp"

namespace llmk::ops {
namespace {

// rows of x (..., d) rotated with table row table_row[r] for row r
void run_rope(const py::array& x, const std::int64_t* tr, const py::array& cos_tab,
              const py::array& sin_tab, std::size_t rotary_dim, bool interleaved, py::array& out) {
  std::size_t rows, d;
  rows_cols(x, &rows, &d);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* xp = cptr<T>(x);
    const T* cp = cptr<T>(cos_tab);
    const T* sp = cptr<T>(sin_tab);
    T* op = ptr<T>(out);
    // streamed stores at o + i and o + half + i: both row starts and halves must be aligned
    const bool stream = !interleaved && rotary_dim == d &&
                        use_stream_aligned_rows(out, d * sizeof(T)) &&
                        (rotary_dim / 2 * sizeof(T)) % 64 == 0;
    py::gil_scoped_release nogil;
    parallel_for(rows, 1, static_cast<double>(d), [&](std::size_t b, std::size_t e) {
      dispatch(rope_kernel{}, op + b * d, xp + b * d, tr + b, cp, sp, e - b, d, rotary_dim,
               interleaved, stream);
    });
  };
  if (is_f32(x))
    run(float{});
  else
    run(double{});
}

}  // namespace

// cos/sin tables (P, half) for positions (P,) int64 and inv_freq (half,) float64: the angle
// pos * inv_freq is formed and reduced in double (exact for positions up to 2^53), then
// cos/sin are scaled by attention_factor and rounded to the output dtype.
py::tuple rope_tables(py::array_t<std::int64_t, py::array::c_style> positions,
                      py::array_t<double, py::array::c_style> inv_freq, double attention_factor,
                      py::dtype dtype) {
  const char* fn = "rope";
  if (positions.ndim() != 1) fail(fn, "positions table must be 1-D");
  if (inv_freq.ndim() != 1) fail(fn, "inv_freq must be 1-D");
  std::size_t p = static_cast<std::size_t>(positions.shape(0));
  std::size_t half = static_cast<std::size_t>(inv_freq.shape(0));
  auto build = [&](auto tag) {
    using T = decltype(tag);
    py::array_t<T> cos_tab({p, half}), sin_tab({p, half});
    const std::int64_t* pos = positions.data();
    const double* f = inv_freq.data();
    T* c = cos_tab.mutable_data();
    T* s = sin_tab.mutable_data();
    {
      py::gil_scoped_release nogil;
      parallel_for(p, 1, 40.0 * static_cast<double>(half), [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i)
          rope_table_row(pos[i], f, half, attention_factor, c + i * half, s + i * half);
      });
    }
    return py::make_tuple(cos_tab, sin_tab);
  };
  if (same_dtype(dtype, py::dtype::of<float>())) return build(float{});
  if (same_dtype(dtype, py::dtype::of<double>())) return build(double{});
  throw py::type_error("[rope] dtype must be float32 or float64");
}

void rope(py::array x, py::array_t<std::int64_t, py::array::c_style> table_row, py::array cos_tab,
          py::array sin_tab, std::size_t rotary_dim, bool interleaved, py::array out) {
  const char* fn = "rope";
  check_operand(fn, "x", x, nullptr, false);
  check_operand(fn, "out", out, &x, true);
  check_same_shape(fn, "out", out, x);
  check_operand(fn, "cos", cos_tab, &x, false);
  check_operand(fn, "sin", sin_tab, &x, false);
  if (x.ndim() < 1) fail(fn, "x must have at least 1 dimension");
  std::size_t rows, d;
  rows_cols(x, &rows, &d);
  if (rotary_dim % 2 != 0 || rotary_dim > d) fail(fn, "rotary_dim must be even and <= D");
  std::size_t half = rotary_dim / 2;
  if (cos_tab.ndim() != 2 || cos_tab.shape(1) != static_cast<py::ssize_t>(half))
    fail(fn, "cos table must have shape (P, rotary_dim/2)");
  check_same_shape(fn, "sin", sin_tab, cos_tab);
  if (table_row.ndim() != 1 || table_row.shape(0) != static_cast<py::ssize_t>(rows))
    fail(fn, "table_row must have one entry per row");
  const std::int64_t* tr = table_row.data();
  const std::int64_t n_tab = cos_tab.shape(0);
  for (std::size_t r = 0; r < rows; ++r)
    if (tr[r] < 0 || tr[r] >= n_tab) fail(fn, "table_row entry out of range");
  run_rope(x, tr, cos_tab, sin_tab, rotary_dim, interleaved, out);
}

namespace {

// rotary_dim: None (D) or an int (numbers.Integral, not a bool), even and in [0, D]
std::size_t rotary_dim_arg(py::handle h, py::ssize_t d) {
  const char* fn = "rope";
  if (h.is_none()) {
    if (d % 2)
      fail(fn, "rotary_dim (default D=" + std::to_string(d) + ") must be even, got " +
                   std::to_string(d));
    return static_cast<std::size_t>(d);
  }
  static py::handle integral =
      py::object(py::module_::import("numbers").attr("Integral")).release();
  if (PyBool_Check(h.ptr()) || !py::isinstance(h, integral))
    throw py::type_error("[rope] rotary_dim must be an int, got " + type_name(h));
  auto r = py::reinterpret_steal<py::object>(PyNumber_Long(h.ptr()));
  if (!r) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(r.ptr(), &overflow);
  const bool odd = overflow ? py::cast<int>(r.attr("__and__")(1)) != 0 : v % 2 != 0;
  const std::string text = py::str(r);
  if (odd) fail(fn, "rotary_dim must be even, got " + text);
  if (overflow || v < 0 || v > d)
    fail(fn, "rotary_dim must be in [0, D=" + std::to_string(d) + "], got " + text);
  return static_cast<std::size_t>(v);
}

// positions (an integer ndarray) broadcastable to lead = x.shape[:-1], as int64 C-contiguous
py::array_t<std::int64_t> positions_arg(const py::array& pos, const py::array& x) {
  const char* fn = "rope";
  const char kind = pos.dtype().kind();
  if (kind != 'i' && kind != 'u')
    throw py::type_error("[rope] positions must be an integer array, got dtype " +
                         std::string(py::str(pos.dtype())));
  const py::ssize_t nl = x.ndim() - 1, np_ = pos.ndim();
  bool ok = np_ <= nl;
  for (py::ssize_t a = 0; ok && a < np_; ++a) {
    const py::ssize_t pd = pos.shape(np_ - 1 - a), ld = x.shape(nl - 1 - a);
    ok = pd == ld || pd == 1;
  }
  if (!ok)
    fail(fn, "positions must have shape (T,) or be broadcastable to x.shape[:-1] = " +
                 tuple_str(x.shape(), nl) + ", got " + shape_str(pos) +
                 " (per-batch positions for x of shape (B, H, T, D) are (B, 1, T))");
  if (kind == 'u' && pos.itemsize() == 8 && pos.size()) {
    auto u = py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>::ensure(pos);
    const std::uint64_t* up = u.data();
    for (py::ssize_t i = 0; i < u.size(); ++i)
      if (up[i] > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail(fn, "positions must be < 2**63");
  }
  auto p = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(pos);
  if (!p) throw py::error_already_set();
  return p;
}

// table row of each row of x (..., D): the index into positions (flattened) that row r of x
// broadcasts to (r % T for positions of shape (T,) or the default arange(T))
std::vector<std::int64_t> table_rows(const py::array& x, const py::array* pos) {
  const py::ssize_t nl = x.ndim() - 1;
  std::size_t rows = 1;
  for (py::ssize_t a = 0; a < nl; ++a) rows *= static_cast<std::size_t>(x.shape(a));
  std::vector<std::int64_t> tr(rows);
  const py::ssize_t t = x.shape(nl - 1);
  if (!pos || (pos->ndim() == 1 && pos->shape(0) == t)) {
    for (std::size_t r = 0; r < rows; ++r)
      tr[r] = static_cast<std::int64_t>(r % static_cast<std::size_t>(t));
    return tr;
  }
  // strides (in entries) of positions along lead's axes: 0 where it broadcasts
  std::vector<std::int64_t> stride(static_cast<std::size_t>(nl), 0);
  std::int64_t s = 1;
  for (py::ssize_t a = pos->ndim() - 1; a >= 0; --a) {
    const py::ssize_t la = nl - pos->ndim() + a;
    if (pos->shape(a) != 1) stride[static_cast<std::size_t>(la)] = s;
    s *= pos->shape(a);
  }
  std::vector<py::ssize_t> idx(static_cast<std::size_t>(nl), 0);
  std::int64_t cur = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    tr[r] = cur;
    for (py::ssize_t a = nl - 1; a >= 0; --a) {  // next multi-index, C order
      const auto ua = static_cast<std::size_t>(a);
      cur += stride[ua];
      if (++idx[ua] < x.shape(a)) break;
      cur -= stride[ua] * x.shape(a);
      idx[ua] = 0;
    }
  }
  return tr;
}

// The tables of the default call (positions arange(T), rotary_dim = D, frequencies from theta),
// by (T, D, theta, attention_factor, dtype): one map lookup instead of the caller's LRU (which
// hashes positions and frequencies). Only touched with the GIL held; the arrays are the LRU's
// (read-only), small (at most kDefaultBytes each, kDefaultEntries of them and kDefaultBudget
// bytes in all, cleared when full),
// and never released at exit (no Python calls after finalisation).
struct default_key {
  py::ssize_t t, d;
  double theta, factor;
  int kind;
  bool operator<(const default_key& o) const {
    return std::tie(t, d, theta, factor, kind) < std::tie(o.t, o.d, o.theta, o.factor, o.kind);
  }
};
constexpr std::size_t kDefaultBytes = std::size_t(1) << 20;
constexpr std::size_t kDefaultEntries = 64;
// all the map's tables together (cos and sin): with the Python LRU's 24 MiB, the 32 MiB the
// README promises in all (the map may hold tables the LRU has already let go)
constexpr std::size_t kDefaultBudget = std::size_t(8) << 20;
std::size_t default_tables_bytes = 0;  // guarded by the GIL, as the map
std::map<default_key, std::pair<py::object, py::object>>& default_tables() {
  static auto* tables = new std::map<default_key, std::pair<py::object, py::object>>();
  return *tables;
}

// 1 / theta ** (arange(0, rdim, 2) / rdim) in float64, as rope_inv_freq computes it
py::array_t<double> default_inv_freq(std::size_t rdim, double theta) {
  py::array_t<double> f(static_cast<py::ssize_t>(rdim / 2));
  double* fp = f.mutable_data();
  for (std::size_t i = 0; i < rdim / 2; ++i)
    fp[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(rdim));
  return f;
}

}  // namespace

// The rope op (_ops.rope): x (..., T, D) rotated at positions (None: arange(T); or an integer
// array broadcastable to x.shape[:-1]) with frequencies inv_freq (float64 (rotary_dim/2,)) or
// 1 / theta ** (2i / rotary_dim); every argument checked with the public messages. cos/sin
// tables come from tables(positions (P,) int64, inv_freq, attention_factor, dtype) (the
// Python layer's LRU; None: built here), those of the default call from a small map. Returns
// None when x is not a plain array, positions or inv_freq not ndarrays, or out overlaps x
// other than exactly (the Python layer converts those and calls again).
py::object fast_rope(py::handle x_h, py::handle pos_h, py::handle theta_h, py::handle inv_h,
                     py::handle inter_h, py::handle rdim_h, py::handle af_h, py::handle out_h,
                     py::handle tables_h) {
  const char* fn = "rope";
  const int kind = plain_kind(x_h);
  const auto& api = py::detail::npy_api::get();
  auto exact_ndarray = [&](py::handle h) {
    return Py_TYPE(h.ptr()) == reinterpret_cast<PyTypeObject*>(api.PyArray_Type_);
  };
  if (!kind || (!pos_h.is_none() && !exact_ndarray(pos_h)) ||
      (!inv_h.is_none() && plain_kind(inv_h) != 2))
    return py::none();
  auto x = py::reinterpret_borrow<py::array>(x_h);
  if (x.ndim() < 2) fail(fn, "x must have shape (..., T, D), got " + shape_str(x));
  const py::ssize_t t = x.shape(x.ndim() - 2), d = x.shape(x.ndim() - 1);
  const std::size_t rdim = rotary_dim_arg(rdim_h, d), half = rdim / 2;
  const bool interleaved = public_bool(fn, "interleaved", inter_h);
  const double factor = public_finite(fn, "attention_factor", af_h);
  double theta = 0.0;
  std::optional<py::array> inv;
  if (inv_h.is_none()) {
    theta = public_finite(fn, "theta", theta_h);
    if (theta <= 0) fail(fn, "theta must be > 0, got " + float_repr(theta));
  } else {
    inv = py::reinterpret_borrow<py::array>(inv_h);
    if (inv->ndim() != 1 || inv->shape(0) != static_cast<py::ssize_t>(half))
      fail(fn, "inv_freq must have shape (rotary_dim/2,) = (" + std::to_string(half) + ",), got " +
                   shape_str(*inv));
    const double* f = cptr<double>(*inv);
    for (std::size_t i = 0; i < half; ++i)
      if (!std::isfinite(f[i])) fail(fn, "inv_freq must be finite");
  }
  std::optional<py::array_t<std::int64_t>> pos;
  if (!pos_h.is_none()) pos = positions_arg(py::reinterpret_borrow<py::array>(pos_h), x);
  py::array out = public_out(fn, out_h, x);
  if (overlaps(x, out) && x.data() != out.data()) return py::none();
  if (x.size() == 0) return std::move(out);
  if (rdim == 0) {
    if (out.data() != x.data())
      std::memcpy(out.mutable_data(), x.data(), static_cast<std::size_t>(x.nbytes()));
    return std::move(out);
  }
  const py::dtype dtype = x.dtype();
  auto make_tables = [&](py::array positions, py::array freqs) -> std::pair<py::array, py::array> {
    py::tuple cs = tables_h.is_none()
                       ? rope_tables(positions, freqs, factor, dtype)
                       : py::tuple(tables_h(positions, freqs, py::float_(factor), dtype));
    // (the tables callback is the Python layer's; checked all the same: the kernel trusts them)
    if (cs.size() != 2) fail(fn, "tables must return (cos, sin)");
    auto c = cs[0].cast<py::array>(), s = cs[1].cast<py::array>();
    check_operand(fn, "cos", c, &x, false);
    check_operand(fn, "sin", s, &x, false);
    if (c.ndim() != 2 || c.shape(0) != positions.size() ||
        c.shape(1) != static_cast<py::ssize_t>(half) || !same_shape(c, s))
      fail(fn, "tables must have shape (P, rotary_dim/2)");
    return {c, s};
  };
  auto arange = [](py::ssize_t n) {
    py::array_t<std::int64_t> a(n);
    for (py::ssize_t i = 0; i < n; ++i) a.mutable_data()[i] = i;
    return a;
  };
  std::pair<py::array, py::array> tabs;
  if (!pos && !inv && rdim == static_cast<std::size_t>(d)) {
    const default_key key{t, d, theta, factor, kind};
    auto& cache = default_tables();
    auto hit = cache.find(key);
    if (hit != cache.end()) {
      tabs = {hit->second.first, hit->second.second};
    } else {
      tabs = make_tables(arange(t), default_inv_freq(rdim, theta));
      const std::size_t bytes = static_cast<std::size_t>(tabs.first.nbytes()) * 2;
      if (bytes <= 2 * kDefaultBytes) {
        if (cache.size() >= kDefaultEntries || default_tables_bytes + bytes > kDefaultBudget) {
          cache.clear();
          default_tables_bytes = 0;
        }
        cache.emplace(key, std::make_pair(tabs.first, tabs.second));
        default_tables_bytes += bytes;
      }
    }
  } else {
    py::array freqs = inv ? *inv : py::array(default_inv_freq(rdim, theta));
    py::array flat = pos ? py::array(py::array_t<std::int64_t>({pos->size()}, pos->data(), *pos))
                         : py::array(arange(t));
    tabs = make_tables(flat, freqs);
  }
  const std::vector<std::int64_t> tr = table_rows(x, pos ? &*pos : nullptr);
  run_rope(x, tr.data(), tabs.first, tabs.second, rdim, interleaved, out);
  return std::move(out);
}

}  // namespace llmk::ops
