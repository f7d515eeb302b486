"""Shared fixtures of the benchmark's CPU tests: a run's metadata and an implementation's result row."""

META = {"pass": "train", "gpu": "H200", "torch": "t", "jax": "j", "cudnn_torch": 1, "date": "d", "rounds": 5,
        "warmup": 2}


def ok(ms, tflops, **extra):
    return {"status": "ok", "ms": ms, "tflops": tflops, **extra}
