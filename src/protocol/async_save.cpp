// dcp::async_save and DefaultStager.
//
// async_save, on the caller's thread:
//   1. take a free staging slot (waits while max_in_flight saves are pending);
//   2. the first time for a communicator: duplicate it (collective) for the background work;
//   3. stage: give every tensor of the state a buffer in the slot (reused when the key, shape
//      and dtype repeat), queue its copy (CPU tensors: memcpy pieces or a strided copy; device
//      tensors: a copy into pinned memory on a side stream of their device), and copy the
//      non-tensor values;
//   4. run the copies and wait for them (Note [Parallel staging copies]), fulfil the staging
//      future, queue the staged state for the worker and return the futures. With
//      StagingOptions::use_async_staging, the task goes to the staging thread instead, which
//      runs step 4 while the caller goes on (Note [Asynchronous staging]).
// The worker thread, in submission order: dcp::save(staged state) on the duplicated
// communicator, fulfil the future, free the slot.
//
// Every staged save copies the values of *that* call: buffers are reused, never the values
// (see AsyncSaveTest.EachSaveHoldsTheValuesOfItsOwnCall).
#include "dcp/async_save.h"
#include "dcp/stateful.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "dcp/filesystem.h"
#include "util/error_context.h"
#include "util/parallel.h"

namespace dcp {

namespace detail {
struct AsyncSaveTimes {
  double staging = 0;  // written before AsyncSaveFuture::staged_ is ready
  double save = 0;     // written before AsyncSaveFuture::future_ is ready
};
}  // namespace detail

namespace {

// A CPU tensor's bytes to copy into its staging buffer (Note [Parallel staging copies]).
struct CopyJob {
  void* dst;
  const void* src;
  size_t nbytes;
};

// The copies stage() queued, which copy_staged() runs. Used by one thread at a time: submit's,
// then (with use_async_staging) the staging thread's.
struct Slot {
  bool busy = false;
  std::map<std::string, at::Tensor> buffers;  // key path -> staging buffer
  std::vector<CopyJob> copies;                // contiguous CPU tensors
  std::vector<std::pair<at::Tensor, at::Tensor>> tensor_copies;  // (buffer, source), other CPU
  std::vector<c10::Stream> streams;  // side streams with device-to-host copies in flight
};

struct Task {
  StateDict staged;
  // The state as the call resolved it (Stateful values' state_dict() may return fresh
  // tensors): keeps every source alive until its copy is done.
  std::optional<Value> sources;
  std::exception_ptr staging_failure;  // set when staging failed (Note [Failed staging])
  std::shared_ptr<StorageWriter> writer;
  SaveOptions options;
  std::optional<std::string> checkpoint_id;
  std::promise<Metadata> promise;
  std::promise<void> staged_promise;
  Event staging;  // the kStage event, reported to options.on_event at its start and end
  Slot* slot = nullptr;
  std::chrono::steady_clock::time_point started;
  std::chrono::steady_clock::time_point stage_start;
  std::shared_ptr<detail::AsyncSaveTimes> times;
};

// Note [Failed staging]: when staging (or the call's own checks) fails on one rank, the other
// ranks' background saves are already headed into collectives on the duplicated communicator.
// So the failing rank still queues its save: the worker runs dcp::save with an empty state and
// a planner that rethrows the failure in its first step, and DistWrapper raises the same error
// (naming this rank) in every rank's future. No rank waits on a collective another rank skips.
class FailedStagingPlanner : public DefaultSavePlanner {
 public:
  explicit FailedStagingPlanner(std::exception_ptr failure) : failure_(std::move(failure)) {}
  void set_up_planner(const StateDict&, const std::optional<StorageMeta>&, bool) override {
    detail::with_context([&] { std::rethrow_exception(failure_); },
                         [] { return "async_save staging"; });
  }

 private:
  std::exception_ptr failure_;
};

// The writer of a save whose caller passed none: every step fails before it is reached
// (FailedStagingPlanner fails first), except the calls made before planning.
class NoWriter : public StorageWriter {
 public:
  void reset(const std::optional<std::string>&) override {}
  void set_up_storage_writer(bool, int) override { fail(); }
  SavePlan prepare_local_plan(SavePlan) override { fail(); }
  std::vector<SavePlan> prepare_global_plan(std::vector<SavePlan>) override { fail(); }
  std::future<std::vector<WriteResult>> write_data(const SavePlan&, SavePlanner&) override {
    fail();
  }
  void finish(const Metadata&, const std::vector<std::vector<WriteResult>>&) override { fail(); }

