// flamia: command-line front end (probe, numerics).
#include <cstdio>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <new>

#include "cli_args.h"
#include "commands.h"
#include "flamia/flamia.h"

namespace {

constexpr const char* kUsage =
    "usage: flamia <command> [options]\n"
    "\n"
    "Microscaled (MXFP8), causally safe attention over packed documents.\n"
    "\n"
    "commands:\n"
    "  probe      isolation probe: do outputs move when inputs they must not depend on change?\n"
    "  numerics   accuracy of the MXFP8 and mixed NVFP4/FP8 routes against an FP64 reference (docs/DESIGN.md §4)\n"
    "  help       this text (also -h, --help); 'flamia help <command>' is 'flamia <command> --help'\n"
    "  version    the release and the C API's ABI number (also --version)\n"
    "\n"
    "Run 'flamia <command> --help' for a command's options and exit statuses; 'flamia --version' for the version.\n";

bool is_any(const char* arg, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (!std::strcmp(arg, n)) return true;
  return false;
}

struct Command {
  const char* name;
  int (*run)(int argc, char** argv);
};
constexpr Command kCommands[] = {{"probe", flamia::cli::run_probe_command},
                                 {"numerics", flamia::cli::run_numerics_command}};

const Command* find_command(const char* name) {
  for (const Command& c : kCommands)
    if (!std::strcmp(name, c.name)) return &c;
  return nullptr;
}

// Runs a command, mapping what it throws to the exit statuses (cli_args.h).
int run_command(const Command& c, int argc, char** argv) {
  using namespace flamia::cli;
  try {
    return c.run(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "flamia %s: %s\n", c.name, e.what());
    return kExitRefused;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "flamia %s: error: out of memory (std::bad_alloc); the run did not finish\n", c.name);
    return kExitError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flamia %s: internal error: %s\n", c.name, e.what());
    return kExitError;
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace flamia::cli;
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return kExitRefused;
  }
  const char* first = argv[1];
  if (!std::strcmp(first, "help") && argc == 3) {  // "flamia help <command>" is "flamia <command> --help"
    if (const Command* c = find_command(argv[2])) {
      char help[] = "--help";
      char* help_argv[] = {help, nullptr};
      return run_command(*c, 1, help_argv);
    }
    std::fprintf(stderr, "flamia help: unknown command %s\n\n%s", quoted(argv[2]).c_str(), kUsage);
    return kExitRefused;
  }
  if (is_any(first, {"-h", "--help", "help"})) {
    if (argc > 2 && !std::strcmp(first, "help")) {
      std::fprintf(stderr, "flamia help: expects at most one command\n\n%s", kUsage);
      return kExitRefused;
    }
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (is_any(first, {"--version", "version"})) {
    std::printf("flamia %s (C API ABI %d)\n", flamia_version(), flamia_abi_version());
    return kExitOk;
  }
  if (const Command* c = find_command(first)) return run_command(*c, argc - 2, argv + 2);
  std::fprintf(stderr, "flamia: unknown command %s\n\n%s", quoted(first).c_str(), kUsage);
  return kExitRefused;
}
