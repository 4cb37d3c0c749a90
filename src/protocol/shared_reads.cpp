// Read once, broadcast (see shared_reads.h).
//
// Note [Read once, broadcast]
//   1. The coordinator, after the global load plan (plan_shared_reads): a tensor read is shared
//      when every rank has it exactly once, with the same saved chunk (storage_index), offsets
//      and lengths. It leaves the ranks' plans. The shared boxes are put in storage order (file,
//      then offset) and cut into runs, one root each: a root takes boxes while it stays within
//      its fair share (every rank's own reads plus the shared bytes, over the ranks); then the
//      rank that reads least so far takes over. Each root thus reads a stretch of a file front
//      to back. Every rank gets the same list of (root, bytes, saved dtype), each entry with
//      its own destination item.
//   2. "prepare reads" step: finish_plan, and each root resolves the buffers of its boxes: the
//      destination itself when it is a contiguous CPU tensor of the saved dtype (no copy), else
//      a temporary in the saved dtype.
//   3. "read" step: the storage reads (a rank's own plan plus its root boxes, through the
//      exchange's planner, which routes the root boxes into their buffers and marks them read)
//      run on a second thread, while this thread walks the list: a box of at least kPackBelow
//      bytes is one broadcast, straight from the root's buffer into each rank's; smaller ones
//      with the same root travel packed, up to kPackBytes a broadcast. A root waits until the
//      boxes of the broadcast are read, so reading and broadcasting overlap. Each rank copies
//      into its destination where its buffer was a temporary (casting as a storage read would)
//      and commits. Nothing that fails stops a rank from joining every broadcast (a root whose
//      read failed sends what its buffer holds); the step then raises the read's error, else
//      the first destination's, on every rank. Only MPI calls of this thread touch `comm`.
//
// What stays read per rank: boxes only some ranks need (a broadcast over the whole
// communicator would send them to ranks that do not), boxes that differ in part (resharding
// overlaps), and byte items (non-tensor values, which are small). Device tensors are broadcast
// through host memory (the temporary buffer), not over NCCL.
#include "protocol/shared_reads.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <exception>
#include <algorithm>
#include <functional>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "util/checked.h"

