"""Wiring: from a checked scenario to objects.

:mod:`.plan` says what a scenario means for its clients without building them (the graph, who is
Byzantine and who colludes, each client's role and seeds); :mod:`.build` builds what a section names
(the rule or attack, the data set, the transport kind, the model's wire layout); :mod:`.assembly`
builds one client's parts from those (identity, rule or attack, initial model, data), once per
process; :mod:`.memory` bounds what a client will hold and what a run needs. It lies above
configuration and the registries and below the client."""
