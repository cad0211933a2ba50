"""A simulated crowd (docs/simulated-crowd.md): workers who read only what a task shows.

* :mod:`~saleval.crowd.simulation.readers`: the reading models (what a worker
  "understands" of a display text), built from ``simulation.reader``;
* :mod:`~saleval.crowd.simulation.lexicon`: the reader that weighs words as people do,
  and the rule that picks a reader for a dataset;
* :mod:`~saleval.crowd.simulation.workers`: the workers, drawn, and their answers.
"""
