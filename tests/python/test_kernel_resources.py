"""What the compiler gave the warp-specialized kernels, read from libflamia_capi.so with
`cuobjdump -res-usage` (no GPU needed; CTest sets FLAMIA_CAPI_LIB when the library is built,
elsewhere the module is skipped with the reason; cuobjdump comes from requirements-test.txt's
nvidia-cuda-cuobjdump wheel, or FLAMIA_CUOBJDUMP, or the PATH).

- Registers: the forward, dQ and dK dV kernels run 384 threads, one CTA per SM, and hand registers
  from the producer warpgroup to the two consumer warpgroups with `setmaxnreg` (forward 40 / 232,
  dQ 24 / 240, dK dV 24 / 240 or 40 / 232): 128 x producer + 256 x consumer = 64,512, which is what
  the launch allocates only when ptxas gives the kernel 168 registers per thread (65,536 / 384,
  rounded down to the allocation unit of 8). With fewer, a consumer's increase would wait forever
  for registers nobody gives back: a hang on the GPU, so it is checked here.
- The forward keeps everything in registers (no stack frame): its variants that spilled ran slower
  (a timeline probe with a 36-byte frame had its steps ~8% long; docs/KERNELS.md).
- The quantizer keeps everything in registers too: its interior-code instances had 24- and 32-byte
  stack frames at 4 CTAs per SM and ran slower than at 3 without (prefix's training-call quantize
  5-6% slower).
- dK dV's FP16-partials instance keeps its step loop free of spills: a stack frame of at most 32
  bytes (the entry's own). A 72-byte frame, which kept part of dK's accumulators in local memory
  through every step, ran that backward 6-8% slower on the long rows (H200, docs/KERNELS.md).
- Instance counts (forward 8: D in {64, 128} x consumer turns x prefix isolation's interior codes;
  dQ 8; dK dV 11: the FP16 dQ partials' instance at D = 128), so that a new instance, build time on CI's two cores, is a deliberate change.
"""

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from capi_library import BUILT, LIB, REASON  # noqa: E402

if not BUILT:
    pytest.skip(REASON, allow_module_level=True)

# 384 threads, producers' and consumers' registers summing to 168 per thread (see above).
WARP_SPECIALIZED_REGISTERS = 168
FORWARD_INSTANCES = 8


def cuobjdump() -> str:
    candidates = [os.environ.get("FLAMIA_CUOBJDUMP")]
    spec = importlib.util.find_spec("nvidia")  # the wheel's namespace package: nvidia/cu13/bin/cuobjdump
    if spec and spec.submodule_search_locations:
        candidates += [str(pathlib.Path(p, "cu13", "bin", "cuobjdump")) for p in spec.submodule_search_locations]
    candidates.append(shutil.which("cuobjdump"))
    for tool in candidates:
        if tool and pathlib.Path(tool).is_file():
            return tool
    pytest.fail("cuobjdump not found: pip install -r requirements-test.txt (nvidia-cuda-cuobjdump) or set FLAMIA_CUOBJDUMP")


def parse_resource_usage(text: str) -> dict:
    """{mangled kernel name: {"REG": n, "STACK": n, ...}} from `cuobjdump -res-usage` output."""
    kernels, name = {}, None
    for line in text.splitlines():
        header = re.match(r"\s*Function (\S+):\s*$", line)
        if header:
            name = header.group(1)
            continue
        if name and "REG:" in line:
            kernels[name] = {key: int(value) for key, value in re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", line)}
            name = None
    return kernels


@pytest.fixture(scope="module")
def kernels() -> dict:
    out = subprocess.run([cuobjdump(), "-res-usage", LIB], capture_output=True, text=True, check=True).stdout
    found = parse_resource_usage(out)
    assert found, "cuobjdump listed no kernels"
    return found


def family(kernels: dict, base: str) -> dict:
    """The instances of one kernel template, by their template arguments (e.g. forward_kernelILi128ELb1ELb0)."""
    found = {}
    for name, usage in kernels.items():
        instance = re.search(rf"\d({base}I.*?)EEEv", name)
        if instance:
            found[instance.group(1)] = usage
    return found


def test_parses_cuobjdump_lines():
    text = (" Function _Z3fooILi64EEvv:\n  REG:168 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:1536 TEXTURE:0\n"
            " Function _Z3barv:\n  REG:32 STACK:24 SHARED:0 LOCAL:0\n")
    usage = parse_resource_usage(text)
    assert usage["_Z3fooILi64EEvv"]["REG"] == 168 and usage["_Z3fooILi64EEvv"]["CONSTANT[0]"] == 1536
    assert usage["_Z3barv"]["STACK"] == 24


@pytest.mark.parametrize("base,instances", [("forward_kernel", FORWARD_INSTANCES), ("backward_dq_kernel", 8),
                                            ("backward_dkdv_kernel", 11)])
def test_warp_specialized_kernels_get_the_registers_their_roles_share(kernels, base, instances):
    found = family(kernels, base)
    assert len(found) == instances, f"{base}: {len(found)} instances, expected {instances}"
    wrong = {name: usage["REG"] for name, usage in found.items() if usage["REG"] != WARP_SPECIALIZED_REGISTERS}
    assert not wrong, f"registers per thread other than {WARP_SPECIALIZED_REGISTERS}: {wrong}"


def spilled(found: dict) -> dict:
    """{instance: (stack frame, local memory) bytes} of the instances that have either."""
    return {name: (usage["STACK"], usage["LOCAL"]) for name, usage in found.items() if usage["STACK"] or usage["LOCAL"]}


def test_forward_kernels_do_not_spill(kernels):
    found = family(kernels, "forward_kernel")
    assert len(found) == FORWARD_INSTANCES
    assert not spilled(found), f"forward instances with a stack frame or local memory (bytes): {spilled(found)}"


def test_quantize_kernels_do_not_spill(kernels):
    found = family(kernels, "quantize_mxfp8_kernel")
    assert found, "no quantize_mxfp8_kernel instances found"
    assert not spilled(found), f"quantizer instances with a stack frame or local memory (bytes): {spilled(found)}"


# backward_dkdv_kernel<D = 128, grid, no turns, no interior codes, FP16 dQ partials>
DQ_PARTIALS_INSTANCE = "backward_dkdv_kernelILi128ELb0ELb0ELb0ELb1"
DQ_PARTIALS_MAX_STACK = 32


def test_dq_partials_instance_keeps_its_step_loop_in_registers(kernels):
    found = family(kernels, "backward_dkdv_kernel")
    assert DQ_PARTIALS_INSTANCE in found, f"no {DQ_PARTIALS_INSTANCE} among {sorted(found)}"
    usage = found[DQ_PARTIALS_INSTANCE]
    assert usage["STACK"] <= DQ_PARTIALS_MAX_STACK and usage["LOCAL"] == 0, (
        f"FP16-partials dK dV instance: stack {usage['STACK']} bytes (at most {DQ_PARTIALS_MAX_STACK}), "
        f"local {usage['LOCAL']}")