namespace dcp::detail {
namespace {

constexpr int64_t kPackBelow = int64_t{1} << 20;  // smaller boxes travel packed
constexpr int64_t kPackBytes = int64_t{16} << 20;  // the most bytes of one packed broadcast

// Hash and equality of a read's storage side: which saved chunk, which box of it.
struct BoxHash {
  size_t operator()(const ReadItem* r) const {
    size_t h = std::hash<std::string>{}(r->storage_index.fqn);
    auto mix = [&h](int64_t v) {
      h ^= std::hash<int64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    };
    if (r->storage_index.offset) {
      for (int64_t v : *r->storage_index.offset) mix(v);
    }
    for (int64_t v : r->storage_offsets) mix(v);
    for (int64_t v : r->lengths) mix(v);
    return h;
  }
};
struct BoxEq {
  bool operator()(const ReadItem* a, const ReadItem* b) const {
    return a->storage_index == b->storage_index && a->storage_offsets == b->storage_offsets &&
           a->lengths == b->lengths;
  }
};
using BoxIndex = std::unordered_map<const ReadItem*, size_t, BoxHash, BoxEq>;

// The saved dtype of a tensor read, or nullopt when the metadata has no tensor under its key.
std::optional<c10::ScalarType> saved_dtype(const Metadata& metadata, const ReadItem& item) {
  auto it = metadata.state_dict_metadata.find(item.storage_index.fqn);
  if (it == metadata.state_dict_metadata.end()) return std::nullopt;
  const auto* tensor = std::get_if<TensorStorageMetadata>(&it->second);
  if (tensor == nullptr) return std::nullopt;
  return tensor->properties.dtype;
}

// The bytes of a read's box in the saved dtype; 0 when unknown or overflowing.
int64_t box_bytes(const Metadata& metadata, const ReadItem& item) {
  const auto dtype = saved_dtype(metadata, item);
  if (!dtype) return 0;
  const auto volume = checked_volume(item.lengths);
  if (!volume) return 0;
  return checked_mul(*volume, static_cast<int64_t>(c10::elementSize(*dtype))).value_or(0);
}

}  // namespace

std::vector<std::vector<SharedRead>> plan_shared_reads(std::vector<LoadPlan>& plans,
                                                       const Metadata& metadata) {
  const size_t n = plans.size();
  std::vector<std::vector<SharedRead>> out(n);
  if (n < 2) return out;

  // Candidates: rank 0's tensor reads (a box every rank reads is among them), in its order;
  // where[r]: the box's position in rank r's plan, -1 while unseen.
  struct Group {
    std::vector<int64_t> where;
    bool shared = true;  // false once a rank reads the box twice
  };
  BoxIndex index;
  std::vector<Group> groups;
  for (size_t i = 0; i < plans[0].items.size(); ++i) {
    const ReadItem& item = plans[0].items[i];
    if (item.type != LoadItemType::TENSOR) continue;
    auto [pos, fresh] = index.emplace(&item, groups.size());
    if (!fresh) {
      groups[pos->second].shared = false;
      continue;
    }
    groups.push_back(Group{std::vector<int64_t>(n, -1)});
    groups.back().where[0] = static_cast<int64_t>(i);
  }
  if (groups.empty()) return out;
  for (size_t r = 1; r < n; ++r) {
    for (size_t i = 0; i < plans[r].items.size(); ++i) {
      const ReadItem& item = plans[r].items[i];
      if (item.type != LoadItemType::TENSOR) continue;
      auto pos = index.find(&item);
      if (pos == index.end()) continue;
      Group& g = groups[pos->second];
      if (g.where[r] >= 0) g.shared = false;
      g.where[r] = static_cast<int64_t>(i);
    }
  }

  std::vector<std::vector<bool>> taken(n);
  for (size_t r = 0; r < n; ++r) taken[r].assign(plans[r].items.size(), false);
  std::vector<int64_t> group_bytes(groups.size(), 0);
  bool any = false;
  for (size_t k = 0; k < groups.size(); ++k) {
    Group& g = groups[k];
    for (int64_t w : g.where) g.shared = g.shared && w >= 0;
    if (!g.shared) continue;
    group_bytes[k] = box_bytes(metadata, plans[0].items[g.where[0]]);
    if (group_bytes[k] == 0) {  // nothing to send (or no tensor): the reader handles it
      g.shared = false;
      continue;
    }
    for (size_t r = 0; r < n; ++r) taken[r][g.where[r]] = true;
    any = true;
  }
  if (!any) return out;

  // What each rank reads anyway, so that roots even out the whole load.
  std::vector<int64_t> load(n, 0);
  int64_t total = 0;
  for (size_t r = 0; r < n; ++r) {
    for (size_t i = 0; i < plans[r].items.size(); ++i) {
      const ReadItem& item = plans[r].items[i];
      if (!taken[r][i] && item.type == LoadItemType::TENSOR) load[r] += box_bytes(metadata, item);
    }
    total += load[r];
  }
  // The shared boxes in storage order (file, offset; rank 0's order for the rest).
  std::vector<std::tuple<std::string, int64_t, size_t>> order;
  for (size_t k = 0; k < groups.size(); ++k) {
    if (!groups[k].shared) continue;
    total += group_bytes[k];
    auto where = metadata.storage_data.find(plans[0].items[groups[k].where[0]].storage_index);
    if (where == metadata.storage_data.end()) {
      order.emplace_back(std::string(), 0, k);
    } else {
      order.emplace_back(where->second.relative_path, where->second.offset, k);
    }
  }
  std::stable_sort(order.begin(), order.end());
  const int64_t fair = (total + static_cast<int64_t>(n) - 1) / static_cast<int64_t>(n);
  auto least = [&] { return static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin()); };
  size_t root = least();
  for (const auto& entry : order) {
    const size_t k = std::get<2>(entry);
    const Group& g = groups[k];
    if (load[root] + group_bytes[k] > fair && load[root] > 0) root = least();
    load[root] += group_bytes[k];
    const c10::ScalarType dtype = *saved_dtype(metadata, plans[0].items[g.where[0]]);
    for (size_t r = 0; r < n; ++r) {
      out[r].push_back(SharedRead{static_cast<int>(root), group_bytes[k], dtype,
                                  plans[r].items[g.where[r]]});
    }
  }
  for (size_t r = 0; r < n; ++r) {
    std::vector<ReadItem> kept;
    kept.reserve(plans[r].items.size() - out[r].size());
    for (size_t i = 0; i < plans[r].items.size(); ++i) {
      if (!taken[r][i]) kept.push_back(std::move(plans[r].items[i]));
    }
    plans[r].items = std::move(kept);
  }
  return out;
}

