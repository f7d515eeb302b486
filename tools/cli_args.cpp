#include "cli_args.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace flamia::cli {

std::string shortened(const std::string& text) {
  constexpr size_t kShown = 64;
  if (text.size() <= kShown) return text;
  size_t cut = kShown;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  return text.substr(0, cut) + "\u2026";
}

std::string quoted(const std::string& text) { return "'" + shortened(text) + "'"; }

std::string exit_status_help(const std::string& ok, const std::string& failed) {
  const auto line = [](int status, const std::string& text) { return "  " + std::to_string(status) + "  " + text + "\n"; };
  return "exit status:\n" + line(kExitOk, ok) + line(kExitFailed, failed) +
         line(kExitRefused, "refused before running: bad usage, or a run over the limits (see --force)") +
         line(kExitError, "the run could not finish: out of memory, or an internal error");
}

namespace {

// list_item: `text` is one item of a comma-separated list (the message then says so).
template <class T>
T parse_number(const std::string& name, const std::string& text, T min = std::numeric_limits<T>::min(),
               bool list_item = false) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  const std::string range = std::string(list_item ? "a comma-separated list of integers" : "an integer") + " from " +
                            std::to_string(min) + " to " + std::to_string(std::numeric_limits<T>::max());
  const std::string got = ", got " + std::string(list_item ? "item " : "") + quoted(text);
  const bool whole = end == text.data() + text.size();
  if (ec == std::errc::result_out_of_range && whole)
    throw UsageError("option --" + name + " expects " + range + got + " (out of range)");
  if (ec == std::errc() && whole && value < min) throw UsageError("option --" + name + " expects " + range + got);
  if (ec == std::errc() && whole) return value;
  // from_chars reads no sign into an unsigned type: name the range, not just "an integer".
  const bool negative = !text.empty() && text[0] == '-';
  if (std::numeric_limits<T>::min() == 0 && negative && text.find_first_not_of("0123456789", 1) == std::string::npos &&
      text.size() > 1)
    throw UsageError("option --" + name + " expects " + range + got + " (negative)");
  throw UsageError("option --" + name + " expects " + range + got);
}

}  // namespace

void ArgParser::add(const std::string& name, Spec spec) {
  order_.push_back(name);
  specs_[name] = std::move(spec);
}

void ArgParser::flag(const std::string& name, bool* target, const std::string& help) {
  add(name, {false, help, "", [target](const std::string&) { *target = true; }});
}
void ArgParser::option(const std::string& name, int* target, const std::string& help, int min) {
  add(name, {true, help, std::to_string(*target), [=](const std::string& v) { *target = parse_number<int>(name, v, min); }});
}
void ArgParser::option(const std::string& name, uint64_t* target, const std::string& help) {
  add(name, {true, help, std::to_string(*target), [=](const std::string& v) { *target = parse_number<uint64_t>(name, v); }});
}
void ArgParser::option(const std::string& name, std::string* target, const std::string& help) {
  add(name, {true, help, *target, [target](const std::string& v) { *target = v; }});
}
void ArgParser::option(const std::string& name, double* target, const std::string& help, double min) {
  char shown[32];
  std::snprintf(shown, sizeof shown, "%g", *target);
  add(name, {true, help, shown, [=](const std::string& v) {
               double value = 0.0;
               const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), value);
               if (ec != std::errc() || end != v.data() + v.size() || !std::isfinite(value) || value < min) {
                 char low[32];
                 std::snprintf(low, sizeof low, "%g", min);
                 throw UsageError("option --" + name + " expects a finite number >= " + low + ", got " + quoted(v));
               }
               *target = value;
             }});
}
void ArgParser::option(const std::string& name, std::vector<int>* target, const std::string& help, int min) {
  std::string def;
  for (int x : *target) def += (def.empty() ? "" : ",") + std::to_string(x);
  add(name, {true, help, def, [=](const std::string& v) {
               target->clear();
               std::stringstream ss(v);
               for (std::string item; std::getline(ss, item, ',');)
                 target->push_back(parse_number<int>(name, item, min, true));
               if (target->empty()) {
                 throw UsageError("option --" + name + " expects a comma-separated list of integers from " +
                                  std::to_string(min) + " to " + std::to_string(INT_MAX) + ", got ''");
               }
             }});
}

bool ArgParser::parse(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    if (arg.rfind("--", 0) != 0) throw UsageError("unexpected argument " + quoted(arg) + " (see flamia " + command_ + " --help)");
    std::string name = arg.substr(2), value;
    bool has_inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1), name = name.substr(0, eq), has_inline_value = true;
    }
    auto it = specs_.find(name);
    if (it == specs_.end()) throw UsageError("unknown option " + shortened("--" + name) + " (see flamia " + command_ + " --help)");
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

void ArgParser::set_default_text(const std::string& name, const std::string& text) { specs_.at(name).default_text = text; }

namespace {
// One help line: the option column padded to a fixed width, then the text.
std::string help_line(std::string left, const std::string& text) {
  constexpr size_t kWidth = 26;
  if (left.size() < kWidth) left.resize(kWidth, ' ');
  return left + " " + text + "\n";
}
}  // namespace

std::string ArgParser::help() const {
  std::string out = "usage: flamia " + command_ + " [options]\n\n" + summary_ + "\n\noptions:\n";
  for (const auto& name : order_) {
    const Spec& s = specs_.at(name);
    out += help_line("  --" + name + (s.takes_value ? " VALUE" : ""),
                     s.help + (s.takes_value && !s.default_text.empty() ? " (default: " + s.default_text + ")" : ""));
  }
  out += help_line("  -h, --help", "show this help");
  return epilog_.empty() ? out : out + "\n" + epilog_;
}

}  // namespace flamia::cli
