"""The extension kinds, each declared once: its registry, where a scenario names it and sets its
settings, and how `dfedrw list` and docs/reference.md call it.

Every place that lists the kinds reads :data:`KINDS`: the scenario's settings tables
(:mod:`peer.config.tables`, :mod:`peer.config.scenario`), the listing and the reference tables
(:mod:`peer.kinds.catalog`) and the command line's ``dfedrw list KIND``. A new registry is a new row
here (a test fails for a :class:`~dfedrw.peer.registry.Registry` of the package this table lacks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dfedrw.peer.learning.datasets import DATASET_REGISTRY
from dfedrw.peer.learning.models import MODEL_REGISTRY
from dfedrw.peer.kinds.registries import ATTACK_REGISTRY, CRS_REGISTRY, RULE_REGISTRY, TPM_REGISTRY
from dfedrw.peer.registry import Registry
from dfedrw.peer.graph.schedule import SCHEDULE_REGISTRY
from dfedrw.peer.graph.topology import TOPOLOGY_REGISTRY
from dfedrw.peer.transport.compression import COMPRESSION_REGISTRY
from dfedrw.peer.transport.kinds import TRANSPORT_REGISTRY

__all__ = ["KINDS", "Kind", "by_name", "by_plural"]


@dataclass(frozen=True)
class Kind:
    """One extension kind.

    ``name``: the kind in messages and settings tables ("rule"); ``plural``: as ``dfedrw list``
    and the ``<!-- registry:KIND -->`` markers name it ("rules"); ``title``: its heading in
    docs/reference.md ("Data sets"). ``section`` and ``key``: the scenario key naming the class
    (``aggregation.rule``); ``field``: the section's field holding its classes' settings tables;
    ``nested``: whether they sit under that field (``[aggregation.tpm_params.NAME]``), not in the
    section itself (``[aggregation.NAME]``)."""

    name: str
    plural: str
    title: str
    registry: Registry
    section: str
    key: str
    field: str
    nested: bool = False

    def table_path(self, name: str, prefix: str | None = None) -> str:
        """The settings table of class ``name`` (written as given), under ``prefix`` (default:
        the section; a client's overrides sit under ``peers.K.aggregation``)."""
        where = prefix or self.section
        return f"{where}.{self.field}.{name}" if self.nested else f"{where}.{name}"

    @property
    def words(self) -> str:
        """The title within a sentence: "data sets", "TPMs"."""
        return self.title if self.title[:2].isupper() else self.title[0].lower() + self.title[1:]


KINDS: tuple[Kind, ...] = (
    Kind("rule", "rules", "Rules", RULE_REGISTRY, "aggregation", "rule", "rule_params"),
    Kind("tpm", "tpms", "TPMs", TPM_REGISTRY, "aggregation", "tpm", "tpm_params", nested=True),
    Kind("crs", "crs", "CRSs", CRS_REGISTRY, "aggregation", "crs", "crs_params", nested=True),
    Kind("attack", "attacks", "Attacks", ATTACK_REGISTRY, "attack", "name", "attack_params"),
    Kind("dataset", "datasets", "Data sets", DATASET_REGISTRY, "data", "name", "params"),
    Kind("model", "models", "Models", MODEL_REGISTRY, "train", "model", "model_params"),
    Kind("topology", "topologies", "Topologies", TOPOLOGY_REGISTRY, "topology", "kind", "params"),
    Kind("schedule", "schedules", "Schedules", SCHEDULE_REGISTRY, "topology", "schedule", "schedule_params", nested=True),
    Kind("transport", "transports", "Transports", TRANSPORT_REGISTRY, "network", "transport", "transport_params"),
    Kind("compression", "compressions", "Compressions", COMPRESSION_REGISTRY, "network", "compression", "compression_params", nested=True),
)

by_name: Mapping[str, Kind] = {k.name: k for k in KINDS}
by_plural: Mapping[str, Kind] = {k.plural: k for k in KINDS}