// The planner the storage reader reads with: the boxes this rank is root of go to their
// broadcast buffers (and are committed later, by exchange), everything else to the load's
// planner. Only the calls a storage reader makes are meaningful.
class SharedReadExchange::Router final : public LoadPlanner {
 public:
  explicit Router(SharedReadExchange& exchange) : x_(exchange) {}

  BoxIndex roots;  // this rank's root boxes -> their position in reads_; filled before reading

  // LoadPlanner:
  void set_up_planner(StateDict& state, const Metadata& metadata, bool is_coordinator) override {
    x_.planner_.set_up_planner(state, metadata, is_coordinator);
  }
  LoadPlan create_local_plan() override { return x_.planner_.create_local_plan(); }
  std::vector<LoadPlan> create_global_plan(std::vector<LoadPlan> plans) override {
    return x_.planner_.create_global_plan(std::move(plans));
  }
  LoadPlan finish_plan(LoadPlan central_plan) override {
    return x_.planner_.finish_plan(std::move(central_plan));
  }
  void load_bytes(const ReadItem& item, Value value) override {
    x_.planner_.load_bytes(item, std::move(value));
  }
  at::Tensor resolve_tensor(const ReadItem& item) override {
    if (const auto* i = root_of(item)) return x_.buffers_[*i].bytes;
    return x_.planner_.resolve_tensor(item);
  }
  void commit_tensor(const ReadItem& item, const at::Tensor& tensor) override {
    if (const auto* i = root_of(item)) {  // exchange() commits it, once every rank has it
      x_.mark_read(*i);
      return;
    }
    x_.planner_.commit_tensor(item, tensor);
  }

 private:
  const size_t* root_of(const ReadItem& item) const {
    if (roots.empty()) return nullptr;
    auto it = roots.find(&item);
    return it == roots.end() ? nullptr : &it->second;
  }

  SharedReadExchange& x_;
};

SharedReadExchange::SharedReadExchange(std::vector<SharedRead> reads, LoadPlanner& planner,
                                       int rank)
    : reads_(std::move(reads)),
      planner_(planner),
      rank_(rank),
      buffers_(reads_.size()),
      router_(std::make_unique<Router>(*this)),
      read_(reads_.size(), false) {}

SharedReadExchange::~SharedReadExchange() = default;

LoadPlanner& SharedReadExchange::planner() { return *router_; }

SharedReadExchange::Buffer& SharedReadExchange::buffer(size_t i) {
  Buffer& b = buffers_[i];
  if (b.bytes.defined()) return b;
  const SharedRead& r = reads_[i];
  at::Tensor dest = planner_.resolve_tensor(r.item);
  TORCH_CHECK(dest.sizes() == c10::IntArrayRef(r.item.lengths), "destination box ",
              dest.sizes(), " of '", r.item.dest_index.fqn, "' does not match the saved box ",
              c10::IntArrayRef(r.item.lengths));
  const bool direct = dest.layout() == c10::kStrided && dest.device().is_cpu() &&
                      dest.scalar_type() == r.dtype && dest.is_contiguous();
  b.dest = dest;
  b.bytes = direct ? dest : at::empty(r.item.lengths, at::TensorOptions().dtype(r.dtype));
  TORCH_INTERNAL_ASSERT(b.bytes.numel() * static_cast<int64_t>(b.bytes.element_size()) == r.nbytes,
                        "shared read of '", r.item.dest_index.fqn, "': ", r.nbytes,
                        " bytes planned, buffer of ", b.bytes.numel(), " elements");
  return b;
}

