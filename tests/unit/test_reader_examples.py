"""Every line reader's docstring examples run: they are its tests and its documentation (readers/__init__.py)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import lossguard.sources.readers as readers

_MODULES = [name for _, name, _ in pkgutil.iter_modules(readers.__path__, readers.__name__ + ".")]


@pytest.mark.parametrize("name", _MODULES)
def test_reader_examples_hold(name):
    module = importlib.import_module(name)
    failed, attempted = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert failed == 0
    if name.rsplit(".", 1)[1] not in ("fields",):
        assert attempted > 0, f"{name} shows no example"
