#include "cli_args.h"

#include <charconv>
#include <cstdio>
#include <sstream>

namespace flamia::cli {
namespace {

template <class T>
T parse_number(const std::string& name, const std::string& text) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size())
    throw UsageError("option --" + name + " expects an integer, got '" + text + "'");
  return value;
}

}  // namespace

void ArgParser::add(const std::string& name, Spec spec) {
  order_.push_back(name);
  specs_[name] = std::move(spec);
}

void ArgParser::flag(const std::string& name, bool* target, const std::string& help) {
  add(name, {false, help, "", [target](const std::string&) { *target = true; }});
}
void ArgParser::option(const std::string& name, int* target, const std::string& help) {
  add(name, {true, help, std::to_string(*target), [=](const std::string& v) { *target = parse_number<int>(name, v); }});
}
void ArgParser::option(const std::string& name, uint64_t* target, const std::string& help) {
  add(name, {true, help, std::to_string(*target), [=](const std::string& v) { *target = parse_number<uint64_t>(name, v); }});
}
void ArgParser::option(const std::string& name, std::string* target, const std::string& help) {
  add(name, {true, help, *target, [target](const std::string& v) { *target = v; }});
}
void ArgParser::option(const std::string& name, std::vector<int>* target, const std::string& help) {
  std::string def;
  for (int x : *target) def += (def.empty() ? "" : ",") + std::to_string(x);
  add(name, {true, help, def, [=](const std::string& v) {
               target->clear();
               std::stringstream ss(v);
               for (std::string item; std::getline(ss, item, ',');) target->push_back(parse_number<int>(name, item));
               if (target->empty()) throw UsageError("option --" + name + " expects a comma-separated list of integers");
             }});
}

bool ArgParser::parse(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    if (arg.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + arg + "' (see flamia " + command_ + " --help)");
    std::string name = arg.substr(2), value;
    bool has_inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1), name = name.substr(0, eq), has_inline_value = true;
    }
    auto it = specs_.find(name);
    if (it == specs_.end()) throw UsageError("unknown option --" + name + " (see flamia " + command_ + " --help)");
    if (it->second.takes_value && !has_inline_value) {
      if (i + 1 >= argc) throw UsageError("option --" + name + " needs a value");
      value = argv[++i];
    } else if (!it->second.takes_value && has_inline_value) {
      throw UsageError("option --" + name + " takes no value");
    }
    it->second.set(value);
  }
  return true;
}

std::string ArgParser::help() const {
  std::string out = "usage: flamia " + command_ + " [options]\n\n" + summary_ + "\n\noptions:\n";
  for (const auto& name : order_) {
    const Spec& s = specs_.at(name);
    std::string left = "  --" + name + (s.takes_value ? " VALUE" : "");
    if (left.size() < 26) left.resize(26, ' ');
    out += left + " " + s.help + (s.takes_value && !s.default_text.empty() ? " (default: " + s.default_text + ")" : "") + "\n";
  }
  out += "  -h, --help                 show this help\n";
  return out;
}

}  // namespace flamia::cli
