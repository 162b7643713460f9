"""The old module paths of collectives and TF-IPU's module names, in one place: each module
here only re-exports the public names of the module that holds the code (its home), and is
imported by its public path, never by this folder's: ``collectives.strategies`` is
``_aliases/strategies.py`` (``collectives.__path__`` lists this folder after the package's
own), ``collectives.ipu.horovod`` is ``_aliases/ipu/horovod/``. No module of collectives
imports one; tests/test_structure.py pins the paths and their homes.
"""
