"""TF-IPU's module names of ipu_node, in one place: each module here only re-exports the
public names of the module of a part that holds the code (its home), and is imported by its
public path, never by this folder's: ``ipu_node.loops`` is ``_aliases/loops.py``
(``ipu_node.__path__`` lists this folder after the package's own). No part of ipu_node
imports one; tests/test_structure.py pins the paths and their homes.
"""
