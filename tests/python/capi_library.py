"""Where the Python tests find libflamia_capi.so: $FLAMIA_CAPI_LIB, which CTest sets when the library is
built (no CUDA toolkit: unset, and the tests that call the library skip with REASON)."""

import os
import pathlib

import pytest

LIB = os.environ.get("FLAMIA_CAPI_LIB")
BUILT = bool(LIB) and pathlib.Path(LIB).exists()
REASON = "libflamia_capi.so not built (no CUDA toolkit): FLAMIA_CAPI_LIB unset"
needs_library = pytest.mark.skipif(not BUILT, reason=REASON)
