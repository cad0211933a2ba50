"""The crowd side of the study: design, simulated crowd, import, quality filters, aggregation.

Modules in layers; each imports only modules of lower layers (``tests/test_import_graph.py``
checks that no cycle exists). The package as a whole sits below :mod:`saleval.analysis`,
which scores what it produces; how a simulated crowd compares with real people is
scored there (:mod:`saleval.analysis.validation`).

0. below the package: the schemas of ``study``, ``simulation`` and ``crowd``, with the
   words their fields take, live with every other schema in :mod:`saleval.config.crowd`,
   which imports nothing from here;
1. :mod:`~saleval.crowd.errors` (the exceptions), :mod:`~saleval.crowd.answers` (the
   answer vocabulary, "I don't know" and its aliases, and the one answer parser),
   :mod:`~saleval.crowd.seeding`;
2. :mod:`~saleval.crowd.reading` (what every input format shares), one module per input
   format: :mod:`~saleval.crowd.long_format` (long answer files) and
   :mod:`~saleval.crowd.lu2024` (the published files); :mod:`~saleval.crowd.sampling`;
   :mod:`~saleval.crowd.source` (the one interface of a crowd source, and
   :func:`~saleval.crowd.source.crowd_source`, which builds the one ``crowd._target_``
   names);
3. :mod:`~saleval.crowd.quality` (filters), :mod:`~saleval.crowd.aggregation`,
   :mod:`~saleval.crowd.design` (tasks and bundles), :mod:`~saleval.crowd.exports` (the
   registry of export formats and the built-in ones),
   :mod:`~saleval.crowd.readers` (the simulated workers' reading models),
   :mod:`~saleval.crowd.simulate` (the simulated crowd), :mod:`~saleval.crowd.published`
   (the published study's tasks and samples as tasks and datasets);
4. :mod:`~saleval.crowd.importer` (the built-in crowd sources: long answer files and the
   published format).
"""
