"""A function shipped by value keeps its cell's file name, so a remote traceback can show the
cell's lines (cloudpickle 3.1.3 renames every code object to "<dynamic-code>"). The end-to-end
check over RPC is test_shipping's test_remote_traceback_shows_cell_source_and_rank."""

from __future__ import annotations

import linecache
import pickle
import traceback
import types

import cloudpickle

from nbdist.shipping import pickler as shipping
from nbdist.shipping.code_filename import reduce_code

CELL = "<ipython-input-7-0123456789ab>"
SOURCE = ("def explode(x):\n"
          "    squares = [i * i for i in range(x)]\n"
          "    raise ValueError(f'bad value {len(squares)}')\n")


def _cell_function() -> types.FunctionType:
    linecache.cache[CELL] = (len(SOURCE), None, SOURCE.splitlines(True), CELL)
    ns = {"__name__": "__main__"}
    exec(compile(SOURCE, CELL, "exec"), ns)
    return ns["explode"]


def _code_objects(code: types.CodeType) -> list[types.CodeType]:
    nested = [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return [code] + [n for c in nested for n in _code_objects(c)]


def test_shipped_function_keeps_the_cells_file_name_in_nested_code_too():
    func = pickle.loads(shipping.dumps(_cell_function()))
    names = {c.co_filename for c in _code_objects(func.__code__)}
    assert names == {CELL}, f"cloudpickle {cloudpickle.__version__} renamed the code: {names}"


def test_a_shipped_functions_traceback_shows_the_cell_line():
    func = pickle.loads(shipping.dumps(_cell_function()))
    try:
        func(3)
    except ValueError as exc:
        text = "".join(traceback.format_exception(exc))
    assert f'File "{CELL}", line 3, in explode' in text
    assert "raise ValueError(f'bad value {len(squares)}')" in text


def test_reduce_code_round_trips_a_code_object_exactly():
    code = _cell_function().__code__
    make, args = reduce_code(code)[:2]
    again = make(*args)
    assert again.co_filename == CELL
    assert again.co_code == code.co_code and again.co_name == code.co_name
    assert again.co_firstlineno == code.co_firstlineno
