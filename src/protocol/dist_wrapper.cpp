// DistWrapper (see dist_wrapper.h). Every message is an outcome:
//   u8 0, str payload                 success
//   u8 1, u8 error type, str message  failure (type: 0 Error, 1 ValueError, 2 TypeError,
//                                      3 NotImplementedError), re-raised with the same type
#include "protocol/dist_wrapper.h"

#include <c10/util/Exception.h>

#include "util/wire.h"

namespace dcp::detail {
namespace {

std::string ok(std::string payload) {
  wire::Writer w;
  w.u8(0);
  w.str(payload);
  return w.take();
}

std::string failure(uint8_t type, const std::string& message) {
  wire::Writer w;
  w.u8(1);
  w.u8(type);
  w.str(message);
  return w.take();
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

bool is_ok(const std::string& outcome) { return !outcome.empty() && outcome[0] == 0; }

std::string payload(const std::string& outcome) {
  wire::Reader r(outcome);
  r.u8();
  return r.str();
}

}  // namespace

DistWrapper::DistWrapper(Communicator& comm, int coordinator)
    : comm_(comm), coordinator_(coordinator) {
  TORCH_CHECK(coordinator >= 0 && coordinator < comm.size(), "coordinator rank ", coordinator,
              " is outside the world of ", comm.size(), " ranks");
}

void DistWrapper::raise(const std::string& encoded) const {
  wire::Reader r(encoded);
  r.u8();
  const uint8_t type = r.u8();
  const std::string message = r.str();
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
    wire::Reader r(outcomes[failed[i]]);
    r.u8();
    const uint8_t t = r.u8();
    if (i == 0) type = t;
    if (i < 8) message += "\n  rank " + std::to_string(failed[i]) + ": " + r.str();
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
      for (const auto& o : all) payloads.push_back(payload(o));
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
  const std::string reply = comm_.scatter(replies, coordinator_);
  if (!is_ok(reply)) raise(reply);
  return payload(reply);
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
      for (const auto& o : all) payloads.push_back(payload(o));
      reply = capture([&] { return global(std::move(payloads)); }, rank());
      if (!is_ok(reply)) reply = coordinator_failure(step, reply);
    }
  }
  reply = comm_.broadcast(reply, coordinator_);
  if (!is_ok(reply)) raise(reply);
  return payload(reply);
}

std::string DistWrapper::broadcast(const std::string& step,
                                   const std::function<std::string()>& fn) {
  if (size() == 1) return fn();
  std::string reply;
  if (is_coordinator()) {
    reply = capture(fn, rank());
    if (!is_ok(reply)) reply = coordinator_failure(step, reply);
  }
  reply = comm_.broadcast(reply, coordinator_);
  if (!is_ok(reply)) raise(reply);
  return payload(reply);
}

std::vector<std::string> DistWrapper::all_gather(const std::string& step,
                                                 const std::function<std::string()>& fn) {
  if (size() == 1) return {fn()};
  std::vector<std::string> all = comm_.all_gather(capture(fn, rank()));
  const std::string error = combine_failures(step, all);
  if (!error.empty()) raise(error);
  std::vector<std::string> payloads;
  for (const auto& o : all) payloads.push_back(payload(o));
  return payloads;
}

}  // namespace dcp::detail
