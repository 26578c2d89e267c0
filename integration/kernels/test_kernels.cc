// Host (CPU) XLA FFI handlers used as native-kernel fixtures by the tests and
// benchmarks. scripts/kernels.sh builds them into shared libraries against
// the FFI 0.2 and 0.3 headers; the node loads those libraries, and JAX loads
// them for cross-checks. Every error a handler produces names the handler.
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Returns from the enclosing handler if `expr` (an ffi::Error) failed.
#define XN_CHECK(expr)                                  \
  do {                                                  \
    if (ffi::Error xn_err = (expr); xn_err.failure()) { \
      return xn_err;                                    \
    }                                                   \
  } while (0)

// Declares `var` from `expr` (an ffi::ErrorOr) or returns its error.
#define XN_TRY(var, expr)                             \
  auto var##_or = (expr);                             \
  if (!var##_or.has_value()) return var##_or.error(); \
  auto var = *var##_or

ffi::Error Fail(std::string_view kernel, const std::string& message) {
  return ffi::Error::InvalidArgument(std::string(kernel) + ": " + message);
}

std::string ShapeString(ffi::AnyBuffer::Dimensions dims) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < dims.size(); ++i) os << (i ? "," : "") << dims[i];
  os << ']';
  return os.str();
}

std::string DtypeString(ffi::DataType dtype) {
  std::ostringstream os;
  os << dtype;
  return os.str();
}

// Checks that `buf` (named `what`) holds `dtype` elements.
ffi::Error CheckDtype(std::string_view kernel, std::string_view what,
                      const ffi::AnyBuffer& buf, ffi::DataType dtype) {
  if (buf.element_type() == dtype) return ffi::Error::Success();
  return Fail(kernel, std::string(what) + " must be " + DtypeString(dtype) +
                          ", got " + DtypeString(buf.element_type()));
}

// Checks that `buf` (named `what`) is `dtype` with exactly `count` elements.
ffi::Error CheckVector(std::string_view kernel, std::string_view what,
                       const ffi::AnyBuffer& buf, ffi::DataType dtype,
                       size_t count) {
  XN_CHECK(CheckDtype(kernel, what, buf, dtype));
  if (buf.element_count() == count) return ffi::Error::Success();
  return Fail(kernel, std::string(what) + " must have " +
                          std::to_string(count) + " elements, got shape " +
                          ShapeString(buf.dimensions()));
}

// y = x * n + sin(x), elementwise.
ffi::Error AddScaled(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                     float n) {
  constexpr std::string_view k = "xn_add_scaled";
  XN_CHECK(CheckDtype(k, "x", x, ffi::F32));
  XN_CHECK(CheckDtype(k, "result", *y, ffi::F32));
  if (!(x.dimensions() == y->dimensions())) {
    return Fail(k, "result shape " + ShapeString(y->dimensions()) +
                       " differs from x shape " + ShapeString(x.dimensions()));
  }
  const float* in = x.typed_data<float>();
  float* out = y->typed_data<float>();
  for (size_t i = 0, e = x.element_count(); i < e; ++i) {
    out[i] = in[i] * n + std::sin(in[i]);
  }
  return ffi::Error::Success();
}

// Two scalar results: the sum and the maximum of x.
ffi::Error SumMax(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> sum,
                  ffi::Result<ffi::AnyBuffer> max) {
  constexpr std::string_view k = "xn_sum_max";
  XN_CHECK(CheckDtype(k, "x", x, ffi::F32));
  XN_CHECK(CheckVector(k, "sum", *sum, ffi::F32, 1));
  XN_CHECK(CheckVector(k, "max", *max, ffi::F32, 1));
  const float* in = x.typed_data<float>();
  float s = 0.0f;
  float m = -INFINITY;
  for (size_t i = 0, e = x.element_count(); i < e; ++i) {
    s += in[i];
    m = std::fmax(m, in[i]);
  }
  *sum->typed_data<float>() = s;
  *max->typed_data<float>() = m;
  return ffi::Error::Success();
}

// Decodes `key` of the attributes (or, if `nested`, of the `dict` attribute).
template <typename T>
ffi::ErrorOr<T> Get(const ffi::Dictionary& attrs, std::string_view key,
                    bool nested = false) {
  constexpr std::string_view k = "xn_attrs";
  const std::string name(key);
  if (!attrs.contains(key)) {
    return ffi::Unexpected(
        Fail(k, nested ? "dict has no key '" + name + "'"
                       : "missing attribute '" + name + "'"));
  }
  ffi::ErrorOr<T> value = attrs.get<T>(key);
  if (!value.has_value()) {
    return ffi::Unexpected(Fail(k, (nested ? "dict key '" : "attribute '") +
                                       name + "': " + value.error().message()));
  }
  return value;
}

