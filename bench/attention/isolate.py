"""Each workload in a child process of its own, so that one implementation that crashes the process
(a segmentation fault in a library after a failed CUDA graph capture, say) costs that
implementation's cell and not the run.

The child (bench_attention.py with the hidden --child-* arguments) times the implementations it is
given and keeps a small JSON file up to date through Progress: the environment it found, the results
it has finished and the implementation it is running. The parent (run_isolated) reads that file once
the child has exited, however it exited: a child that died by a signal is reported as
'crashed (signal N)' for the implementation it was running, and a new child runs the implementations
it had not finished (those set up beside it under --schedule interleaved are set up again). Only the
standard library here: the parent imports neither torch nor JAX.
"""

import json
import os
import subprocess
import sys
import tempfile


class Progress:
    """The child's side: what it has finished and what it is running, rewritten (atomically) at every
    change; with path None it keeps the state and writes nothing (the run in one process)."""

    def __init__(self, path=None):
        self.path = path
        self.state = {"meta": None, "done": {}, "running": None, "phase": None, "fatal": None}

    def set_meta(self, meta):
        self.state["meta"] = meta
        self._write()

    def start(self, impl, phase="timing"):
        """impl runs from now on: if the process dies, impl is what crashed (in this phase)."""
        self.state.update(running=impl, phase=phase)
        self._write()

    def finish(self, impl, result):
        self.state["done"][impl] = result
        self.state.update(running=None, phase=None)
        self._write()

    def idle(self):
        self.state.update(running=None, phase=None)
        self._write()

    def fatal(self, message):
        """The child cannot run anything (no GPU, say): the parent stops the run."""
        self.state["fatal"] = message
        self._write()

    def _write(self):
        if self.path is None:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f)
        os.replace(tmp, self.path)  # a child killed mid-write leaves the previous state whole


def read_progress(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}  # the child died before its first write


def crash_status(returncode):
    """'crashed (signal 11)' for a child killed by a signal, 'crashed (exit 3)' for one that exited."""
    if returncode < 0:
        return f"crashed (signal {-returncode})"
    return f"crashed (exit {returncode})"


def run_isolated(impls, launch, log=lambda msg: None):
    """Runs `impls` (one workload's implementations, in order) in child processes: launch(impls,
    progress_path) runs one child over those implementations and returns its exit status
    (subprocess's: negative for a signal). A crash reports the implementation the child was running
    and starts a new child for the rest; one outside any of them (the child's start, flamia's
    reference output) reports all that are left. Returns (results {impl: result} in impls' order,
    the first child's environment or None, a fatal message or None)."""
    results, meta = {}, None
    remaining = list(impls)
    while remaining:
        with tempfile.TemporaryDirectory(prefix="bench-child-") as tmp:
            path = os.path.join(tmp, "progress.json")
            code = launch(list(remaining), path)
            state = read_progress(path)
        meta = meta or state.get("meta")
        if state.get("fatal"):
            return results, meta, state["fatal"]
        done = state.get("done") or {}
        for impl in remaining:
            if impl in done:
                results[impl] = done[impl]
        remaining = [i for i in remaining if i not in done]
        if not remaining:
            break
        status = crash_status(code) if code != 0 else "error: its process exited without a result"
        culprit, phase = state.get("running"), state.get("phase")
        if culprit in remaining:
            results[culprit] = {"status": status}
            if phase and phase != "timing":
                results[culprit]["note"] = f"{status} in its {phase}"
            remaining.remove(culprit)
            log(f"bench:   {culprit:15s} {status}{f' ({phase})' if phase else ''}; "
                f"{len(remaining)} left for a new process")
            continue
        where = (f"while running {culprit} ({phase})" if culprit else "outside any implementation")
        for impl in remaining:
            results[impl] = {"status": status, "note": f"the workload's process died {where}"}
        log(f"bench:   the workload's process {status} {where}: {', '.join(remaining)} not run")
        break
    return {i: results[i] for i in impls if i in results}, meta, None


def child_launcher(script, argv, workload):
    """launch() for run_isolated: the benchmark script re-run with the parent's arguments and the
    hidden --child-* ones (its output goes to the parent's stdout and stderr)."""
    def launch(impls, progress_path):
        cmd = [sys.executable, str(script), *argv, "--child-workload", workload, "--child-impls",
               ",".join(impls), "--child-progress", progress_path]
        return subprocess.run(cmd, check=False).returncode
    return launch
