// A small, strict command-line parser for the flamia tools: every option is declared with its
// help text, unknown options and malformed values are errors that name the option.
#pragma once

#include <climits>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/options.h"

namespace flamia::cli {

// Exit statuses of every command; each command's --help lists them (exit_status_help).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;   // the run finished, and what it checks does not hold
inline constexpr int kExitRefused = 2;  // bad usage, or a run over the limits: refused before running
inline constexpr int kExitError = 3;    // the run could not finish: out of memory, or an internal error

// A refusal: main prints it and exits with kExitRefused.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs a library check that throws std::invalid_argument (core, analysis) as a usage check: its
// message becomes a UsageError. Any other exception, and any thrown once the run has started, is
// an error of the run (kExitError).
template <class Check>
void usage_check(Check&& check) {
  try {
    check();
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

// An argument as an error message echoes it: cut to its first 64 bytes (at a UTF-8 character
// boundary) and "…" when longer, so that a huge argument does not flood the terminal; quoted()
// puts it in single quotes.
std::string shortened(const std::string& text);
std::string quoted(const std::string& text);

// An option enum's value from its name (core/options.h's EnumNames), or a usage error that lists the
// valid names.
template <OptionEnum E>
E parse_flag(const std::string& flag, const std::string& value) {
  if (const std::optional<E> v = parse_option<E>(value)) return *v;
  throw UsageError(flag + " must be " + option_names<E>() + ", got " + quoted(value));
}

// The "exit status:" section of a command's --help: `ok` and `failed` say what 0 and 1 mean for
// it; 2 and 3 are the same for every command.
std::string exit_status_help(const std::string& ok, const std::string& failed);

class ArgParser {
 public:
  ArgParser(std::string command, std::string summary) : command_(std::move(command)), summary_(std::move(summary)) {}

  void flag(const std::string& name, bool* target, const std::string& help);
  // An int option; values below min are refused with the option's range.
  void option(const std::string& name, int* target, const std::string& help, int min = INT_MIN);
  void option(const std::string& name, uint64_t* target, const std::string& help);
  void option(const std::string& name, std::string* target, const std::string& help);
  // A finite number >= min.
  void option(const std::string& name, double* target, const std::string& help, double min);
  // A comma-separated list of ints, each at least min.
  void option(const std::string& name, std::vector<int>* target, const std::string& help, int min = INT_MIN);

  // Replaces the "(default: ...)" text of an option declared before (e.g. a default that is another option).
  void set_default_text(const std::string& name, const std::string& text);
  // Text that --help prints after the options (e.g. exit_status_help).
  void set_epilog(std::string text) { epilog_ = std::move(text); }

  // Returns false when --help was given (help already printed). Throws UsageError.
  bool parse(int argc, char** argv);
  std::string help() const;

 private:
  struct Spec {
    bool takes_value;
    std::string help, default_text;
    std::function<void(const std::string&)> set;
  };
  std::string command_, summary_, epilog_;
  std::vector<std::string> order_;
  std::map<std::string, Spec> specs_;
  void add(const std::string& name, Spec spec);
};

}  // namespace flamia::cli
