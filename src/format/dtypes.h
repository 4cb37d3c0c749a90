// Dtype names as Python spells them in pickles: torch.<name> dtype globals and the legacy
// typed-storage classes (torch.FloatStorage, ...) of torch.save records.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

namespace dcp::detail {

/// Canonical Python name ("float32", "bfloat16", ...). Throws for dtypes Python lacks.
std::string python_dtype_name(c10::ScalarType dtype);
/// Accepts canonical names and aliases ("float", "double", "half", "long", ...).
std::optional<c10::ScalarType> dtype_from_python_name(const std::string& name);
/// The legacy storage class ("FloatStorage") or nullopt for dtypes saved through
/// UntypedStorage and _rebuild_tensor_v3.
std::optional<std::string> legacy_storage_name(c10::ScalarType dtype);
std::optional<c10::ScalarType> dtype_from_storage_name(const std::string& name);

}  // namespace dcp::detail
