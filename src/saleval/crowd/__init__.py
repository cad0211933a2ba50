"""The crowd side of the study: design, simulated crowd, import, quality filters, aggregation.

Modules in layers; each imports only modules of lower layers (``tests/test_import_graph.py``
checks that no cycle exists):

1. :mod:`~saleval.crowd.errors` (the exceptions), :mod:`~saleval.crowd.answers` (the
   answer vocabulary, "I don't know" and its aliases, and the one answer parser),
   :mod:`~saleval.crowd.seeding`;
2. :mod:`~saleval.crowd.reading` (what every input format shares), one module per input
   format: :mod:`~saleval.crowd.long_format` (long answer files) and
   :mod:`~saleval.crowd.lu2024` (the published files); :mod:`~saleval.crowd.sampling`;
3. :mod:`~saleval.crowd.config` (the schemas of ``study``, ``simulation``, ``crowd``);
4. :mod:`~saleval.crowd.quality` (filters), :mod:`~saleval.crowd.aggregation`,
   :mod:`~saleval.crowd.design` (tasks and bundles), :mod:`~saleval.crowd.exports`,
   :mod:`~saleval.crowd.readers` (the simulated workers' reading models),
   :mod:`~saleval.crowd.simulate` (the simulated crowd), :mod:`~saleval.crowd.published`
   (the published study's tasks and samples as tasks and datasets),
   :mod:`~saleval.crowd.validation` (simulated vs real crowd);
5. :mod:`~saleval.crowd.importer` (import orchestration: the crowd sources that
   ``crowd._target_`` names).
"""
