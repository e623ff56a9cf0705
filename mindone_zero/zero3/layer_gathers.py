"""How a ZeRO-3 layer Cell gathers its parameters: one coalesced group, or a wrapper per parameter.

``LayerGathers`` is a base of ``ZeroCell`` (``layers.py``). The choice is made from the parameters'
``ParamGather`` records before any gather Cell is built ([Note: coalesced gathers] in
``coalesce.py``), so a layer holds the gather Cells its ``construct`` calls and no others.
"""
from ..core.stage import StagePolicy
from .coalesce import build_gather_group
from .param_wrapper import ZeroParamWrapper, gather_attr_name, gather_build_of, param_gather, shard_parameter

__all__ = ["LayerGathers"]


class LayerGathers:
    """The gathers of a layer Cell (a base of ``ZeroCell``). Reads the layer's ``coalesces``,
    ``zero_stage``, ``optimizer_parallel_group`` and ``zero3_param_attrs``; sets
    ``zero_gather_group``, ``zero_coalesce`` and the ``<attr>_zero_gather`` wrappers."""

    def _build_gathers(self, group, cell_type):
        # All the split parameters in one all-gather, or none ([Note: coalesced gathers] in coalesce.py).
        self.zero_gather_group = None
        self.zero_coalesce = False
        self.zero3_gather_dtype = cell_type
        if self.coalesces and StagePolicy(self.zero_stage).shards_params:
            params = [param for _, param in self._gathered_params()]
            specs = [shard_parameter(param, group) for param in params]  # a frozen one's too (no record)
            # built by shard_network's GatherBuild while it builds ([Note: gather Cells built once])
            build = next((b for b in map(gather_build_of, params) if b is not None), None)
            self.zero_gather_group = build_gather_group(
                [param_gather(param, group, cell_type, spec) for param, spec in zip(params, specs)], build)
            self.zero_coalesce = self.zero_gather_group is not None
        if not self.zero_coalesce:
            self.gather_per_parameter()

    def _gathered_params(self) -> list:
        return [(a, getattr(self, a)) for a in self.zero3_param_attrs if getattr(self, a, None) is not None]

    def gather_per_parameter(self) -> None:
        """Gather each parameter with its own ``ZeroParamWrapper`` (``<attr>_zero_gather``), not in
        one coalesced group: what a layer that cannot coalesce builds, and what ``shard_network``
        turns a layer built before it to when ZeRO++ options apply ([Note: ZeRO++ at build] in
        ``param_wrapper.py``). Not collective."""
        group = self.optimizer_parallel_group
        for attr, param in self._gathered_params():
            setattr(self, gather_attr_name(attr), ZeroParamWrapper(param, self.zero_stage, group,
                                                                   self.zero3_gather_dtype))
        self.zero_gather_group = None
        self.zero_coalesce = False

    def gather_cells(self) -> list:
        """The gather Cells ``construct`` calls: the coalesced group when the Cell coalesces ([Note:
        coalesced gathers]), else the per-parameter wrappers. Not collective."""
        if self.zero_coalesce:
            return [self.zero_gather_group]
        return [getattr(self, gather_attr_name(a)) for a, _ in self._gathered_params()]
