// The flamia subcommands. Each takes the arguments after its name and returns the exit status.
#pragma once

namespace flamia::cli {

int run_probe_command(int argc, char** argv);
int run_numerics_command(int argc, char** argv);

}  // namespace flamia::cli
