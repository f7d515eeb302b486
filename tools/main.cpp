// flamia: command-line front end (probe, numerics).
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>

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
    "\n"
    "Run 'flamia <command> --help' for a command's options; 'flamia --version' for the version.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::printf("flamia %s (C API ABI %d)\n", flamia_version(), flamia_abi_version());
    return 0;
  }
  const char* command = argv[1];
  try {
    if (!std::strcmp(command, "probe")) return flamia::cli::run_probe_command(argc - 2, argv + 2);
    if (!std::strcmp(command, "numerics")) return flamia::cli::run_numerics_command(argc - 2, argv + 2);
    std::fprintf(stderr, "flamia: unknown command '%s'\n\n%s", command, kUsage);
    return 2;
  } catch (const flamia::cli::UsageError& e) {
    std::fprintf(stderr, "flamia %s: %s\n", command, e.what());
    return 2;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "flamia %s: %s\n", command, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flamia %s: error: %s\n", command, e.what());
    return 1;
  }
}