 private:
  [[noreturn]] static void fail() { TORCH_CHECK(false, "async_save: no storage writer"); }
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Note [Buffer keys]: a staging buffer is reused for the value at the same place of the next
// state dict, so the key must name the place unambiguously. Each step is tagged and
// self-delimiting: "s<length>:<chars>" for a string key, "i<n>;" for an int key, "l<i>;" /
// "t<i>;" for a list / tuple index, "#<i>;" for a local shard. The keys of distinct places thus
// differ (a prefix code), where joining with '/' mixed {"a/b": t1} with {"a": {"b": t2}}.
std::string buffer_key_step(const Key& key) {
  if (const auto* s = std::get_if<std::string>(&key)) {
    return "s" + std::to_string(s->size()) + ":" + *s;
  }
  return "i" + std::to_string(std::get<int64_t>(key)) + ";";
}

}  // namespace

// Everything a DefaultStager owns. Thread-safety: submit and stats from the caller's thread,
// run_stager on the staging thread, run_worker on the worker thread; mu_ guards the shared
// state below it.
struct DefaultStager::Impl {
  explicit Impl(StagingOptions options);
  ~Impl();

  // What an AsyncSaveFuture holds of one submitted save.
  struct Submitted {
    std::shared_future<Metadata> saved;
    std::shared_future<void> staged;
    std::shared_ptr<const detail::AsyncSaveTimes> times;
  };
  Submitted submit(const StateDict& state, std::shared_ptr<StorageWriter> writer,
                   const SaveOptions& options, const std::optional<std::string>& checkpoint_id);
  Value stage(const Value& value, Slot& slot, const std::string& path);
  void copy_staged(Slot& slot);
  void finish_staging(Task& task);
  at::Tensor stage_tensor(const at::Tensor& src, Slot& slot, const std::string& key);
  Communicator* background_comm(Communicator* user_comm);
  void run_stager();
  void run_worker();

  const StagingOptions options_;
  mutable std::mutex mu_;                 // guards everything below
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::deque<std::unique_ptr<Task>> staging_queue_;  // staged asynchronously, in order
  std::deque<std::unique_ptr<Task>> queue_;          // staged, waiting for the worker
  bool stopping_ = false;                 // no new saves; the stager drains its queue
  bool stager_done_ = false;              // the staging thread has ended; the worker drains
  StagingStats stats_;
  Communicator* user_comm_ = nullptr;     // the communicator background_ duplicates
  std::unique_ptr<Communicator> background_;
  std::thread stager_;                    // with use_async_staging only
  std::thread worker_;                    // started last
};

struct AsyncSaveAccess {
  static AsyncSaveFuture save(DefaultStager& stager, std::shared_ptr<DefaultStager> owned,
                              const StateDict& state, std::shared_ptr<StorageWriter> writer,
                              const SaveOptions& options, const std::optional<std::string>& id) {
    const auto started = std::chrono::steady_clock::now();
    AsyncSaveFuture out;
    DefaultStager::Impl::Submitted submitted =
        stager.impl_->submit(state, std::move(writer), options, id);
    out.future_ = std::move(submitted.saved);
    out.staged_ = std::move(submitted.staged);
    out.times_ = std::move(submitted.times);
    out.blocking_seconds_ = seconds_since(started);
    out.owned_stager_ = std::move(owned);
    return out;
  }
};

DefaultStager::DefaultStager(StagingOptions options) : impl_(std::make_unique<Impl>(options)) {}

DefaultStager::~DefaultStager() = default;

StagingStats DefaultStager::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu_);
  return impl_->stats_;
}

DefaultStager::Impl::Impl(StagingOptions options) : options_(options) {
  TORCH_CHECK(options_.max_in_flight >= 1, "StagingOptions::max_in_flight must be >= 1");
  for (int i = 0; i < options_.max_in_flight; ++i) slots_.push_back(std::make_unique<Slot>());
  if (options_.use_async_staging) stager_ = std::thread([this] { run_stager(); });
  worker_ = std::thread([this] { run_worker(); });
}