// Echoes every attribute kind back. ret0 f64[11]: a_i8 a_i16 a_i32 a_i64 a_u8
// a_u16 a_u32 a_u64 a_f32 a_f64 a_pred(0/1); ret1 f64[]: arr_i64 then arr_f32;
// ret2 u8[]: the bytes of name; ret3 f64[3]: dict.k, dict.scale, len(label).
ffi::Error EchoAttrs(ffi::Result<ffi::AnyBuffer> scalars,
                     ffi::Result<ffi::AnyBuffer> arrays,
                     ffi::Result<ffi::AnyBuffer> name_bytes,
                     ffi::Result<ffi::AnyBuffer> dict_out,
                     ffi::Dictionary attrs) {
  constexpr std::string_view k = "xn_attrs";
  static constexpr std::string_view kKnown[] = {
      "a_i8",  "a_i16", "a_i32",  "a_i64",   "a_u8",    "a_u16", "a_u32",
      "a_u64", "a_f32", "a_f64",  "a_pred",  "arr_i64", "arr_f32",
      "name",  "dict"};
  for (std::string_view key : attrs) {
    bool known = false;
    for (std::string_view want : kKnown) known = known || key == want;
    if (!known) {
      return Fail(k, "unexpected attribute '" + std::string(key) + "'");
    }
  }

  XN_TRY(i8, Get<int8_t>(attrs, "a_i8"));
  XN_TRY(i16, Get<int16_t>(attrs, "a_i16"));
  XN_TRY(i32, Get<int32_t>(attrs, "a_i32"));
  XN_TRY(i64, Get<int64_t>(attrs, "a_i64"));
  XN_TRY(u8, Get<uint8_t>(attrs, "a_u8"));
  XN_TRY(u16, Get<uint16_t>(attrs, "a_u16"));
  XN_TRY(u32, Get<uint32_t>(attrs, "a_u32"));
  XN_TRY(u64, Get<uint64_t>(attrs, "a_u64"));
  XN_TRY(f32, Get<float>(attrs, "a_f32"));
  XN_TRY(f64, Get<double>(attrs, "a_f64"));
  XN_TRY(pred, Get<bool>(attrs, "a_pred"));
  XN_TRY(arr_i64, Get<ffi::Span<const int64_t>>(attrs, "arr_i64"));
  XN_TRY(arr_f32, Get<ffi::Span<const float>>(attrs, "arr_f32"));
  XN_TRY(name, Get<std::string_view>(attrs, "name"));
  XN_TRY(dict, Get<ffi::Dictionary>(attrs, "dict"));
  XN_TRY(dict_k, Get<int64_t>(dict, "k", true));
  XN_TRY(dict_scale, Get<float>(dict, "scale", true));
  XN_TRY(dict_label, Get<std::string_view>(dict, "label", true));

  const size_t n_arrays = arr_i64.size() + arr_f32.size();
  XN_CHECK(CheckVector(k, "ret0", *scalars, ffi::F64, 11));
  XN_CHECK(CheckVector(k, "ret1", *arrays, ffi::F64, n_arrays));
  XN_CHECK(CheckVector(k, "ret2", *name_bytes, ffi::U8, name.size()));
  XN_CHECK(CheckVector(k, "ret3", *dict_out, ffi::F64, 3));

  double* s = scalars->typed_data<double>();
  const double values[11] = {double(i8),  double(i16), double(i32), double(i64),
                             double(u8),  double(u16), double(u32), double(u64),
                             double(f32), f64,         pred ? 1.0 : 0.0};
  for (size_t i = 0; i < 11; ++i) s[i] = values[i];

  double* a = arrays->typed_data<double>();
  for (int64_t v : arr_i64) *a++ = double(v);
  for (float v : arr_f32) *a++ = double(v);

  uint8_t* b = name_bytes->typed_data<uint8_t>();
  for (char c : name) *b++ = static_cast<uint8_t>(c);

  double* d = dict_out->typed_data<double>();
  d[0] = double(dict_k);
  d[1] = double(dict_scale);
  d[2] = double(dict_label.size());
  return ffi::Error::Success();
}

ffi::Error AlwaysFail(ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer>,
                      std::string_view message) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                    "xn_fail: " + std::string(message));
}

// y = x + 1; deliberately trivial so benchmarks measure call overhead.
ffi::Error Increment(ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y) {
  constexpr std::string_view k = "xn_increment";
  XN_CHECK(CheckDtype(k, "x", x, ffi::F32));
  XN_CHECK(CheckVector(k, "result", *y, ffi::F32, x.element_count()));
  const float* in = x.typed_data<float>();
  float* out = y->typed_data<float>();
  for (size_t i = 0, e = x.element_count(); i < e; ++i) out[i] = in[i] + 1.0f;
  return ffi::Error::Success();
}

// Crashes the process, as a buggy kernel would.
ffi::Error Abort(ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer>) { std::abort(); }

#undef XN_CHECK
#undef XN_TRY

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(xn_add_scaled, AddScaled,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("n"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(xn_sum_max, SumMax,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(xn_attrs, EchoAttrs,
                              ffi::Ffi::Bind()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attrs<ffi::Dictionary>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(xn_fail, AlwaysFail,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<std::string_view>("message"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(xn_increment, Increment,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(xn_abort, Abort,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
