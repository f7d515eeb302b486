"""Argument checks of the PyTorch ops and the FP64 reference that need nothing from torch itself
(they read only ``.device``, or plain Python numbers), so they run and are tested without torch or a
GPU."""


def check_devices(op, reference_name, reference, **tensors):
    """Raise ValueError naming the first of ``tensors`` (name=tensor) that is not on the device of
    ``reference`` (whose name is ``reference_name``): the C API reads every pointer on one device."""
    for name, t in tensors.items():
        if t.device != reference.device:
            raise ValueError(f"flamia.{op}: {name} is on {t.device} but {reference_name} is on {reference.device}; "
                             f"every tensor of the call must be on one device")


def _preview(values, shown=8):
    """values as a short list for a message: the first `shown` entries, then how many more."""
    head = ", ".join(str(v) for v in values[:shown])
    return f"[{head}, ... ({len(values) - shown} more)]" if len(values) > shown else f"[{head}]"


def check_document_lengths(op, lens, total_tokens):
    """Raise ValueError unless ``lens`` (a list of ints) are document lengths >= 0 that add up to
    ``total_tokens``, the packed tokens of q. A cu_seqlens passed in their place (starts at 0, never
    decreases, ends at total_tokens, and so does not add up to it) is named as such."""
    looks_like_offsets = (len(lens) >= 2 and lens[0] == 0 and lens[-1] == total_tokens
                          and all(a <= b for a, b in zip(lens, lens[1:])))
    if sum(lens) != total_tokens and looks_like_offsets:
        raise ValueError(f"flamia.{op}: lens = {_preview(lens)} looks like cu_seqlens (starts at 0, never decreases, "
                         f"ends at the {total_tokens} tokens of q); pass the document lengths instead, e.g. "
                         f"flamia.reference.document_lengths(cu_seqlens)")
    for i, n in enumerate(lens):
        if n < 0:
            raise ValueError(f"flamia.{op}: document lengths must be >= 0, got lens[{i}] = {n}")
    if sum(lens) != total_tokens:
        raise ValueError(f"flamia.{op}: document lengths sum to {sum(lens)}, but q holds {total_tokens} tokens")


def check_hf_attention_kwargs(name, key_length, kwargs):
    """Raise ValueError for a transformers attention call that asks for what the kernels do not
    serve, rather than dropping it: a sliding window that binds (transformers' own flash-attention
    path applies ``sliding_window`` only when the keys outnumber it, as here) and logit soft-capping
    (Gemma 2's ``softcap``)."""
    window = kwargs.get("sliding_window")
    if window is not None and key_length > window:
        raise ValueError(f"{name}: sliding-window attention is not served (sliding_window={window} on rows of "
                         f"{key_length} tokens); the kernels attend to the whole document")
    softcap = kwargs.get("softcap")
    if softcap:
        raise ValueError(f"{name}: logit soft-capping is not served (softcap={softcap}); the kernels take raw scores")