DefaultStager::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (stager_.joinable()) stager_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stager_done_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

// Note [Asynchronous staging]: with use_async_staging, submit() only allocates the buffers and
// queues the copies (stage()); this thread runs them (copy_staged()) in submission order,
// fulfils the staging future, and only then hands the task to the worker, so the worker never
// writes a buffer still being filled. Every task takes this path, those whose staging already
// failed in submit() too: the worker must get the saves in submission order, since their
// collectives must pair up across ranks. The task holds references to the sources until their
// copies are done, so a caller that drops its tensors early frees nothing that is still read;
// changing them before staging_completion() is what the caller must not do.
void DefaultStager::Impl::run_stager() {
  while (true) {
    std::unique_ptr<Task> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !staging_queue_.empty() || stopping_; });
      if (staging_queue_.empty()) return;  // stopping, and nothing left to stage
      task = std::move(staging_queue_.front());
      staging_queue_.pop_front();
    }
    finish_staging(*task);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_all();
  }
}

void DefaultStager::Impl::run_worker() {
  while (true) {
    std::unique_ptr<Task> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty() || (stopping_ && stager_done_); });
      if (queue_.empty()) return;  // stopping, and nothing left to write
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    // Before the future is ready, so that a caller whose get() returned sees its save in
    // the time and in stats().saves.
    auto finished = [&] {
      task->times->save = seconds_since(task->started);
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.saves;
    };
    try {
      if (task->staging_failure) {  // Note [Failed staging]
        task->options.planner = std::make_shared<FailedStagingPlanner>(task->staging_failure);
      }
      Metadata md = save(task->staged, *task->writer, task->options, task->checkpoint_id);
      finished();
      task->promise.set_value(std::move(md));
    } catch (...) {
      finished();
      task->promise.set_exception(std::current_exception());
    }
    Slot* slot = task->slot;
    task.reset();  // drop the staged references before the slot is reused
    {
      std::lock_guard<std::mutex> lock(mu_);
      slot->busy = false;
    }
    cv_.notify_all();
  }
}

Communicator* DefaultStager::Impl::background_comm(Communicator* user_comm) {
  if (user_comm == nullptr) return nullptr;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (background_ && user_comm_ == user_comm) return background_.get();
    // A different communicator: let the saves using the old duplicate finish first.
    cv_.wait(lock, [&] {
      return queue_.empty() && std::count_if(slots_.begin(), slots_.end(), [](const auto& s) {
               return s->busy;
             }) == 0;
    });
  }
  std::unique_ptr<Communicator> dup = user_comm->duplicate();  // collective
  std::lock_guard<std::mutex> lock(mu_);
  background_ = std::move(dup);
  user_comm_ = user_comm;
  return background_.get();
}

at::Tensor DefaultStager::Impl::stage_tensor(const at::Tensor& original, Slot& slot,
                                       const std::string& key) {
  const at::Tensor src = original.detach();
  at::Tensor& buf = slot.buffers[key];
  if (buf.defined() && buf.sizes() == src.sizes() && buf.scalar_type() == src.scalar_type()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.reuses;
  } else {
    at::TensorOptions opts = at::TensorOptions().dtype(src.scalar_type());
    if (!src.device().is_cpu() && options_.use_pinned_memory) opts = opts.pinned_memory(true);
    buf = at::empty(src.sizes(), opts);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.allocations;
    stats_.bytes_allocated += static_cast<int64_t>(buf.numel() * buf.element_size());
  }
  if (src.device().is_cpu()) {
    if (src.is_contiguous() && src.layout() == c10::kStrided) {
      slot.copies.push_back(CopyJob{buf.data_ptr(), src.data_ptr(),
                                    static_cast<size_t>(src.numel()) * src.element_size()});
    } else {
      slot.tensor_copies.emplace_back(buf, src);
    }
    return buf;
  }
  // Device tensor: copy on a side stream that first waits for the work queued on the current
  // stream; copy_staged waits for the side stream.
  const c10::Device device = src.device();
  c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream current = impl.getStream(device);
  const c10::Stream side = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  c10::Event produced(device.type());
  produced.record(current);
  produced.block(side);
  {
    c10::StreamGuard guard(side);
    buf.copy_(src, /*non_blocking=*/options_.use_pinned_memory);
  }
  if (slot.streams.empty() || slot.streams.back() != side) slot.streams.push_back(side);
  return buf;
}

