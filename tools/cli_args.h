// A small, strict command-line parser for the flamia tools: every option is declared with its
// help text, unknown options and malformed values are errors that name the option.
#pragma once

#include <climits>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace flamia::cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class ArgParser {
 public:
  ArgParser(std::string command, std::string summary) : command_(std::move(command)), summary_(std::move(summary)) {}

  void flag(const std::string& name, bool* target, const std::string& help);
  // An int option; values below min are refused with the option's range.
  void option(const std::string& name, int* target, const std::string& help, int min = INT_MIN);
  void option(const std::string& name, uint64_t* target, const std::string& help);
  void option(const std::string& name, std::string* target, const std::string& help);
  void option(const std::string& name, std::vector<int>* target, const std::string& help);  // comma list

  // Replaces the "(default: ...)" text of an option declared before (e.g. a default that is another option).
  void set_default_text(const std::string& name, const std::string& text);

  // Returns false when --help was given (help already printed). Throws UsageError.
  bool parse(int argc, char** argv);
  std::string help() const;

 private:
  struct Spec {
    bool takes_value;
    std::string help, default_text;
    std::function<void(const std::string&)> set;
  };
  std::string command_, summary_;
  std::vector<std::string> order_;
  std::map<std::string, Spec> specs_;
  void add(const std::string& name, Spec spec);
};

}  // namespace flamia::cli
