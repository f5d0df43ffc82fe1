"""The kinds of extension, listed once.

:mod:`.table` declares every kind (its registry, where a scenario names it and sets its settings,
what ``dfedrw list`` calls it); :mod:`.catalog` lists what each registry holds for ``dfedrw list``
and docs/reference.md; :mod:`.registries` holds the aggregation stack's and the attacks' registries
and builds a rule from names. The registries, all on :class:`dfedrw.peer.registry.Registry`, sit
with what they register (:mod:`dfedrw.peer.aggregation`, :mod:`dfedrw.peer.attacks`,
:mod:`dfedrw.peer.learning`, :mod:`dfedrw.peer.graph`, :mod:`dfedrw.peer.transport`).
"""