LoadPlan SharedReadExchange::reader_plan(LoadPlan own) {
  for (size_t i = 0; i < reads_.size(); ++i) {
    if (reads_[i].root != rank_) continue;
    buffer(i);
    own.items.push_back(reads_[i].item);
    router_->roots.emplace(&reads_[i].item, i);
  }
  return own;
}

void SharedReadExchange::mark_read(size_t i) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    read_[i] = true;
  }
  read_cv_.notify_all();
}

bool SharedReadExchange::wait_read(size_t i) {
  std::unique_lock<std::mutex> lock(mu_);
  read_cv_.wait(lock, [&] { return read_[i] || reading_done_; });
  return read_[i];
}

void SharedReadExchange::read_and_exchange(Communicator& comm, const std::function<void()>& read) {
  std::exception_ptr read_error;
  std::thread reader([&] {
    try {
      read();
    } catch (...) {
      read_error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      reading_done_ = true;
    }
    read_cv_.notify_all();
  });
  std::exception_ptr exchange_error;
  try {
    exchange(comm);
  } catch (...) {
    exchange_error = std::current_exception();
  }
  reader.join();
  if (read_error) std::rethrow_exception(read_error);
  if (exchange_error) std::rethrow_exception(exchange_error);
}

void SharedReadExchange::deliver(size_t i) {
  Buffer& b = buffers_[i];
  if (!b.bytes.is_same(b.dest)) b.dest.copy_(b.bytes);
  planner_.commit_tensor(reads_[i].item, b.dest);
  b = Buffer{};  // a temporary's memory goes now
}

void SharedReadExchange::exchange(Communicator& comm) {
  std::exception_ptr first;
  auto guarded = [&first](const std::function<void()>& fn) {
    try {
      fn();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  };
  std::vector<char> pack;
  size_t i = 0;
  while (i < reads_.size()) {
    const int root = reads_[i].root;
    const bool is_root = root == rank_;
    if (reads_[i].nbytes >= kPackBelow) {  // straight from the root's buffer into each rank's
      const int64_t nbytes = reads_[i].nbytes;
      void* data = nullptr;
      at::Tensor scratch;  // where a rank whose destination failed receives
      if (is_root) wait_read(i);
      guarded([&] { data = buffer(i).bytes.data_ptr(); });
      if (data == nullptr) {
        scratch = at::empty({nbytes}, at::kByte);
        data = scratch.data_ptr();
      }
      comm.broadcast_buffer(data, static_cast<size_t>(nbytes), root);
      (is_root ? sent_bytes_ : received_bytes_) += nbytes;
      if (!scratch.defined()) guarded([&] { deliver(i); });
      ++i;
      continue;
    }
    size_t end = i;
    int64_t total = 0;
    while (end < reads_.size() && reads_[end].root == root && reads_[end].nbytes < kPackBelow &&
           total + reads_[end].nbytes <= kPackBytes) {
      total += reads_[end++].nbytes;
    }
    pack.resize(static_cast<size_t>(total));
    if (is_root) {
      int64_t offset = 0;
      for (size_t k = i; k < end; ++k) {
        wait_read(k);
        std::memcpy(pack.data() + offset, buffer(k).bytes.data_ptr(), reads_[k].nbytes);
        offset += reads_[k].nbytes;
      }
    }
    comm.broadcast_buffer(pack.data(), pack.size(), root);
    (is_root ? sent_bytes_ : received_bytes_) += total;
    int64_t offset = 0;
    for (size_t k = i; k < end; ++k) {
      guarded([&] {
        Buffer& b = buffer(k);
        if (!is_root) std::memcpy(b.bytes.data_ptr(), pack.data() + offset, reads_[k].nbytes);
        deliver(k);
      });
      offset += reads_[k].nbytes;
    }
    i = end;
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace dcp::detail
