"""The leak experiment's configurations, in report order: config name -> the name its attention
implementation is registered under with transformers (attention.py). Torch-free, so train.py --help,
report.py and run_all.sh read it without the GPU stack."""

CONFIGS = {
    "bf16": "leak_bf16",  # exact BF16 attention; also the evaluation reference
    "document": "leak_flamia_document",  # flamia MXFP8, isolation="document"
    "prefix": "leak_flamia_prefix",  # flamia MXFP8, isolation="prefix"
    "e2m1": "leak_e2m1_token",  # 4-bit K/V, one scale per token: causal-safe quantization noise
    "leaky": "leak_leaky_e2m1",  # 4-bit K/V, one scale per 32-token block: a numerics leak
    "leaky_tile": "leak_leaky_tile",  # exact attention, causal mask at 32-token tile granularity: a mask leak
}
REFERENCE = "bf16"
