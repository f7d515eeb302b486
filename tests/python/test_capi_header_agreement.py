"""The ctypes bindings (python/flamia/_capi.py) against the C header they mirror
(include/flamia/flamia.h), read as text: the ABI version, every enum's names and values, and every
struct's fields in order with C types that match the ctypes ones. A field or enum value added to
one side only fails here, without a GPU or a built library."""

import ctypes
import importlib.util
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]
HEADER = (REPO / "include" / "flamia" / "flamia.h").read_text()


def load_capi():
    # _capi.py imports nothing from the package's torch side, so it loads on its own.
    spec = importlib.util.spec_from_file_location("flamia_capi_bindings", REPO / "python" / "flamia" / "_capi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CAPI = load_capi()


def strip_comments(text):
    return re.sub(r"/\*.*?\*/", "", re.sub(r"//[^\n]*", "", text), flags=re.S)


def header_enums():
    """{enum name: {constant: value}}."""
    enums = {}
    for name, body in re.findall(r"typedef\s+enum\s+(\w+)\s*\{(.*?)\}\s*\w+\s*;", strip_comments(HEADER), re.S):
        constants = {}
        for item in body.split(","):
            item = item.strip()
            if item:
                constant, value = (part.strip() for part in item.split("="))
                constants[constant] = int(value)
        enums[name] = constants
    return enums


def header_structs():
    """{struct name: [(field, C type), ...]} in declaration order (one declaration may name several)."""
    structs = {}
    for name, body in re.findall(r"typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*\w+\s*;", strip_comments(HEADER), re.S):
        fields = []
        for declaration in body.split(";"):
            declaration = " ".join(declaration.split())
            if not declaration:
                continue
            match = re.match(r"((?:const\s+)?[\w]+\s*\**)\s*(.*)", declaration)
            base, names = match.group(1).replace(" ", ""), match.group(2)
            for field in names.split(","):
                field = field.strip()
                pointer = field.count("*")
                field = field.lstrip("*").strip()
                array = re.match(r"(\w+)\[(\d+)\]", field)
                ctype = base + "*" * pointer
                if array:
                    field, ctype = array.group(1), f"{base}[{array.group(2)}]"
                fields.append((field, ctype))
        structs[name] = fields
    return structs


# The ctypes each C type of the header must be bound as.
C_TO_CTYPES = {
    "void*": ctypes.c_void_p,
    "constint32_t*": ctypes.c_void_p,
    "flamia_offsets_status*": ctypes.c_void_p,
    "int64_t": ctypes.c_int64,
    "int32_t": ctypes.c_int32,
    "int": ctypes.c_int,
    "float": ctypes.c_float,
    "char[512]": ctypes.c_char * 512,
}


def test_abi_version_agrees():
    version = int(re.search(r"#define\s+FLAMIA_ABI_VERSION\s+(\d+)", HEADER).group(1))
    assert CAPI.ABI_VERSION == version


def header_define(name):
    return int(re.search(rf"#define\s+{name}\s+(\d+)", HEADER).group(1))


def test_p_boost_range_agrees():
    # The Python options record (_options.py) takes its default and range from these.
    assert CAPI.P_BOOST_LOG2_DEFAULT == header_define("FLAMIA_P_BOOST_LOG2_DEFAULT")
    assert CAPI.P_BOOST_LOG2_MAX == header_define("FLAMIA_P_BOOST_LOG2_MAX")


def test_enums_agree():
    enums = header_enums()
    assert {"flamia_status", "flamia_dtype", "flamia_isolation", "flamia_scale_geometry", "flamia_scale_rule",
            "flamia_offsets_error"} <= set(enums)
    assert {c_name: value for value, c_name in CAPI._STATUS_NAMES.items()} == enums["flamia_status"]
    assert {f"FLAMIA_{name}": value for name, value in vars(CAPI).items()
            if name == "SUCCESS" or name.startswith("ERROR_")} == enums["flamia_status"]
    assert {f"FLAMIA_{name}": value for name, value in vars(CAPI).items() if name.startswith("DTYPE_")} == enums[
        "flamia_dtype"]
    assert {c_name: value for value, c_name in CAPI.OFFSETS_ERRORS.items()} == enums["flamia_offsets_error"]
    assert {f"FLAMIA_{name}": value for name, value in vars(CAPI).items()
            if name.startswith("OFFSETS_") and name != "OFFSETS_ERRORS"} == enums["flamia_offsets_error"]
    # The Python spellings: each option enum's C constants end with the upper-cased Python name.
    for table, enum in ((CAPI.ISOLATION, "flamia_isolation"), (CAPI.SCALE_GEOMETRY, "flamia_scale_geometry"),
                        (CAPI.SCALE_RULE, "flamia_scale_rule")):
        c_values = {constant.rsplit("_", 1)[1].lower(): value for constant, value in enums[enum].items()}
        assert table == c_values, enum


def test_structs_agree_field_by_field():
    structs = header_structs()
    bindings = {"flamia_tensor": CAPI.Tensor, "flamia_documents": CAPI.Documents, "flamia_options": CAPI.Options,
                "flamia_error": CAPI.Error, "flamia_offsets_status": CAPI.OffsetsStatus}
    assert set(bindings) == set(structs)
    enum_types = set(header_enums())
    for name, struct in bindings.items():
        c_fields = structs[name]
        py_fields = struct._fields_
        assert [field for field, _ in c_fields] == [field for field, _ in py_fields], name
        for (field, ctype), (_, py_type) in zip(c_fields, py_fields):
            want = ctypes.c_int if ctype in enum_types else C_TO_CTYPES[ctype]  # a C enum is an int
            if issubclass(want, ctypes.Array):
                assert issubclass(py_type, ctypes.Array), (name, field)
                assert (py_type._length_, py_type._type_) == (want._length_, want._type_), (name, field)
            else:
                assert py_type == want, (name, field, ctype)


def test_parser_sees_every_declaration():
    # One declaration naming several fields, and a field added to the header alone, are both seen.
    fields = dict(header_structs()["flamia_tensor"])
    assert fields["tokens"] == fields["heads"] == fields["dim"] == "int64_t"
    assert "deterministic" in dict(header_structs()["flamia_options"])
