"""A client and its lifecycle: the round loop of an honest client (:mod:`.client`) and of a
Byzantine one (:mod:`.byzantine`), what a round writes and when, the same in every engine
(:mod:`.rounds`), which neighbours it waits for (:mod:`.presence`), coming back after a restart
(:mod:`.rejoin`, :mod:`.checkpoint`), colluders' pooled models (:mod:`.collusion`), and its
links to the launcher (:mod:`.telemetry`, :mod:`.rendezvous`); its parts are built by
:mod:`dfedrw.peer.wiring.assembly`."""
