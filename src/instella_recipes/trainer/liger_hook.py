"""Instella's entry in liger-kernel's table, added the moment liger's table module loads, so that importing the library
costs nothing where Liger is not used.

Registering eagerly (`trainer/liger.py: register`) would import liger-kernel, Triton, torch and the model on every
`import instella_recipes.trainer`, i.e. in every entry point's first line (`stop_requests`), before `preflight` has
checked the command line, and in every test subprocess: about a second of Triton alone. The Trainer imports liger only
when `use_liger_kernel` is set (transformers' `apply_liger_kernel`), and so does our own check; this one-shot import
hook on `sys.meta_path` (Python's documented way to act on an import, `importlib.abc.MetaPathFinder`) adds Instella
right after liger's `monkey_patch` module has run, before anyone can look the model type up in it. Why it is ours:
liger has no registration API for third-party model types.
"""

import importlib.abc
import importlib.util
import sys

TABLE_MODULE = "liger_kernel.transformers.monkey_patch"  # holds MODEL_TYPE_TO_APPLY_LIGER_FN


def _register(table_module) -> None:
    # heavy (torch, the model, liger's modules): imported only once liger itself has been
    from .liger import register

    register(table_module)


class _AfterLigerTableLoads(importlib.abc.MetaPathFinder):
    """Wraps the loader of liger's table module so that `_register` runs right after the module's own code."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TABLE_MODULE:
            return None
        sys.meta_path.remove(self)  # one shot; the real finders below locate the module
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            _register(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Register Instella now if liger's table is already loaded, else as soon as it loads (idempotent)."""
    if TABLE_MODULE in sys.modules:
        _register(sys.modules[TABLE_MODULE])
    elif not any(isinstance(f, _AfterLigerTableLoads) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterLigerTableLoads())