// Note [Parallel staging copies]: stage() only collects the copies; copy_staged() cuts those of
// contiguous CPU tensors into pieces of kCopyPiece bytes and memcpys the pieces on
// StagingOptions::copy_threads threads (the calling one among them), so that staging a large
// state runs at the memory's speed rather than one core's. Small tensors are one piece each.
// Then it runs the strided CPU copies and waits for the device copies' side streams. On
// failure as on success, the slot's queued copies are dropped.
void DefaultStager::Impl::copy_staged(Slot& slot) {
  constexpr size_t kCopyPiece = size_t{8} << 20;
  struct Piece {
    char* dst;
    const char* src;
    size_t nbytes;
  };
  std::vector<Piece> pieces;
  for (const CopyJob& job : slot.copies) {
    for (size_t done = 0; done < job.nbytes; done += kCopyPiece) {
      pieces.push_back(Piece{static_cast<char*>(job.dst) + done,
                             static_cast<const char*>(job.src) + done,
                             std::min(kCopyPiece, job.nbytes - done)});
    }
  }
  slot.copies.clear();
  auto tensor_copies = std::move(slot.tensor_copies);
  auto streams = std::move(slot.streams);
  slot.tensor_copies.clear();
  slot.streams.clear();
  int threads = options_.copy_threads;
  if (threads <= 0) {
    threads = static_cast<int>(std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
  }
  detail::run_parallel(pieces.size(), threads, [&](size_t i) {
    std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].nbytes);
  });
  for (auto& [buf, src] : tensor_copies) buf.copy_(src);
  for (const c10::Stream& stream : streams) stream.synchronize();
}

// Step 4 for one task: the copies, then the staging event's end and the staging future. A
// failed copy makes the task a failed staging (Note [Failed staging]).
void DefaultStager::Impl::finish_staging(Task& task) {
  try {
    copy_staged(*task.slot);
  } catch (...) {
    task.staging_failure = std::current_exception();
    task.staged = StateDict();
    task.staging.ok = false;
  }
  task.sources.reset();
  task.staging.end = true;
  task.staging.seconds = seconds_since(task.stage_start);
  if (task.options.on_event) task.options.on_event(task.staging);
  task.times->staging = seconds_since(task.started);
  if (task.staging_failure) {
    task.staged_promise.set_exception(task.staging_failure);
  } else {
    task.staged_promise.set_value();
  }
}

Value DefaultStager::Impl::stage(const Value& value, Slot& slot, const std::string& path) {
  if (value.is_tensor()) return stage_tensor(value.tensor(), slot, path);
  if (value.is_sharded_tensor()) {
    const ShardedTensor& st = value.get<ShardedTensor>();
    std::vector<Shard> shards;
    for (size_t i = 0; i < st.local_shards().size(); ++i) {
      const Shard& s = st.local_shards()[i];
      shards.push_back(Shard{stage_tensor(s.tensor, slot, path + "#" + std::to_string(i) + ";"),
                             s.offsets});
    }
    return ShardedTensor(st.global_shape(), st.dtype(), std::move(shards));
  }
  if (value.is_dict()) {
    Dict out;
    for (const auto& [k, v] : value.dict()) {
      out.insert_or_assign(k, stage(v, slot, path + buffer_key_step(k)));
    }
    return out;
  }
  if (value.is_list() || value.is<Tuple>()) {
    const std::vector<Value>& items = value.is_list() ? value.list() : value.get<Tuple>().items;
    std::vector<Value> out;
    for (size_t i = 0; i < items.size(); ++i) {
      out.push_back(stage(items[i], slot,
                          path + (value.is_list() ? "l" : "t") + std::to_string(i) + ";"));
    }
    if (value.is_list()) return List(std::move(out));
    return Tuple{std::move(out)};
  }
  return value;  // plain values are copied
}

