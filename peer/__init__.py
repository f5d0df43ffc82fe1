"""One client of the network and everything it is made of. Its rooms: :mod:`.config` (what a
scenario says), :mod:`.kinds` and :mod:`.registry` (the kinds of extension and the registry they
share), :mod:`.aggregation` and :mod:`.attacks` (rules and attacks), :mod:`.learning` (data sets,
models, training), :mod:`.graph` (topologies and schedules), :mod:`.transport` (models on the wire),
:mod:`.wiring` (from a scenario to objects), :mod:`.client` (the round loop and its lifecycle) and
:mod:`.results` (what a run leaves on disk); :mod:`.cli` runs one client process."""
