"""dprobe.core.patch.replaced: a library's attribute swapped for a ``with`` block and put back."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dprobe.core.patch import replaced


def test_an_attribute_is_replaced_inside_and_put_back_after_even_on_an_error() -> None:
    lib = SimpleNamespace(check=len)
    with replaced(lib, "check", str):
        assert lib.check is str
    assert lib.check is len
    with pytest.raises(RuntimeError), replaced(lib, "check", str):
        raise RuntimeError("inside")
    assert lib.check is len


def test_an_attribute_the_library_lacks_is_left_alone() -> None:
    lib = SimpleNamespace(other=1)
    with replaced(lib, "check", str):
        assert not hasattr(lib, "check")
    assert vars(lib) == {"other": 1}