DefaultStager::Impl::Submitted DefaultStager::Impl::submit(
    const StateDict& state, std::shared_ptr<StorageWriter> writer, const SaveOptions& options,
    const std::optional<std::string>& checkpoint_id) {
  const auto started = std::chrono::steady_clock::now();
  // Every rank reaches the duplication (a collective) before anything that can fail alone.
  Communicator* bg = background_comm(options.no_dist ? nullptr : options.comm);
  Slot* slot = nullptr;
  {
    std::unique_lock<std::mutex> lock(mu_);
    TORCH_CHECK(!stopping_, "async_save on a stager that is shutting down");
    cv_.wait(lock, [&] {
      for (auto& s : slots_) {
        if (!s->busy) {
          slot = s.get();
          return true;
        }
      }
      return false;
    });
    slot->busy = true;
  }
  auto task = std::make_unique<Task>();
  task->slot = slot;
  task->started = started;
  task->times = std::make_shared<detail::AsyncSaveTimes>();
  task->options = options;  // options.on_event reports the staging phase
  task->staging.phase = Phase::kStage;  // dcp/events.h
  task->staging.rank = options.comm != nullptr && !options.no_dist ? options.comm->rank() : 0;
  task->staging.world_size =
      options.comm != nullptr && !options.no_dist ? options.comm->size() : 1;
  task->staging.checkpoint_id = checkpoint_id.value_or("");
  if (options.on_event) options.on_event(task->staging);
  task->stage_start = std::chrono::steady_clock::now();
  try {
    TORCH_CHECK(writer != nullptr, "async_save: no storage writer");
    task->sources.emplace(resolve_stateful(state));
    task->staged = stage(*task->sources, *slot, "").dict();
  } catch (...) {
    slot->copies.clear();
    slot->tensor_copies.clear();
    task->staging_failure = std::current_exception();  // Note [Failed staging]
    task->staged = StateDict();
    task->staging.ok = false;
    if (writer == nullptr) writer = std::make_shared<NoWriter>();
  }
  task->writer = std::move(writer);
  task->options.comm = bg;
  task->options.no_dist = bg == nullptr;
  task->checkpoint_id = checkpoint_id;
  Submitted out{task->promise.get_future().share(), task->staged_promise.get_future().share(),
                task->times};
  // A failed staging takes the same path, so that saves reach the worker in submission order
  // on every rank (their collectives must match across ranks).
  const bool in_background = options_.use_async_staging;
  if (!in_background) finish_staging(*task);
  {
    std::lock_guard<std::mutex> lock(mu_);
    (in_background ? staging_queue_ : queue_).push_back(std::move(task));
  }
  cv_.notify_all();
  return out;
}

void AsyncSaveFuture::wait() const {
  TORCH_CHECK(future_.valid(), "AsyncSaveFuture: no save");
  future_.wait();
}

bool AsyncSaveFuture::done() const {
  TORCH_CHECK(future_.valid(), "AsyncSaveFuture: no save");
  return future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

double AsyncSaveFuture::save_seconds() const {
  wait();
  return times_->save;
}

std::shared_future<void> AsyncSaveFuture::staging_completion() const {
  TORCH_CHECK(staged_.valid(), "AsyncSaveFuture: no save");
  return staged_;
}

double AsyncSaveFuture::staging_seconds() const {
  staging_completion().wait();
  return times_->staging;
}

Metadata AsyncSaveFuture::get() const {
  TORCH_CHECK(future_.valid(), "AsyncSaveFuture: no save");
  return future_.get();
}

AsyncSaveFuture async_save(const StateDict& state, std::shared_ptr<StorageWriter> writer,
                           const AsyncSaveOptions& options,
                           const std::optional<std::string>& checkpoint_id) {
  std::shared_ptr<DefaultStager> stager = options.stager;
  std::shared_ptr<DefaultStager> owned;
  if (!stager) owned = stager = std::make_shared<DefaultStager>();
  return AsyncSaveAccess::save(*stager, std::move(owned), state, std::move(writer),
                               static_cast<const SaveOptions&>(options), checkpoint_id);
}

AsyncSaveFuture async_save(const StateDict& state, const std::string& checkpoint_id,
                           const AsyncSaveOptions& options) {
  return async_save(state, std::make_shared<FileSystemWriter>(), options, checkpoint_id);
}

}  // namespace dcp
