// `dcp`: the command-line tool (docs/cli.md). Looks inside, verifies, compares and converts
// checkpoints written by dcp or by Python DCP. Arguments are parsed with CLI11; every error
// becomes one line on stderr and exit status 2 (1 is "not sound" / "not equal").
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "dcp/version.h"

namespace {

// One line: the message without LibTorch's backtrace, its context lines joined.
std::string one_line(std::string message) {
  while (!message.empty() && message.back() == '\n') message.pop_back();
  for (char& c : message) {
    if (c == '\n') c = ' ';
  }
  return message;
}

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);
  CLI::App app{"dcp: look inside, verify, compare and convert PyTorch Distributed Checkpoints"};
  app.set_version_flag("--version", std::string("dcp ") + dcp::kVersion);
  app.require_subcommand(1);

  std::string checkpoint, a, b, source, destination, to;
  std::optional<std::string> keys;
  bool json = false;
  int threads = 4;

  CLI::App* inspect = app.add_subcommand("inspect", "keys, shapes, dtypes, chunks, bytes, files");
  inspect->add_option("CKPT", checkpoint, "checkpoint directory")->required();
  inspect->add_flag("--json", json, "print JSON instead of a table");
  inspect->add_option("--keys", keys, "only keys matching this glob (e.g. 'model.*')");

  CLI::App* verify = app.add_subcommand("verify", "check every byte of a checkpoint");
  verify->add_option("CKPT", checkpoint, "checkpoint directory")->required();
  verify->add_option("--threads", threads, "reading threads")->check(CLI::Range(1, 256));
  verify->add_flag("--json", json, "print the report as JSON");

  CLI::App* diff = app.add_subcommand("diff", "compare two checkpoints key by key");
  diff->add_option("A", a, "checkpoint directory")->required();
  diff->add_option("B", b, "checkpoint directory")->required();
  diff->add_option("--keys", keys, "only keys matching this glob");
  diff->add_flag("--json", json, "print JSON");

  CLI::App* convert = app.add_subcommand(
      "convert", "a checkpoint directory to one torch.save file or a Hugging Face safetensors "
                 "model, or the other way round");
  convert->add_option("SRC", source, "checkpoint directory, torch.save file or Hugging Face "
                                     "model directory")->required();
  convert->add_option("DST", destination, "what to write")->required();
  convert->add_option("--to", to, "torch (a checkpoint's default), dcp (a file's or a Hugging "
                                  "Face model's) or safetensors")
      ->check(CLI::IsMember({"torch", "dcp", "safetensors"}));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*inspect) return dcp::cli::inspect(checkpoint, json, keys);
    if (*verify) return dcp::cli::verify(checkpoint, threads, json);
    if (*diff) return dcp::cli::diff(a, b, keys, json);
    if (*convert) return dcp::cli::convert(source, destination, to);
  } catch (const c10::Error& e) {
    std::cerr << "dcp: error: " << one_line(e.what_without_backtrace()) << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dcp: error: " << one_line(e.what()) << "\n";
    return 2;
  }
  return 2;
}
