"""Who talks to whom: the graphs a scenario can name (:mod:`.topology`) and those that change from
round to round (:mod:`.schedule`); the graph types are in :mod:`dfedrw.topologies`."""
