// oneDNN matmul back end (gemm_onednn.h). API: oneDNN 2.6 (Debian 12's libdnnl-dev), dnnl::matmul::desc.
#include "gemm_onednn.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <cstring>
#include <list>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "coc/core/error.h"
#include "coc/core/log.h"

namespace coc::detail {
namespace {

using dnnl::memory;

memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::kF32: return memory::data_type::f32;
    case DType::kBF16: return memory::data_type::bf16;
    case DType::kF16: return memory::data_type::f16;
    case DType::kInt8: return memory::data_type::s8;
  }
  return memory::data_type::undef;
}

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

/// Everything that makes two problems need different primitives.
struct Key {
  DType ab, c;
  int64_t m, n, k, lda, ldb, ldc;
  bool ta, tb;
  float alpha, beta;
  bool operator==(const Key& o) const {
    return std::tie(ab, c, m, n, k, lda, ldb, ldc, ta, tb, alpha, beta) ==
           std::tie(o.ab, o.c, o.m, o.n, o.k, o.lda, o.ldb, o.ldc, o.ta, o.tb, o.alpha, o.beta);
  }
};
struct KeyHash {
  size_t operator()(const Key& x) const {
    size_t h = static_cast<size_t>(x.ab) * 31 + static_cast<size_t>(x.c);
    for (int64_t v : {x.m, x.n, x.k, x.lda, x.ldb, x.ldc}) h = h * 1000003u ^ static_cast<size_t>(v);
    return h * 7 + (x.ta ? 2 : 0) + (x.tb ? 1 : 0) + std::hash<float>()(x.alpha) * 13 + std::hash<float>()(x.beta);
  }
};

/// A primitive and its three memory objects, made once: each call only points them at the caller's buffers
/// (set_data_handle), so a GEMM on the hot path allocates nothing.
struct Entry {
  dnnl::matmul prim;
  memory a, b, c;
};

/// Per-thread LRU of primitives: oneDNN streams are not thread-safe, and a per-thread cache needs no lock. A run
/// sees a few dozen shapes (each layer, each CoC chunk size); the bound only guards against unbounded growth when
/// shapes never repeat (auto's timing, odd m per step).
class Cache {
 public:
  static constexpr size_t kCapacity = 256;
  Entry& get(const Key& key) {
    if (auto it = map_.find(key); it != map_.end()) {
      order_.splice(order_.begin(), order_, it->second.second);
      return it->second.first;
    }
    Entry e = create(key);  // first: a problem oneDNN refuses (it throws) leaves the cache as it was
    if (map_.size() >= kCapacity) {
      map_.erase(order_.back());
      order_.pop_back();
    }
    order_.push_front(key);
    ++created_;
    return map_.emplace(key, std::make_pair(std::move(e), order_.begin())).first->second.first;
  }
  dnnl::stream& stream() { return stream_; }
  int64_t created() const { return created_; }

 private:
  static Entry create(const Key& x) {
    // Row-major views: a [m, k] with strides {lda, 1}, or its transpose {1, lda}; likewise b and c.
    memory::desc a({x.m, x.k}, dnnl_type(x.ab), x.ta ? memory::dims{1, x.lda} : memory::dims{x.lda, 1});
    memory::desc b({x.k, x.n}, dnnl_type(x.ab), x.tb ? memory::dims{1, x.ldb} : memory::dims{x.ldb, 1});
    memory::desc c({x.m, x.n}, dnnl_type(x.c), memory::dims{x.ldc, 1});
    dnnl::primitive_attr attr;
    if (x.alpha != 1.0f) attr.set_output_scales(0, {x.alpha});
    if (x.beta != 0.0f) {
      dnnl::post_ops po;
      po.append_sum(x.beta);
      attr.set_post_ops(po);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, cpu_engine());
    return Entry{dnnl::matmul(pd), memory(a, cpu_engine(), DNNL_MEMORY_NONE), memory(b, cpu_engine(), DNNL_MEMORY_NONE),
                 memory(c, cpu_engine(), DNNL_MEMORY_NONE)};
  }
  std::unordered_map<Key, std::pair<Entry, std::list<Key>::iterator>, KeyHash> map_;
  std::list<Key> order_;
  dnnl::stream stream_{cpu_engine()};
  int64_t created_ = 0;
};

Cache& cache() {
  thread_local Cache c;
  return c;
}

