"""cloudpickle's private parts that nbdist's pickler builds on, read here and nowhere else
(each registered in ``torch_private.PRIVATES``, feature ``shipping``, checked on the
versions in ``CLOUDPICKLE_VERIFIED``). Read, never replaced: plain cloudpickle in the same
process (Ray, Dask) pickles as it does without nbdist."""

from __future__ import annotations

from cloudpickle import cloudpickle as _cp

__all__ = [
    "DYNAMIC_CLASS_TRACKER_BY_ID",
    "EMPTY_CELL",
    "class_setstate",
    "extract_code_globals",
    "find_imported_submodules",
    "get_cell_contents",
    "make_skeleton_class",
    "should_pickle_by_reference",
]

find_imported_submodules = _cp._find_imported_submodules  # (code, top-level deps) -> modules
extract_code_globals = _cp._extract_code_globals  # code -> the global names it reads
get_cell_contents = _cp._get_cell_contents  # a closure cell -> its value, or EMPTY_CELL
EMPTY_CELL = _cp._empty_cell_value
class_setstate = _cp._class_setstate  # fills a skeleton class
make_skeleton_class = _cp._make_skeleton_class  # a class made anew on the receiving side
DYNAMIC_CLASS_TRACKER_BY_ID = _cp._DYNAMIC_CLASS_TRACKER_BY_ID  # class id -> its tracker
should_pickle_by_reference = _cp._should_pickle_by_reference  # (obj) -> by name, not value
