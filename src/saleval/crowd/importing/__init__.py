"""What a crowd produced, turned into the import's tables (docs/aggregation.md).

In layers, each module importing only those before it:

1. :mod:`~saleval.crowd.importing.rows`: what every input format shares: reading delimited
   rows, the rejects list and the ``strict``/``report`` policy, file hashes, and
   :class:`~saleval.crowd.importing.rows.CrowdImport`, what an import returns;
2. one module per input format: :mod:`~saleval.crowd.importing.long_format` (long answer
   files: one answer per row) and :mod:`~saleval.crowd.importing.published_format` (the
   aggregated file Lu et al. 2024 published); :mod:`~saleval.crowd.importing.source` (the
   one interface of a crowd source, and
   :func:`~saleval.crowd.importing.source.crowd_source`, which builds the one
   ``crowd._target_`` names);
3. :mod:`~saleval.crowd.importing.quality` (the filters),
   :mod:`~saleval.crowd.importing.aggregation` (answers to A[i, j, k], agreement),
   :mod:`~saleval.crowd.importing.published_study` (the published study's samples and
   tasks, read from its file, as a task set and as datasets);
4. :mod:`~saleval.crowd.importing.builtin`: the built-in crowd sources (``crowd=answers``,
   ``crowd=lu2024``).
"""