/// Dense copies of strided operands, per thread, grown as needed and kept.
struct Scratch {
  std::vector<char> a, b, c;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

/// Makes `buf` hold at least `bytes`, growing only: a vector resized up again zero-fills what it regains.
void grow(std::vector<char>& buf, int64_t bytes) {
  if (buf.size() < static_cast<size_t>(bytes)) buf.resize(static_cast<size_t>(bytes));
}

/// rows × cols elements of `es` bytes from `src` into `dst`, each with its own leading dimension.
void copy_rows(const void* src, int64_t ld_src, void* dst, int64_t ld_dst, int64_t rows, int64_t cols, int64_t es) {
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(static_cast<char*>(dst) + i * ld_dst * es, static_cast<const char*>(src) + i * ld_src * es,
                static_cast<size_t>(cols * es));
}

/// An operand stored as [rows, cols] with leading dimension ld: dense when ld == cols (or one row). Otherwise packed
/// into `buf` and described as dense. Why: oneDNN 2.6 runs its brgemm kernels only on dense matrices and sends a
/// padded view to gemm:jit, whose sums round differently (measured: a 5×40·40×72 product changes bits when any
/// leading dimension is padded). Packing makes a row's bits independent of the caller's strides, which
/// deterministic mode relies on (its paths store the same rows with different leading dimensions), and keeps the
/// faster kernel. Costs one pass over the operand: O(rows·cols) against the GEMM's O(m·n·k).
GemmOperand densify(GemmOperand x, int64_t rows, int64_t cols, std::vector<char>& buf) {
  if (x.ld == cols || rows == 1) {
    x.ld = cols;
    return x;
  }
  const int64_t es = dtype_size(x.type);
  grow(buf, rows * cols * es);
  copy_rows(x.data, x.ld, buf.data(), cols, rows, cols, es);
  return {buf.data(), x.type, cols, x.trans};
}

}  // namespace

void onednn_gemm(const GemmOperand& a_in, const GemmOperand& b_in, void* c, DType ct, int64_t ldc, int64_t m,
                 int64_t n, int64_t k, float alpha, float beta) {
  Scratch& sc = scratch();
  const GemmOperand a = densify(a_in, a_in.trans ? k : m, a_in.trans ? m : k, sc.a);
  const GemmOperand b = densify(b_in, b_in.trans ? n : k, b_in.trans ? k : n, sc.b);
  const GemmOperand c_in{c, ct, ldc, false};
  // c is read (beta != 0) and written: packed in before, unpacked after.
  const GemmOperand cd = beta != 0.0f ? densify(c_in, m, n, sc.c) : GemmOperand{c, ct, ldc == n || m == 1 ? n : ldc};
  void* cdata = const_cast<void*>(cd.data);
  if (cd.ld != n) {  // beta == 0 and strided: compute into scratch, nothing to pack in
    grow(sc.c, m * n * dtype_size(ct));
    cdata = sc.c.data();
  }
  const Key key{a.type, ct, m, n, k, a.ld, b.ld, n, a.trans, b.trans, alpha, beta};
  try {
    Cache& cc = cache();
    Entry& e = cc.get(key);
    e.a.set_data_handle(const_cast<void*>(a.data));
    e.b.set_data_handle(const_cast<void*>(b.data));
    e.c.set_data_handle(cdata);
    e.prim.execute(cc.stream(), {{DNNL_ARG_SRC, e.a}, {DNNL_ARG_WEIGHTS, e.b}, {DNNL_ARG_DST, e.c}});
    cc.stream().wait();
    if (cdata != c) copy_rows(cdata, n, c, ldc, m, n, dtype_size(ct));
  } catch (const dnnl::error& err) {
    const std::string what = fmt::format("oneDNN matmul {} x {} -> {}: op(a) [{}, {}] (ld {}{}), op(b) [{}, {}] "
                                         "(ld {}{}), c [{}, {}] (ld {}): {}",
                                         to_string(a_in.type), to_string(b_in.type), to_string(ct), m, k, a_in.ld,
                                         a_in.trans ? ", transposed" : "", k, n, b_in.ld,
                                         b_in.trans ? ", transposed" : "", m, n, ldc, err.what());
    if (err.status == dnnl_unimplemented)
      throw_invalid("rank {}: {}: oneDNN has no kernel for {} inputs on this CPU; compute in fp32 here, or use a CPU "
                    "with AVX512_BF16 or AMX (coc env says what this one has)",
                    log::rank(), what, to_string(a_in.type));
    throw Error(ErrorKind::kInternal, fmt::format("rank {}: {}", log::rank(), what));
  }
}

std::string onednn_kernel_name(DType t) {
  try {
    const Key key{t, DType::kF32, 64, 64, 64, 64, 64, 64, false, false, 1.0f, 0.0f};
    Entry& e = cache().get(key);
    const char* name = nullptr;
    dnnl_primitive_desc_query(e.prim.get_primitive_desc(), dnnl_query_impl_info_str, 0, &name);
    return name ? name : "";
  } catch (const dnnl::error&) {
    return "";
  }
}

int64_t onednn_primitives_created() { return cache().created(); }

}  // namespace coc::detail
