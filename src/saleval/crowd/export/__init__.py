"""What goes to workers and platforms (docs/study-design.md#exports):
:mod:`~saleval.crowd.export.formats`, the registry of export formats and the built-in
ones."""
