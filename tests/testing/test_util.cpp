// Shared test kit (see test_util.h).
#include "testing/test_util.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

namespace dcp::testing {

at::Tensor make_tensor(c10::ScalarType dtype, c10::IntArrayRef shape, int64_t seed) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  auto i = at::arange(numel, at::kLong);
  auto f = (((i * 7 + seed) % 251) - 100).to(at::kDouble) / 4.0;
  at::Tensor out;
  if (dtype == at::kBool) {
    out = (((i * 7 + seed) % 251) % 2).to(at::kBool);
  } else if (at::isIntegralType(dtype, /*includeBool=*/false)) {
    auto v = ((i * 7 + seed) % 251) - 100;
    if (dtype == at::kByte) v = (i * 7 + seed) % 251;
    out = v.to(dtype);
  } else {
    out = f.to(dtype);
  }
  return out.reshape(shape);
}

StateDict reference_state_dict() {
  StateDict sd;
  const std::vector<c10::ScalarType> dtypes = {at::kFloat, at::kHalf,  at::kBFloat16, at::kDouble,
                                               at::kChar,  at::kShort, at::kInt,      at::kLong,
                                               at::kByte,  at::kBool};
  Dict tensors;
  int64_t seed = 1;
  for (auto dt : dtypes) {
    const std::string name = dtype_name(dt);
    tensors[name + "_2d"] = make_tensor(dt, {5, 3}, seed++);
    tensors[name + "_scalar"] = make_tensor(dt, {}, seed++);
    tensors[name + "_empty"] = make_tensor(dt, {3, 0}, seed++);
    // Non-contiguous: saved as its values (Python saves the same values).
    tensors[name + "_transposed"] = make_tensor(dt, {4, 6}, seed++).t();
  }
  sd["tensors"] = tensors;

  Dict model;
  model["layers.0.weight"] = make_tensor(at::kFloat, {8, 4}, 100);
  model["layers.0.bias"] = make_tensor(at::kFloat, {8}, 101);
  Dict layer1;
  layer1["weight"] = make_tensor(at::kFloat, {2, 8}, 102);
  model["layers"] = Dict{{std::string("1"), Value(layer1)}};
  sd["model"] = model;

  Dict state0;
  state0["step"] = make_tensor(at::kFloat, {}, 103);
  state0["exp_avg"] = make_tensor(at::kFloat, {8, 4}, 104);
  state0["exp_avg_sq"] = make_tensor(at::kFloat, {8, 4}, 105);
  Dict group;
  group["lr"] = 0.001;
  group["betas"] = Tuple{{0.9, 0.999}};
  group["eps"] = 1e-8;
  group["weight_decay"] = 0.0;
  group["amsgrad"] = false;
  group["params"] = List{Value(0), Value(1), Value(2)};
  Dict optim;
  optim["state"] = Dict{{int64_t{0}, Value(state0)}};
  optim["param_groups"] = List{Value(group)};
  sd["optim"] = optim;

  sd["step"] = 1234;
  sd["big_int"] = int64_t{1} << 40;
  sd["negative"] = -7;
  sd["lr"] = 0.125;
  sd["name"] = "run-7 \xc3\xa9t\xc3\xa9";  // UTF-8
  sd["flag"] = true;
  sd["nothing"] = None{};
  sd["blob"] = Bytes{std::string("\x00\x01\xff\x80 raw", 8)};
  sd["ints"] = List{Value(1), Value(2), Value(3)};
  sd["mixed"] = List{Value("a"), Value(1.5), Value(List{Value(1), Value(2)})};
  sd["list_of_tensors"] = List{Value(make_tensor(at::kFloat, {2}, 200)),
                               Value(make_tensor(at::kLong, {3}, 201))};
  sd["empty_dict"] = Dict{};
  return sd;
}

namespace {

Value blank(const Value& v) {
  if (v.is_tensor()) return at::zeros_like(v.tensor(), at::MemoryFormat::Contiguous);
  if (v.is_dict()) {
    Dict out;
    for (const auto& [k, item] : v.dict()) out.insert_or_assign(k, blank(item));
    return out;
  }
  if (v.is_list()) {
    List out;
    for (const auto& item : v.list()) out.push_back(blank(item));
    return out;
  }
  return None{};
}

}  // namespace

StateDict blank_like(const StateDict& state) { return blank(Value(state)).dict(); }

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/dcp_test_XXXXXX";
  char* made = ::mkdtemp(tmpl.data());
  TORCH_CHECK(made != nullptr, "mkdtemp failed");
  path_ = made;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::future<std::vector<WriteResult>> FaultInjectionWriter::write_data(const SavePlan& plan,
                                                                       SavePlanner& planner) {
  auto results = StorageWriterWrapper::write_data(plan, planner);
  if (point_ == FaultPoint::kWriteData) {
    results.get();  // the data files are written
    TORCH_CHECK(false, "injected fault: write_data failed");
  }
  return results;
}

void FaultInjectionWriter::finish(const Metadata& metadata,
                                  const std::vector<std::vector<WriteResult>>& results) {
  TORCH_CHECK(point_ != FaultPoint::kFinish, "injected fault: finish failed");
  StorageWriterWrapper::finish(metadata, results);
}

WritePayload FailingSavePlanner::resolve_data(const WriteItem& item) {
  TORCH_CHECK(calls_++ != fail_at_, "injected fault: resolve_data of '", item.index.fqn, "'");
  return DefaultSavePlanner::resolve_data(item);
}

std::string describe_difference(const Value& expected, const Value& actual,
                                const std::string& path) {
  std::ostringstream os;
  if (expected.variant().index() != actual.variant().index()) {
    os << path << ": expected " << expected << " got " << actual;
    return os.str();
  }
  if (expected.is_dict()) {
    const Dict& e = expected.dict();
    const Dict& a = actual.dict();
    for (const auto& [k, v] : e) {
      const Value* other = a.find(k);
      if (other == nullptr) return path + "." + key_to_string(k) + ": missing";
      auto d = describe_difference(v, *other, path + "." + key_to_string(k));
      if (!d.empty()) return d;
    }
    if (e.size() != a.size()) return path + ": extra keys";
    return "";
  }
  if (expected.is_list()) {
    const List& e = expected.list();
    const List& a = actual.list();
    if (e.size() != a.size()) return path + ": list length differs";
    for (size_t i = 0; i < e.size(); ++i) {
      auto d = describe_difference(e[i], a[i], path + "." + std::to_string(i));
      if (!d.empty()) return d;
    }
    return "";
  }
  if (expected != actual) {
    os << path << ": expected " << expected << " got " << actual;
    return os.str();
  }
  return "";
}

}  // namespace dcp::testing
