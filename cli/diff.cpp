// `dcp diff` (see commands.h): loads both checkpoints whole, without a destination
// (EmptyStateDictLoadPlanner), flattens them to dotted keys and compares key by key. Works
// across world sizes and layouts: what is compared is the global tensor.
#include <ATen/ATen.h>

#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/commands.h"
#include "dcp/checkpoint.h"
#include "dcp/metadata.h"
#include "dcp/planner.h"

namespace dcp::cli {
namespace {

FlatStateDict load_flat(const std::string& checkpoint) {
  StateDict state;
  LoadOptions options;
  options.planner = std::make_shared<EmptyStateDictLoadPlanner>();
  load(state, checkpoint, options);
  return flatten_state_dict(state);
}

struct Outcome {
  std::string key;
  std::string status;  // "equal", "different", "only in A", "only in B"
  std::string detail;
  double max_abs_diff = -1;  // tensors of equal shape and a numeric dtype
};

Outcome compare(const std::string& key, const Value& a, const Value& b) {
  Outcome o{key, "equal", "", -1};
  if (a.is_tensor() != b.is_tensor()) {
    o.status = "different";
    o.detail = std::string("a ") + a.type_name() + " against a " + b.type_name();
    return o;
  }
  if (!a.is_tensor()) {
    if (!(a == b)) o.status = "different", o.detail = "the values differ";
    return o;
  }
  const at::Tensor& x = a.tensor();
  const at::Tensor& y = b.tensor();
  if (x.scalar_type() != y.scalar_type() || x.sizes() != y.sizes()) {
    o.status = "different";
    o.detail = dtype_name(x.scalar_type()) + c10::str(x.sizes()) + " against " +
               dtype_name(y.scalar_type()) + c10::str(y.sizes());
    return o;
  }
  if (at::equal(x, y)) return o;
  o.status = "different";
  if (x.is_floating_point() || x.is_complex() || at::isIntegralType(x.scalar_type(), false)) {
    const at::Tensor d = (x.to(at::kDouble) - y.to(at::kDouble)).abs();
    o.max_abs_diff = d.numel() ? d.max().item<double>() : 0.0;
    o.detail = "largest absolute difference " + c10::str(o.max_abs_diff);
  } else {
    o.detail = "the elements differ";
  }
  return o;
}

}  // namespace

int diff(const std::string& a, const std::string& b, const std::optional<std::string>& keys,
         bool json) {
  const FlatStateDict fa = load_flat(a), fb = load_flat(b);
  std::map<std::string, const Value*> va, vb;
  for (const auto& [k, v] : fa.items) va[k] = &v;
  for (const auto& [k, v] : fb.items) vb[k] = &v;
  std::set<std::string> all;
  for (const auto& [k, v] : va) all.insert(k);
  for (const auto& [k, v] : vb) all.insert(k);
  std::vector<Outcome> outcomes;
  for (const auto& k : all) {
    if (keys && !key_matches(*keys, k)) continue;
    auto ia = va.find(k), ib = vb.find(k);
    if (ib == vb.end())
      outcomes.push_back({k, "only in A", "", -1});
    else if (ia == va.end())
      outcomes.push_back({k, "only in B", "", -1});
    else
      outcomes.push_back(compare(k, *ia->second, *ib->second));
  }
  TORCH_CHECK(!keys || !outcomes.empty(), "no key of either checkpoint matches '", *keys, "'");
  size_t differing = 0;
  for (const auto& o : outcomes) differing += o.status != "equal";
  if (json) {
    nlohmann::ordered_json out;
    out["a"] = a;
    out["b"] = b;
    out["equal"] = differing == 0;
    out["keys"] = nlohmann::ordered_json::array();
    for (const auto& o : outcomes) {
      nlohmann::ordered_json j = {{"key", o.key}, {"status", o.status}};
      if (!o.detail.empty()) j["detail"] = o.detail;
      if (o.max_abs_diff >= 0) j["max_abs_diff"] = o.max_abs_diff;
      out["keys"].push_back(std::move(j));
    }
    std::cout << out.dump(2) << "\n";
  } else {
    for (const auto& o : outcomes) {
      std::cout << o.status << "  " << o.key << (o.detail.empty() ? "" : "  (" + o.detail + ")")
                << "\n";
    }
    std::cout << (differing == 0 ? "EQUAL" : "DIFFERENT") << ": " << outcomes.size()
              << " keys compared, " << differing << " differ\n";
  }
  return differing == 0 ? 0 : 1;
}

}  // namespace dcp::cli
