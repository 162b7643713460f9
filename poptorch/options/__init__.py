"""Options: ``poptorch.Options`` and its groups (``Training``, ``Distributed``, ``Precision``,
``TensorLocations``, ...), PopART's options and the attribute store they share.

Private modules: the store (``_options_dict``), the groups (``_options_groups``), PopART's
options (``_popart_options``) and ``Options`` itself (``_options``). Imports the pipelining
part's execution strategies only (``setExecutionStrategy`` takes one).
"""

__all__: list[str] = []
