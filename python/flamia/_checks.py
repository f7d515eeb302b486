"""Argument checks the PyTorch ops share that need nothing from torch itself (they read only
``.device``), so they run and are tested without torch or a GPU."""


def check_devices(op, reference_name, reference, **tensors):
    """Raise ValueError naming the first of ``tensors`` (name=tensor) that is not on the device of
    ``reference`` (whose name is ``reference_name``): the C API reads every pointer on one device."""
    for name, t in tensors.items():
        if t.device != reference.device:
            raise ValueError(f"flamia.{op}: {name} is on {t.device} but {reference_name} is on {reference.device}; "
                             f"every tensor of the call must be on one device")
