"""Who talks to whom: the communication graphs a scenario can name (:mod:`.topology`) and the
graphs that change from round to round (:mod:`.schedule`). The graph types themselves are in
:mod:`dfedrw.topologies`.
"""
