// Dtype name tables (docs/format.md §2, §3).
#include "format/dtypes.h"

#include <c10/util/Exception.h>

#include <array>

#include "dcp/metadata.h"

namespace dcp::detail {
namespace {

struct DtypeName {
  c10::ScalarType dtype;
  const char* python;
  const char* storage;  // nullptr: saved via UntypedStorage + _rebuild_tensor_v3
};

constexpr std::array<DtypeName, 21> kDtypes = {{
    {c10::ScalarType::Float, "float32", "FloatStorage"},
    {c10::ScalarType::Double, "float64", "DoubleStorage"},
    {c10::ScalarType::Half, "float16", "HalfStorage"},
    {c10::ScalarType::BFloat16, "bfloat16", "BFloat16Storage"},
    {c10::ScalarType::Long, "int64", "LongStorage"},
    {c10::ScalarType::Int, "int32", "IntStorage"},
    {c10::ScalarType::Short, "int16", "ShortStorage"},
    {c10::ScalarType::Char, "int8", "CharStorage"},
    {c10::ScalarType::Byte, "uint8", "ByteStorage"},
    {c10::ScalarType::Bool, "bool", "BoolStorage"},
    {c10::ScalarType::ComplexFloat, "complex64", "ComplexFloatStorage"},
    {c10::ScalarType::ComplexDouble, "complex128", "ComplexDoubleStorage"},
    {c10::ScalarType::ComplexHalf, "complex32", nullptr},
    {c10::ScalarType::UInt16, "uint16", nullptr},
    {c10::ScalarType::UInt32, "uint32", nullptr},
    {c10::ScalarType::UInt64, "uint64", nullptr},
    {c10::ScalarType::Float8_e4m3fn, "float8_e4m3fn", nullptr},
    {c10::ScalarType::Float8_e5m2, "float8_e5m2", nullptr},
    {c10::ScalarType::Float8_e4m3fnuz, "float8_e4m3fnuz", nullptr},
    {c10::ScalarType::Float8_e5m2fnuz, "float8_e5m2fnuz", nullptr},
    {c10::ScalarType::Float8_e8m0fnu, "float8_e8m0fnu", nullptr},
}};

struct Alias {
  const char* name;
  c10::ScalarType dtype;
};
constexpr std::array<Alias, 9> kAliases = {{
    {"float", c10::ScalarType::Float},
    {"double", c10::ScalarType::Double},
    {"half", c10::ScalarType::Half},
    {"long", c10::ScalarType::Long},
    {"int", c10::ScalarType::Int},
    {"short", c10::ScalarType::Short},
    {"cfloat", c10::ScalarType::ComplexFloat},
    {"cdouble", c10::ScalarType::ComplexDouble},
    {"chalf", c10::ScalarType::ComplexHalf},
}};

}  // namespace

std::string python_dtype_name(c10::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.python;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(false, "dtype ", dtype, " has no Python DCP equivalent");
}

std::optional<c10::ScalarType> dtype_from_python_name(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (name == d.python) return d.dtype;
  }
  for (const auto& a : kAliases) {
    if (name == a.name) return a.dtype;
  }
  return std::nullopt;
}

std::optional<std::string> legacy_storage_name(c10::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.storage ? std::optional<std::string>(d.storage) : std::nullopt;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(false, "dtype ", dtype, " has no Python DCP equivalent");
}

std::optional<c10::ScalarType> dtype_from_storage_name(const std::string& name) {
  for (const auto& d : kDtypes) {
    if (d.storage && name == d.storage) return d.dtype;
  }
  return std::nullopt;
}

}  // namespace dcp::detail

namespace dcp {

// Declared in dcp/metadata.h; the names are the format's.
std::string dtype_name(c10::ScalarType dtype) { return detail::python_dtype_name(dtype); }

}  // namespace dcp
