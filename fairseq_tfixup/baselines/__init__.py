"""Methods the T-Fixup paper compares against, registered with fairseq on import.

Every module of this folder is imported (as fairseq imports its own ``models`` folder), so a new
method is its module here plus its row in ``tfixup/methods.py``: no list to extend.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
