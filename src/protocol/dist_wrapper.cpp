// DistWrapper (see dist_wrapper.h). Every message is an outcome, its status in the last byte:
//   payload, u8 0                        success
//   message, u8 error type, u8 1         failure (type: 0 Error, 1 ValueError, 2 TypeError,
//                                        3 NotImplementedError), re-raised with the same type
// A trailer rather than a header, so that wrapping a payload appends a byte and unwrapping one
// drops it: at scale the payloads are the plans and the committed Metadata, hundreds of MiB,
// and a header would copy each of them into fresh memory twice (docs/performance.md). An
// outcome the coordinator broadcasts that is over 1 MiB goes in two messages: its size (i64,
// then u8 2), then its bytes, sent in place (broadcast_outcome).
#include "protocol/dist_wrapper.h"

#include <c10/util/Exception.h>

#include "util/wire.h"

namespace dcp::detail {
namespace {

constexpr char kOk = 0, kFailed = 1;
// In broadcast_outcome's first message only: the outcome follows through broadcast_buffer,
// this many bytes (an i64 before the status byte).
constexpr char kFollows = 2;
constexpr size_t kInlineOutcome = size_t{1} << 20;

std::string ok(std::string payload) {
  payload.push_back(kOk);
  return payload;
}

std::string failure(uint8_t type, std::string message) {
  message.push_back(static_cast<char>(type));
  message.push_back(kFailed);
  return message;
}

bool is_ok(const std::string& outcome) { return !outcome.empty() && outcome.back() == kOk; }

// A failure's type and message (a malformed outcome is an Error saying so).
std::pair<uint8_t, std::string> failure_of(const std::string& outcome) {
  if (outcome.size() < 2 || outcome.back() != kFailed) {
    return {0, "malformed step outcome of " + std::to_string(outcome.size()) + " bytes"};
  }
  return {static_cast<uint8_t>(outcome[outcome.size() - 2]),
          outcome.substr(0, outcome.size() - 2)};
}

// A success's payload, taken out of the outcome without copying it.
std::string payload(std::string&& outcome) {
  TORCH_CHECK(is_ok(outcome), "malformed step outcome of ", outcome.size(), " bytes");
  outcome.pop_back();
  return std::move(outcome);
}

// Runs fn and returns its outcome, never throwing.
std::string capture(const std::function<std::string()>& fn, int rank) {
  try {
    return ok(fn());
  } catch (const c10::ValueError& e) {
    return failure(1, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    return failure(2, e.what_without_backtrace());
  } catch (const c10::NotImplementedError& e) {
    return failure(3, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    return failure(0, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return failure(0, e.what());
  } catch (...) {
    return failure(0, "unknown exception on rank " + std::to_string(rank));
  }
}

}  // namespace

DistWrapper::DistWrapper(Communicator& comm, int coordinator)
    : comm_(comm), coordinator_(coordinator) {
  TORCH_CHECK(coordinator >= 0 && coordinator < comm.size(), "coordinator rank ", coordinator,
              " is outside the world of ", comm.size(), " ranks");
}

void DistWrapper::raise(const std::string& encoded) const {
  const auto [type, message] = failure_of(encoded);
  switch (type) {
    case 1: TORCH_CHECK_VALUE(false, message);
    case 2: TORCH_CHECK_TYPE(false, message);
    case 3: TORCH_CHECK_NOT_IMPLEMENTED(false, message);
    default: TORCH_CHECK(false, message);
  }
}

std::string DistWrapper::combine_failures(const std::string& step,
                                          const std::vector<std::string>& outcomes) {
  std::vector<int> failed;
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (!is_ok(outcomes[r])) failed.push_back(static_cast<int>(r));
  }
  if (failed.empty()) return "";
  std::string ranks;
  for (size_t i = 0; i < failed.size(); ++i) ranks += (i ? ", " : "") + std::to_string(failed[i]);
  std::string message = "step '" + step + "' failed on rank" +
                        (failed.size() > 1 ? "s " : " ") + ranks + " of " +
                        std::to_string(outcomes.size());
  uint8_t type = 0;
  for (size_t i = 0; i < failed.size(); ++i) {
    const auto [t, what] = failure_of(outcomes[failed[i]]);
    if (i == 0) type = t;
    if (i < 8) message += "\n  rank " + std::to_string(failed[i]) + ": " + what;
  }
  if (failed.size() > 8) message += "\n  ...";
  return failure(type, message);
}

std::string DistWrapper::coordinator_failure(const std::string& step,
                                             const std::string& outcome) {
  std::vector<std::string> outcomes(size(), ok(""));
  outcomes[coordinator_] = outcome;
  return combine_failures(step, outcomes);
}

// The coordinator's outcome on every rank. A small one travels in one broadcast. A large one
// (the committed Metadata, hundreds of MiB at scale) is sent from where it is with
// broadcast_buffer, after a first broadcast of its size: broadcast() would return the
// coordinator a copy of it. The first broadcast also lets the other ranks wait for the
// coordinator without spinning (MpiCommunicator).
std::string DistWrapper::broadcast_outcome(std::string outcome) {
  std::string first;
  if (is_coordinator()) {
    if (outcome.size() <= kInlineOutcome) {
      first = std::move(outcome);
    } else {
      wire::Writer w;
      w.i64(static_cast<int64_t>(outcome.size()));
      w.u8(kFollows);
      first = w.take();
    }
  }
  first = comm_.broadcast(first, coordinator_);
  if (first.size() != sizeof(int64_t) + 1 || first.back() != kFollows) return first;
  const int64_t n = wire::Reader(first).i64();
  TORCH_CHECK(n > static_cast<int64_t>(kInlineOutcome), "malformed outcome size ", n);
  if (!is_coordinator()) outcome.resize(static_cast<size_t>(n));
  comm_.broadcast_buffer(outcome.data(), outcome.size(), coordinator_);
  return outcome;
}

std::string DistWrapper::reduce_scatter(
    const std::string& step, const std::function<std::string()>& local,
    const std::function<std::vector<std::string>(std::vector<std::string>)>& global) {
  if (size() == 1) return global({local()}).at(0);
  const std::string mine = capture(local, rank());
  std::vector<std::string> all = comm_.gather(mine, coordinator_);
  std::vector<std::string> replies;
  if (is_coordinator()) {
    std::string error = combine_failures(step, all);
    if (error.empty()) {
      std::vector<std::string> payloads;
      for (auto& o : all) payloads.push_back(payload(std::move(o)));
      all = {};
      std::vector<std::string> results;
      error = capture([&] {
        results = global(std::move(payloads));
        TORCH_CHECK(static_cast<int>(results.size()) == size(), "global step returned ",
                    results.size(), " results for ", size(), " ranks");
        return std::string();
      }, rank());
      if (is_ok(error)) {
        for (auto& r : results) replies.push_back(ok(std::move(r)));
      } else {
        error = coordinator_failure(step, error);
      }
    }
    if (replies.empty()) replies.assign(size(), error);
  }
  std::string reply = comm_.scatter(replies, coordinator_);
  if (!is_ok(reply)) raise(reply);
  return payload(std::move(reply));
}

std::string DistWrapper::all_reduce(
    const std::string& step, const std::function<std::string()>& local,
    const std::function<std::string(std::vector<std::string>)>& global) {
  if (size() == 1) return global({local()});
  const std::string mine = capture(local, rank());
  std::vector<std::string> all = comm_.gather(mine, coordinator_);
  std::string reply;
  if (is_coordinator()) {
    reply = combine_failures(step, all);
    if (reply.empty()) {
      std::vector<std::string> payloads;
      for (auto& o : all) payloads.push_back(payload(std::move(o)));
      all = {};
      reply = capture([&] { return global(std::move(payloads)); }, rank());
      if (!is_ok(reply)) reply = coordinator_failure(step, reply);
    }
  }
  reply = broadcast_outcome(std::move(reply));
  if (!is_ok(reply)) raise(reply);
  return payload(std::move(reply));
}

std::string DistWrapper::broadcast(const std::string& step,
                                   const std::function<std::string()>& fn) {
  if (size() == 1) return fn();
  std::string reply;
  if (is_coordinator()) {
    reply = capture(fn, rank());
    if (!is_ok(reply)) reply = coordinator_failure(step, reply);
  }
  reply = broadcast_outcome(std::move(reply));
  if (!is_ok(reply)) raise(reply);
  return payload(std::move(reply));
}

std::vector<std::string> DistWrapper::all_gather(const std::string& step,
                                                 const std::function<std::string()>& fn) {
  if (size() == 1) return {fn()};
  std::vector<std::string> all = comm_.all_gather(capture(fn, rank()));
  const std::string error = combine_failures(step, all);
  if (!error.empty()) raise(error);
  std::vector<std::string> payloads;
  for (auto& o : all) payloads.push_back(payload(std::move(o)));
  return payloads;
}

}  // namespace dcp::detail
