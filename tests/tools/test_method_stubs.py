"""tools/nbexport.py writes the signatures of the methods `@method_of` attaches into their class, for type
checkers; every form it cannot write is refused (exit 2 from the exporter), never written wrong."""

import ast

import pytest

from nbexport import ExportError, with_method_stubs

HEAD = "from typing import TYPE_CHECKING\n\nfrom ggml_lite.bind import method_of\n\n\n"


def stubs_of(text: str, cls: str = "A") -> list:
    """The statements inside `cls`'s `if TYPE_CHECKING:` block of the exported text."""
    tree = ast.parse(with_method_stubs("m.py", HEAD + text))
    (klass,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    (block,) = [n for n in klass.body if isinstance(n, ast.If)]
    return block.body


def test_the_signature_keeps_parameters_annotations_and_return():
    (fn,) = stubs_of("class A:\n    x = 1\n\n\n@method_of(A)\n"
                     "def f(a, n: int, *rest, k: str = 'x', **kw) -> int:\n    return n\n")
    assert ast.unparse(fn) == "def f(a, n: int, *rest, k: str=..., **kw) -> int:\n    ..."


def test_the_method_name_given_positionally_or_by_keyword():
    text = ("class A:\n    x = 1\n\n\n@method_of(A, 'size')\ndef a_size(a) -> int:\n    return 1\n\n\n"
            "@method_of(A, name='name')\ndef a_name(a) -> str:\n    return ''\n")
    assert [f.name for f in stubs_of(text)] == ["size", "name"]


def test_an_async_function_gets_an_async_signature():
    (fn,) = stubs_of("class A:\n    x = 1\n\n\n@method_of(A)\nasync def g(a) -> None:\n    pass\n")
    assert isinstance(fn, ast.AsyncFunctionDef)


def test_a_long_signature_is_written_one_parameter_per_line():
    params = ", ".join(f"parameter_{i}: int = {i}" for i in range(8))
    out = with_method_stubs("m.py", HEAD + f"class A:\n    x = 1\n\n\n@method_of(A)\ndef f(a, {params}) -> int:\n"
                            "    return 1\n")
    block = out.split("if TYPE_CHECKING:")[1].split("\n\n")[0].split("\n")[1:]
    assert block[0] == "        def f(" and block[-1] == "        ) -> int: ..." and max(map(len, block)) <= 120
    assert "            parameter_7: int = ...," in block
    ast.parse(out)


@pytest.mark.parametrize("text, says", [
    ("class A: pass\n\n\n@method_of(A)\ndef f(a):\n    pass\n", "lines of its own"),
    ("class A:\n    x = 1\n\n\n@method_of(A)\n@staticmethod\ndef f(a):\n    pass\n", "alone"),
    ("import ggml_lite.bind as bind\n\n\nclass A:\n    x = 1\n\n\n@bind.method_of(A)\ndef f(a):\n    pass\n", "alone"),
    ("class A:\n    x = 1\n\n\ndef outer():\n    @method_of(A)\n    def f(a):\n        pass\n", "top-level"),
    ("class A:\n    x = 1\n\n\n@method_of(A, 'x', 'y')\ndef f(a):\n    pass\n", "ClassName"),
    ("class A:\n    x = 1\n\n\n@method_of(A, size)\ndef f(a):\n    pass\n", "ClassName"),
    ("@method_of(B)\ndef f(b):\n    pass\n", "not defined in this module"),
])
def test_forms_it_cannot_write_are_refused(text, says):
    with pytest.raises(ExportError, match=says):
        with_method_stubs("m.py", HEAD + text)


def test_method_of_under_another_name_is_refused():
    text = "from ggml_lite.bind import method_of as attach\n\n\nclass A:\n    x = 1\n"
    with pytest.raises(ExportError, match="its own name"):
        with_method_stubs("m.py", text)


def test_type_checking_must_be_imported():
    with pytest.raises(ExportError, match="TYPE_CHECKING"):
        with_method_stubs("m.py", "class A:\n    x = 1\n\n\n@method_of(A)\ndef f(a):\n    pass\n")
