"""The crowd side of the study, one subpackage per concept (docs/architecture.md, *Where
things are*).

The package as a whole sits below :mod:`saleval.analysis`, which scores what it produces
(how a simulated crowd compares with real people is scored there,
:mod:`saleval.analysis.validation`), and above the schemas of ``study``, ``simulation``
and ``crowd``, which live with every other schema in :mod:`saleval.config.crowd` and
import nothing from here.

* at the top, what every concept shares: :mod:`~saleval.crowd.errors` (the exceptions),
  :mod:`~saleval.crowd.answers` (the answer vocabulary, "I don't know" and its aliases,
  and the one answer parser), :mod:`~saleval.crowd.seeding` (per-item generators);
* :mod:`saleval.crowd.design`: what a study is: which samples
  (:mod:`~saleval.crowd.design.sampling`), the tasks, gold questions and bundles, verified;
* :mod:`saleval.crowd.simulation`: a simulated crowd: the workers' reading models and
  their answers;
* :mod:`saleval.crowd.export`: what goes to workers and platforms (the export formats);
* :mod:`saleval.crowd.importing`: what comes back: the crowd sources, the two input
  formats, the published study's tasks and datasets, quality filters and aggregation.

A concept imports the shared modules and :mod:`saleval.crowd.design`, never another
concept (``tests/test_import_graph.py``).
"""
